"""Faults 5, 6: the worker SIGKILLed at a side effect (the deploy's or the rollback's config write), then
retried. The step runs in a child process: ``python -m promshift.local.faults.kills child deploy|rollback
<json>``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import promshift
from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.core.render import remote_write_name, remote_write_names
from promshift.local.faults.env import (
    CATALOG,
    GROUP,
    Fault,
    FaultEnv,
    FaultResult,
    deploy,
    now,
    rollback,
    small_group,
)
from promshift.orchestration.compose import compose_migration
from promshift.steps.migration import Backends

# -- 5, 6: the worker SIGKILLed at a side effect ---------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    """``child deploy|rollback <json>``: run that step; print WRITTEN after the config write, then wait to die."""
    step, spec = argv[0], json.loads(argv[1])
    import promshift.adapters.deploy as deploy_module

    real = deploy_module.write_atomically

    def write_then_hang(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        print("WRITTEN", flush=True)
        time.sleep(120)  # SIGKILLed here: after the write, before the reload and the audit event

    deploy_module.write_atomically = write_then_hang
    stack = SimpleNamespace(source_url=spec["source_url"], target_url=spec["target_url"],
                            source_config_path=Path(spec["config_path"]),
                            target_remote_write_url=spec["remote_write_url"])
    backends = Backends(source=PrometheusClient(stack.source_url, timeout_s=30),
                        target=PrometheusClient(stack.target_url, timeout_s=30),
                        source_config_path=spec["config_path"], target_remote_write_url=spec["remote_write_url"])
    audit = AuditStore(spec["audit_url"])
    m = compose_migration(small_group(), backends, audit=audit, routing=RoutingStore(audit.url, engine=audit.engine),
                          snapshots_dir=spec["snapshots_dir"], run_id=spec["run_id"], catalog_dir=CATALOG.parent)
    if step == "deploy":
        m.deploy_dual_write(spec["snapshot"], now())
    else:
        m.rollback(spec["snapshot"], reason="fault: the worker is killed in the middle", now=now())
    print("FINISHED", flush=True)


def run_and_kill(env: FaultEnv, step: str, audit_url: str, run_id: str, snap: Mapping[str, Any]) -> dict[str, Any]:
    spec = {"source_url": env.stack.source_url, "target_url": env.stack.target_url,
            "config_path": str(env.stack.source_config_path), "remote_write_url": env.stack.target_remote_write_url,
            "audit_url": audit_url, "snapshots_dir": str(env.work / "snapshots"), "run_id": run_id,
            "snapshot": dict(snap)}
    child_env = dict(os.environ)
    package_root = str(Path(promshift.__file__).resolve().parent.parent)  # this very package, in the child
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, child_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "promshift.local.faults.kills", "child", step,
                             json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
    deadline = time.monotonic() + 60
    line = ""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.strip() in ("WRITTEN", "FINISHED"):
            break
    if line.strip() != "WRITTEN":
        proc.kill()
        raise RuntimeError(f"the child never reached its side effect: {line!r} {proc.stderr.read()[-2000:]}")
    os.kill(proc.pid, signal.SIGKILL)
    code = proc.wait(10)
    return {"child_pid": proc.pid, "exit": code, "killed_by": "SIGKILL" if code == -signal.SIGKILL else str(code)}


def fault_kill_deploy(env: FaultEnv) -> FaultResult:
    f = Fault(env, "worker SIGKILLed in deploy_dual_write, then retried", "deploy_dual_write")
    url = env.sqlite_url("f5")
    audit = env.audit(url, "f5")
    m = env.migration(audit, "manual__fault-5")
    m.validate(now())
    snap = m.snapshot(now())
    killed = run_and_kill(env, "deploy", url, m.run_id, snap)
    entry = remote_write_name(GROUP)
    after_kill = {"file_has_entry": entry in remote_write_names(env.config_bytes()),
                  "loaded": entry in env.loaded_entries(),
                  "events": [e.kind for e in audit.events()]}
    retried = m.deploy_dual_write(snap, now())  # Airflow's retry, in this process
    live_after_retry = entry in env.loaded_entries()
    rolled = rollback(m, snap)
    f.details.update(kill=killed, after_kill=after_kill, retry={"resumed": "resumed" in retried,
                                                               "live": live_after_retry}, rollback=rolled)
    return f.finish(outcome=f"killed after the config write (file has entry: {after_kill['file_has_entry']}, "
                            f"loaded: {after_kill['loaded']}, no event); retry verified, reloaded and recorded it "
                            f"once (resumed); rollback restored_identical={rolled['restored_identical']}",
                    notes="a child process ran deploy_dual_write and was SIGKILLed right after the atomic file "
                          "write, before the reload and the audit event; the retry ran in this process",
                    audit=audit, must_have=("dual_write_deployed", "rolled_back"),
                    extra_ok=killed["killed_by"] == "SIGKILL" and after_kill["file_has_entry"]
                    and "resumed" in retried and live_after_retry
                    and [e.kind for e in audit.events()].count("dual_write_deployed") == 1)


def fault_kill_rollback(env: FaultEnv) -> FaultResult:
    f = Fault(env, "worker SIGKILLed during rollback, then retried", "rollback")
    url = env.sqlite_url("f6")
    audit = env.audit(url, "f6")
    m = env.migration(audit, "manual__fault-6")
    snap, _ = deploy(m)
    killed = run_and_kill(env, "rollback", url, m.run_id, snap)
    entry = remote_write_name(GROUP)
    after_kill = {"file_is_snapshot": env.config_bytes() == f.original, "loaded": entry in env.loaded_entries(),
                  "events": [e.kind for e in audit.events()]}
    rolled = rollback(m, snap)  # the retry
    again = rollback(m, snap)  # and once more: nothing new is recorded
    f.details.update(kill=killed, after_kill=after_kill, rollback=rolled, second_retry=again.get("already_rolled_back"))
    return f.finish(outcome=f"killed after the snapshot bytes were written, before the reload (entry still loaded: "
                            f"{after_kill['loaded']}) and the event; retry reloaded and recorded rolled_back, "
                            f"restored_identical={rolled['restored_identical']}",
                    notes="a child process ran rollback and was SIGKILLed right after the restore's file write; "
                          "the retry (and a second one, which records nothing) ran in this process",
                    audit=audit, must_have=("rolled_back",),
                    extra_ok=killed["killed_by"] == "SIGKILL" and after_kill["loaded"]
                    and rolled["restored_identical"] is True and again.get("already_rolled_back") is True
                    and [e.kind for e in audit.events()].count("rolled_back") == 1)




if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    child_main(sys.argv[2:])
