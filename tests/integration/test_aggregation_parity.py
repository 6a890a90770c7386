"""Proof by parity (issue 40 item 3): each original read on the source against its rewrite on the target.

A real pair: the source scrapes a 2-node fleet every second and evaluates the group's recording rules every
second; its remote write ships the group's keep filter, which (with ``aggregations``) keeps the recorded series
and not the raw metric. One recording is planted wrong (``* 1.001``): the golden layer must FAIL that read, by
name, and pass the reads whose recordings are right, a counter's rate included.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.settings import load_catalog
from promshift.core.catalog import Aggregate, MetricGroup
from promshift.core.verdicts import Verdict
from promshift.local.stack.fleet import FleetServer, FleetSpec, file_sd_groups
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.prometheus import PrometheusProcess

pytestmark = pytest.mark.integration

AGGREGATES = (Aggregate("DCGM_FI_DEV_GPU_TEMP", ("Hostname",), ("max",)),
              Aggregate("DCGM_FI_DEV_POWER_USAGE", ("Hostname",), ("sum", "count")),
              # Fleet-wide: the recorded series has no host label at all.
              Aggregate("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", (), ("sum",), rate_s=10.0))
# The recording of the power sum is planted wrong on the source, so the target receives it wrong.
WRONG = "Hostname:DCGM_FI_DEV_POWER_USAGE:sum"
PANELS = {
    "node_temp": "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)",
    "fleet_hot": "max(DCGM_FI_DEV_GPU_TEMP) > 0",
    "node_power": "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "power_count": "count(DCGM_FI_DEV_POWER_USAGE)",
    "energy": "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10s])) * 3600",
    "per_gpu": "DCGM_FI_DEV_GPU_TEMP",
    "memory_temp": "max by (Hostname) (DCGM_FI_DEV_MEMORY_TEMP)",  # shipped raw: compared as before
}


def _group() -> MetricGroup:
    group = load_catalog(profile="demo").get("gpu-power-thermal")
    return dataclasses.replace(group, aggregations=AGGREGATES, scrape_interval_s=1.0)


def _rules() -> str:
    rules = []
    for a in AGGREGATES:
        for record, expr in a.rules():
            rules.append({"record": record, "expr": f"{expr} * 1.001" if record == WRONG else expr})
    return json.dumps({"groups": [{"name": "promshift-aggregate-gpu-power-thermal", "interval": "1s",
                                   "rules": rules}]})


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusClient, PrometheusClient, float]]:
    tmp = tmp_path_factory.mktemp("aggregation-parity")
    fleet = FleetSpec(nodes=2)
    server = FleetServer(fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp / "sd.json").write_text(json.dumps(file_sd_groups(fleet, server.port)))
    (tmp / "aggregate.yml").write_text(_rules())
    procs: list[PrometheusProcess] = []

    def start(name: str, config: str, *flags: str) -> PrometheusClient:
        (port,) = find_free_ports(1)
        proc = PrometheusProcess(name, tmp, port=port, config=config, flags=flags)
        procs.append(proc)
        proc.wait_ready(40)
        return PrometheusClient(proc.url, timeout_s=10)

    try:
        target = start("target", "global: {scrape_interval: 1m}\n", "--web.enable-remote-write-receiver")
        keep = _group().name_regex()
        source = start("source", (
            f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
            f"rule_files: ['{tmp / 'aggregate.yml'}']\n"
            f"scrape_configs:\n- job_name: dcgm\n  file_sd_configs: [{{files: ['{tmp / 'sd.json'}']}}]\n"
            f"remote_write:\n- url: {target.base_url}/api/v1/write\n  queue_config: {{batch_send_deadline: 500ms}}\n"
            f"  write_relabel_configs: [{{source_labels: [__name__], regex: '{keep}', action: keep}}]\n"))
        since = time.time()
        deadline = since + 40
        while (target.scalar("count(Hostname:DCGM_FI_DEV_GPU_TEMP:max)") or 0) < 2:
            assert time.time() < deadline, "the target never received the recorded series"
            time.sleep(0.5)
        time.sleep(max(0.0, since + 30 - time.time()))
        yield source, target, since
    finally:
        for proc in reversed(procs):
            proc.stop(20)
        server.shutdown()


def test_each_original_read_matches_its_rewrite_and_a_wrong_recording_fails_by_name(
        pair: tuple[PrometheusClient, PrometheusClient, float], tmp_path: Path) -> None:
    source, target, since = pair
    # The keep filter shipped the recorded series only: the raw aggregated metric stayed on the source.
    assert (source.scalar("count(DCGM_FI_DEV_GPU_TEMP)") or 0) == 16
    assert (target.scalar("count(DCGM_FI_DEV_GPU_TEMP)") or 0) == 0
    assert target.scalar("count(Hostname:DCGM_FI_DEV_GPU_TEMP:max)") == 2  # 8x fewer series than per GPU
    assert target.scalar("count(DCGM_FI_DEV_MEMORY_TEMP)") == 16  # not aggregated: shipped raw

    dashboard = {"panels": [{"title": title, "targets": [{"refId": "A", "expr": expr}]}
                            for title, expr in PANELS.items()]}
    (tmp_path / "fleet.json").write_text(json.dumps(dashboard))
    group = _group()
    policy = dataclasses.replace(group.parity, golden_dashboards=(str(tmp_path),), step_s=1.0, skip_recent_s=3.0)
    check = ParityCheck(dataclasses.replace(group, parity=policy), source, target)
    window = check.window(dual_write_since=since, now=time.time())
    assert window is not None
    measurements, inventory = check.golden(*window)
    json.dumps([m.to_dict() for m in measurements] + [inventory.to_dict()], allow_nan=False)
    by = {m.name.removeprefix("golden[").removesuffix("]"): m for m in measurements}
    for panel in ("node_temp", "fleet_hot", "power_count", "energy", "memory_temp"):
        assert by[panel].verdict == Verdict.SUCCESSFUL, (panel, by[panel].reason, by[panel].numbers)
    # Each compared read asked the source the original and the target its rewrite.
    assert by["node_temp"].queries[1].startswith("max by (Hostname) (Hostname:DCGM_FI_DEV_GPU_TEMP:max)")
    assert by["node_temp"].numbers["points_compared"] >= 20 and not by["node_temp"].numbers["offenders"]
    assert ":DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION:rate10s" in by["energy"].queries[1]
    # The wrong recording: FAILED, the read named (its measurement), the series and the values shown.
    bad = by["node_power"]
    assert bad.name == "golden[node_power]"  # the panel: the read named
    assert bad.verdict == Verdict.FAILED, bad.reason
    assert "the rewritten read on the target differs from the original read on the source" in bad.reason
    assert 'Hostname="gpu-node-000' in bad.reason and bad.numbers["offenders"]
    # A per-GPU read cannot read the recorded series: the target cannot answer it as the source does.
    assert by["per_gpu"].verdict == Verdict.FAILED
    assert "ships aggregated (aggregations), and cannot be rewritten" in by["per_gpu"].reason
    assert {row.panel: row.disposition for row in inventory.queries}["per_gpu"] == "compared"


def test_every_parity_layer_on_an_aggregated_group_passes_when_its_reads_do(
        pair: tuple[PrometheusClient, PrometheusClient, float], tmp_path: Path) -> None:
    """The whole gate (coverage, aggregates, labels, samples, golden) over the group's shipped series: the
    recorded ones and the raw metric it does not aggregate; the golden reads are the ones whose recordings are
    right."""
    source, target, since = pair
    panels = {k: PANELS[k] for k in ("node_temp", "fleet_hot", "energy", "memory_temp")}
    dashboard = {"panels": [{"title": title, "targets": [{"refId": "A", "expr": expr}]}
                            for title, expr in panels.items()]}
    (tmp_path / "fleet.json").write_text(json.dumps(dashboard))
    group = _group()
    policy = dataclasses.replace(group.parity, golden_dashboards=(str(tmp_path),), step_s=1.0, skip_recent_s=3.0)
    result = ParityCheck(dataclasses.replace(group, parity=policy), source, target).run(
        dual_write_since=since, now=time.time())
    bad = [(m.name, m.verdict.value, m.reason) for m in result.measurements if m.verdict != Verdict.SUCCESSFUL]
    assert result.verdict == Verdict.SUCCESSFUL, bad
    golden = [m for m in result.measurements if m.name.startswith("golden[")]
    assert len(golden) == len(panels)


def test_a_moved_rule_over_an_aggregated_metric_goes_rewritten_and_parity_compares_it_so(
        pair: tuple[PrometheusClient, PrometheusClient, float], tmp_path: Path) -> None:
    """The group's rules move at cut-over: one that reads an aggregated metric's raw series is rewritten to the
    recorded series for the target, compared original-on-source against rewritten-on-target; the group's own
    aggregation rules never move; a rule that needs the raw series refuses the move, named."""
    from promshift.adapters.rules_deploy import PrometheusRulesTarget, RulesMove, SourceRules, rules_parity
    from promshift.core.deploy import DeployError

    source, target, since = pair
    group = _group()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "promshift-aggregate-gpu-power-thermal.yml").write_text(_rules())
    team = ("groups:\n- name: gpu\n  rules:\n"
            "  - alert: NodeHot\n    expr: max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) > 0\n    for: 1m\n"
            "  - record: node:memory_temp:max\n    expr: max by (Hostname) (DCGM_FI_DEV_MEMORY_TEMP)\n")
    (tmp_path / "team.yml").write_text(team)
    (tmp_path / "prometheus.yml").write_text(
        "rule_files: [team.yml, rules/promshift-aggregate-gpu-power-thermal.yml]\n")
    (tmp_path / "target.yml").write_text("global: {}\n")
    move = RulesMove.for_group(SourceRules(tmp_path / "prometheus.yml", source),
                               PrometheusRulesTarget(tmp_path / "target.yml", target, group_name=group.name), group)
    snapshot = move.snapshot()
    plan = move.plan(snapshot)
    assert [r.name for r in plan.selection.rules] == ["NodeHot", "node:memory_temp:max"]
    assert "max by (Hostname) (Hostname:DCGM_FI_DEV_GPU_TEMP:max) > 0" in plan.document
    assert "DCGM_FI_DEV_GPU_TEMP)" not in plan.document
    # The source keeps evaluating the original until the handoff removes it; the target gets the rewrite.
    assert list(plan.edits) == [str(tmp_path / "team.yml")]

    measurements = rules_parity(source, target, plan.selection, start=since + 5, end=time.time() - 3, step=1.0,
                                abs_tol=1e-9, rel_tol=1e-9, aggregates=group.aggregations, recording_step=1.0)
    by = {m.name: m for m in measurements}
    hot = next(m for name, m in by.items() if "NodeHot" in name)
    assert hot.verdict == Verdict.SUCCESSFUL, hot.reason
    assert hot.queries[1] == "max by (Hostname) (Hostname:DCGM_FI_DEV_GPU_TEMP:max) > 0"
    assert measurements[0].verdict == Verdict.SUCCESSFUL, [(m.name, m.reason) for m in measurements]

    (tmp_path / "team.yml").write_text(team + "  - alert: GpuZeroHot\n    expr: DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} > 90\n")
    with pytest.raises(DeployError, match=r"alert GpuZeroHot .* reads the raw series of a metric the group ships "
                                          r"aggregated and cannot move to the target"):
        move.plan(move.snapshot())
