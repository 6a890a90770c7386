"""Issue 39, items 1 and 2: whether a point exists is noise too under two scrapers, and the window starts where
both sides can answer. Synthetic scrapes of a fleet, bucketed as the samples layer asks for them."""

from __future__ import annotations

import math
import random

import pytest

from promshift.core.parity import (
    INDEPENDENT_NOISE_K,
    SampleComparison,
    comparison_step,
    comparison_window,
    coverage_measurement,
    credit_edges,
    edge_allowance,
    near_gap,
    scrape_interval_of,
    settle_time,
)
from promshift.core.verdicts import Verdict

INTERVAL = 2.0  # both scrapers
STEP = 5.0
START, END = 1000.0, 1200.0  # the window's grid: 41 instants
GRID = (START, END, STEP)
HOSTS = 16
REBOOTED = 5  # of HOSTS: down 60 s, counters restart


def scrape_times(phase: float, *, down: tuple[float, float] | None) -> list[float]:
    """One scraper's sample times for one host: every INTERVAL from its phase, none while the host is down."""
    first = START - 2 * STEP - INTERVAL + phase
    times = [first + k * INTERVAL for k in range(int((END - START + 3 * STEP) / INTERVAL))]
    return [t for t in times if down is None or not down[0] <= t < down[1]]


def gauge(host: int, gpu: int, t: float, rng: random.Random) -> float:
    return 400 + 40 * math.sin(t / 90 + host) + 5 * gpu + 12 * (rng.random() - 0.5)


def energy(host: int, gpu: int, t: float, booted: float | None) -> float:
    """A counter growing ~450 J/s; restarted from 0 at ``booted``."""
    base = 0.0 if booted is not None and t >= booted else 1e9 + 1e6 * host
    since = t - booted if booted is not None and t >= booted else t
    return base + (450 + 5 * gpu) * since


def buckets(samples: list[tuple[float, float]], *, counter: bool) -> list[tuple[float, float]]:
    """What the samples layer asks for: ``avg_over_time(x[step])`` of a gauge, ``rate(x[2 step])`` of a counter
    (reset-aware, no extrapolation), at every grid instant where the side has enough samples."""
    out = []
    for k in range(int((END - START) / STEP) + 1):
        t = START + k * STEP
        span = 2 * STEP if counter else STEP
        inside = [(ts, v) for ts, v in samples if t - span < ts <= t]
        if counter:
            if len(inside) < 2:
                continue
            increase = sum(b - a if b >= a else b for (_, a), (_, b) in zip(inside, inside[1:], strict=False))
            out.append((t, increase / (inside[-1][0] - inside[0][0])))
        elif inside:
            out.append((t, sum(v for _, v in inside) / len(inside)))
    return out


Side = dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]


def fleet(phase: float, seed: int, *, outage_shift: float = 0.0, reboots: bool = True) -> Side:
    """One scraper's buckets for the fleet: two gauges and a counter on 8 GPUs per host; hosts 0-4 go down for
    60 s (staggered) and come back with their counter restarted. ``outage_shift``: this scraper's clock sees the
    node's edges that much later (the issue's 0.3 s)."""
    rng = random.Random(seed)
    out: Side = {}
    for h in range(HOSTS):
        host = f"gpu-node-{h:04d}"
        begins = START + 21.3 + 29.1 * h + outage_shift
        down = (begins, begins + 60) if reboots and h < REBOOTED else None
        times = scrape_times(phase, down=down)
        for g in range(8):
            for metric, counter in (("POWER:avg5s", False), ("TEMP:avg5s", False), ("ENERGY:rate10s", True)):
                if counter:
                    raw = [(t, energy(h, g, t, down[1] if down else None)) for t in times]
                else:
                    raw = [(t, gauge(h, g, t, rng) * (0.15 if metric.startswith("TEMP") else 1)) for t in times]
                out[(("Hostname", host), ("__name__", metric), ("gpu", str(g)))] = buckets(raw, counter=counter)
    return out


def judged(source: Side, target: Side, *, edges: bool = True) -> SampleComparison:
    c = SampleComparison(abs_tol=1e-9, rel_tol=1e-9, noise_k=INDEPENDENT_NOISE_K, host_labels=("Hostname",),
                         grid=GRID if edges else None, edge_s=edge_allowance(INTERVAL, STEP) if edges else 0.0)
    c.add(source, target)
    return c


