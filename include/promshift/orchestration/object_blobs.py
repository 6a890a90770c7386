"""``adapters.blobs.Blobs`` through Airflow's ``ObjectStoragePath``: snapshots every worker can read.

``PROMSHIFT_SNAPSHOTS_URL`` names the base (``s3://bucket/prefix`` in production; by default
``file://$PROMSHIFT_HOME/snapshots``). A ``file://`` base is written like ``LocalBlobs`` (atomic
rename, 0600 files in 0700 directories); any other protocol through ``write_bytes`` (an object
store's put is whole or nothing).
"""

from __future__ import annotations

from typing import Any

from promshift.adapters.blobs import LocalBlobs


class ObjectStorageBlobs:
    def __init__(self, base_url: str) -> None:
        from airflow.sdk import ObjectStoragePath

        self.base_url = base_url.rstrip("/")
        self.base: Any = ObjectStoragePath(self.base_url)

    def put(self, key: str, data: bytes, *, mode: int = 0o600) -> str:
        target = self.base / key
        if target.protocol == "file":
            LocalBlobs(self.base.path).put(key, data, mode=mode)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return str(target)

    def get(self, ref: str) -> bytes:
        from airflow.sdk import ObjectStoragePath

        return bytes(ObjectStoragePath(ref).read_bytes())
