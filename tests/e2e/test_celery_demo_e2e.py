"""End to end: ``make demo EXECUTOR=celery`` (issue 12): the migration under Airflow's CeleryExecutor.

Airflow runs as separate processes — api-server, scheduler, dag-processor, triggerer and two Celery
workers (one task at a time each), every one with a ``PROMSHIFT_HOME`` of its own — on the machine's
Redis (broker) and PostgreSQL (Airflow's metadata, the audit log and its anchor). Snapshots and
reports go to one shared object store. The run must cut over with the mapped parity shards spread
over both workers (Airflow's own task-instance records, in ``report.json``'s ``executor`` block), the
audit log in PostgreSQL and no SQLite audit file anywhere, and every process stopped afterwards.

Session: an Airflow of its own (``run_demo``, as ``make demo EXECUTOR=celery``): another executor.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from promshift.adapters.audit_anchor import anchor_for
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import audit_key
from promshift.local.celery_lab import CeleryServices
from promshift.local.demo import QUICK_PROFILE, run_demo, shared_store
from promshift.local.stack.local import AIRFLOW, LocalStack, StackConfig
from tests.e2e.conftest import free_port, stop_stack
from tests.e2e.test_demo_e2e import proc_cmdline, proc_environ, proc_pids

# The stack, Airflow's six processes and the run on 2 loaded cores: above the 600 s pytest-timeout of pyproject.toml.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

RUN_TIMEOUT_S = 900.0
NODES = 40
GROUP = "gpu-memory"


def group_members(pgid: int) -> list[int]:
    members = []
    for pid in proc_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(pid)
    return members


def test_celery_demo_spreads_parity_shards_over_two_workers_and_cuts_over(
        small_stack_env: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    services = CeleryServices.from_env(port)
    home = small_stack_env / "state"
    try:
        check_celery_demo(small_stack_env, home, services, port)
    finally:
        services.drop_databases()  # only this test's own (they carry the demo's comment)


def check_celery_demo(tmp: Path, home: Path, services: CeleryServices, port: int) -> None:
    try:
        out = run_demo(group_name=GROUP, scenario="happy", nodes=NODES, airflow_port=port,
                       report_root=tmp / "reports", executor="celery", timeout_s=RUN_TIMEOUT_S,
                       profile=QUICK_PROFILE)
        stack = LocalStack(StackConfig.from_env())
        pgid = int(stack.pid_path(AIRFLOW).read_text())
        running = group_members(pgid)
        cmdlines = [" ".join(proc_cmdline(pid)) for pid in running]
        answering = services.workers_answering(services.worker_names(), timeout_s=10)
    finally:
        stop_stack()
    # -- everything stopped: the whole process group, and no Airflow process of this test's home left --------
    assert group_members(pgid) == [], "stack down left a member of Airflow's process group running"
    leftovers = [pid for pid in proc_pids() if pid != os.getpid() and str(home) in proc_environ(pid)
                 and any(m in " ".join(proc_cmdline(pid)) for m in ("airflow ", "[celeryd:"))]
    assert leftovers == [], [" ".join(proc_cmdline(p)) for p in leftovers]
    assert services.workers_answering(services.worker_names(), timeout_s=2) == set()
    # While it ran: separate processes for each component, two Celery workers answering over the broker.
    expected = ["airflow api_server", "airflow scheduler", "airflow dag-processor", "airflow triggerer",
                *(f"[celeryd: {name}:MainProcess]" for name in services.worker_names())]
    assert [e for e in expected if not any(e in c for c in cmdlines)] == [], cmdlines
    assert answering == set(services.worker_names())

    report = json.loads((out / "report.json").read_text())
    assert report["final_stage"] == "cut_over", report["summary"]
    assert [s["stage"] for s in report["stages"]] == ["dual_writing", "warming", "verified", "approved",
                                                      "cut_over"]
    assert report["parity"]["verdict"] == "SUCCESSFUL" and report["parity"]["shards"] >= 2

    # -- which worker ran what: Airflow's task instances --------------------------------------------------
    executor = report["executor"]
    assert executor["kind"] == "celery"
    workers = {w["hostname"]: w for w in executor["workers"]}
    assert set(workers) == set(services.worker_names()), executor
    assert all(w["pid"] for w in workers.values())
    assert len(set(executor["parity_samples_workers"])) >= 2, executor
    shards = [t for w in workers.values() for t in w["tasks"] if t["task_id"] == "parity_samples"]
    assert sorted(t["map_index"] for t in shards) == list(range(report["parity"]["shards"]))
    # The demo's policy pins shard i to worker i % 2 (each worker's own queue): Airflow's records agree.
    names = services.worker_names()
    assert all(t["map_index"] % 2 == names.index(host) for host, w in workers.items() for t in w["tasks"]
               if t["task_id"] == "parity_samples"), executor
    ran = {t["task_id"] for w in workers.values() for t in w["tasks"]}
    assert {"validate", "snapshot", "deploy_dual_write", "parity", "latency", "gate", "approval", "cutover",
            "done"} <= ran, executor
    assert executor["not_run"] == ["rollback"]

    # -- the audit log is PostgreSQL, anchored in another PostgreSQL database ------------------------------
    audit_url = services.database_url("audit")
    assert audit_url.startswith("postgresql+psycopg://")
    store = AuditStore(audit_url, key=audit_key(), anchor=anchor_for(services.database_url("anchor"),
                                                                     create=False))
    events = store.events(group=GROUP, run_id=report["run_id"])
    assert len(events) == report["audit"]["events"] >= 9
    assert store.verify().ok
    assert not list(home.rglob("audit*.db")), "a SQLite audit file was written"

    # -- no worker kept state on its own disk: each has its own PROMSHIFT_HOME, the store is shared ---------
    homes = [home / "airflow" / "homes" / name.replace("@", "_") for name in services.worker_names()]
    assert all(h.is_dir() for h in homes) and len(set(homes)) == 2
    assert not [p for h in homes for p in h.rglob("*") if p.is_file()], "a worker wrote to its own PROMSHIFT_HOME"
    snapshots = list((shared_store(home) / "snapshots").rglob("*.yml"))
    assert len(snapshots) == 1, snapshots
    published = [p.name for p in (shared_store(home) / "reports").rglob("*") if p.is_file()]
    assert "report.json" in published, published  # the done task published the run's report there