def test_two_scrapers_and_a_reboot_are_successful() -> None:
    """5 of 16 nodes down 60 s, counters restarting, the edges seen 0.3 s apart: the points one side lacks next to
    the other side's gap are the scrapers' noise, not a missing series (the false FAILED of issue 39)."""
    source, target = fleet(0.0, 1), fleet(0.3, 2, outage_shift=0.3)
    before = judged(source, target, edges=False).measurement(["q"])
    assert before.verdict == Verdict.FAILED and "points missing on target" in before.reason  # the old rule
    c = judged(source, target)
    m = c.measurement(["q"])
    assert m.verdict == Verdict.SUCCESSFUL, m.reason
    assert c.edge_points > 0 and c.missing_points == 0 and c.missing_series == 0
    assert "points missing on one side within 7s of a gap on the other" in m.reason
    assert m.numbers["edges"] == {"points": c.edge_points, "series": c.edge_series, "within_s": 7.0}


def test_reboots_are_successful_whatever_the_scrapers_phases() -> None:
    rng = random.Random(7)
    old_failed = 0
    for seed in range(20):
        phases = (rng.uniform(0, INTERVAL), rng.uniform(0, INTERVAL))
        source, target = fleet(phases[0], 2 * seed), fleet(phases[1], 2 * seed + 1, outage_shift=rng.uniform(0, 1))
        m = judged(source, target).measurement(["q"])
        assert m.verdict == Verdict.SUCCESSFUL, (phases, m.reason)
        old_failed += judged(source, target, edges=False).measurement(["q"]).verdict == Verdict.FAILED
    assert old_failed >= 5  # the old rule failed healthy pairs this way


def drop(side: Side, share: float, *, seed: int, stretch: bool) -> Side:
    """The target silently loses ``share`` of its points: one contiguous stretch per series, or scattered."""
    rng = random.Random(seed)
    out: Side = {}
    for labels, points in side.items():
        if stretch:
            n = max(1, round(share * len(points)))
            at = rng.randrange(0, len(points) - n)
            out[labels] = points[:at] + points[at + n:]
        else:
            out[labels] = [p for p in points if rng.random() >= share]
    return out


@pytest.mark.parametrize("stretch", [True, False])
def test_a_silent_two_percent_loss_still_fails(stretch: bool) -> None:
    """The target loses 2 % of its points where the source has no gap: a genuinely missing stretch, FAILED."""
    source, target = fleet(0.0, 1, reboots=False), fleet(0.3, 2, reboots=False)
    lossy = drop(target, 0.02, seed=3, stretch=stretch)
    c = judged(source, lossy)
    m = c.measurement(["q"])
    assert m.verdict == Verdict.FAILED and "points missing on target" in m.reason, m.reason
    assert c.missing_points > 0 and c.edge_points == 0


def test_a_loss_next_to_a_reboot_fails_beyond_the_allowance() -> None:
    """A reboot does not excuse a longer stretch: points missing further than one interval and a step from the
    source's gap still count."""
    source, target = fleet(0.0, 1), fleet(0.3, 2, outage_shift=0.3)
    host0 = {k: v for k, v in target.items() if dict(k)["Hostname"] == "gpu-node-0000"}
    # Host 0's outage on the source ends at START + 80 (the first bucket after it ~START + 85): the target loses
    # 30 s after its own recovery, silently.
    lossy = {**target, **{k: [p for p in v if not START + 80 <= p[0] < START + 115] for k, v in host0.items()}}
    c = judged(source, lossy)
    assert c.measurement(["q"]).verdict == Verdict.FAILED and c.missing_points > 0


def test_a_series_only_at_the_edge_is_noise_but_a_missing_one_is_not() -> None:
    grid_points = [(START + k * STEP, 1.0) for k in range(41)]
    edge_only = [(START, 1.0)]  # the source saw the host once more before it went down for the whole window
    a, b = (("Hostname", "a"), ("__name__", "m")), (("Hostname", "b"), ("__name__", "m"))
    c = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=GRID, edge_s=7.0)
    c.add({a: edge_only, b: grid_points}, {b: grid_points})
    assert (c.edge_series, c.missing_series) == (1, 0) and c.measurement(["q"]).verdict == Verdict.SUCCESSFUL
    c = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=GRID, edge_s=7.0)
    c.add({a: grid_points, b: grid_points}, {b: grid_points})
    assert c.missing_series == 1 and c.measurement(["q"]).verdict == Verdict.FAILED
    # Only on the target, and only next to the target's own gap: the source saw the edge apart.
    c = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=GRID, edge_s=7.0)
    c.add({b: grid_points}, {a: [(END, 1.0)], b: grid_points})
    assert (c.edge_series, c.extra_series) == (1, 0)
    # dual_write (no noise model): every missing point counts, whatever the grid.
    exact = SampleComparison(abs_tol=0, rel_tol=0, grid=GRID, edge_s=7.0)
    exact.add({b: grid_points}, {b: grid_points[:-1]})
    assert exact.missing_points == 1 and exact.measurement(["q"]).verdict == Verdict.FAILED


