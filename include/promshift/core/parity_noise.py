"""Parity's noise model: engine rounding and tolerances, two independent scrapers' jitter and the bias model, and the
per-host window aggregates judged against that noise. Re-exported by ``core.parity``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from promshift.core.evidence import json_safe
from promshift.core.parity_labels import LabelSet, Points, _some
from promshift.core.verdicts import Measurement, Verdict

# The relative tolerance of a compared query per function family, when the pair is declared as different engines
# (``parity.engines: different``). The same engine (dual-write from one Prometheus into Prometheus or AMP, which
# runs Prometheus' engine) computes the same floats: the catalog's tolerance (1e-9 by default) stands. Different
# engines agree on these functions only to the rounding of their arithmetic: measured on VictoriaMetrics, ``deriv``
# differed from Prometheus by 1.9e-9 relative (issue 39); least squares, variances, quantile interpolation and
# smoothing all sum products in an order of their own. 1e-6 is a thousand times that and still a millionth of the
# value: a real difference (a lost sample, a 0.1 % drift) stays far beyond it. Functions whose meaning differs
# between engines (VictoriaMetrics' ``rate`` does not extrapolate) are not rounding: no tolerance makes them agree.
ENGINE_ROUNDING: dict[str, tuple[frozenset[str], float]] = {
    "regression": (frozenset({"deriv", "predict_linear"}), 1e-6),
    "variance": (frozenset({"stddev", "stdvar", "stddev_over_time", "stdvar_over_time"}), 1e-6),
    "quantile": (frozenset({"quantile", "quantile_over_time", "histogram_quantile"}), 1e-6),
    "smoothing": (frozenset({"holt_winters", "double_exponential_smoothing"}), 1e-6),
    "summation": (frozenset({"sum", "avg", "sum_over_time", "avg_over_time"}), 1e-8),
}


def engine_tolerance(functions: Iterable[str], *, engines: str, rel_tol: float) -> tuple[float, dict[str, Any] | None]:
    """The relative tolerance a query calling ``functions`` is compared with, and why when it is not ``rel_tol``.

    Same engines: ``rel_tol``. Different engines: the widest of ``ENGINE_ROUNDING``'s families the query calls (never
    below ``rel_tol``), recorded with the functions and the reason.
    """
    if engines != "different":
        return rel_tol, None
    used = set(functions)
    hits = {family: (sorted(names & used), tol) for family, (names, tol) in ENGINE_ROUNDING.items() if names & used}
    widest = max((tol for _, tol in hits.values()), default=0.0)
    if widest <= rel_tol:
        return rel_tol, None
    family = next(f for f, (_, tol) in hits.items() if tol == widest)
    return widest, {"rel_tolerance": widest, "family": family, "functions": hits[family][0],
                    "reason": f"parity.engines: different: {', '.join(hits[family][0])} ({family}) round differently "
                              f"between engines; {widest:g} relative instead of {rel_tol:g}"}


def values_equal(a: float, b: float, *, abs_tol: float, rel_tol: float) -> bool:
    """Equal within tolerance; NaN equals NaN, infinities equal only themselves."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= abs_tol + rel_tol * max(abs(a), abs(b))


# independent_scraper: two scrapers read a noisy gauge at different instants, so a point may differ by the
# series' own scrape-to-scrape variation. Allowed on top of the tolerance: NOISE_K times the standard deviation
# of the source series' successive differences in the window (for two independent reads of a process with
# noise sigma, the difference has sigma*sqrt(2), as successive differences do). Point by point that is a screen
# for gross corruption only (OUTLIER_SHARE of the points may exceed it); what decides is the bias model below.
INDEPENDENT_NOISE_K = 4.0
# A share of points beyond NOISE_K spreads that two healthy scrapers may show (heavy-tailed jitter, a late
# scrape at a bucket's edge); more is a finding.
OUTLIER_SHARE = 0.05
# The bias model: per metric (and per metric and host) the mean target-minus-source difference over every
# compared series must stay within BIAS_K standard errors of what the data's own noise gives it, plus the
# sampling-phase term, with the catalog tolerance as the floor. 6 standard errors: over ~100 tests per run
# (metrics x hosts) a healthy scrape is flagged about once in 10^7 runs under normal noise, while a 5 %
# bias on a metric of a 10-host sample (standard error ~0.2 % of the value) is 25 standard errors out.
BIAS_K = 6.0


