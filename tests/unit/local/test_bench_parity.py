"""bench/parity's setup logic: the whole-fleet group, the text-size estimate and the disk passes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from promshift.local.stack.backfill import fleet_metrics
from promshift.local.stack.fleet import FleetSpec
from promshift.local.stack.local import EXTERNAL_LABELS, SCRAPE_JOB

RUN_PY = Path(__file__).resolve().parents[3] / "bench" / "parity" / "run.py"


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_parity_run", RUN_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_whole_fleet_group_claims_every_rendered_counter(bench) -> None:  # type: ignore[no-untyped-def]
    group = bench.bench_group("whole-fleet")
    assert list(group.metrics) == list(fleet_metrics())
    assert len(group.metrics) == 25  # dcgm-exporter's 26 default counters but the label-only driver version
    assert group.metric_regex is None
    assert group.parity == bench.bench_group("gpu-power-thermal").parity


def test_estimate_is_close_to_the_text_written(bench, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fleet = FleetSpec(nodes=6)
    metrics = list(fleet_metrics())
    steps = list(range(1_796_223_570, 1_796_223_570 + 20 * 30, 30))
    plan = bench.plan_faults(fleet, metrics, seed="test")
    estimate = bench.estimate_text_bytes(fleet, metrics, steps, EXTERNAL_LABELS, SCRAPE_JOB)
    written = bench.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, tmp_path)
    for side, size in written["bytes"].items():
        assert size <= estimate[side] <= size * 1.10, (side, size, estimate[side])
    # Writing one side alone gives the same file as writing it with the others.
    alone = tmp_path / "alone"
    alone.mkdir()
    clean = bench.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, alone, ("clean",))
    assert list(clean["files"]) == ["clean"]
    assert clean["files"]["clean"].read_bytes() == written["files"]["clean"].read_bytes()
    assert clean["samples"]["clean"] == written["samples"]["clean"] == fleet.nodes * 8 * len(metrics) * len(steps)


def test_passes_fit_half_the_free_disk(bench) -> None:  # type: ignore[no-untyped-def]
    estimate = {"source": 17, "target": 20, "clean": 20}
    assert bench.plan_passes(estimate, 200) == [("source", "target", "clean")]
    assert bench.plan_passes(estimate, 80) == [("source", "target"), ("clean",)]
    assert bench.plan_passes(estimate, 40) == [("source",), ("target",), ("clean",)]
    with pytest.raises(RuntimeError, match="disk: one side's OpenMetrics text needs"):
        bench.plan_passes(estimate, 39)


# -- judging: what makes the README's "3/3 faults found, 0/5 false positives" -------------------------------

M1, M2, M3 = "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_MEMORY_TEMP"
H1, H2, RENAME, DRIFT, OTHER = "gpu-node-0001", "gpu-node-0002", "gpu-node-0003", "gpu-node-0004", "gpu-node-0005"


@pytest.fixture
def plan(bench):  # type: ignore[no-untyped-def]
    return bench.FaultPlan(drift_host=DRIFT, rename_host=RENAME, missing=frozenset({(M1, H1, 0), (M2, H2, 3)}))


def layer(name: str, verdict: str = "FAILED", **numbers: object) -> dict[str, object]:
    return {"name": name, "verdict": verdict, "reason": "", "numbers": numbers}


def found_everything() -> dict[str, dict[str, object]]:
    """Layers as ParityCheck reports a run that named every planted fault (see bench/results/parity.json)."""
    return {
        "coverage": layer("coverage", short_keys=[M1, M2], worst_missing_ratio=0.001),
        "host_coverage": layer("host_coverage", short_keys=[H1, H2, RENAME],
                               renamed_keys={"hostname@target": [RENAME]}),
        "labels": layer("labels", drift={m: {"only_source": [], "only_target": ["hostname"],
                                             "renamed": {"hostname": "Hostname"}} for m in (M1, M2, M3)}),
        "aggregates": layer("aggregates", differing_keys=[H1, H2, DRIFT]),
        "samples": layer("samples", hosts_sampled=[H1, DRIFT, OTHER]),
    }


def result(layers: dict[str, dict[str, object]], verdict: str = "FAILED") -> dict[str, object]:
    return {"verdict": verdict, "measurements": list(layers.values())}


def test_a_run_naming_every_planted_fault_is_judged_3_of_3(bench, plan) -> None:  # type: ignore[no-untyped-def]
    judged = bench.judge_promshift(result(found_everything()), plan)
    assert [judged[k]["found"] for k in bench.FAULTS] == [True, True, True]
    assert judged["all_found"] is True
    assert (judged["missing_series"]["hosts_named"], judged["missing_series"]["hosts_planted"]) == (2, 2)
    assert judged["label_rename"]["host_identified"] is True
    assert "`hostname` only on target in 3 metrics" in judged["label_rename"]["evidence"]
    assert judged["value_drift"]["other_hosts_differing"] == []
    assert judged["samples_layer"]["faulty_hosts_sampled"] == [H1, DRIFT]
    assert bench.faults_found_counts(judged, judged) == {"promshift": 3, "naive": 3}


@pytest.mark.parametrize(("fault", "layer_name", "edit"), [
    # The coverage layer passed: a shortfall in its numbers alone is not a finding.
    ("missing_series", "coverage", {"verdict": "SUCCESSFUL"}),
    # One metric holding a missing series is not named short.
    ("missing_series", "coverage", {"numbers": {"short_keys": [M1]}}),
    # host_coverage names one of the two hosts holding missing series.
    ("missing_series", "host_coverage", {"numbers": {"short_keys": [H1, RENAME]}}),
    ("label_rename", "labels", {"verdict": "SUCCESSFUL"}),
    # Label drift, but not the planted one (`hostname` only on the source).
    ("label_rename", "labels", {"numbers": {"drift": {M1: {"only_source": ["hostname"], "only_target": []}}}}),
    ("value_drift", "aggregates", {"verdict": "SUCCESSFUL"}),
    # The aggregates differ on the hosts with missing series only, not on the drift host.
    ("value_drift", "aggregates", {"numbers": {"differing_keys": [H1, H2]}}),
])
def test_a_fault_the_evidence_does_not_name_is_not_found(bench, plan, fault: str, layer_name: str,  # type: ignore[no-untyped-def]
                                                         edit: dict[str, object]) -> None:
    layers = found_everything()
    layers[layer_name] = {**layers[layer_name], **edit}
    judged = bench.judge_promshift(result(layers), plan)
    assert judged[fault]["found"] is False
    assert [k for k in bench.FAULTS if not judged[k]["found"]] == [fault]  # the others are still found
    assert judged["all_found"] is False
    assert bench.faults_found_counts(judged, judged)["promshift"] == 2


def test_a_missing_layer_finds_nothing_and_does_not_crash(bench, plan) -> None:  # type: ignore[no-untyped-def]
    judged = bench.judge_promshift(result({}), plan)
    assert not any(judged[k]["found"] for k in bench.FAULTS) and judged["all_found"] is False
    assert judged["samples_layer"] == {"verdict": "absent", "hosts_sampled": 0, "faulty_hosts_sampled": []}


def test_the_rename_host_is_identified_only_when_host_coverage_names_it(bench, plan) -> None:  # type: ignore[no-untyped-def]
    layers = found_everything()
    layers["host_coverage"]["numbers"] = {"short_keys": [H1, H2], "renamed_keys": {}}  # type: ignore[index]
    judged = bench.judge_promshift(result(layers), plan)
    assert judged["label_rename"]["found"] is True and judged["label_rename"]["host_identified"] is False


def test_hosts_differing_beyond_the_planted_ones_are_listed(bench, plan) -> None:  # type: ignore[no-untyped-def]
    layers = found_everything()
    layers["aggregates"]["numbers"] = {"differing_keys": [H1, H2, DRIFT, OTHER]}  # type: ignore[index]
    judged = bench.judge_promshift(result(layers), plan)
    assert judged["value_drift"]["found"] is True
    assert judged["value_drift"]["other_hosts_differing"] == [OTHER]


def series(metric: str, host: str, gpu: int, host_label: str = "Hostname") -> dict[str, str]:
    return {"__name__": metric, host_label: host, "gpu": str(gpu), "instance": host, "job": "dcgm"}


def naive_out(**overrides: object) -> dict[str, object]:
    """What child_naive returns when the baseline saw every planted fault: the planted missing series and the
    renamed host's source series missing, its `hostname` series extra, the drift host's values off."""
    out: dict[str, object] = {
        "missing": [series(M1, H1, 0), series(M2, H2, 3), series(M1, RENAME, 0), series(M2, RENAME, 0)],
        "extra": [series(M1, RENAME, 0, "hostname"), series(M2, RENAME, 0, "hostname")],
        "mismatched_by_host": {DRIFT: {"series": 2, "points": 242}},
    }
    out.update(overrides)
    return out


def test_the_baseline_seeing_every_fault_is_judged_3_of_3(bench, plan) -> None:  # type: ignore[no-untyped-def]
    judged = bench.judge_naive(naive_out(), plan, "Hostname")
    assert [judged[k]["found"] for k in bench.FAULTS] == [True, True, True] and judged["all_found"] is True
    assert judged["missing_series"]["evidence"] == ("2/2 planted missing series named (plus 2 of the renamed host, "
                                                    "0 unexplained)")


@pytest.mark.parametrize(("fault", "overrides"), [
    ("missing_series", {"missing": [series(M1, H1, 0), series(M1, RENAME, 0)]}),  # one planted series not seen
    ("missing_series", {"missing": [series(M1, H1, 0), series(M2, H2, 4)]}),  # the wrong GPU of H2
    ("label_rename", {"extra": []}),
    ("label_rename", {"extra": [series(M1, RENAME, 0, "hostname"), series(M1, OTHER, 0, "hostname")]}),  # 2 hosts
    ("label_rename", {"extra": [{**series(M1, RENAME, 0), "hostname": RENAME}]}),  # still carries Hostname
    ("value_drift", {"mismatched_by_host": {OTHER: {"series": 1, "points": 1}}}),
])
def test_the_baseline_missing_a_fault_is_judged_so(bench, plan, fault: str,  # type: ignore[no-untyped-def]
                                                   overrides: dict[str, object]) -> None:
    judged = bench.judge_naive(naive_out(**overrides), plan, "Hostname")
    assert [k for k in bench.FAULTS if not judged[k]["found"]] == [fault]
    assert judged["all_found"] is False


def test_unexplained_missing_series_are_counted_in_the_baselines_evidence(bench, plan) -> None:  # type: ignore[no-untyped-def]
    out = naive_out(missing=[series(M1, H1, 0), series(M2, H2, 3), series(M3, OTHER, 1)])
    judged = bench.judge_naive(out, plan, "Hostname")
    assert judged["missing_series"]["found"] is True
    assert "(plus 0 of the renamed host, 1 unexplained)" in judged["missing_series"]["evidence"]


def clean_run(verdict: str, wall_s: float = 1.0) -> dict[str, object]:
    return {"result": {"verdict": verdict}, "wall_s": wall_s}


def test_every_clean_run_that_is_not_successful_is_a_false_positive(bench) -> None:  # type: ignore[no-untyped-def]
    runs = [clean_run("SUCCESSFUL"), clean_run("INCONCLUSIVE"), clean_run("SUCCESSFUL"), clean_run("FAILED"),
            clean_run("SUCCESSFUL", 2.34567)]
    naive = {"wall_s": 3.14159, "missing": [{}], "extra": [], "mismatched_by_host": {"h": {}, "i": {}}}
    clean = bench.judge_clean(runs, naive)
    assert (clean["promshift_runs"], clean["promshift_failed"], clean["promshift_false_positive_rate"]) == (5, 2, 0.4)
    assert clean["verdicts"] == ["SUCCESSFUL", "INCONCLUSIVE", "SUCCESSFUL", "FAILED", "SUCCESSFUL"]
    assert clean["seeds"] == [f"bench-clean-{i}" for i in range(5)] and clean["wall_s"][-1] == 2.346
    assert clean["naive"] == {"wall_s": 3.142, "missing_series": 1, "extra_series": 0, "mismatched_hosts": 2}
    all_clean = bench.judge_clean([clean_run("SUCCESSFUL")] * 5, None)
    assert (all_clean["promshift_failed"], all_clean["promshift_false_positive_rate"], all_clean["naive"]) == (0, 0.0,
                                                                                                             None)
    assert bench.judge_clean([], None)["promshift_false_positive_rate"] is None


def test_the_written_target_holds_exactly_the_planted_faults(bench, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The faults the judging looks for are the ones in the text: every planted missing series absent, the rename
    host's series under `hostname`, the drift host's values x 1.01, everything else as the clean side."""
    import re

    fleet = FleetSpec(nodes=8)
    metrics = list(bench.bench_group("gpu-power-thermal").metrics)
    steps = [1_796_223_570 + 30 * i for i in range(3)]
    plan = bench.plan_faults(fleet, metrics, seed="judging")
    written = bench.write_openmetrics(fleet, metrics, steps, plan, EXTERNAL_LABELS, SCRAPE_JOB, tmp_path)
    line = re.compile(r'^(\w+)\{(.*)\} (\S+) (\d+)$')

    def parse(side: str) -> dict[tuple[str, str, int, str], list[float]]:
        out: dict[tuple[str, str, int, str], list[float]] = {}
        for text in written["files"][side].read_text().splitlines():
            if text.startswith("#"):
                continue
            m = line.match(text)
            assert m, text
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            host_label = "Hostname" if "Hostname" in labels else "hostname"
            out.setdefault((m[1], labels[host_label], int(labels["gpu"]), host_label), []).append(float(m[3]))
        return out

    clean, target = parse("clean"), parse("target")
    assert len(clean) == fleet.nodes * 8 * len(metrics)
    assert {(m, h, g) for m, h, g, _ in clean} - {(m, h, g) for m, h, g, _ in target} == set(plan.missing)
    for (metric, host, gpu, label), values in target.items():
        expected = clean[metric, host, gpu, "Hostname"]
        assert label == ("hostname" if host == plan.rename_host else "Hostname")
        if host == plan.drift_host:
            assert values == pytest.approx([v * 1.01 for v in expected], rel=1e-12) and values != expected
        else:
            assert values == expected
