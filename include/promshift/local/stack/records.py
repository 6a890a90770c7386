"""A stand-in's small state: JSON records in a file under the stack's home (or in memory without one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from promshift.adapters.deploy import write_keeping


class JsonRecords:
    """``_read``/``_write`` of ``{key: record}`` in ``state_path`` (kept across the stand-in's restarts), or in
    memory when ``state_path`` is None. An unreadable or malformed file reads as empty."""

    state_path: Path | None
    _memory: dict[str, Any]

    def _read(self) -> dict[str, Any]:
        if self.state_path is None:
            return dict(self._memory)
        try:
            document = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    def _write(self, records: dict[str, Any]) -> None:
        if self.state_path is None:
            self._memory = dict(records)
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_keeping(self.state_path, (json.dumps(records, indent=2, sort_keys=True) + "\n").encode())