def test_near_gap_reads_the_grid() -> None:
    points = [(START + k * STEP, 1.0) for k in range(41) if k not in (10, 11)]
    at = near_gap(points, GRID, 7.0)
    assert at(START + 9 * STEP) and at(START + 12 * STEP) and at(START + 8 * STEP + 3)
    assert not at(START + 8 * STEP) and not at(START + 14 * STEP)
    assert not near_gap([(START + k * STEP, 1.0) for k in range(41)], GRID, 7.0)(START)


def test_coverage_credits_an_edge_seen_apart_but_not_a_missing_host() -> None:
    """At an instant the target has not yet seen host h come back (the source has): its wide count (a sample
    within the allowance) credits it. A host the target never has stays missing; a host only on the target
    stays extra unless the source saw it within the allowance too."""
    src = {(("Hostname", "h"),): 8.0, (("Hostname", "k"),): 8.0}
    tgt = {(("Hostname", "k"),): 8.0}
    s, g, credited = credit_edges((src, tgt), ({}, {(("Hostname", "h"),): 8.0, (("Hostname", "k"),): 8.0}))
    assert g[(("Hostname", "h"),)] == 8.0 and credited == 8
    s, g, credited = credit_edges((src, tgt), ({}, {(("Hostname", "k"),): 8.0}))
    assert g.get((("Hostname", "h"),), 0.0) == 0.0 and credited == 0
    hosts = [(1.0, {"h": s.get((("Hostname", "h"),), 0.0), "k": 8.0},
              {"h": g.get((("Hostname", "h"),), 0.0), "k": 8.0})]
    assert coverage_measurement(hosts, max_missing_ratio=0.0, queries=[], key="host").verdict == Verdict.FAILED
    # Only on the target at the instant: credited on the source from its own wide count, up to the target's.
    s, g, credited = credit_edges(({}, {(("Hostname", "h"),): 8.0}), ({(("Hostname", "h"),): 6.0}, {}))
    assert s == {(("Hostname", "h"),): 6.0} and credited == 6


# -- item 2: the step and the window ---------------------------------------------------------------------------

CONFIG = """
global:
  scrape_interval: 15s
scrape_configs:
  - job_name: dcgm
    scrape_interval: 5s
    static_configs: [{targets: ['a:9400']}]
  - job_name: node
    static_configs: [{targets: ['a:9100']}]
"""


def test_the_scrape_interval_of_the_groups_jobs_comes_from_the_config() -> None:
    assert scrape_interval_of(CONFIG, ["dcgm"]) == (5.0, "scrape_interval 5s of job 'dcgm'")
    assert scrape_interval_of(CONFIG, ["dcgm", "node"])[0] == 15.0  # the slowest of the group's jobs
    assert scrape_interval_of(CONFIG, ["federated"]) == (15.0, "scrape_interval 15s of global (job 'federated' "
                                                                "not in the config)")
    assert scrape_interval_of("scrape_configs: []", [])[0] == 60.0  # Prometheus' default
    with pytest.raises(ValueError):
        scrape_interval_of("- a list", ["dcgm"])


def test_a_step_below_the_scrape_interval_is_raised_and_said_so() -> None:
    assert comparison_step(5.0, 2.0) == (5.0, None)
    assert comparison_step(5.0, None) == (5.0, None)
    step, note = comparison_step(2.0, 5.0)
    assert step == 5.0 and note is not None and note.startswith("step raised from 2s to 5s")


def test_the_first_instant_is_a_scrape_interval_after_dual_write_began() -> None:
    """A 2 s step on 5 s scrapes: two steps of settling put the first instant 4 s after dual-write began, where
    the source still answers from a sample scraped before it (the false FAILED of issue 39). Now the step is
    raised to the interval and the first instant is at least an interval and a step later."""
    since = 1001.9
    old = comparison_window(dual_write_since=since, now=1100, skip_recent_s=10, step=2.0, settle_s=2 * 2.0)
    assert old is not None and old[0] - since < 5.0
    step, _ = comparison_step(2.0, 5.0)
    new = comparison_window(dual_write_since=since, now=1100, skip_recent_s=10, step=step,
                            settle_s=settle_time(step, 5.0))
    assert new is not None and new[0] - since >= 5.0 + step
    # Never earlier than the two steps it always had.
    assert settle_time(30.0, 5.0) == 60.0 and settle_time(30.0) == 60.0


