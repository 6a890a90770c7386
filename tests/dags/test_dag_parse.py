"""What keeps the DAG file's parse cheap changes nothing a DAG does, and a worker builds only its task's DAG."""

from __future__ import annotations

import copy
import json
import os
import pickle
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "promshift_groups.py"


def _parse(monkeypatch: pytest.MonkeyPatch, only: str | None = None) -> dict[str, Any]:
    from airflow.sdk import DAG

    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    if only is None:
        monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    else:  # what Airflow's task runner sets before it parses the file to run a task of ``only``
        monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", only)
    return {v.dag_id: v for v in runpy.run_path(str(DAG_FILE)).values() if isinstance(v, DAG)}


def _serialized(dag: Any) -> str:
    from airflow.serialization.serialized_objects import DagSerialization

    data = DagSerialization.to_dict(dag)
    data["dag"].pop("fileloc", None)
    return json.dumps(data, sort_keys=True, default=str)


def test_a_worker_builds_only_the_dag_of_its_task_and_the_same_dag(monkeypatch: pytest.MonkeyPatch) -> None:
    everything = _parse(monkeypatch)
    by_hand = {"promshift__decommission", "promshift__recommission", "promshift__rollback"}
    group_dags = [d for d in everything if d not in by_hand | {"promshift__bake_watch"}]
    assert len(everything) >= 6 and group_dags
    for dag_id in (group_dags[-1], "promshift__bake_watch", "promshift__recommission"):
        only = _parse(monkeypatch, only=dag_id)
        # The three by-hand DAGs are built together (one call, a few tasks each); anything else alone.
        assert set(only) == (by_hand if dag_id in by_hand else {dag_id}), dag_id
        for built in only:
            assert _serialized(only[built]) == _serialized(everything[built]), built


def test_a_form_field_copies_and_checks_like_a_plain_param() -> None:
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from promshift.orchestration.dag_factory import _form_field, run_params_schema

    form = run_params_schema()
    for name, field in form.items():
        plain = Param(field.value, field.description, schema=dict(field.schema), source=field.source)
        copied = copy.deepcopy(field)
        assert type(copied) is Param, name  # a Param (serialized as one), with the same two shortcuts
        assert copied.resolve() == plain.resolve() and copy.deepcopy(copied).schema == plain.schema, name
        assert (copied.value, copied.description, copied.schema, copied.source) == (
            plain.value, plain.description, plain.schema, plain.source), name
        assert copied.schema is not field.schema, name
        assert field.resolve() == plain.resolve() == field.resolve(), name  # the second from the cache
        assert pickle.loads(pickle.dumps(field)).schema == field.schema, name
    # A run's own value is always checked by jsonschema, cache or not.
    with pytest.raises(ParamValidationError):
        form["warmup_override"].resolve("ten minutes")
    assert form["warmup_override"].resolve("10m") == "10m"
    assert form["dry_run"].resolve(True) is True
    # A default the schema refuses is refused every time (only accepted pairs are remembered).
    bad = _form_field("x" * 10, description="too long", type="string", maxLength=3)
    for _ in range(2):
        with pytest.raises(ParamValidationError):
            bad.resolve()
    assert bad.resolve(suppress_exception=True) is None
    with pytest.raises(TypeError, match="flat"):
        _form_field("", description="nested", type="string", enum=["a"])  # type: ignore[arg-type]


def test_link_refuses_tasks_of_two_dags() -> None:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from promshift.orchestration.dag_factory import link

    with DAG("one", schedule=None):
        a = EmptyOperator(task_id="a")
        b = EmptyOperator(task_id="b")
    with DAG("two", schedule=None):
        c = EmptyOperator(task_id="c")
    link(a, b)
    assert b.upstream_task_ids == {"a"} and a.downstream_task_ids == {"b"}
    with pytest.raises(ValueError, match="not tasks of one DAG"):
        link(b, c)
    assert not c.upstream_task_ids


def test_the_schedule_asset_is_equal_to_and_serialized_as_a_plain_asset() -> None:
    from airflow.sdk import Asset
    from airflow.serialization.serialized_objects import BaseSerialization

    from promshift.orchestration.dag_factory import cut_over_asset

    ours, plain = cut_over_asset("gpu-memory"), Asset("promshift://group/gpu-memory/cut_over")
    assert ours == plain and hash(ours) == hash(plain) == hash(ours)
    assert BaseSerialization.serialize(ours) == BaseSerialization.serialize(plain)
    assert {ours} == {plain}


