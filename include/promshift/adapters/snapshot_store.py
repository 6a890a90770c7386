"""Snapshots between tasks, on disk: one JSON file per group and run, hash-checked when read back."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from promshift.core.deploy import DeployError, DeploySnapshot


class FileSnapshotStore:
    """A ``core.deploy.SnapshotStore`` under a directory (``<dir>/<group>/<run>.json``, written atomically)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def put(self, group: str, run_id: str, snapshot: DeploySnapshot) -> str:
        safe_run = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
        safe_group = re.sub(r"[^A-Za-z0-9_.-]", "_", group)
        path = self.directory / safe_group / f"{safe_run}.{snapshot.kind}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(snapshot.to_dict(), handle, indent=1)
        os.replace(tmp, path)
        return str(path)

    def get(self, ref: str) -> DeploySnapshot:
        try:
            data = json.loads(Path(ref).read_text())
        except (OSError, ValueError) as exc:
            raise DeployError(f"snapshot {ref} cannot be read: {exc.__class__.__name__}") from None
        return DeploySnapshot.from_dict(data)
