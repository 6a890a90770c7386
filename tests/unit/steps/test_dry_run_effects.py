"""Dry run as effects (issue 34 item 3): the wiring chooses a run's effects once; a dry run's record what each
step would have done and touch nothing that changes (no deployer, no snapshot, no move, no stage)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.deploy import InMemoryConfigDeployer, InMemorySnapshotStore
from promshift.core.events import EventKind
from promshift.core.run_params import RunParams
from promshift.core.stages import Stage
from promshift.orchestration.compose import compose_migration
from promshift.steps.effects import DryRunEffects, LiveEffects
from promshift.steps.migration import Backends

PACKAGE = REPO_ROOT / "include" / "promshift"


def test_dry_run_is_decided_in_three_places_only() -> None:
    """The wiring's choice of effects, validate's claim and the approval's skip; no step or operator else."""
    found = [f"{path.relative_to(PACKAGE)}" for folder in ("steps", "orchestration")
             for path in sorted((PACKAGE / folder).rglob("*.py"))
             for line in path.read_text().splitlines() if re.search(r"if .*dry_run", line)]
    assert sorted(found) == ["orchestration/approval_operators.py", "orchestration/wiring.py", "steps/migration.py"]


class Untouchable:
    """A deployer a dry run must never use."""

    kind = "memory"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a dry run used the deployer's {name}")


def migration(tmp_path: Path, deployer: Any, *, dry_run: bool) -> Any:
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get("gpu-memory")
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    never = PrometheusClient("http://127.0.0.1:0")  # port 0: any question fails at once
    return compose_migration(group, Backends(never, never, "", "http://127.0.0.1:0/api/v1/write"), audit=audit,
                             routing=RoutingStore(audit.url, engine=audit.engine), run_id="manual__effects",
                             snapshots_dir=tmp_path / "snapshots", deployer=deployer,
                             snapshots=InMemorySnapshotStore(), run_params=RunParams(dry_run=dry_run))


def test_a_dry_runs_effects_record_what_would_happen_and_change_nothing(tmp_path: Path) -> None:
    m = migration(tmp_path, Untouchable(), dry_run=True)
    effects, now, kept = DryRunEffects(m, "remote_write"), datetime.now(UTC), []
    snap = effects.snapshot(now, keep_moves=lambda: kept.append("moves"))
    deployed = effects.deploy(snap, now)
    assert deployed["dual_write_since"] is None and deployed["stage"] == "planned"
    assert effects.start_warmup(now, duration_s=60, timeout_s=300, deployed=deployed) is False  # nothing to follow
    assert effects.skipped("cut-over") == "dry run: no cut-over"
    assert effects.rollback_recorded("gate FAILED", now)["performed"] is False
    events = m.audit.events(group="gpu-memory")
    assert [e.evidence_data["step"] for e in events] == ["snapshot", "deploy_dual_write", "warm_up", "rollback"]
    assert {e.kind for e in events} == {EventKind.DRY_RUN_STEP} and all(e.stage_to is None for e in events)
    assert kept == [] and m.stage() == Stage.PLANNED and not (tmp_path / "snapshots").exists()


def test_a_real_runs_effects_do_it(tmp_path: Path) -> None:
    m = migration(tmp_path, InMemoryConfigDeployer("global: {}\n", "global: {}\nremote_write: []\n", kind="k8s-cr"),
                  dry_run=False)
    effects, now, kept = LiveEffects(m, "k8s-cr"), datetime.now(UTC), []
    snap = effects.snapshot(now, keep_moves=lambda: kept.append("moves"))
    assert kept == ["moves"] and snap["sha256"]
    assert effects.skipped("cut-over") is None and effects.rollback_recorded("why", now) is None
    assert [e.kind for e in m.audit.events(group="gpu-memory")] == [EventKind.SNAPSHOT_TAKEN]
