from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.core.golden import MIN_POINTS, GoldenWindow, WindowShortfall, dashboard_queries, fit_window

DASHBOARD = json.loads((Path(__file__).resolve().parents[3] / "catalog/dashboards/dcgm-exporter-dashboard.json")
                       .read_text())
T0 = 1_000_000 * 30.0  # dual-write settled here (aligned to the step)


def test_real_dashboard_queries_are_extracted() -> None:
    queries = dashboard_queries(DASHBOARD, name="dcgm.json")
    assert len(queries) == 8
    assert queries[0].panel == "GPU Temperature" and queries[0].dashboard == "dcgm.json"
    assert queries[0].expr == 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'


def test_rows_nest_panels() -> None:
    dash = {"panels": [{"type": "row", "title": "r", "panels": [{"title": "p", "targets": [{"expr": "up"}]}]}]}
    assert [q.panel for q in dashboard_queries(dash)] == ["p"]


def fit(expr: str, minutes_of_data: float, step: float = 30.0) -> GoldenWindow | WindowShortfall:
    return fit_window(expr, {}, earliest=T0, latest=T0 + minutes_of_data * 60, step=step)


@pytest.mark.parametrize("expr,starts_after_s", [
    ("rate(x[5m])", 300), ("avg_over_time(x[$__rate_interval])", 120), ("x offset 10m", 600),
    ("max_over_time(rate(x[1m])[10m:1m])", 660), ("x", 0), ("sum(x) or vector(0)", 0),
])
def test_window_starts_after_the_look_back(expr: str, starts_after_s: float) -> None:
    w = fit(expr, 60)
    assert isinstance(w, GoldenWindow)
    assert w.start == T0 + starts_after_s and w.end == T0 + 3600


def test_range_window_is_the_longest_whose_own_range_fits() -> None:
    w = fit("max_over_time(x[$__range])", 60)
    assert isinstance(w, GoldenWindow)
    # $__range is the window itself: the window starts a whole window after dual-write began.
    assert w.start - (w.end - w.start) >= T0 and w.expr == f"max_over_time(x[{int(w.end - w.start)}s])"
    assert w.end - w.start == 1800


def test_short_dual_write_says_how_long_to_wait() -> None:
    short = fit("rate(x[5m])", 5)  # 5 minutes of settled data, 5 minutes of look-back, 3 points needed
    assert isinstance(short, WindowShortfall)
    assert short.wait_s == (MIN_POINTS - 1) * 30
    assert "needs 5m of dual-write before the window" in short.reason and "wait 1m" in short.reason


def test_read_ahead_ends_the_window_early_and_waits_when_it_cannot() -> None:
    w = fit("x offset -5m", 60)
    assert isinstance(w, GoldenWindow) and w.end == T0 + 3600 - 300
    short = fit("x offset -5m", 5)
    assert isinstance(short, WindowShortfall) and "reads 5m ahead" in short.reason and short.wait_s == 60
    at_end = fit("x @ end()", 60)
    assert isinstance(at_end, GoldenWindow) and at_end.end == T0 + 3600


def test_fixed_at_before_dual_write_is_never_comparable() -> None:
    never = fit("x @ 100", 60)
    assert isinstance(never, WindowShortfall) and never.wait_s is None and "never comparable" in never.reason


class NoServer:
    """Any query is a test failure: these cases must be decided without asking a backend."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"unexpected backend call {name}")


def _golden(tmp_path: Path, exprs: list[str], **parity: object) -> tuple[list, dict]:  # type: ignore[type-arg]
    import dataclasses

    from promshift.adapters.parity_check import ParityCheck
    from promshift.adapters.settings import load_catalog

    (tmp_path / "d.json").write_text(json.dumps({"panels": [{"title": f"p{i}", "targets": [{"expr": e}]}
                                                            for i, e in enumerate(exprs)]}))
    group = load_catalog().get("gpu-memory")
    policy = dataclasses.replace(group.parity, golden_dashboards=("d.json",), **parity)  # type: ignore[arg-type]
    check = ParityCheck(dataclasses.replace(group, parity=policy), NoServer(), NoServer(),  # type: ignore[arg-type]
                        catalog_dir=tmp_path)
    return check.golden(T0, T0 + 3600)


def test_inventory_names_every_expression_and_a_group_without_queries_has_no_golden_layer(tmp_path: Path) -> None:
    exprs = ["DCGM_FI_DEV_GPU_TEMP", 'DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname"}', "rate(DCGM_FI_DEV_FB_USED)",
             "vector(1)"]
    measurements, inventory = _golden(tmp_path, exprs[:1])
    assert measurements == [] and inventory.summary.startswith("no golden layer")
    measurements, _ = _golden(tmp_path, exprs[:1], golden_required=True)
    assert [(m.name, m.verdict.value) for m in measurements] == [("golden", "INCONCLUSIVE")]
    measurements, inventory = _golden(tmp_path, exprs)
    assert [row.disposition for row in inventory.queries] == [
        "not this group's metrics", "needs variable $Hostname", "unsupported", "not this group's metrics"]
    assert "expected type matrix" in str(inventory.queries[2].detail)
    assert [(m.name, m.verdict.value) for m in measurements] == [("golden[p1]", "INCONCLUSIVE"),
                                                                ("golden[p2]", "INCONCLUSIVE")]
    json.dumps(inventory.to_dict(), allow_nan=False)
