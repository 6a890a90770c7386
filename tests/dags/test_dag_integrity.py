"""The DagBag parses cleanly: one migration DAG per target connection (the group chosen in its form), the waves,
the bake watch and the by-hand DAGs, each with tags, retries, docs and the full task chain."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MIGRATION_CHAIN = ["validate", "snapshot", "deploy_dual_write", "warm_up", "parity_plan", "parity_samples", "parity",
                   "latency", "gate", "approval", "cutover", "done"]
BY_HAND = {"promshift__decommission", "promshift__recommission", "promshift__rollback"}
# promshift__retire and promshift__unretire: a whole source, chosen in the form (docs/lifecycle.md)
RETIRE = {"promshift__retire", "promshift__unretire"}
FIXED = BY_HAND | RETIRE | {"promshift__bake_watch", "promshift__plan", "promshift__waves"}
# The multi-target catalog below: each group's target connection.
TARGETS = {"gpu-utilization": "promshift_target", "gpu-memory": "amp_c", "gpu-power-thermal": "amp_b",
           "gpu-clocks": "amp_b"}


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    # Connections are faked with env vars so nothing live is needed to parse.
    os.environ.setdefault("AIRFLOW_CONN_PROMSHIFT_SOURCE", '{"conn_type": "prometheus", "host": "http://127.0.0.1:1"}')
    os.environ.setdefault("AIRFLOW_CONN_PROMSHIFT_TARGET", '{"conn_type": "prometheus", "host": "http://127.0.0.1:2"}')
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def multi_target_catalog(folder: Path, edit: Any = None) -> Path:
    """The shipped catalog with wave 2 moved to the pair cluster_b -> amp_b and gpu-memory to amp_c (three target
    connections: three migration DAGs); gpu-clocks asks within 2h (its DAG-mate gpu-power-thermal within 24h).
    ``edit``: changes the document further."""
    doc = yaml.safe_load((REPO / "catalog" / "metric_groups.yaml").read_text())
    doc["waves"] = {2: {"source": "cluster_b", "target": "amp_b"}}
    groups = {g["name"]: g for g in doc["groups"]}
    groups["gpu-memory"]["target"] = "amp_c"
    groups["gpu-clocks"]["approval_timeout"] = "2h"
    if edit is not None:
        edit(groups)
    path = folder / "metric_groups.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copytree(REPO / "catalog" / "dashboards", folder / "dashboards")
    return path


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The DagBag of the multi-target catalog (its tasks keep the catalog's path; the environment is restored)."""
    catalog = multi_target_catalog(tmp_path_factory.mktemp("multi"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROMSHIFT_CATALOG", str(catalog))
        mp.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(REPO / "dags"))
    bag.catalog_path = catalog  # type: ignore[attr-defined]
    return bag


def _groups(bag: Any) -> list[Any]:
    from promshift.adapters.settings import load_catalog

    return list(load_catalog(getattr(bag, "catalog_path", None)).groups)


def _migration_dags(bag: Any) -> dict[str, Any]:
    return {dag_id: dag for dag_id, dag in bag.dags.items() if dag_id.startswith("promshift__migrate__")}



def mapped_over(dag: Any, lister_id: str, lister_class: str, mapped_id: str, mapped_class: str) -> Any:
    """``mapped_id`` is ``mapped_class`` mapped (``expand_kwargs``) over the list ``lister_id`` returns, its only
    upstream; ``lister_id`` (a ``lister_class``) has none. Returns the mapped task."""
    lister, mapped = dag.get_task(lister_id), dag.get_task(mapped_id)
    assert type(lister).__name__ == lister_class and lister.upstream_task_ids == set()
    assert type(mapped).__name__ == "MappedOperator" and mapped.operator_class.__name__ == mapped_class
    assert mapped.upstream_task_ids == {lister_id}
    assert type(mapped.expand_input).__name__ == "ListOfDictsExpandInput"  # expand_kwargs(lister.output)
    assert mapped.expand_input.value.operator is lister
    return mapped

def test_no_import_errors(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {} and multi.import_errors == {}


def test_one_migration_dag_per_target_connection(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    from promshift.core.catalog import migration_dag_id

    # The shipped catalog sends every group to one workspace: one migration DAG, its form listing all four.
    names = [g.name for g in _groups(dagbag)]
    assert len(names) >= 3 and {g.dag_id for g in _groups(dagbag)} == {"promshift__migrate__promshift_target"}
    assert set(dagbag.dag_ids) == FIXED | {"promshift__migrate__promshift_target"}
    shipped = dagbag.dags["promshift__migrate__promshift_target"].params.get_param("group").schema
    assert shipped["enum"] == names
    # Three target connections: three migration DAGs, each form listing its own target's groups in catalog order.
    assert set(multi.dag_ids) == FIXED | {migration_dag_id(t) for t in set(TARGETS.values())}
    for target in set(TARGETS.values()):
        dag = multi.dags[migration_dag_id(target)]
        assert dag.params.get_param("group").schema["enum"] == [g for g in names if TARGETS[g] == target], target
        assert {t.task_id for t in dag.tasks} == {*MIGRATION_CHAIN, "rollback"}, target
        assert f"target:{target}" in dag.tags
    assert {g.name: g.dag_id for g in _groups(multi)} == {n: migration_dag_id(t) for n, t in TARGETS.items()}


def test_every_dag_has_tags_retries_and_docs(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    from promshift.orchestration.dag_factory import MIN_ACTIVE_MIGRATIONS

    for bag in (dagbag, multi):
        migrations = _migration_dags(bag)
        assert migrations
        for dag_id, dag in bag.dags.items():
            assert "promshift" in dag.tags, dag_id
            assert dag.default_args.get("retries", 0) >= 1, dag_id
            assert dag.doc_md and ("Migrate" in dag.doc_md or dag_id not in migrations), dag_id
            if dag_id in migrations:
                # Runs of different groups side by side (validate's audit claim holds one run per group).
                groups = dag.params.get_param("group").schema["enum"]
                assert dag.max_active_runs == max(MIN_ACTIVE_MIGRATIONS, len(groups)), dag_id
                assert "migration" in dag.tags and all(f"`{g}`" in dag.doc_md for g in groups), dag_id
            else:
                assert dag.max_active_runs == 1, dag_id


def _chosen(task: Any, group: str) -> Any:
    """A copy of ``task`` with ``group`` chosen in the form, as a run's rendering does."""
    chosen = copy.copy(task)
    chosen.choose_group({"params": {"group": group}})
    return chosen


def test_task_chain_and_rollback_wiring(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    for dag in (*_migration_dags(dagbag).values(), *_migration_dags(multi).values()):
        assert {t.task_id for t in dag.tasks} == {*MIGRATION_CHAIN, "rollback"}, dag.dag_id
        for upstream, downstream in zip(MIGRATION_CHAIN, MIGRATION_CHAIN[1:], strict=False):
            assert downstream in dag.get_task(upstream).downstream_task_ids, (dag.dag_id, upstream)
        assert dag.get_task("validate").upstream_task_ids == set(), dag.dag_id
        rollback = dag.get_task("rollback")
        assert rollback.trigger_rule == "one_failed"
        assert rollback.upstream_task_ids == {"deploy_dual_write", "warm_up", "parity_plan", "parity_samples",
                                              "parity", "latency", "gate", "approval", "cutover"}, dag.dag_id
        assert dag.get_task("parity").trigger_rule == "none_failed"
        assert type(dag.get_task("parity_samples")).__name__ == "MappedOperator"
        approval = dag.get_task("approval")
        # The gate never retries; the approval retries once, only for Airflow's own failures (a Reject,
        # timeout or four-eyes refusal raises AirflowFailException, which is never retried).
        assert approval.retries == 1 and dag.get_task("gate").retries == 0
        # Nobody is assigned when the DAG is built: the chosen group's approvers are, when the question is asked.
        assert approval.assigned_users == [] and approval.approver_entries is None
    dag = dagbag.dags["promshift__migrate__promshift_target"]
    assert _chosen(dag.get_task("approval"), "gpu-utilization").group.approvers == ("team:gpu-oncall",)
    assert _chosen(dag.get_task("approval"), "gpu-memory").group.approvers == ("team:gpu-oncall",)


def test_the_approval_waits_for_the_chosen_groups_own_timeout(multi) -> None:  # type: ignore[no-untyped-def]
    approval = multi.dags["promshift__migrate__amp_b"].get_task("approval")
    assert approval.response_timeout == timedelta(hours=24)  # the longest of its groups' (gpu-power-thermal's)
    for group, wait in (("gpu-clocks", timedelta(hours=2)), ("gpu-power-thermal", timedelta(hours=24))):
        chosen = _chosen(approval, group)
        chosen.ask_within_group_timeout()
        assert chosen.response_timeout == wait, group


def test_a_migration_dag_refuses_a_group_of_another_target_or_none(multi) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    dag = multi.dags["promshift__migrate__amp_b"]
    for task_id in ("validate", "cutover", "rollback", "approval"):
        task = dag.get_task(task_id)
        assert task.group_name == "" and task.dag_target == "amp_b", task_id
        with pytest.raises(AirflowFailException, match="migrates to connection 'amp_c', not this DAG's 'amp_b': "
                                                       "trigger promshift__migrate__amp_c"):
            _chosen(task, "gpu-memory")
        with pytest.raises(AirflowFailException, match="unknown metric group 'gpu-nothing'"):
            _chosen(task, "gpu-nothing")
        assert _chosen(task, "gpu-clocks").group_name == "gpu-clocks"
        assert task.group_name == "", task_id  # the DAG's own task is never changed by a run's choice


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
    """A bad group is left out of its target's migration DAG form (and the by-hand forms, the waves): the good
    groups of the same target keep that DAG; the problems are listed in ``promshift__catalog_errors``."""
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
    good = ["gpu-utilization", "gpu-power-thermal"]
    assert set(dagbag.dag_ids) == FIXED | {"promshift__migrate__promshift_target", "promshift__catalog_errors"}
    # The good groups keep their target's DAG; the bad ones are not in any form.
    migration = dagbag.dags["promshift__migrate__promshift_target"]
    assert migration.params.get_param("group").schema["enum"] == good
    for dag_id in BY_HAND:
        assert dagbag.dags[dag_id].params.get_param("group").schema["enum"] == good, dag_id
    # The waves wait on the good groups' dependencies only (gpu-clocks, which waited on gpu-power-thermal, is out).
    waves = dagbag.dags["promshift__waves"].timetable.asset_condition
    assert [a.uri for a in waves.objects] == ["promshift://group/gpu-utilization/cut_over"]
    # The bake watch lists the good groups only.
    watch_doc = dagbag.dags["promshift__bake_watch"].doc_md
    assert all(f"`{g}`" in watch_doc for g in good) and "gpu-memory" not in watch_doc and "gpu-clocks" not in watch_doc
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


def test_a_bad_group_alone_on_its_target_takes_only_that_targets_dag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With gpu-memory the only group of connection amp_c, its problem leaves amp_c without a migration DAG; the
    other targets keep theirs, with their full forms."""

    def break_memory(groups: dict[str, Any]) -> None:
        groups["gpu-memory"]["approval_timeout"] = "10000000y"

    dagbag = _dagbag_for(multi_target_catalog(tmp_path, break_memory), monkeypatch)
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == FIXED | {"promshift__catalog_errors", "promshift__migrate__promshift_target",
                                           "promshift__migrate__amp_b"}
    assert dagbag.dags["promshift__migrate__amp_b"].params.get_param("group").schema["enum"] == [
        "gpu-power-thermal", "gpu-clocks"]
    assert dagbag.dags["promshift__migrate__promshift_target"].params.get_param("group").schema["enum"] == [
        "gpu-utilization"]
    doc = dagbag.dags["promshift__catalog_errors"].doc_md
    assert "group 'gpu-memory': field 'approval_timeout'" in doc
    assert "Without a DAG until this is fixed: group 'gpu-memory'." in doc


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


def test_production_without_promshift_catalog_gives_the_errors_dag_with_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No guess at a catalog beside site-packages: the refusal is the errors DAG's one line, not an import error."""
    monkeypatch.delenv("PROMSHIFT_CATALOG", raising=False)
    monkeypatch.setenv("PROMSHIFT_ENV", "production")
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    dagbag = DagBag(dag_folder=str(REPO / "dags"))
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == ["promshift__catalog_errors", "promshift__plan"]
    listing = dagbag.dags["promshift__catalog_errors"].doc_md.split("```\n")[1].rstrip("\n")
    assert listing == ("PROMSHIFT_ENV=production: no catalog (PROMSHIFT_CATALOG is not set; the lab's default beside "
                       "the code is not used outside the lab)")


# --------------------------------------------------------------------------- the trigger form and the waves


def test_every_migration_dag_has_the_trigger_form(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamValidationError

    from promshift.core.run_params import WARMUP_OVERRIDE_PATTERN

    for bag in (dagbag, multi):
        names = [g.name for g in _groups(bag)]
        for dag_id, dag in _migration_dags(bag).items():
            target = dag_id.removeprefix("promshift__migrate__")
            params = {name: dag.params.get_param(name) for name in dag.params}
            assert set(params) == {"group", "dry_run", "change_ticket", "warmup_override", "reason",
                                   "accept_short_history"}, dag_id
            assert params["accept_short_history"].value is False
            assert params["accept_short_history"].schema["type"] == "boolean"
            # The group: one of this target's groups, in catalog order; Airflow refuses any other at trigger time.
            schema = params["group"].schema
            assert schema["type"] == "string", dag_id
            assert schema["enum"] == [g.name for g in _groups(bag) if g.target == target] != [], dag_id
            for other in (n for n in names if n not in schema["enum"]):
                with pytest.raises(ParamValidationError):
                    params["group"].resolve(value=other)
            with pytest.raises(ParamValidationError):
                params["group"].resolve(value="no-such-group")
            assert params["group"].resolve(value=schema["enum"][-1]) == schema["enum"][-1]
            assert (params["dry_run"].value, params["dry_run"].schema["type"]) == (False, "boolean")
            assert params["change_ticket"].schema["type"] == "string" and params["change_ticket"].value == ""
            assert params["reason"].schema["type"] == "string"
            assert params["warmup_override"].schema["pattern"] == WARMUP_OVERRIDE_PATTERN
            # The approver's form is the comment alone, never the trigger form.
            assert set(dag.get_task("approval").serialized_params) == {"comment"}, dag_id
    # The multi-target catalog really has a DAG whose form leaves groups out.
    assert multi.dags["promshift__migrate__amp_b"].params.get_param("group").schema["enum"] == [
        "gpu-power-thermal", "gpu-clocks"]


def test_the_warmup_override_schema_accepts_durations_only(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamValidationError

    dag = dagbag.dags["promshift__migrate__promshift_target"]
    param = dag.params.get_param("warmup_override")
    for good in ("", "10m", "1h30m", "90s"):
        assert param.resolve(value=good) == good
    for bad in ("ten minutes", "10", "-5m", "1.5h"):
        with pytest.raises(ParamValidationError):
            param.resolve(value=bad)
    with pytest.raises(ParamValidationError):
        dag.params.get_param("dry_run").resolve(value="yes")


def test_the_waves_start_dependents_on_their_dependencies_cut_over_assets(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import AssetAlias

    for bag in (dagbag, multi):
        groups = _groups(bag)
        for dag_id, dag in _migration_dags(bag).items():
            # Started by hand or by the waves, never by a schedule; the cutover emits the chosen group's asset.
            assert type(dag.timetable).__name__ == "NullTimetable", dag_id
            assert dag.get_task("cutover").outlets == [AssetAlias("promshift-cut-over")], dag_id
        waves = bag.dags["promshift__waves"]
        assert type(waves.timetable).__name__ == "AssetTriggeredTimetable"
        condition = waves.timetable.asset_condition  # type: ignore[attr-defined]
        # Any cut-over of a group some group depends on (ready then checks that all of a dependent's have).
        assert type(condition).__name__ == "AssetAny"
        depended_on = {dep for g in groups for dep in g.depends_on}
        assert {a.uri for a in condition.objects} == {f"promshift://group/{d}/cut_over" for d in depended_on}
        assert len(condition.objects) == len(depended_on)
        assert {t.task_id for t in waves.tasks} == {"ready", "start"}
        start = mapped_over(waves, "ready", "WavesReadyOperator", "start", "TriggerDagRunOperator")
        # A start whose run id exists already (another worker's, an earlier try's) is skipped, not failed.
        assert start.partial_kwargs["skip_when_already_exists"] is True
        assert start.partial_kwargs["wait_for_completion"] is False
    # The shipped catalog: power after utilisation, clocks after power: two assets, no group depends on memory.
    shipped = dagbag.dags["promshift__waves"].timetable.asset_condition
    assert sorted(a.uri for a in shipped.objects) == ["promshift://group/gpu-power-thermal/cut_over",
                                                      "promshift://group/gpu-utilization/cut_over"]


def test_without_dependencies_the_waves_dag_has_no_schedule(tmp_path: Path) -> None:
    from promshift.core.catalog import parse_catalog
    from promshift.orchestration.dag_factory import build_waves_dag

    def independent(groups: dict[str, Any]) -> None:
        for group in groups.values():
            group.pop("depends_on", None)

    path = multi_target_catalog(tmp_path, independent)
    waves = build_waves_dag(parse_catalog(path.read_text()).groups, catalog_path=path)
    assert type(waves.timetable).__name__ == "NullTimetable"
    assert "No group of the catalog depends on another." in waves.doc_md


def test_the_bake_watch_checks_every_group_on_the_catalogs_interval(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import AssetAlias

    for bag in (dagbag, multi):
        watch = bag.dags["promshift__bake_watch"]
        # A timedelta schedule (Airflow's config picks the delta timetable's flavour).
        assert type(watch.timetable).__name__ in ("DeltaTriggerTimetable", "DeltaDataIntervalTimetable")
        assert watch.timetable.delta == timedelta(minutes=15)  # type: ignore[attr-defined]  # defaults.bake.interval
        assert watch.max_active_runs == 1 and not watch.catchup
        # Two tasks however many groups: the watched list, then one mapped check per watched group.
        assert [t.task_id for t in watch.tasks] == ["watched", "bake_check"]
        check = mapped_over(watch, "watched", "BakeWatchListOperator", "bake_check", "BakeCheckOperator")
        # The baked asset of the checked group is emitted through the alias; each map index named by its group.
        assert check.partial_kwargs["outlets"] == [AssetAlias("promshift-baked")]
        assert check.partial_kwargs["map_index_template"] == "{{ task.group_name }}"
        assert all(f"`{g.name}`" in watch.doc_md for g in _groups(bag))


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
    # the approver's own fields: the form's group is not the approver's to change; the history loss is theirs to accept
    assert set(approval.serialized_params) == {"comment", "accept_history_loss"}
    assert approval.params.get_param("accept_history_loss").value is False
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


def test_every_latency_probe_is_bounded_per_target_workspace_without_setup(dagbag, multi) -> None:  # type: ignore[no-untyped-def]
    """One migration DAG per target workspace, and its latency task runs one instance at a time across all the
    DAG's runs: the bound per workspace needs no pool (nothing to create; nothing waits for one that is missing)."""
    from promshift.orchestration.dag_factory import LATENCY_PROBES_PER_WORKSPACE

    targets = set()
    for bag in (dagbag, multi):
        for dag_id, dag in _migration_dags(bag).items():
            target = dag_id.removeprefix("promshift__migrate__")
            latency = dag.get_task("latency")
            assert latency.target_conn_id == latency.dag_target == target, dag_id
            assert latency.max_active_tis_per_dag == LATENCY_PROBES_PER_WORKSPACE == 1, dag_id
            targets.add(target)
            # Only the probe is bounded, and no task asks for a pool someone must create.
            assert {t.pool for t in dag.tasks if not hasattr(t, "partial_kwargs")} == {"default_pool"}
            assert [t.task_id for t in dag.tasks if getattr(t, "max_active_tis_per_dag", None)] == ["latency"]
    assert targets == set(TARGETS.values())  # one DAG, so one bound, per workspace


def test_the_retire_dag_asks_between_prepare_and_the_switch_and_the_source_is_chosen_in_its_form(dagbag) -> None:  # noqa: ANN001
    retire = dagbag.dags["promshift__retire"]
    assert set(retire.task_ids) == {"prepare", "consolidate", "approval", "retire"}
    # the write queues are merged before the approval (it shows the result) and so before the switch
    assert retire.get_task("consolidate").upstream_task_ids == {"prepare"}
    assert retire.get_task("approval").upstream_task_ids == {"prepare", "consolidate"}
    assert retire.get_task("retire").upstream_task_ids == {"approval"}
    assert retire.params.get_param("source").schema["enum"] == ["promshift_source"]
    approval = retire.get_task("approval")
    assert "accept" in approval.params and approval.params.get_param("accept").source == "task"
    unretire = dagbag.dags["promshift__unretire"]
    assert set(unretire.task_ids) == {"unretire"} and "reason" in unretire.params
