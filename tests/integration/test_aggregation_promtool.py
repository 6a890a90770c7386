"""The recommended recording rules and each read's rewrite, evaluated by the real Prometheus engine (promtool 2.42).

For per-GPU series of a gauge, a second gauge and a counter, the plan's rules are evaluated by ``promtool test
rules`` and every read's original aggregation is compared with its rewrite over the recorded series at several
instants: the same groups, the same values (within float rounding). A rule planted wrong fails the same check.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from promshift.core.aggregation import decide, read_shapes

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")]

LABELS = {"Hostname", "gpu", "instance", "job"}
HOSTS, GPUS = 2, 4
# Per metric: its reads with how many groups each answers, and its type.
READS = {
    "U": ([("avg by (Hostname) (U)", HOSTS), ("avg(U)", 1), ("count(U)", 1),
           ('sum by (Hostname) (U{Hostname="n1"})', 1)], "gauge"),
    "T": ([("max by (Hostname) (T)", HOSTS), ("max(T) > 0", 1), ("topk(1, max by (Hostname) (T))", 1)], "gauge"),
    "E_total": ([("sum by (Hostname) (rate(E_total[5m]))", HOSTS), ("sum(increase(E_total[5m])) / 60", 1)],
                "counter"),
}


def _series() -> list[dict[str, str]]:
    out = []
    for h in range(HOSTS):
        for g in range(GPUS):
            labels = f'Hostname="n{h}", gpu="{g}", instance="n{h}:9400", job="dcgm"'
            out.append({"series": f"U{{{labels}}}", "values": f"{10 * h + g}+{g + 1}x40"})
            out.append({"series": f"T{{{labels}}}", "values": f"{50 + 7 * g - h}-{g % 3}x40"})
            out.append({"series": f"E_total{{{labels}}}", "values": f"{100 * g}+{g * 3 + h + 1}x40"})
    return out


def _decisions() -> dict[str, object]:
    out = {}
    for metric, (reads, type_) in READS.items():
        shapes = [(f"{metric} {i}", s) for i, (e, _) in enumerate(reads) for s in read_shapes(e) if s.metric == metric]
        out[metric] = decide(metric, shapes, LABELS, type_=type_)
    return out


def _run(tmp_path: Path, rules: list[dict[str, str]], checks: list[dict[str, object]]) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "aggregate", "interval": "15s",
                                                                     "rules": rules}]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": _series(), "promql_expr_test": checks}]}))
    return subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                          timeout=60, check=False)


def _checks(decisions: dict[str, object]) -> list[dict[str, object]]:
    checks: list[dict[str, object]] = []
    for metric, agg in decisions.items():
        assert len(agg.reads) == len(READS[metric][0])
        for reader, original, rewritten in agg.reads:  # each whole read, as a dashboard or rule has it
            groups = READS[metric][0][int(reader.split()[1])][1]
            for at in ("6m", "8m", "10m"):
                # every group of the original has a partner in the rewrite, and no value differs
                checks.append({"expr": f"count(({original}) - ({rewritten}))", "eval_time": at,
                               "exp_samples": [{"labels": "{}", "value": groups}]})
                checks.append({"expr": f"count(abs(({original}) - ({rewritten})) > 1e-6)", "eval_time": at,
                               "exp_samples": []})
    return checks


def test_every_rewritten_read_gives_the_original_answer_on_prometheus(tmp_path: Path) -> None:
    decisions = _decisions()
    assert all(a.recommended for a in decisions.values()), {m: a.blockers for m, a in decisions.items()}
    rules = [{"record": r.record, "expr": r.expr} for a in decisions.values() for r in a.rules]
    assert {r["record"] for r in rules} == {"Hostname:U:sum", "Hostname:U:count", "Hostname:T:max",
                                            "Hostname:E_total:rate5m"}
    checks = _checks(decisions)
    assert len(checks) == 2 * 3 * sum(len(reads) for reads, _ in READS.values())
    done = _run(tmp_path, rules, checks)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_rule_planted_wrong_fails_the_same_check(tmp_path: Path) -> None:
    decisions = _decisions()
    rules = [{"record": r.record, "expr": r.expr} for a in decisions.values() for r in a.rules]
    for r in rules:
        if r["record"] == "Hostname:T:max":
            r["expr"] = "min by (Hostname) (T)"  # planted: the per-node minimum recorded as the maximum
    done = _run(tmp_path, rules, _checks(decisions))
    assert done.returncode != 0
    assert "Hostname:T:max" in done.stdout + done.stderr
