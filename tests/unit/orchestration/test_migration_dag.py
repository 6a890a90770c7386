# ruff: noqa: F811 - the operator fixtures (env, audit, dag, teams_env) are imported by name
"""The migration DAG of a target workspace, its group chosen in the trigger form; the waves and bake-watch lists.

The DAGs are the production factory's, built from a copy of the shipped catalog edited per test (groups sent to
other connections, their own approval timeouts and approvers). A task is rendered as Airflow renders it in a
run (``render_template_fields``: the form's group is chosen, its XComArg inputs are pulled), then executed against
a real SQLite audit log (``PROMSHIFT_AUDIT_URL``, the ``env`` fixture of ``test_operators``).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from airflow.sdk import DAG, Asset, AssetAlias
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import load_catalog
from promshift.core.stages import Stage
from promshift.orchestration.dag_factory import (
    BAKED_ALIAS,
    CUT_OVER_ALIAS,
    build_bake_watch_dag,
    build_migration_dag,
    build_waves_dag,
)
from promshift.orchestration.lifecycle_operators import BakeCheckOperator
from promshift.orchestration.migration_operators import CutoverOperator
from tests.fakes import FakeTI
from tests.unit.core.test_approvers import teams_env  # noqa: F401 - fixture
from tests.unit.orchestration.test_operators import (  # noqa: F401 - fixtures
    CATALOG,
    GROUP,
    PROFILE,
    RUN_ID,
    UP_TO_CUT_OVER,
    audit,
    dag,
    env,
    gate_inputs,
    hitl_event,
    make_context,
    seed,
)

TARGET = "promshift_target"
CUT_OVER = UP_TO_CUT_OVER


def catalog_copy(tmp_path: Path, edit: Callable[[dict[str, Any]], None] = lambda doc: None) -> Path:
    """The shipped catalog (and the dashboards it names) in ``tmp_path``, its YAML changed by ``edit``."""
    doc = yaml.safe_load(CATALOG.read_text())
    edit(doc)
    path = tmp_path / "catalog" / "metric_groups.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if not (path.parent / "dashboards").exists():
        shutil.copytree(CATALOG.parent / "dashboards", path.parent / "dashboards")
    return path


def entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in doc["groups"] if g["name"] == name)


def migration_dag(path: Path, target: str = TARGET) -> Any:
    groups = [g for g in load_catalog(path, profile=PROFILE).groups if g.target == target]
    return build_migration_dag(groups, target=target, catalog_path=path, profile=PROFILE)


def move(audit: AuditStore, group: str, history: list[Stage], run_id: str = RUN_ID) -> None:
    """Stage moves of ``group`` as its runs record them (each a checked transition)."""
    current = audit.stage_of(group)
    for stage in history:
        audit.append(group=group, run_id=run_id, kind=f"seed_{stage.value}", actor="test", at=datetime.now(UTC),
                     evidence={}, stage_from=current, stage_to=stage)
        current = stage


@dataclass
class RenderTI(FakeTI):
    """A task instance as Airflow hands it to a rendering task: XComArg inputs are pulled from it by task id."""

    xcoms: dict[tuple[str, str], Any] = field(default_factory=dict)

    def xcom_pull(self, *, task_ids: str, key: str, default: Any = None, map_indexes: Any = None) -> Any:
        return self.xcoms.get((task_ids, key), default)


def run_context(group: str, xcoms: dict[tuple[str, str], Any] | None = None) -> dict[str, Any]:
    """A run of the migration DAG whose form chose ``group``."""
    ctx = make_context(params={"group": group})
    ctx["ti"] = RenderTI(xcoms=dict(xcoms or {}))
    return ctx


# -- choose_group: the form's group, checked against the catalog when the task renders -----------------------------


def test_a_task_takes_the_forms_group_with_its_own_connections(env: Path, audit: AuditStore, tmp_path: Path) -> None:
    path = catalog_copy(tmp_path, lambda doc: entry(doc, "gpu-utilization").update(source="cluster_b"))
    validate = migration_dag(path).get_task("validate")
    # Parsed for every group of the target: none chosen yet.
    assert (validate.group_name, validate.dag_target) == ("", TARGET)
    validate.render_template_fields(run_context("gpu-utilization"))
    assert (validate.group_name, validate.source_conn_id, validate.target_conn_id) == (
        "gpu-utilization", "cluster_b", TARGET)
    assert validate.group.name == "gpu-utilization"


def test_an_unknown_group_is_refused_in_one_line_and_nothing_is_touched(env: Path, audit: AuditStore,
                                                                       tmp_path: Path) -> None:
    path = catalog_copy(tmp_path)
    validate = migration_dag(path).get_task("validate")
    with pytest.raises(AirflowFailException) as err:
        validate.render_template_fields(run_context("gpu-nope"))
    assert str(err.value) == (f"unknown metric group 'gpu-nope': the catalog {path} has gpu-utilization, gpu-memory, "
                              "gpu-power-thermal, gpu-clocks")
    with pytest.raises(AirflowFailException, match="^no metric group chosen \\(the form's 'group'\\): the catalog "):
        validate.render_template_fields(make_context())  # no group in the form (Airflow's form requires one)
    # A group removed from the catalog since the DAG file was parsed (the form still listed it).
    path.write_text(path.read_text().replace("name: gpu-clocks", "name: gpu-clocks-v2"))
    with pytest.raises(AirflowFailException, match="^unknown metric group 'gpu-clocks': .* gpu-clocks-v2$"):
        validate.render_template_fields(run_context("gpu-clocks"))
    assert validate.group_name == "" and audit.events() == []


def test_a_group_the_catalog_sends_to_another_workspace_is_refused_naming_its_dag(
        env: Path, audit: AuditStore, tmp_path: Path) -> None:
    path = catalog_copy(tmp_path)
    dag = migration_dag(path)  # gpu-memory in this target's form, as the DAG file was parsed
    assert "gpu-memory" in dag.params.get_param("group").schema["enum"]
    catalog_copy(tmp_path, lambda doc: entry(doc, "gpu-memory").update(target="amp_b"))  # then moved
    for task_id in ("validate", "approval", "cutover", "rollback"):
        task = dag.get_task(task_id)
        with pytest.raises(AirflowFailException) as err:
            task.render_template_fields(run_context("gpu-memory"))
        assert str(err.value) == ("group 'gpu-memory' migrates to connection 'amp_b', not this DAG's "
                                  "'promshift_target': trigger promshift__migrate__amp_b"), task_id
        assert task.group_name == "" and task.target_conn_id == TARGET, task_id
    assert audit.events() == []
    # The DAG of the group's new target takes it.
    validate = migration_dag(path, "amp_b").get_task("validate")
    validate.render_template_fields(run_context("gpu-memory"))
    assert (validate.group_name, validate.target_conn_id) == ("gpu-memory", "amp_b")


# -- the approval: the chosen group's timeout and approvers -------------------------------------------------------


def own_approvals(doc: dict[str, Any]) -> None:
    # The run's trigger user (sre-carol) is one of gpu-memory's approvers: never asked (four eyes).
    entry(doc, "gpu-memory").update(approval_timeout="45m", approvers=["sre-carol", "oncall-dave"])
    entry(doc, "gpu-utilization")["approval_timeout"] = "3h"


@pytest.mark.parametrize(("group", "timeout", "asked"), [
    ("gpu-memory", timedelta(minutes=45), ["oncall-dave"]),
    ("gpu-utilization", timedelta(hours=3), ["oncall-alice", "oncall-bob"]),
])
def test_the_approval_asks_the_chosen_groups_approvers_within_its_timeout(
        env: Path, audit: AuditStore, teams_env: dict[str, Any], tmp_path: Path, group: str, timeout: timedelta,
        asked: list[str]) -> None:
    path = catalog_copy(tmp_path, own_approvals)
    dag = migration_dag(path)
    approval = dag.get_task("approval")
    # Parsed for every group: nobody assigned yet, and the longest wait of the DAG's groups (the default 24 h).
    assert approval.approver_entries is None and approval.assigned_users == []
    assert approval.response_timeout == timedelta(hours=24)
    move(audit, group, [Stage.DUAL_WRITING, Stage.WARMING])
    inputs = gate_inputs("SUCCESSFUL")
    gate = dag.get_task("gate")
    gate.render_template_fields(run_context(group, {("parity", "return_value"): inputs["parity"],
                                                    ("latency", "return_value"): inputs["latency"]}))
    evidence = gate.execute(run_context(group))
    assert audit.stage_of(group) == Stage.VERIFIED

    ctx = run_context(group, {("gate", "return_value"): evidence})
    ctx["task_instance"] = SimpleNamespace(id="0190a0f0-0000-7000-8000-000000000003")
    approval.render_template_fields(ctx)
    assert approval.group_name == group and approval.gate_evidence == evidence
    with pytest.raises(TaskAwaitingInput) as parked:
        approval.execute(ctx)
    assert parked.value.timeout == approval.response_timeout == timeout
    assert teams_env["assigned_users"] == [{"id": a, "name": a} for a in asked]
    assert teams_env["subject"] == f"[SUCCESSFUL] Cut over metric group {group} to AMP?"
    [shown] = [e for e in audit.events(group=group) if e.kind == "evidence_shown"]
    assert shown.evidence_data["approvers"] == asked
    approval.execute_complete(ctx, hitl_event("Approve", {"id": asked[-1], "name": asked[-1]}))
    assert audit.stage_of(group) == Stage.APPROVED
    # The other groups were not touched.
    assert {e.group for e in audit.events()} == {group}


# -- the waves: WavesReadyOperator over the audit's stage moves ----------------------------------------------------


def test_the_waves_start_each_ready_dependent_in_its_targets_dag(env: Path, audit: AuditStore,
                                                                tmp_path: Path) -> None:
    path = catalog_copy(tmp_path, lambda doc: entry(doc, "gpu-power-thermal").update(target="amp_b"))
    waves = build_waves_dag(load_catalog(path, profile=PROFILE).groups, catalog_path=path, profile=PROFILE)
    ready = waves.get_task("ready")
    assert ready.execute(make_context()) == []  # nothing cut over
    move(audit, "gpu-utilization", CUT_OVER[:-1])
    assert ready.execute(make_context()) == []  # approved is not cut over
    move(audit, "gpu-utilization", [Stage.CUT_OVER])
    [start] = ready.execute(make_context())
    assert start["trigger_dag_id"] == "promshift__migrate__amp_b"  # gpu-power-thermal's own target's DAG
    assert start["conf"] == {"group": "gpu-power-thermal", "reason": "wave: gpu-utilization cut over"}
    assert re.fullmatch(r"wave__gpu-power-thermal__[0-9a-f]{16}", start["trigger_run_id"])
    # Every worker and retry names the same run (Airflow starts it once).
    move(audit, "gpu-utilization", [Stage.BAKING])
    assert ready.execute(make_context()) == [start]
    # The mapped start takes each entry as TriggerDagRunOperator's own arguments.
    trigger = waves.get_task("start").unmap(start)
    assert (trigger.trigger_dag_id, trigger.trigger_run_id, trigger.conf) == (
        "promshift__migrate__amp_b", start["trigger_run_id"], start["conf"])
    assert trigger.skip_when_already_exists is True and trigger.wait_for_completion is False
    # Started (its run holds it): not started again; gpu-clocks waits for it to cut over.
    move(audit, "gpu-power-thermal", [Stage.DUAL_WRITING], run_id=start["trigger_run_id"])
    assert ready.execute(make_context()) == []
    move(audit, "gpu-power-thermal", CUT_OVER[1:], run_id=start["trigger_run_id"])
    [then] = ready.execute(make_context())
    assert then["trigger_dag_id"] == "promshift__migrate__promshift_target"
    assert then["conf"] == {"group": "gpu-clocks", "reason": "wave: gpu-power-thermal cut over"}
    assert then["trigger_run_id"].startswith("wave__gpu-clocks__")


def test_a_dependent_rolled_back_is_not_started_again_until_its_dependency_cuts_over_again(
        env: Path, audit: AuditStore) -> None:
    waves = build_waves_dag(load_catalog(CATALOG, profile=PROFILE).groups, catalog_path=CATALOG, profile=PROFILE)
    ready = waves.get_task("ready")
    move(audit, "gpu-utilization", CUT_OVER)
    [first] = ready.execute(make_context())
    move(audit, "gpu-power-thermal", [Stage.DUAL_WRITING, Stage.ROLLED_BACK], run_id=first["trigger_run_id"])
    assert ready.execute(make_context()) == [first]  # the run id that exists: Airflow skips it
    move(audit, "gpu-utilization", [Stage.ROLLED_BACK, *CUT_OVER])
    [second] = ready.execute(make_context())
    assert second["conf"] == first["conf"] and second["trigger_run_id"] != first["trigger_run_id"]


# -- the bake watch: BakeWatchListOperator over the audit's stage moves --------------------------------------------


def test_the_bake_watch_lists_the_groups_cut_over_or_baking_with_their_connections(
        env: Path, audit: AuditStore, tmp_path: Path) -> None:
    path = catalog_copy(tmp_path, lambda doc: entry(doc, "gpu-memory").update(source="cluster_b", target="amp_b"))
    watch = build_bake_watch_dag(load_catalog(path, profile=PROFILE).groups, catalog_path=path, profile=PROFILE)
    watched = watch.get_task("watched")
    assert watched.execute(make_context()) == []
    move(audit, "gpu-memory", [*CUT_OVER, Stage.BAKING])
    move(audit, "gpu-utilization", CUT_OVER)
    move(audit, "gpu-power-thermal", [*CUT_OVER, Stage.BAKING, Stage.BAKED])
    move(audit, "gpu-clocks", [*CUT_OVER, Stage.BAKING, Stage.ROLLED_BACK_READS])
    move(audit, "gpu-retired", CUT_OVER)  # in the audit, no longer in the catalog
    entries = watched.execute(make_context())
    assert entries == [  # catalog order
        {"group_name": "gpu-utilization", "source_conn_id": "promshift_source", "target_conn_id": TARGET},
        {"group_name": "gpu-memory", "source_conn_id": "cluster_b", "target_conn_id": "amp_b"},
    ]
    # Each entry is one mapped check's arguments: the group and its own connections.
    checks = [watch.get_task("bake_check").unmap(e) for e in entries]
    assert [(c.group_name, c.source_conn_id, c.target_conn_id) for c in checks] == [
        ("gpu-utilization", "promshift_source", TARGET), ("gpu-memory", "cluster_b", "amp_b")]
    assert all(c.outlets == [AssetAlias(BAKED_ALIAS)] for c in checks)


# -- the assets: emitted through the task's alias, and only through it ----------------------------------------------


class RecordingOutletEvents:
    """``context["outlet_events"]`` as a task uses it: ``[alias].add(asset, extra=...)``; records each add."""

    def __init__(self) -> None:
        self.added: list[tuple[Any, str, dict[str, Any] | None]] = []

    def __getitem__(self, key: Any) -> Any:
        added = self.added

        class Accessor:
            def add(self, asset: Asset, extra: dict[str, Any] | None = None) -> None:
                added.append((key, asset.uri, extra))

        return Accessor()


OUTLETS = {
    "alias": lambda alias, uri: [AssetAlias(alias)],
    "none": lambda alias, uri: [],
    "the-asset-itself": lambda alias, uri: [Asset(uri)],  # Airflow's own outlet, emitted by Airflow: not added
}


def test_the_migration_dag_emits_through_the_aliases(dag: Any) -> None:
    assert dag.get_task("cutover").outlets == [AssetAlias(CUT_OVER_ALIAS)]
    assert all(not t.outlets for t in dag.tasks if t.task_id != "cutover")


@pytest.mark.parametrize("outlets", list(OUTLETS))
def test_the_cutover_emits_the_groups_cut_over_asset_only_through_its_alias(
        env: Path, audit: AuditStore, outlets: str) -> None:
    uri = f"promshift://group/{GROUP}/cut_over"
    with DAG("promshift__migrate__promshift_target", schedule=None):
        cutover = CutoverOperator(task_id="cutover", group_name=GROUP, catalog_path=str(CATALOG), profile=PROFILE,
                                  dag_target=TARGET, outlets=OUTLETS[outlets](CUT_OVER_ALIAS, uri))
    seed(audit, CUT_OVER[:-1])
    ctx = make_context()
    ctx["outlet_events"] = events = RecordingOutletEvents()
    assert cutover.execute(ctx)["routing"]["read_from"] == "target"
    assert audit.stage_of(GROUP) == Stage.CUT_OVER
    expected = [(AssetAlias(CUT_OVER_ALIAS), uri, {"group": GROUP, "run_id": RUN_ID})]
    assert events.added == (expected if outlets == "alias" else [])


@pytest.mark.parametrize("outlets", list(OUTLETS))
@pytest.mark.parametrize("outcome", ["baked", "baking"])
def test_the_bake_check_emits_the_groups_baked_asset_only_through_its_alias_after_a_bake(
        env: Path, audit: AuditStore, monkeypatch: pytest.MonkeyPatch, outlets: str, outcome: str) -> None:
    from promshift.steps.lifecycle import GroupLifecycle

    uri = f"promshift://group/{GROUP}/baked"
    monkeypatch.setattr(GroupLifecycle, "bake_check", lambda self, now: {"outcome": outcome, "clean_since": 5.0})
    with DAG("promshift__bake_watch", schedule=None):
        check = BakeCheckOperator(task_id="bake_check", group_name=GROUP, catalog_path=str(CATALOG), profile=PROFILE,
                                  outlets=OUTLETS[outlets](BAKED_ALIAS, uri))
    seed(audit, [*CUT_OVER, Stage.BAKING])
    ctx = make_context()
    ctx["outlet_events"] = events = RecordingOutletEvents()
    assert check.execute(ctx) == {"outcome": outcome, "clean_since": 5.0}
    expected = [(AssetAlias(BAKED_ALIAS), uri, {"group": GROUP, "clean_since": 5.0})]
    assert events.added == (expected if outlets == "alias" and outcome == "baked" else [])


# -- the DAG itself ----------------------------------------------------------------------------------------------


def test_one_dag_per_target_with_its_groups_in_the_form(tmp_path: Path) -> None:
    path = catalog_copy(tmp_path, lambda doc: entry(doc, "gpu-memory").update(target="amp_b"))
    groups = load_catalog(path, profile=PROFILE).groups
    dag = migration_dag(path)
    assert dag.dag_id == "promshift__migrate__promshift_target"
    assert dag.params.get_param("group").schema["enum"] == ["gpu-utilization", "gpu-power-thermal", "gpu-clocks"]
    assert set(dag.params) == {"group", "dry_run", "change_ticket", "warmup_override", "reason",
                               "accept_short_history"}
    # Runs of different groups side by side (validate's audit claim holds each group to one run).
    assert dag.max_active_runs == 16
    # One latency probe at a time on this workspace, across all the DAG's runs, with no pool to create.
    assert (dag.get_task("latency").max_active_tis_per_dag, dag.get_task("latency").pool) == (1, "default_pool")
    assert {t.dag_target for t in dag.tasks if hasattr(t, "dag_target")} == {TARGET}
    other = migration_dag(path, "amp_b")
    assert (other.dag_id, other.params.get_param("group").schema["enum"]) == ("promshift__migrate__amp_b",
                                                                             ["gpu-memory"])
    assert other.get_task("latency").max_active_tis_per_dag == 1
    with pytest.raises(ValueError, match="for groups of target 'promshift_target' only"):
        build_migration_dag(groups, target=TARGET, catalog_path=path, profile=PROFILE)
    many = [dataclasses.replace(groups[0], name=f"g-{i}") for i in range(20)]
    assert build_migration_dag(many, target=TARGET, catalog_path=path, profile=PROFILE).max_active_runs == 20


def test_build_group_dag_chooses_the_group_of_every_unmapped_task(dag: Any) -> None:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    assert dag.dag_id == "promshift__migrate__promshift_target"
    for task in dag.tasks:
        if isinstance(task, MappedOperator):
            continue  # parity_samples: unmapped per shard when it runs, and chooses then
        assert (task.group_name, task.dag_target) == (GROUP, TARGET), task.task_id
    # What Airflow does with a shard of the mapped task when it runs: the form's group is chosen as it renders.
    shard = dag.get_task("parity_samples").unmap({"shard": {"hosts": []}})
    assert shard.group_name == ""
    shard.choose_group({"params": {"group": GROUP}})
    assert shard.group_name == GROUP