SCALE_CHILD = r"""
import json, os, runpy, sys, time
import airflow.sdk
import promshift.orchestration.dag_factory as factory
from promshift.adapters.settings import load_catalog
runpy.run_path(sys.argv[1])  # once cold: imports and Airflow's one-time set-up are not what is compared


def best(build, times=3):
    spent = []
    for _ in range(times):
        started = time.process_time()
        made = build()
        spent.append(time.process_time() - started)
    return min(spent), made


build_s, namespace = best(lambda: runpy.run_path(sys.argv[1]))
dags = list({v.dag_id: v for v in namespace.values() if isinstance(v, airflow.sdk.DAG)}.values())
# The shape the file had before, as bench/dag_parse/run.py measures it: one migration DAG (13 tasks) per group,
# built by the same factory (each group alone in its DAG's form).
catalog = os.environ["PROMSHIFT_CATALOG"]
groups = load_catalog(catalog).groups
started = time.process_time()
for group in groups:
    factory.build_migration_dag([group], target=group.target, catalog_path=catalog)
per_group_s = time.process_time() - started
print(json.dumps({"groups": len(groups), "dag_ids": sorted(d.dag_id for d in dags),
                  "tasks": sum(len(d.tasks) for d in dags), "build_s": build_s, "per_group_s": per_group_s}))
"""


def _build_at(groups: int, tmp_path: Path) -> dict[str, Any]:
    import subprocess

    sys.path.insert(0, str(REPO / "bench" / "catalog"))
    try:
        from run import catalog_text  # bench/catalog/run.py
    finally:
        sys.path.remove(str(REPO / "bench" / "catalog"))
    catalog = tmp_path / f"catalog-{groups}.yaml"
    catalog.write_text(catalog_text(groups))
    env = {**os.environ, "PROMSHIFT_CATALOG": str(catalog), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("PROMSHIFT_PROFILE", None)
    env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
    done = subprocess.run([sys.executable, "-c", SCALE_CHILD, str(DAG_FILE)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["groups"] == groups
    return row


@pytest.mark.integration  # fresh interpreters
def test_the_dags_do_not_grow_with_groups_and_the_build_stays_far_under_a_dag_per_group(tmp_path: Path) -> None:
    """At 200 and at 1,000 groups (bench/catalog's catalog) the file builds the same DAGs with the same tasks: only
    the forms' lists of groups grow. CPU seconds of the file's build (best of three) against, in the same process,
    building the shape it had before, one migration DAG per group (bench/dag_parse/run.py's baseline). Measured
    on 2 shared cores at 1,000 groups: 0.38 s against 3.60 s (a tenth); a DAG per group coming back, or per-group
    work in the build, passes half of it and fails this."""
    small, large = _build_at(200, tmp_path), _build_at(1000, tmp_path)
    assert small["dag_ids"] == large["dag_ids"] == sorted([
        "promshift__migrate__promshift_target", "promshift__waves", "promshift__bake_watch",
        "promshift__decommission", "promshift__recommission", "promshift__rollback",
        "promshift__retire", "promshift__unretire"])
    assert small["tasks"] == large["tasks"] == 13 + 2 + 2 + 3 + 1 + 1 + 4 + 1
    for row in (small, large):
        ratio = row["build_s"] / row["per_group_s"]
        print(f"{row['groups']:,} groups: build {row['build_s']:.2f}s CPU, a DAG per group {row['per_group_s']:.2f}s: "
              f"{ratio:.2f}x (load {os.getloadavg()[0]:.1f})")
    assert large["build_s"] < 0.5 * large["per_group_s"]
    # The build grows with the catalog's parse only: far less than five times from 200 to 1,000 groups' DAGs would.
    assert large["build_s"] - small["build_s"] < 0.5 * (large["per_group_s"] - small["per_group_s"])


def test_the_collector_is_paused_inside_and_as_it_was_after_even_on_an_error() -> None:
    import gc

    from promshift.core.memory import cyclic_gc_paused

    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        raise RuntimeError("a DAG failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_parsing_the_file_leaves_the_collector_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    assert gc.isenabled()
    assert _parse(monkeypatch)
    assert gc.isenabled()


def test_a_worker_of_the_catalog_errors_dag_builds_everything_it_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.core.catalog import CATALOG_ERRORS_DAG_ID

    # Its problems include what building the other DAGs found, so nothing is skipped for it.
    assert set(_parse(monkeypatch, only=CATALOG_ERRORS_DAG_ID)) == set(_parse(monkeypatch))