def noise_allowance(mode: str) -> float:
    """A parity mode's ``noise_k``: 0 for ``dual_write`` (both sides hold the same samples), else
    ``INDEPENDENT_NOISE_K``."""
    return 0.0 if mode == "dual_write" else INDEPENDENT_NOISE_K


def successive_spread(points: Points) -> float:
    """Standard deviation of the finite successive differences of ``points`` (0 with fewer than two)."""
    values = [v for _, v in points if math.isfinite(v)]
    diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
    if len(diffs) < 2:
        return 0.0
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))


def _either(a: Callable[[float], bool], b: Callable[[float], bool]) -> Callable[[float], bool]:
    return lambda t: a(t) or b(t)


def pooled_spreads(source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points]) -> dict[str, float]:
    """Per metric, the median successive-difference spread of the batch's series that have one (three values or
    more, on the side with the larger): the noise of a series too short to show its own (a host that was down for
    most of the window), as its siblings read on the same scrapers show it."""
    per_metric: dict[str, list[float]] = {}
    for labels, points in source.items():
        other = target.get(labels, ())
        own = [successive_spread(p) for p in (points, other) if _finite_count(p) >= 3]
        if own:
            per_metric.setdefault(dict(labels).get("__name__", ""), []).append(max(own))
    return {m: sorted(v)[len(v) // 2] for m, v in per_metric.items()}


def _finite_count(points: Points) -> int:
    return sum(1 for _, v in points if math.isfinite(v))


def _own_spread(src: Points, tgt: Points, pooled: float) -> tuple[float, float]:
    """Each side's successive-difference spread; a side with fewer than three values has none of its own and
    takes ``pooled`` (its metric's, from ``pooled_spreads``)."""
    return tuple(successive_spread(p) if _finite_count(p) >= 3 else pooled for p in (src, tgt))  # type: ignore[return-value]


def _mean_step(points: Points) -> float:
    """The series' mean change per step (its trend): what a sampling-phase shift of up to one step costs."""
    values = [v for _, v in points if math.isfinite(v)]
    return abs(values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 0.0


# Per key (a metric, or a metric and a host), sums over its series: count, sum and sum of squares of each
# series' mean difference, the model variance of that mean, the phase term and the mean magnitude.
_BIAS_FIELDS = ("series", "sum_d", "sum_d2", "sum_model_var", "sum_phase", "sum_scale")


def bias_findings(stats: Mapping[str, Sequence[float]], *, abs_tol: float, rel_tol: float,
                  k: float = BIAS_K) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Keys whose mean target-minus-source difference is beyond the two scrapers' own noise.

    ``stats`` maps ``metric`` or ``metric\x00host`` to the ``_BIAS_FIELDS`` sums. The expected
    difference of two independent scrapes is estimated from the data itself: the standard error
    of the mean difference is the larger of the spread of the series' own mean differences
    (between series) and the model one (each side's neighbouring-sample spread: the variance of
    one read is half that of successive differences; a series' mean of P points has 1/P of it);
    the sampling phase (the scrapers read at different instants of each step) adds the series'
    trend over one step. The catalog tolerance is the floor. Returns the findings (metric-level
    first; a host only for metrics not already named) and, per metric, the evidence.
    """
    findings: list[dict[str, Any]] = []
    evidence: dict[str, Any] = {}
    flagged: set[str] = set()
    metric_var: dict[str, float] = {}
    for key in sorted(stats, key=lambda k: ("\x00" in k, k)):
        n, sum_d, sum_d2, sum_model, sum_phase, sum_scale = (float(x) for x in stats[key])
        if n <= 0:
            continue
        metric, _, host = key.partition("\x00")
        bias = sum_d / n
        between = max(0.0, (sum_d2 - n * bias * bias) / (n - 1)) if n > 1 else 0.0
        var = max(between, sum_model / n)
        if not host:
            metric_var[metric] = var
        else:
            # A host's few series say little about their own spread: the metric's (all hosts) stands in.
            var = max(var, metric_var.get(metric, 0.0))
        se = math.sqrt(var / n)
        scale = sum_scale / n
        allowed = abs_tol + rel_tol * scale + k * se + sum_phase / n
        row = {"metric": metric, "series": int(n), "bias": bias, "allowed": allowed, "standard_error": se,
               "relative": bias / scale if scale else None}
        if host:
            row["host"] = host
        elif len(evidence) < 50:
            evidence[metric] = json_safe({k: v for k, v in row.items() if k != "metric"})
        if abs(bias) > allowed and (not host or metric not in flagged):
            findings.append(json_safe(row))
            if not host:
                flagged.add(metric)
    return findings, evidence


def describe_bias(findings: Sequence[Mapping[str, Any]], limit: int = 3) -> str:
    """E.g. ``DCGM_FI_DEV_POWER_USAGE:avg5s reads 5.0 % higher on the target (+17.4; noise allows 1.1)``."""
    parts = []
    for f in findings[:limit]:
        rel = f.get("relative")
        size = f"{abs(rel):.1%} {'higher' if f['bias'] > 0 else 'lower'}" if isinstance(rel, float) else (
            f"{f['bias']:+.4g}")
        where = f" on host {f['host']}" if f.get("host") else ""
        parts.append(f"{f['metric'] or 'the answer'}{where} reads {size} on the target ({f['bias']:+.4g}; the "
                     f"scrapers' own noise allows {f['allowed']:.3g})")
    more = f" and {len(findings) - limit} more" if len(findings) > limit else ""
    return "; ".join(parts) + more


def _robust_sd(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation: the spread of most values, untouched by a few outliers."""
    if len(values) < 5:
        return 0.0
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    dev = sorted(abs(v - mid) for v in values)
    return 1.4826 * dev[len(dev) // 2]


def _few_reads_variance(model_var: Mapping[str, float], reads: Mapping[str, float]) -> dict[str, float]:
    """Per host with fewer than three reads in the window, the pooled per-read variance over its reads."""
    per_read = sorted(v * reads[h] for h, v in model_var.items() if reads.get(h, 0.0) >= 3)
    if not per_read:
        return {}
    pooled = per_read[len(per_read) // 2]
    return {h: pooled / max(n, 1.0) for h, n in reads.items() if n < 3}


def independent_aggregate_measurement(rows: Sequence[tuple[str, Mapping[str, float], Mapping[str, float]]], *,
                                      model_var: Mapping[str, Mapping[str, float]],
                                      edge_share: Mapping[str, Mapping[str, float]] | None = None,
                                      reads: Mapping[str, Mapping[str, float]] | None = None,
                                      abs_tol: float, rel_tol: float, queries: Sequence[str],
                                      explained: Iterable[str] = (), k: float = BIAS_K) -> Measurement:
    """Per-host window aggregates of two independent scrapers, judged against their own noise.

    For each metric (``rows``: what, source by host, target by host) and host, the difference
    ``d = target - source`` is allowed the catalog floor plus ``k`` times its expected spread:
    the larger of the model (``model_var[what][host]``: each side's variance of the window
    mean from its own samples, both sides counted) and the spread of ``d`` across the hosts
    (robust: a few biased hosts do not widen it); a host's own check also allows ``edge_share``
    of its value (``edge_share[what][host]``; for a counter's window rate: each end may hold a
    value up to one scrape older or newer than its timestamp, as an exporter that collects on its
    own clock gives, 2 / samples in the window). A metric whose mean and median difference over the
    hosts are beyond its standard error (the larger of the model's and the hosts' own spread over
    the square root of their number) is named as biased; otherwise a host beyond its own
    allowance is named with the metric. ``reads`` (``reads[what][host]``: the source's samples per series
    in the window): a host with fewer than three (down for most of the window, at an outage's edge) cannot
    show its own spread, so its model variance is at least its siblings' per-read variance (the median over
    the hosts that can) over its own reads.
    """
    edge_share = edge_share or {}
    reads = reads or {}
    compared = 0
    biased: list[dict[str, Any]] = []
    hosts_off: dict[str, list[str]] = {}
    worst: list[dict[str, Any]] = []
    evidence: dict[str, Any] = {}
    for what, src, tgt in rows:
        common = [h for h in src if h in tgt and math.isfinite(src[h]) and math.isfinite(tgt[h])]
        if not common:
            continue
        compared += len(common)
        diffs = {h: tgt[h] - src[h] for h in common}
        across = _robust_sd(list(diffs.values())) ** 2
        few = _few_reads_variance(model_var.get(what, {}), reads.get(what, {}))
        allowed: dict[str, float] = {}
        variances: dict[str, float] = {}
        for h in common:
            scale = max(abs(src[h]), abs(tgt[h]))
            variances[h] = max(model_var.get(what, {}).get(h, 0.0), across, few.get(h, 0.0))
            edge = edge_share.get(what, {}).get(h, 0.0) * scale
            allowed[h] = abs_tol + rel_tol * scale + edge + k * math.sqrt(variances[h])
        n = len(common)
        bias = sum(diffs.values()) / n
        spread = (sum((d - bias) ** 2 for d in diffs.values()) / (n - 1)) if n > 1 else 0.0
        se = max(math.sqrt(sum(variances.values())) / n, math.sqrt(spread / n))
        scale = sum(abs(src[h]) for h in common) / n
        metric_allowed = abs_tol + rel_tol * scale + k * se
        evidence[what] = json_safe({"hosts": n, "bias": bias, "allowed": metric_allowed, "standard_error": se,
                                    "relative": bias / scale if scale else None})
        middle = sorted(diffs.values())[n // 2]
        # The whole metric is biased when its mean and its median both are: a few hosts move the mean only.
        if abs(bias) > metric_allowed and abs(middle) > metric_allowed and n > 1:
            biased.append({"metric": what, "bias": bias, "allowed": metric_allowed,
                           "relative": bias / scale if scale else None})
            continue
        for h in common:
            if abs(diffs[h]) > allowed[h]:
                hosts_off.setdefault(h, []).append(what)
                if len(worst) < 10:
                    worst.append(json_safe({"series": f"{what} {{host={h!r}}}", "problem": "aggregate differs",
                                            "source": src[h], "target": tgt[h], "allowed": allowed[h]}))
    numbers: dict[str, Any] = {"aggregates_compared": compared, "differing_keys": sorted(hosts_off),
                               "biased_metrics": json_safe(biased), "worst": worst,
                               "noise_model": {"per_metric": evidence, "bias_k": k}}
    if compared == 0:
        return Measurement("aggregates", Verdict.INCONCLUSIVE, "no aggregate present on both sides", tuple(queries),
                           numbers)
    if biased or hosts_off:
        parts = []
        if biased:
            parts.append(describe_bias(biased))
        known = set(explained)
        new = sorted(h for h in hosts_off if h not in known)
        if new:
            metrics = sorted({m for h in new for m in hosts_off[h]})
            parts.append(f"window aggregates differ beyond the scrapers' own noise for {_some(new, 'host')} "
                         f"({', '.join(metrics[:3])})")
        old = sorted(h for h in hosts_off if h in known)
        if old:
            parts.append(f"{_some(old, 'host')} differ where series are missing (see host_coverage)")
        numbers["unexplained_keys"] = new
        return Measurement("aggregates", Verdict.FAILED, "; ".join(parts), tuple(queries), numbers)
    return Measurement("aggregates", Verdict.SUCCESSFUL,
                       f"{compared} per-host window aggregates agree within the two scrapers' own noise",
                       tuple(queries), numbers)
