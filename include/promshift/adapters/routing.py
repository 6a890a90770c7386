"""The routing manifest: which backend serves each metric group's reads."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from promshift.settings import state_home


def default_routing_path() -> Path:
    return state_home() / "routing.json"


class RoutingError(RuntimeError):
    """The routing manifest cannot be read (not JSON, or not ``{"groups": {...}}``); it is never overwritten."""


class RoutingManifest:
    """A JSON file mapping group -> {read_from, url, since, run_id}; written atomically."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path else default_routing_path()

    def load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"groups": {}}
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise RoutingError(f"routing manifest {self.path} is unreadable or corrupt: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("groups"), dict) or not all(
                isinstance(v, dict) for v in data["groups"].values()):
            raise RoutingError(f'routing manifest {self.path} is not {{"groups": {{group: route}}}}')
        return data

    def route(self, group: str, *, read_from: str, url: str, at: datetime, run_id: str) -> dict[str, Any]:
        data = self.load()
        data["groups"][group] = {"read_from": read_from, "url": url, "since": at.isoformat(), "run_id": run_id}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".routing-")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(tmp, self.path)
        return data["groups"][group]

    def read_from(self, group: str) -> str:
        return self.load()["groups"].get(group, {}).get("read_from", "source")
