"""Snapshots between tasks: one JSON blob per group and run, hash-checked when read back.

``BlobSnapshotStore`` keeps them in any ``adapters.blobs.Blobs`` (an object store every worker
reads, in production); ``FileSnapshotStore`` is the same under a local directory.
"""

from __future__ import annotations

import json
import os

from promshift.adapters.blobs import Blobs, LocalBlobs
from promshift.core.deploy import DeployError, DeploySnapshot, snapshot_key


class BlobSnapshotStore:
    """A ``core.deploy.SnapshotStore`` over ``Blobs`` (``<group>/<run>.<kind>.json``, written whole)."""

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs

    def put(self, group: str, run_id: str, snapshot: DeploySnapshot) -> str:
        data = json.dumps(snapshot.to_dict(), indent=1).encode()
        return self.blobs.put(snapshot_key(group, run_id, f"{snapshot.kind}.json"), data)

    def get(self, ref: str) -> DeploySnapshot:
        try:
            data = json.loads(self.blobs.get(ref))
        except (OSError, ValueError) as exc:
            raise DeployError(f"snapshot {ref} cannot be read: {exc.__class__.__name__}") from None
        return DeploySnapshot.from_dict(data)


class FileSnapshotStore(BlobSnapshotStore):
    """``BlobSnapshotStore`` under a local directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__(LocalBlobs(directory))
