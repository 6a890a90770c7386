"""The DagBag parses cleanly, one DAG per catalog group, each with tags, retries and the full task chain."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    # Connections are faked with env vars so nothing live is needed to parse.
    os.environ.setdefault("AIRFLOW_CONN_PROMSHIFT_SOURCE", '{"conn_type": "prometheus", "host": "http://127.0.0.1:1"}')
    os.environ.setdefault("AIRFLOW_CONN_PROMSHIFT_TARGET", '{"conn_type": "prometheus", "host": "http://127.0.0.1:2"}')
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}


def test_one_dag_per_catalog_group(dagbag) -> None:  # type: ignore[no-untyped-def]
    from promshift.adapters.settings import load_catalog

    expected = {g.dag_id for g in load_catalog().groups}
    assert len(expected) >= 3
    lifecycle = {"promshift__decommission", "promshift__recommission", "promshift__rollback"}  # one each, every group
    assert set(dagbag.dag_ids) == expected | lifecycle | {"promshift__bake_watch", "promshift__plan"}


def test_every_dag_has_tags_retries_and_docs(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert "promshift" in dag.tags, dag_id
        assert dag.default_args.get("retries", 0) >= 1, dag_id
        migration = dag_id.count("__") == 1 and dag_id not in (
            "promshift__bake_watch", "promshift__plan", "promshift__decommission", "promshift__recommission",
            "promshift__rollback")
        assert dag.doc_md and ("Migrate" in dag.doc_md or not migration), dag_id
        assert dag.max_active_runs == 1, dag_id


def test_task_chain_and_rollback_wiring(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags["promshift__gpu_utilization"]
    chain = ["validate", "snapshot", "deploy_dual_write", "warm_up", "parity_plan", "parity_samples", "parity",
             "latency", "gate", "approval",
             "cutover", "done"]
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    rollback = dag.get_task("rollback")
    assert rollback.trigger_rule == "one_failed"
    assert {"deploy_dual_write", "warm_up", "parity_plan", "parity_samples", "parity", "gate", "approval",
            "cutover"} <= rollback.upstream_task_ids
    assert dag.get_task("parity").trigger_rule == "none_failed"
    approval = dag.get_task("approval")
    # The gate never retries; the approval retries once, only for Airflow's own failures (a Reject,
    # timeout or four-eyes refusal raises AirflowFailException, which is never retried).
    assert approval.retries == 1 and dag.get_task("gate").retries == 0
    assert {u["id"] for u in approval.assigned_users} == {"oncall-alice", "oncall-bob"}


@pytest.mark.integration  # a fresh interpreter
def test_parse_is_cheap() -> None:
    """The DAG file's own cost, in a fresh interpreter that has imported Airflow as the DAG processor has.

    Airflow's import (~18 s on this 2-core machine under load) is not the DAG file's cost and is
    excluded; what is timed is the catalog parse, promshift's imports and building every DAG,
    which must stay far under Airflow's 30 s DAG import timeout (bench/catalog measures scale).
    """
    code = ("import time, runpy; import airflow.sdk, airflow.providers.standard.operators.hitl; "
            "t=time.perf_counter(); runpy.run_path('dags/promshift_groups.py'); print(time.perf_counter()-t)")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    parse_s = float(out.stdout.strip().splitlines()[-1])
    print(f"DAG file parse {parse_s:.2f}s after Airflow's own import (process {time.perf_counter() - started:.2f}s)")
    assert parse_s < 10


# --------------------------------------------------------------------------- a bad catalog


def _dagbag_for(catalog: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PROMSHIFT_CATALOG", str(catalog))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_one_bad_group_keeps_the_other_dags_and_shows_its_problems(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from airflow.sdk.exceptions import AirflowFailException

    text = (REPO / "catalog" / "metric_groups.yaml").read_text()
    # gpu-memory: a 10-million-year approval timeout and a lone approver; gpu-clocks: a C++-only regex.
    text = text.replace("    wave: 1\n    metrics:\n      - DCGM_FI_DEV_FB_FREE",
                        "    wave: 1\n    approval_timeout: 10000000y\n    metrics:\n      - DCGM_FI_DEV_FB_FREE", 1)
    text = text.replace("metric_regex: DCGM_FI_DEV_(SM|MEM)_CLOCK", r"metric_regex: DCGM_FI_DEV_(SM|MEM)_CLOCK\C*")
    assert text.count("10000000y") == 1 and text.count(r"\C*") == 1
    catalog = tmp_path / "metric_groups.yaml"
    catalog.write_text(text)
    # Whatever Airflow's logging setup does with the records, the DAG file must log at error level.
    errors_logged: list[str] = []
    original_error = logging.Logger.error

    def record_error(self: logging.Logger, msg: object, *args: object, **kwargs: object) -> None:
        errors_logged.append(str(msg) % args if args else str(msg))
        original_error(self, msg, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(logging.Logger, "error", record_error)
    dagbag = _dagbag_for(catalog, monkeypatch)
    assert dagbag.import_errors == {}
    good = {"promshift__gpu_utilization", "promshift__gpu_power_thermal"}
    steps = ("decommission", "recommission", "rollback")
    assert set(dagbag.dag_ids) == good | {f"promshift__{s}" for s in steps} | {
        "promshift__catalog_errors", "promshift__bake_watch", "promshift__plan"}
    # The bake watch watches the good groups only.
    watched = {t.task_id for t in dagbag.dags["promshift__bake_watch"].tasks if t.task_id.startswith("bake_check__")}
    assert watched == {"bake_check__gpu_utilization", "bake_check__gpu_power_thermal"}
    errors = dagbag.dags["promshift__catalog_errors"]
    assert "promshift" in errors.tags and errors.max_active_runs == 1
    assert "group 'gpu-memory': field 'approval_timeout': must be at most 10y" in errors.doc_md
    assert r"group 'gpu-clocks': field 'metric_regex': regex 'DCGM_FI_DEV_(SM|MEM)_CLOCK\\C*'" in errors.doc_md
    assert "Without a DAG until this is fixed: group 'gpu-memory', group 'gpu-clocks'" in errors.doc_md
    assert any("field 'approval_timeout'" in line for line in errors_logged)  # logged loudly
    assert any("groups without a DAG: group 'gpu-memory', group 'gpu-clocks'" in line for line in errors_logged)
    (task,) = errors.tasks
    with pytest.raises(AirflowFailException, match="2 problem") as excinfo:
        task.execute({})
    assert "approval_timeout" in str(excinfo.value) and r"\C" in str(excinfo.value)


@pytest.mark.parametrize("kind", ["missing", "directory", "not-utf8", "yaml-syntax"])
def test_an_unreadable_catalog_gives_one_errors_dag_with_one_line(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = tmp_path / "catalog.yaml"
    if kind == "directory":
        catalog.mkdir()
    elif kind == "not-utf8":
        catalog.write_bytes(b"version: 1\ngroups: [\xff\xfe]\n")
    elif kind == "yaml-syntax":
        catalog.write_text("version: 1\ngroups: [\n")
    dagbag = _dagbag_for(catalog, monkeypatch)
    assert dagbag.import_errors == {}
    # The plan DAG reads no catalog (it drafts one), so it stays.
    assert sorted(dagbag.dag_ids) == ["promshift__catalog_errors", "promshift__plan"]
    doc = dagbag.dags["promshift__catalog_errors"].doc_md
    listing = doc.split("```\n")[1].rstrip("\n")
    assert "\n" not in listing and "Traceback" not in doc
    expected = {"missing": "No such file or directory", "directory": "it is a directory",
                "not-utf8": "not UTF-8 text", "yaml-syntax": "invalid YAML"}[kind]
    assert expected in listing and "Without a DAG until this is fixed: every group" in doc


# --------------------------------------------------------------------------- the trigger form and the waves


def test_every_group_dag_has_the_trigger_form(dagbag) -> None:  # type: ignore[no-untyped-def]
    from promshift.adapters.settings import load_catalog
    from promshift.core.run_params import WARMUP_OVERRIDE_PATTERN

    for dag_id in (g.dag_id for g in load_catalog().groups):
        dag = dagbag.dags[dag_id]
        params = {name: dag.params.get_param(name) for name in dag.params}
        assert set(params) == {"dry_run", "change_ticket", "warmup_override", "reason"}, dag_id
        assert (params["dry_run"].value, params["dry_run"].schema["type"]) == (False, "boolean")
        assert params["change_ticket"].schema["type"] == "string" and params["change_ticket"].value == ""
        assert params["reason"].schema["type"] == "string"
        assert params["warmup_override"].schema["pattern"] == WARMUP_OVERRIDE_PATTERN
        # The approver's form is the comment alone, never the trigger form.
        assert set(dag.get_task("approval").serialized_params) == {"comment"}, dag_id


def test_the_warmup_override_schema_accepts_durations_only(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamValidationError

    param = dagbag.dags["promshift__gpu_memory"].params.get_param("warmup_override")
    for good in ("", "10m", "1h30m", "90s"):
        assert param.resolve(value=good) == good
    for bad in ("ten minutes", "10", "-5m", "1.5h"):
        with pytest.raises(ParamValidationError):
            param.resolve(value=bad)
    with pytest.raises(ParamValidationError):
        dagbag.dags["promshift__gpu_memory"].params.get_param("dry_run").resolve(value="yes")


def test_dependents_are_scheduled_on_their_dependencies_cut_over_assets(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import Asset

    from promshift.adapters.settings import load_catalog

    for group in load_catalog().groups:
        dag = dagbag.dags[group.dag_id]
        assert dag.get_task("cutover").outlets == [Asset(f"promshift://group/{group.name}/cut_over")], group.name
        if group.depends_on:
            assert type(dag.timetable).__name__ == "AssetTriggeredTimetable", group.name
            wanted = {f"promshift://group/{dependency}/cut_over" for dependency in group.depends_on}
            condition = dag.timetable.asset_condition  # type: ignore[attr-defined]
            assert type(condition).__name__ == "AssetAll", group.name  # every dependency, not any of them
            assert {a.uri for a in condition.objects} == wanted, group.name
        else:
            assert type(dag.timetable).__name__ == "NullTimetable", group.name
    # The shipped catalog's waves: utilisation and memory start by hand; power after utilisation; clocks after power.
    power = dagbag.dags["promshift__gpu_power_thermal"].timetable.asset_condition
    assert [a.uri for a in power.objects] == ["promshift://group/gpu-utilization/cut_over"]


def test_the_bake_watch_checks_every_group_on_the_catalogs_interval(dagbag) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from airflow.sdk import Asset

    from promshift.adapters.settings import load_catalog

    groups = load_catalog().groups
    watch = dagbag.dags["promshift__bake_watch"]
    # A timedelta schedule (Airflow's config picks the delta timetable's flavour).
    assert type(watch.timetable).__name__ in ("DeltaTriggerTimetable", "DeltaDataIntervalTimetable")
    assert watch.timetable.delta == timedelta(minutes=15)  # type: ignore[attr-defined]  # defaults.bake.interval
    assert watch.max_active_runs == 1 and not watch.catchup
    for group in groups:
        key = group.name.replace("-", "_")
        check, emit = watch.get_task(f"bake_check__{key}"), watch.get_task(f"baked__{key}")
        assert check.group_name == group.name and emit.upstream_task_ids == {check.task_id}
        assert emit.outlets == [Asset(f"promshift://group/{group.name}/baked")]
        assert not check.outlets  # a check that did not bake the group emits nothing
    assert len(watch.tasks) == 2 * len(groups)


def test_one_decommission_recommission_and_rollback_dag_for_every_group(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamValidationError

    from promshift.adapters.settings import load_catalog

    names = [group.name for group in load_catalog().groups]
    by_hand = {d for d in dagbag.dags if d.endswith(("__decommission", "__recommission", "__rollback"))}
    assert by_hand == {"promshift__decommission", "promshift__recommission", "promshift__rollback"}
    decommission = dagbag.dags["promshift__decommission"]
    assert decommission.timetable.__class__.__name__ == "NullTimetable"  # by hand only
    assert decommission.get_task("approval").downstream_task_ids == {"decommission"}
    assert decommission.get_task("prepare").downstream_task_ids == {"approval"}
    approval = decommission.get_task("approval")
    assert type(approval).__name__ == "DecommissionApprovalOperator"
    assert approval.assigned_users == []  # the chosen group's approvers, resolved when the question is asked
    assert set(approval.serialized_params) == {"comment"}  # the form's group is not the approver's to change
    recommission = dagbag.dags["promshift__recommission"]
    assert [t.task_id for t in recommission.tasks] == ["recommission"]
    assert set(recommission.params) == {"group", "reason"}
    rollback = dagbag.dags["promshift__rollback"]
    assert [t.task_id for t in rollback.tasks] == ["rollback"] and set(rollback.params) == {"group", "reason"}
    for dag in (decommission, recommission, rollback):
        schema = dag.params.get_param("group").schema
        assert schema["enum"] == names and schema["type"] == "string", dag.dag_id
        with pytest.raises(ParamValidationError):  # Airflow refuses an unknown group at trigger time
            dag.params.get_param("group").resolve("no-such-group")


def test_every_task_of_every_dag_has_an_execution_timeout_with_a_stated_reason(dagbag) -> None:  # type: ignore[no-untyped-def]
    """A hung worker ends: every task has a backstop, each from the reasoned table (or the plan DAG's own)."""
    from datetime import timedelta

    from promshift.orchestration.dag_factory import EXECUTION_TIMEOUTS, build_catalog_errors_dag

    source = (REPO / "include" / "promshift" / "orchestration" / "dag_factory.py").read_text()
    seen = set()
    errors = build_catalog_errors_dag(problems=["x"], catalog_path="c.yaml")  # only with a bad catalog
    for dag_id, dag in {**dagbag.dags, errors.dag_id: errors}.items():
        for task in dag.tasks:
            timeout = task.execution_timeout if not hasattr(task, "partial_kwargs") else \
                task.partial_kwargs.get("execution_timeout")
            assert isinstance(timeout, timedelta) and timeout > timedelta(0), (dag_id, task.task_id)
            kind = task.task_id.split("__", 1)[0]
            if dag_id != "promshift__plan":
                assert timeout == EXECUTION_TIMEOUTS[kind], (dag_id, task.task_id)
                seen.add(kind)
    # Every value in the table is used, and each has its reason: a comment line right above it.
    assert seen == set(EXECUTION_TIMEOUTS)
    lines = source.splitlines()
    for kind in EXECUTION_TIMEOUTS:
        [at] = [i for i, line in enumerate(lines) if line.strip().startswith(f'"{kind}": timedelta(')]
        assert lines[at - 1].strip().startswith("#") and len(lines[at - 1].strip()) > 20, kind


def test_every_latency_probe_runs_in_its_target_workspaces_pool(dagbag) -> None:  # type: ignore[no-untyped-def]
    from promshift.adapters.settings import load_catalog
    from promshift.orchestration.dag_factory import latency_pool

    for group in load_catalog().groups:
        dag = dagbag.dags[group.dag_id]
        latency = dag.get_task("latency")
        assert latency.pool == latency_pool(latency.target_conn_id) == f"promshift_latency__{latency.target_conn_id}"
        # Only the probe is bounded: the other steps keep Airflow's default pool.
        assert {t.pool for t in dag.tasks if t.task_id != "latency" and not hasattr(t, "partial_kwargs")} == {
            "default_pool"}