def test_a_host_with_one_read_in_the_window_gets_its_siblings_noise() -> None:
    """A host that was down for most of the window has one read per series on each side, at different instants:
    its window average is one read's noise apart, which its own (empty) spread cannot show."""
    from promshift.core.parity import independent_aggregate_measurement

    rng = random.Random(3)
    src = {f"h{i}": 4000.0 + 10 * i for i in range(16)}
    tgt = {h: v + rng.gauss(0, 3) for h, v in src.items()}
    tgt["h0"] = src["h0"] + 52.0  # one read each, 52 W apart (a per-read sd of ~60 W over 8 GPUs)
    model = {"avg P": {h: (0.0 if h == "h0" else 2 * 60.0 ** 2 / 17) for h in src}}
    reads = {"avg P": {h: (1.0 if h == "h0" else 17.0) for h in src}}
    without = independent_aggregate_measurement([("avg P", src, tgt)], model_var=model, abs_tol=1e-9, rel_tol=1e-9,
                                                queries=["q"])
    assert without.verdict == Verdict.FAILED and "h0" in without.reason  # the false FAILED
    m = independent_aggregate_measurement([("avg P", src, tgt)], model_var=model, reads=reads, abs_tol=1e-9,
                                          rel_tol=1e-9, queries=["q"])
    assert m.verdict == Verdict.SUCCESSFUL, m.reason
    # A host with its full reads keeps its own noise: a 5 % drift on it still fails.
    drifted = dict(tgt, h5=src["h5"] * 1.05)
    m = independent_aggregate_measurement([("avg P", src, drifted)], model_var=model, reads=reads, abs_tol=1e-9,
                                          rel_tol=1e-9, queries=["q"])
    assert m.verdict == Verdict.FAILED and "h5" in m.reason


def test_a_gap_just_before_the_window_is_seen() -> None:
    """A host came back just before the window: the source's first bucket is the window's first instant, the
    target's a step later. The gap lies outside the window, so the comparison reads past it (``span`` inside a
    wider ``grid``) to see it; without the wider grid the missing first point would read as a loss."""
    a = (("Hostname", "a"), ("__name__", "m:rate10s"))
    source = [(START + k * STEP, 1.0) for k in range(41)]  # from the window's start, after a gap before it
    target = source[1:]
    narrow = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=GRID, edge_s=7.0)
    narrow.add({a: source}, {a: target})
    assert narrow.missing_points == 1  # no gap in sight inside the window alone
    wide = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=(START - 10, END + 10, STEP),
                            span=(START, END), edge_s=7.0)
    wide.add({a: source + [(END + 5, 1.0), (END + 10, 1.0)]}, {a: [(START - 10, 1.0), *target, (END + 5, 1.0)]})
    assert (wide.missing_points, wide.edge_points, wide.points_compared) == (0, 1, 40)
    assert wide.measurement(["q"]).verdict == Verdict.SUCCESSFUL
    # Points beyond the window are never compared: a difference there is not this window's.
    beyond = SampleComparison(abs_tol=0, rel_tol=0, noise_k=INDEPENDENT_NOISE_K, grid=(START - 10, END + 10, STEP),
                              span=(START, END), edge_s=7.0)
    beyond.add({a: [*source, (END + 5, 1.0)]}, {a: [*source, (END + 5, 9.0)]})
    assert beyond.points_compared == 41 and beyond.mismatches == 0


def test_a_doubled_write_still_fails() -> None:
    """Both replicas of an HA pair written to the target: every host's window aggregate doubles. The edge
    allowance and the few-reads variance change nothing there."""
    from promshift.core.parity import independent_aggregate_measurement

    src = {f"h{i}": 4000.0 + 10 * i for i in range(16)}
    model = {"avg P": {h: 2 * 60.0 ** 2 / 17 for h in src}}
    reads = {"avg P": {h: (1.0 if h == "h0" else 17.0) for h in src}}
    m = independent_aggregate_measurement([("avg P", src, {h: 2 * v for h, v in src.items()})], model_var=model,
                                          reads=reads, abs_tol=1e-9, rel_tol=1e-9, queries=["q"])
    assert m.verdict == Verdict.FAILED and "reads 100.0% higher on the target" in m.reason, m.reason
    # Coverage: the doubled target is never credited down, nor the source up beyond its own wide count.
    s, g, credited = credit_edges(({"h": 8.0}, {"h": 16.0}), ({"h": 8.0}, {"h": 16.0}))
    assert (s, g, credited) == ({"h": 8.0}, {"h": 16.0}, 0)
