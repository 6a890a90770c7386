"""In-memory stand-ins for Airflow's side of the operator interface, shared by unit and integration tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTI:
    """Answers ``xcom_pull(task_ids=...)`` from prepared values and keeps what is pushed, as a task instance does."""

    xcoms: dict[str, Any] = field(default_factory=dict)
    map_index: int = -1
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_pull(self, task_ids: str | list[str] | None = None, **_: Any) -> Any:
        if isinstance(task_ids, list):  # as Airflow does: a list of task ids answers a list
            return [self.xcoms.get(t) for t in task_ids]
        return self.xcoms.get(task_ids) if task_ids is not None else None

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)  # XCom values must serialise
        self.pushed[key] = value
