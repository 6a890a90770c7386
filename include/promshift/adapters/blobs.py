"""Named bytes that any step of a run may read back: snapshots of what a deploy replaced.

``LocalBlobs`` keeps them under a directory (one machine, or a volume every worker mounts);
``promshift.orchestration.object_blobs.ObjectStorageBlobs`` keeps them wherever Airflow's
``ObjectStoragePath`` reaches (``s3://...`` in production), so the worker that rolls back need
not be the one that took the snapshot. Either way a blob is named by its key (group and run),
written whole or not at all, and read back by the reference ``put`` returned; the callers check
the bytes against the sha256 they recorded in the audit log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from promshift.adapters.deploy import write_atomically


@runtime_checkable
class Blobs(Protocol):
    def put(self, key: str, data: bytes, *, mode: int = 0o600) -> str:
        """Store ``data`` under ``key`` (``group/run.yml``); return the reference ``get`` reads."""

    def get(self, ref: str) -> bytes:
        """The bytes ``put`` stored (OSError if they cannot be read)."""


class LocalBlobs:
    """Blobs under a directory: directories 0700, files ``mode`` (0600: a snapshot holds what the config holds)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def put(self, key: str, data: bytes, *, mode: int = 0o600) -> str:
        path = self.directory / key
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, data, mode=mode)
        return str(path)

    def get(self, ref: str) -> bytes:
        return Path(ref.removeprefix("file://")).read_bytes()
