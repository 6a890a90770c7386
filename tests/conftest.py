"""Test-wide settings and the tiers.

A throwaway AIRFLOW_HOME so tests never touch ~/airflow. Every test belongs to one tier, by its folder
unless it says otherwise:

- unit (``tests/unit``, ``tests/dags``, ``tests/board`` without a marker): starts no process — the guard
  below refuses ``subprocess``, ``multiprocessing`` and ``os.fork`` with a line naming the rule;
- ``integration`` (``tests/integration``, ``tests/package``, or a unit-folder test marked so): real servers
  on 127.0.0.1, promtool, other processes;
- ``e2e`` (``tests/e2e``, the board's browser test): DAGs run by Airflow on the local stack; the ``spine``
  among them (the happy path, one Airflow) runs in ``make test``, the rest in ``make e2e``;
- ``slow``: integration tests too long for ``make test``'s 15 minutes (the fault matrix); ``make e2e`` runs them.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="promshift-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
# Every writer needs the audit HMAC key, as in a deployment; tests of a missing key unset it.
os.environ.setdefault("PROMSHIFT_AUDIT_KEY", "test-only-audit-key-0123456789abcdef")

# Imported once before the unit guard: croniter asks `file` for the word size when imported, and matplotlib's font
# manager runs `fc-list` to build its font cache the first time where fontconfig is installed (chromium brings it).
import croniter  # noqa: E402, F401
import matplotlib.font_manager  # noqa: E402, F401

TESTS = Path(__file__).resolve().parent
TIER_OF_FOLDER = {"integration": "integration", "package": "integration", "e2e": "e2e"}
UNIT_RULE = "the unit tier starts no process (move this test to tests/integration or mark it integration)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
        if (tier := TIER_OF_FOLDER.get(folder)) and not item.get_closest_marker(tier):
            item.add_marker(tier)


def is_unit(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(m) for m in ("integration", "e2e", "slow", "spine"))


class ProcessStarted(AssertionError):
    """A unit test tried to start a process."""


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise ProcessStarted(UNIT_RULE)


@pytest.fixture(autouse=True)
def unit_tier_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if is_unit(request.node):
        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
        monkeypatch.setattr(os, "fork", _refuse)
        monkeypatch.setattr(os, "posix_spawn", _refuse)
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
    yield
