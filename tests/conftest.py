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
from collections import Counter
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


# The two-worker tiers' modules, longest first: a module's seconds on a loaded 2-core run (its Airflow's start
# included). make test's second tier and make e2e run `--dist loadfile --no-loadscope-reorder`, so pytest-xdist
# hands modules to its two workers in collection order, and each worker takes its next module while it still has
# two tests to go. xdist's default order, by number of tests, ran the longest modules last: the spine (two tests)
# near the end of make test's tier; in make e2e the one-test modules (k8s-cr, lifecycle, plan-aggregate), and the
# worker that had taken k8s-cr took lifecycle too while the other ran out of modules (simulated with these
# numbers: 2,058 s against 1,774 s longest first; bench/e2e_order/run.py). The numbers only order the modules: the
# listed ones run first, longest first, then the others by number of tests, most first, as xdist's default
# (tests/unit/test_e2e_order.py checks that tests/e2e's are listed). Only with --no-loadscope-reorder.
# 2026-12-06 (branch e2ebudget): the fleet, git, AMP and Celery runs use the demo-quick profile (a
# 1-minute warm-up instead of 2: a minute less per scenario run one after another), the spine's demo-history warms
# up a minute, and every e2e stack stop kills Airflow 8 s after SIGTERM instead of 30 (its triggerer and API server
# ignored SIGTERM): the seconds of those modules are the last CI's less those, measured waits (see the report).
MODULE_SECONDS = {
    "e2e/test_k8s_cr_demo_e2e.py": 1250,  # 1,181 s in make e2e 2026-12-06 up to its retire (the consolidation since)
    "e2e/test_lifecycle_demo_e2e.py": 680,  # 680 s in make e2e 2026-12-06 with the history horizon (load 5-8)
    "e2e/test_fleet_demo_e2e.py": 415,  # 557 s in the last CI (set-up 524, teardown 33): two waves, one stop
    "e2e/test_git_demo_e2e.py": 275,  # 417 s: happy, then drift
    "e2e/test_amp_demo_e2e.py": 215,  # 303 s: happy, then bad-credentials (no warm-up), two stops
    "integration/test_faults.py": 185,
    "integration/test_fab_api_server.py": 185,  # 2026-12-06 at load 12: an Airflow api-server with FAB's auth manager
    "e2e/test_celery_demo_e2e.py": 180,  # 262 s
    "integration/test_ha_pairs.py": 150,
    # 337 s in make e2e 2026-12-06 (load 5-8); demo's warm-up (its golden panels need 3 points at 30 s)
    "e2e/test_plan_aggregate_demo_e2e.py": 337,
    "board/test_board_airflow.py": 100,  # 122 s; its Airflow's stop too
    "integration/test_retire_source.py": 94,
    "integration/test_queue_swap.py": 82,
    "integration/test_k8s_queue_swap.py": 75,
    "integration/test_git_retire.py": 69,
    "integration/test_horizon_local.py": 8,
    "integration/test_parity_query_limits.py": 6,
    # make test's spine: 667 s alone on 2 cores at load 12 (2026-12-06), where plan-aggregate took 531 s against
    # its 250-282 s in make e2e runs: about half in CI; a minute's warm-up and 22 s of its stop less now.
    "e2e/test_demo_e2e.py": 250,
}


def module_of(item: pytest.Item) -> str:
    """The item's module, relative to tests/ (``e2e/test_amp_demo_e2e.py``)."""
    return Path(str(item.path)).resolve().relative_to(TESTS).as_posix()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
        if (tier := TIER_OF_FOLDER.get(folder)) and not item.get_closest_marker(tier):
            item.add_marker(tier)


def longest_first(items: list[pytest.Item]) -> None:
    """Listed modules first, longest first; then the others, most tests first. Stable: a module's tests stay
    together and in their order, and modules that tie keep theirs."""
    modules = [module_of(item) for item in items]
    tests = Counter(modules)
    order = {id(item): (-MODULE_SECONDS.get(m, 0), -tests[m]) for item, m in zip(items, modules, strict=True)}
    items.sort(key=lambda item: order[id(item)])


class LongestFirst:
    @pytest.hookimpl(trylast=True)  # after -m/-k deselected: the number of tests is of the tests that will run
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        longest_first(items)


def pytest_configure(config: pytest.Config) -> None:
    # Only where xdist is told to keep the order (the two-worker tiers): a plain run keeps pytest's own order.
    if config.getoption("loadscopereorder", default=True) is False:
        config.pluginmanager.register(LongestFirst(), "promshift-longest-first")


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
