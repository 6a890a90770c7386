"""Parity maths on already-fetched data: coverage counts and raw-sample comparison."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.durations import parse_duration
from promshift.core.errors import ErrorKind
from promshift.core.evidence import json_number, json_safe, number_from_json
from promshift.core.inputs import CONFIG, parse_yaml_bounded
from promshift.core.verdicts import Layer, Measurement, Verdict

LabelSet = tuple[tuple[str, str], ...]
Points = Sequence[tuple[float, float]]


def align_window(start: float, end: float, step: float) -> tuple[float, float]:
    """Round ``start`` up and ``end`` down to multiples of ``step``.

    AMP aligns query timestamps to the step for caching; aligning on both sides makes
    the two answers sample the same instants.
    """
    if step <= 0:
        raise ValueError(f"step must be > 0, got {step}")
    return math.ceil(start / step) * step, math.floor(end / step) * step


def comparison_window(*, dual_write_since: float, now: float, skip_recent_s: float, step: float,
                      settle_s: float = 0.0) -> tuple[float, float] | None:
    """The aligned window fully inside dual-write and older than ``skip_recent_s``, or None.

    ``settle_s`` (at least one scrape interval) keeps out the first instants after the
    reload: there the source still answers from samples scraped before dual-write began,
    which the target never received.
    """
    start, end = align_window(dual_write_since + settle_s, now - skip_recent_s, step)
    return (start, end) if end > start else None


def scrape_interval_of(config_text: str, jobs: Iterable[str]) -> tuple[float, str]:
    """The longest scrape interval of ``jobs`` in a Prometheus config, and where it came from.

    A job's own ``scrape_interval``, else the config's global one, else Prometheus' default (1 m). A job the
    config does not name (federated, or renamed by relabelling) counts with the global interval. No job at
    all: the global interval. Raises ``InputRefused``/``ValueError`` on a config that cannot be read.
    """
    doc = parse_yaml_bounded(config_text, CONFIG) or {}
    if not isinstance(doc, dict):
        raise ValueError("the source's config is not a mapping")
    glob = doc.get("global") if isinstance(doc.get("global"), dict) else {}
    default = parse_duration(str(glob.get("scrape_interval") or "1m"))
    per_job: dict[str, float] = {}
    for job in doc.get("scrape_configs") or []:
        if isinstance(job, dict) and job.get("job_name"):
            own = job.get("scrape_interval")
            per_job[str(job["job_name"])] = parse_duration(str(own)) if own else default
    wanted = sorted(set(jobs))
    if not wanted:
        return default, f"global scrape_interval {default:g}s (no job label on the group's series)"
    found = {j: per_job.get(j, default) for j in wanted}
    job = max(found, key=lambda j: (found[j], j))
    where = f"job {job!r}" if job in per_job else f"global (job {job!r} not in the config)"
    return found[job], f"scrape_interval {found[job]:g}s of {where}"


def comparison_step(step_s: float, scrape_interval_s: float | None) -> tuple[float, str | None]:
    """The step parity compares at: the catalog's, raised to the source's scrape interval when below it.

    Below one scrape interval an instant can fall where the source answers from a sample older than the
    step, which the target (or the other scraper) may not hold: a step is never below the interval.
    Returns the step and, when raised, the sentence that says so in the evidence.
    """
    if scrape_interval_s is None or step_s >= scrape_interval_s:
        return step_s, None
    return scrape_interval_s, (f"step raised from {step_s:g}s to {scrape_interval_s:g}s: below the source's scrape "
                               f"interval an instant can read a sample the other side does not hold")


def settle_time(step_s: float, scrape_interval_s: float | None = None) -> float:
    """How long after dual-write began the first compared instant may be: two steps, and at least one scrape
    interval plus a step (the source's newest sample at that instant was scraped after dual-write began)."""
    return max(2 * step_s, (scrape_interval_s or 0.0) + step_s)


def sample_hosts(hosts: Iterable[str], k: int, seed: str) -> list[str]:
    """A deterministic sample of ``k`` hosts: the same hosts, seed and k give the same answer."""
    ranked = sorted(set(hosts), key=lambda h: hashlib.sha256(f"{seed}\x00{h}".encode()).hexdigest())
    return sorted(ranked[:k])


def normalize_labels(labels: Mapping[str, str], *, ignore: Iterable[str] = (),
                     rename: Mapping[str, str] | None = None) -> LabelSet:
    """Drop ignored labels (external labels, replica labels), apply renames, sort."""
    skip = set(ignore)
    rename = rename or {}
    out: dict[str, str] = {}
    for name, value in labels.items():
        if name in skip:
            continue
        out[rename.get(name, name)] = value
    return tuple(sorted(out.items()))


def without_dropped(series: Mapping[LabelSet, Points], dropped: Iterable[str]) -> dict[LabelSet, Points]:
    """The source's series as the target should hold them after the group's declared ``labeldrop``.

    Each label set loses ``dropped``; series that then share a label set are summed point by point
    (``sum without (dropped)``). Where the drop is safe (the plan's uniqueness check) every series
    stays apart and this is a plain strip; where two collide, the target (which received both under
    one label set) cannot equal their sum, so the comparison fails rather than passing on one of them.
    """
    gone = set(dropped)
    if not gone:
        return dict(series)
    out: dict[LabelSet, Points] = {}
    merged: dict[LabelSet, dict[float, float]] = {}
    for labels, points in series.items():
        key = tuple((k, v) for k, v in labels if k not in gone)
        if key not in out:
            out[key] = points
            continue
        acc = merged.get(key)
        if acc is None:
            acc = merged[key] = {t: v for t, v in out[key]}
        for t, v in points:
            acc[t] = acc.get(t, 0.0) + v
    for key, acc in merged.items():
        out[key] = sorted(acc.items())
    return out


KIND_FROM_METADATA = "source_metadata"
KIND_FROM_DCGM = "dcgm_list"
KIND_DEFAULT = "default"


def metric_kinds(names: Iterable[str], metadata: Mapping[str, Sequence[Mapping[str, str]]],
                 fallback: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per metric, its kind (``counter``, ``gauge``...) and where that came from.

    The source Prometheus's metadata (``/api/v1/metadata``: what its targets declared in ``# TYPE``)
    decides; ``fallback`` (dcgm-exporter's list) only when the source declares no type for a metric,
    only ``unknown``, or conflicting types; a metric in neither is a ``gauge`` (compared per bucket
    average, as an untyped series is) with ``from`` ``default``.
    """
    out: dict[str, dict[str, str]] = {}
    for name in names:
        declared = {e.get("type", "") for e in metadata.get(name, ())} - {"", "unknown"}
        if len(declared) == 1:
            out[name] = {"kind": declared.pop(), "from": KIND_FROM_METADATA}
        elif name in fallback:
            out[name] = {"kind": fallback[name], "from": KIND_FROM_DCGM}
        else:
            out[name] = {"kind": "gauge", "from": KIND_DEFAULT}
        if len(declared) > 1:
            out[name]["conflict"] = ", ".join(sorted(declared))
    return out


@dataclass(frozen=True)
class HostLabels:
    """The names a side may give the host label: the group's own, its declared aliases, undeclared variants.

    ``aliases`` are labels the group's ``rename_labels`` map onto the host label (``{hostname: Hostname}``
    makes ``hostname`` an alias of ``Hostname``): a host found under one is the same host. ``variants``
    are the names an undeclared rename most likely took (the case variants dcgm-exporter's 2026
    ``Hostname`` -> ``hostname`` rename produced): a host found only under one is drift, named as such.
    """

    name: str
    aliases: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()

    @classmethod
    def for_group(cls, host_label: str, rename: Mapping[str, str]) -> HostLabels:
        canonical = rename.get(host_label, host_label)
        aliases = sorted(n for n in set(rename) | set(rename.values())
                         if n != host_label and rename.get(n, n) == canonical)
        cases = {host_label.lower(), host_label[:1].upper() + host_label[1:], host_label[:1].lower() + host_label[1:]}
        return cls(host_label, tuple(aliases), tuple(sorted(cases - {host_label, *aliases})))

    @property
    def names(self) -> tuple[str, ...]:
        """Every name to group by, the host label first."""
        return (self.name, *self.aliases, *self.variants)

    @property
    def declared(self) -> tuple[str, ...]:
        """The host label and its declared aliases: the names a host may carry without drift."""
        return (self.name, *self.aliases)

    def locate(self, labels: Mapping[str, str]) -> tuple[str, str | None]:
        """``(host, None)`` under a declared name, ``(host, variant)`` only under an undeclared one.

        ``("", None)`` when the series has no name of the host label at all.
        """
        for n in self.declared:
            if labels.get(n):
                return labels[n], None
        for n in self.variants:
            if labels.get(n):
                return labels[n], n
        return "", None


def count_hosts(rows: Iterable[tuple[Mapping[str, str], float]], hosts: HostLabels
                ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Sum ``(labels, count)`` rows per host: ``(by_host, by_variant)``.

    ``by_host`` keys hosts found under the host label or a declared alias (``""``: no host label at
    all); ``by_variant`` maps an undeclared variant (e.g. ``hostname``) to the hosts found only under it.
    """
    by_host: dict[str, float] = {}
    by_variant: dict[str, dict[str, float]] = {}
    for labels, n in rows:
        host, variant = hosts.locate(labels)
        into = by_host if variant is None else by_variant.setdefault(variant, {})
        into[host] = into.get(host, 0.0) + n
    return by_host, by_variant


def rename_hint(from_label: str, to_label: str) -> str:
    """The catalog line that would declare a rename, in the words every layer uses."""
    return f"renamed? add `parity.rename_labels: {{{from_label}: {to_label}}}` if intended"


def hosts_per_label(per_side: Mapping[str, Mapping[str, int]], declared: Sequence[str]) -> str:
    """How many hosts each side has under each name of the host label, e.g.
    ``hosts per label name: source Hostname 100; target Hostname 50, hostname 50``.

    ``per_side`` maps ``source``/``target`` to name -> hosts; the ``declared`` names are always shown
    (0 renamed is a fleet that has not started a declared rename), other names only when used.
    """
    parts = []
    for side in ("source", "target"):
        counts = per_side.get(side, {})
        shown = [f"{n} {counts.get(n, 0)}" for n in declared]
        shown += [f"{n} {c}" for n, c in sorted(counts.items()) if n not in declared and c]
        parts.append(f"{side} {', '.join(shown)}")
    return "hosts per label name: " + "; ".join(parts)


def undeclared_rename_note(under: tuple[Mapping[str, Iterable[str]], Mapping[str, Iterable[str]]],
                           label: str) -> str | None:
    """Why a golden answer may differ: hosts found only under an undeclared name of the host label.

    ``under`` (source, target) maps an undeclared name (``hostname``) to the hosts found only under it
    on that side (the host coverage layer's finding); None when there are none.
    """
    parts = []
    for side, found in zip(("source", "target"), under, strict=True):
        for variant, hosts in sorted(found.items()):
            if hosts:
                parts.append(f"`{variant}` instead of `{label}` on {_some(sorted(hosts), 'host')} of the {side}: "
                             f"{rename_hint(variant, label)}")
    return "; ".join(parts) or None


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


def edge_allowance(scrape_interval_s: float, step_s: float) -> float:
    """How far from a gap in one side's series a point may be missing on the other, for two independent scrapers.

    Their phases differ by less than one scrape interval, so each sees an outage begin and end up to one
    interval apart; a sample counts in the step bucket it falls in, which rounds that to the grid (one step).
    """
    return scrape_interval_s + step_s


def near_gap(points: Points, grid: tuple[float, float, float], within_s: float) -> Callable[[float], bool]:
    """A test: is an instant within ``within_s`` of an instant of ``grid`` (start, end, step) where ``points``
    has no value? Points off the grid count as present where they fall."""
    start, end, step = grid
    have = {round(t, 3) for t, _ in points}
    n = int(round((end - start) / step)) if step > 0 else -1
    gaps = [start + k * step for k in range(n + 1) if round(start + k * step, 3) not in have]

    def test(t: float) -> bool:
        i = bisect.bisect_left(gaps, t - within_s - 1e-6)
        return i < len(gaps) and gaps[i] <= t + within_s + 1e-6

    return test


def format_labels(labels: LabelSet) -> str:
    name = dict(labels).get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return f"{name}{{{rest}}}"


@dataclass
class SampleComparison:
    """Running totals of a raw-sample comparison; feed it series, it keeps only counts and offenders."""

    abs_tol: float
    rel_tol: float
    max_offenders: int = 10
    # independent_scraper: each series may also differ by noise_k x its successive-difference spread (0: exact),
    # and the verdict comes from the bias model (``bias_findings``) over every series of a metric and host.
    noise_k: float = 0.0
    # The names of the host label, to key the bias model per host (none: per metric only).
    host_labels: tuple[str, ...] = ()
    # independent_scraper: the window's grid (start, end, step) and how far from a gap in a series a point may be
    # missing on the other side (``edge_allowance``: one scrape interval, the most two scrapers' phases differ,
    # and a step, the bucket a sample rounds into). 0: every missing point counts.
    grid: tuple[float, float, float] | None = None
    edge_s: float = 0.0
    # The compared window inside ``grid`` (None: all of it): points beyond it only show where a gap is.
    span: tuple[float, float] | None = None
    series_compared: int = 0
    points_compared: int = 0
    mismatches: int = 0
    missing_points: int = 0
    missing_series: int = 0
    extra_series: int = 0
    # Points (and whole series) one side lacks next to a gap in the other side's series: the scrapers' noise.
    edge_points: int = 0
    edge_series: int = 0
    offenders: list[dict[str, Any]] = field(default_factory=list)
    bias_stats: dict[str, list[float]] = field(default_factory=dict)

    def _inside(self, side: Mapping[LabelSet, Points]) -> dict[LabelSet, Points]:
        assert self.span is not None
        low, high = self.span
        out = {labels: [p for p in points if low - 1e-6 <= p[0] <= high + 1e-6] for labels, points in side.items()}
        return {labels: points for labels, points in out.items() if points}

    @property
    def judges_edges(self) -> bool:
        return bool(self.noise_k and self.edge_s > 0 and self.grid)

    def _at_edge(self, points: Points) -> Callable[[float], bool]:
        """Whether an instant is within ``edge_s`` of a grid instant where ``points`` has no value (a scrape gap,
        a staleness marker, a restart: whatever left the series without a sample there)."""
        assert self.grid is not None
        return near_gap(points, self.grid, self.edge_s)

    def _offend(self, labels: LabelSet, problem: str, **numbers: Any) -> None:
        if len(self.offenders) < self.max_offenders:
            # An infinite delta (+Inf against a finite value) must stay JSON: the audit store refuses Inf.
            self.offenders.append({"series": format_labels(labels), "problem": problem, **json_safe(numbers)})

    def add(self, source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points]) -> None:
        """Compare one batch (e.g. one host) of normalized series from both sides."""
        pooled = pooled_spreads(source, target) if self.noise_k else {}
        # Each side's gaps, read on the whole grid; points are compared only inside the window (``span``).
        src_gaps = {labels: self._at_edge(points) for labels, points in source.items()} if self.judges_edges else {}
        tgt_gaps = {labels: self._at_edge(points) for labels, points in target.items()} if self.judges_edges else {}
        if self.span is not None and self.judges_edges:
            source, target = self._inside(source), self._inside(target)
        for labels, src_points in source.items():
            tgt_points = target.get(labels)
            at_edge = src_gaps.get(labels)
            if tgt_points is None and at_edge is not None and all(at_edge(t) for t, _ in src_points):
                # The source holds this series only next to its own gaps (a host going down or coming back):
                # the other scraper saw that edge a little earlier or later.
                self.edge_series += 1
                self.edge_points += len(src_points)
                continue
            if tgt_points is None:
                self.missing_series += 1
                self.missing_points += len(src_points)
                self._offend(labels, "missing on target", source_points=len(src_points))
                continue
            self.series_compared += 1
            tgt_by_t = {round(t, 3): v for t, v in tgt_points}
            bad = missing = edge = 0
            worst_delta = 0.0
            spreads = (_own_spread(src_points, tgt_points, pooled.get(dict(labels).get("__name__", ""), 0.0))
                       if self.noise_k else (0.0, 0.0))
            noise = self.noise_k * max(spreads)
            for t, v in src_points:
                tv = tgt_by_t.get(round(t, 3))
                if tv is None:
                    if at_edge is not None and at_edge(t):
                        edge += 1
                    else:
                        missing += 1
                    continue
                self.points_compared += 1
                if not values_equal(v, tv, abs_tol=self.abs_tol + noise, rel_tol=self.rel_tol):
                    bad += 1
                    if not (math.isnan(v) or math.isnan(tv)):
                        worst_delta = max(worst_delta, abs(v - tv))
            self.mismatches += bad
            self.missing_points += missing
            self.edge_points += edge
            if self.noise_k:
                edge_test = _either(at_edge, tgt_gaps[labels]) if at_edge is not None else None
                self._add_bias(labels, src_points, tgt_points, tgt_by_t, spreads, edge_test)
            if bad or missing:
                self._offend(labels, "values differ" if bad else "points missing on target",
                             mismatched_points=bad, missing_points=missing, max_abs_delta=worst_delta)
        for labels in target.keys() - source.keys():
            own = tgt_gaps.get(labels)
            if own is not None and all(map(own, (t for t, _ in target[labels]))):
                self.edge_series += 1  # only next to the target's own gaps: the source saw the edge apart
                continue
            self.extra_series += 1
            self._offend(labels, "only on target")

    def _add_bias(self, labels: LabelSet, src_points: Points, tgt_points: Points,
                  tgt_by_t: Mapping[float, float], spreads: tuple[float, float],
                  at_edge: Callable[[float], bool] | None = None) -> None:
        """Add one series to the bias model. A point next to a gap on either side (``at_edge``) is left out of
        the mean: its step bucket holds fewer samples than the others (as few as one read, or a rate over two),
        so its value is as noisy as its existence; the point screen still judges it."""
        diffs, scale = [], 0.0
        for t, v in src_points:
            tv = tgt_by_t.get(round(t, 3))
            if at_edge is not None and at_edge(t):
                continue
            if tv is not None and math.isfinite(v) and math.isfinite(tv):
                diffs.append(tv - v)
                scale += abs(v)
        if not diffs:
            return
        p = len(diffs)
        d = sum(diffs) / p
        # One read's variance is half the variance of successive differences; each side reads once per point.
        model = (spreads[0] ** 2 + spreads[1] ** 2) / 2 / p
        row = (1.0, d, d * d, model, max(_mean_step(src_points), _mean_step(tgt_points)), scale / p)
        as_dict = dict(labels)
        metric = as_dict.get("__name__", "")
        host = next((as_dict[n] for n in self.host_labels if as_dict.get(n)), "")
        for key in (metric, f"{metric}\x00{host}") if host else (metric,):
            acc = self.bias_stats.setdefault(key, [0.0] * len(_BIAS_FIELDS))
            for i, x in enumerate(row):
                acc[i] += x

    def findings(self) -> list[dict[str, Any]]:
        """The bias model's findings (independent scrapers only; empty for exact comparisons)."""
        if not self.noise_k:
            return []
        return bias_findings(self.bias_stats, abs_tol=self.abs_tol, rel_tol=self.rel_tol)[0]

    COUNTS = ("series_compared", "points_compared", "mismatches", "missing_points", "missing_series",
              "extra_series", "edge_points", "edge_series")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe totals, so shards (mapped tasks) can hand them to a reducer."""
        out = {**{k: getattr(self, k) for k in self.COUNTS}, "offenders": list(self.offenders)}
        if self.judges_edges:
            out["edge_s"] = self.edge_s
        if self.bias_stats:
            out["bias_stats"] = {k: list(v) for k, v in self.bias_stats.items()}
        return out

    def merge(self, shard: Mapping[str, Any]) -> None:
        """Add one shard's totals (from ``to_dict``) into this comparison."""
        for k in self.COUNTS:
            setattr(self, k, getattr(self, k) + int(shard.get(k, 0)))
        if shard.get("edge_s") and not self.edge_s:
            self.edge_s = float(shard["edge_s"])
        room = self.max_offenders - len(self.offenders)
        self.offenders.extend(list(shard.get("offenders", []))[:max(0, room)])
        for key, row in (shard.get("bias_stats") or {}).items():
            acc = self.bias_stats.setdefault(key, [0.0] * len(_BIAS_FIELDS))
            for i, x in enumerate(row):
                acc[i] += float(x)

    def measurement(self, queries: Sequence[str]) -> Measurement:
        numbers: dict[str, Any] = {
            "series_compared": self.series_compared,
            "points_compared": self.points_compared,
            "mismatches": self.mismatches,
            "missing_points": self.missing_points,
            "missing_series": self.missing_series,
            "extra_series": self.extra_series,
            "worst": list(self.offenders),
        }
        if self.noise_k and self.edge_s > 0:
            numbers["edges"] = {"points": self.edge_points, "series": self.edge_series, "within_s": self.edge_s}
        findings: list[dict[str, Any]] = []
        # Independent scrapers: single points beyond the jitter are expected now and then (OUTLIER_SHARE);
        # a systematic difference is the bias model's to find.
        outliers = self.mismatches
        if self.noise_k:
            findings, evidence = bias_findings(self.bias_stats, abs_tol=self.abs_tol, rel_tol=self.rel_tol)
            numbers["noise_model"] = {"per_metric": evidence, "bias_k": BIAS_K, "outlier_share": OUTLIER_SHARE,
                                      "findings": findings[:20]}
            if self.mismatches <= OUTLIER_SHARE * self.points_compared:
                outliers = 0
        if self.missing_series or self.extra_series or outliers or self.missing_points or findings:
            parts = []
            if findings:
                parts.append(describe_bias(findings))
            if self.missing_series:
                parts.append(f"{self.missing_series} series missing on target")
            if self.extra_series:
                parts.append(f"{self.extra_series} series only on target (label drift?)")
            if outliers:
                parts.append(f"{self.mismatches} of {self.points_compared} points differ beyond tolerance")
            if self.missing_points:
                parts.append(f"{self.missing_points} points missing on target")
            return Measurement("samples", Verdict.FAILED, "; ".join(parts), tuple(queries), numbers)
        if self.points_compared == 0:
            return Measurement("samples", Verdict.INCONCLUSIVE, "no points to compare in the window",
                               tuple(queries), numbers)
        if self.noise_k:
            edges = (f"; {self.edge_points} points missing on one side within {self.edge_s:g}s of a gap on the "
                     f"other (a scrape the other scraper missed at an outage's edge)" if self.edge_points else "")
            return Measurement("samples", Verdict.SUCCESSFUL,
                               f"{self.points_compared} points in {self.series_compared} series agree within the two "
                               f"scrapers' own noise ({len(numbers['noise_model']['per_metric'])} metrics, no bias "
                               f"beyond {BIAS_K:g} standard errors){edges}", tuple(queries), numbers)
        return Measurement("samples", Verdict.SUCCESSFUL,
                           f"{self.points_compared} points in {self.series_compared} series identical "
                           f"within tolerance", tuple(queries), numbers)


def coverage_measurement(counts: Sequence[tuple[float, Mapping[str, float], Mapping[str, float]]], *,
                         max_missing_ratio: float, queries: Sequence[str], name: str = "coverage",
                         key: str = "metric", key_label: str | None = None,
                         under_variants: tuple[Mapping[str, Iterable[str]], Mapping[str, Iterable[str]]] = ({}, {}),
                         ) -> Measurement:
    """Judge series counts per key (metric name, or host) at several instants.

    ``counts`` holds ``(t, source_counts, target_counts)``; each mapping is key -> count.
    The reason names the worst keys, so a drift report says *which* hosts or metrics.
    ``under_variants`` (source, target) maps an undeclared name of the key's label (``key_label``,
    e.g. ``Hostname``) to the keys found only under it on that side (e.g. ``hostname``): a host
    short on the target but present there under ``hostname`` is named as renamed, not as missing.
    """
    rows = []
    worst_ratio = 0.0
    total_source = 0.0
    short: dict[str, float] = {}
    extra: set[str] = set()
    for t, src, tgt in counts:
        for k in sorted(set(src) | set(tgt)):
            s, g = src.get(k, 0.0), tgt.get(k, 0.0)
            total_source += s
            if not s:
                # Series under a key the source does not have: drift (a renamed or dropped label), not loss.
                extra.add(k)
                rows.append({"at": t, key: k, "source": s, "target": g, "missing_ratio": None})
                continue
            ratio = (s - g) / s
            worst_ratio = max(worst_ratio, ratio)
            if ratio > max_missing_ratio:
                short[k] = max(short.get(k, 0.0), ratio)
                rows.append({"at": t, key: k, "source": s, "target": g, "missing_ratio": round(ratio, 6)})
    numbers: dict[str, Any] = {"instants": len(counts), "keys": len({k for _, src, _ in counts for k in src}),
                               "short": rows[:50], "worst_missing_ratio": worst_ratio}
    if total_source == 0:
        return Measurement(name, Verdict.INCONCLUSIVE, "the source has no series of this group",
                           tuple(queries), numbers)
    # Short on the target but there under another name: renamed. Extra on the target, and under
    # another name on the source: renamed the other way.
    label = key_label or key
    on_target = {k: v for v, keys in sorted(under_variants[1].items()) for k in keys}
    on_source = {k: v for v, keys in sorted(under_variants[0].items()) for k in keys}
    renamed: dict[tuple[str, str], list[str]] = {}
    for k in sorted(short):
        if k in on_target:
            renamed.setdefault((on_target[k], "target"), []).append(k)
    for k in sorted(extra):
        if k in on_source:
            renamed.setdefault((on_source[k], "source"), []).append(k)
    moved = {k for ks in renamed.values() for k in ks}
    if short or extra:
        parts = []
        for (variant, side), keys in sorted(renamed.items()):
            where = (f"on the target, not `{label}`" if side == "target"
                     else f"on the source, `{label}` on the target")
            parts.append(f"{_some(keys, key)} present under `{variant}` {where}: {rename_hint(variant, label)}")
        if renamed:
            numbers["renamed_keys"] = {f"{variant}@{side}": keys for (variant, side), keys in sorted(renamed.items())}
        if short:
            numbers["short_keys"] = sorted(short, key=lambda k: (-short[k], k))
        missing = [k for k in numbers.get("short_keys", []) if k not in moved]
        if missing:
            worst = max(short[k] for k in missing)
            parts.append(f"target misses series of {_some(missing, key)}; worst {worst:.2%} missing, "
                         f"limit {max_missing_ratio:.2%}")
        unexplained = sorted(extra - moved)
        if extra:
            numbers["extra_keys"] = sorted(extra)
        if unexplained:
            shown = sorted(f"{key} {k!r}" if k else f"no {label} label" for k in unexplained)
            parts.append(f"target has series under {', '.join(shown[:5])} that the source does not")
        return Measurement(name, Verdict.FAILED, "; ".join(parts), tuple(queries), numbers)
    return Measurement(name, Verdict.SUCCESSFUL,
                       f"series counts of {numbers['keys']} {key}s match at {len(counts)} instants",
                       tuple(queries), numbers)


Counts = Mapping[Any, float]


def credit_edges(narrow: tuple[Counts, Counts], wide: tuple[Counts, Counts]
                 ) -> tuple[dict[Any, float], dict[Any, float], int]:
    """Series counts at one instant of two independent scrapers, with their outages' edges counted as noise.

    ``narrow`` (source, target) are the counts at the instant, ``wide`` the series with a sample within the
    edge allowance around it (``edge_allowance``: the other scraper saw the same outage begin or end up to one
    scrape interval apart). A side short at the instant is credited from its wide count up to the other side's
    count at the instant: a host missing on the target for longer than the allowance stays missing, and one only
    on the target stays extra. Returns both sides' counts and how many series were credited.
    """
    (src, tgt), (src_wide, tgt_wide) = narrow, wide
    out_src, out_tgt, credited = dict(src), dict(tgt), 0
    for key in set(src) | set(tgt):
        s, g = src.get(key, 0.0), tgt.get(key, 0.0)
        if g < s:
            out_tgt[key] = max(g, min(tgt_wide.get(key, 0.0), s))
            credited += int(out_tgt[key] - g)
        elif s < g:
            out_src[key] = max(s, min(src_wide.get(key, 0.0), g))
            credited += int(out_src[key] - s)
    return out_src, out_tgt, credited


def _some(keys: Sequence[str], key: str) -> str:
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"{len(keys)} {key}{'s' if len(keys) != 1 else ''} ({shown})"


def label_drift(source: Mapping[str, Iterable[str]], target: Mapping[str, Iterable[str]], *,
                ignore: Iterable[str] = (), rename: Mapping[str, str] | None = None,
                dropped: Iterable[str] = ()) -> dict[str, Any]:
    """Compare label names per metric after normalization; name what differs on each side.

    ``source``/``target`` map metric -> label names. Renames apply to both sides (the
    group's rules say how the target's labels map to the source's). ``dropped`` (the group's
    declared ``drop_labels``) leave the source's side only: a target that still has one is drift. A metric's entry has
    ``only_source``, ``only_target`` and, when a name on one side only is a case variant of
    one the other side has (``hostname`` vs ``Hostname``), ``renamed``: ``{that name: the other}``.
    """
    skip = set(ignore) | {"__name__"}
    gone = set(dropped)
    rename = rename or {}
    drift: dict[str, Any] = {}
    for metric in sorted(set(source) | set(target)):
        src = {rename.get(n, n) for n in source.get(metric, ()) if n not in skip and n not in gone}
        tgt = {rename.get(n, n) for n in target.get(metric, ()) if n not in skip}
        if src != tgt:
            drift[metric] = {"only_source": sorted(src - tgt), "only_target": sorted(tgt - src)}
            renamed = _case_renames(src, tgt)
            if renamed:
                drift[metric]["renamed"] = renamed
    return drift


def _case_renames(src: set[str], tgt: set[str]) -> dict[str, str]:
    """Names on one side only whose case variant the other side has: ``{name: variant}``.

    The target's extra names are read as renames of the source's first (the source is the
    reference); a source-only name is a rename only if it is not already the other end of one.
    """
    out: dict[str, str] = {}
    for t in sorted(tgt - src):
        match = sorted(n for n in src if n != t and n.lower() == t.lower())
        if match:
            out[t] = match[0]
    for s in sorted(src - tgt):
        if s in out.values():
            continue
        match = sorted(n for n in tgt if n != s and n.lower() == s.lower() and n not in out)
        if match:
            out[s] = match[0]
    return out


def label_renames(drift: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """Every suspected rename in a ``label_drift`` result: ``(from, to) -> side`` the ``from`` name is on."""
    out: dict[tuple[str, str], str] = {}
    for d in drift.values():
        for frm, to in (d.get("renamed") or {}).items():
            out[(frm, to)] = "target" if frm in d.get("only_target", ()) else "source"
    return out


def describe_label_drift(drift: Mapping[str, Mapping[str, Any]],
                         hosts: Mapping[str, Sequence[str]] | None = None) -> str:
    """Plain words, e.g. ``DCGM_FI_DEV_GPU_UTIL: `Hostname` only on source, `hostname` only on target``.

    Metrics with the same drift share one part. Each suspected rename ends with the hosts that
    carry the renamed name (``hosts``: name -> hosts, when the caller looked them up) and the
    ``rename_labels`` line that would declare it.
    """
    same: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for metric, d in drift.items():
        same.setdefault((tuple(d.get("only_source", ())), tuple(d.get("only_target", ()))), []).append(metric)
    parts = []
    for (only_source, only_target), metrics in same.items():
        sides = []
        if only_source:
            sides.append(", ".join(f"`{n}`" for n in only_source) + " only on source")
        if only_target:
            sides.append(", ".join(f"`{n}`" for n in only_target) + " only on target")
        named = ", ".join(metrics[:5]) + (f" and {len(metrics) - 5} more metrics" if len(metrics) > 5 else "")
        parts.append(f"{named}: {' and '.join(sides)}")
    for (frm, to), side in sorted(label_renames(drift).items()):
        on = hosts.get(frm) if hosts else None
        where = f"`{frm}` on {_some(list(on), 'host')} of the {side}" if on else f"`{frm}` on the {side}"
        parts.append(f"{where}: {rename_hint(frm, to)}")
    return "; ".join(parts)


def assess(measurements: Sequence[Measurement], *, failure_limit: int, inconclusive_limit: int) -> Verdict:
    """Argo Rollouts' assessment: more FAILED than ``failure_limit`` fails, more INCONCLUSIVE than
    ``inconclusive_limit`` is inconclusive, any ERROR (consecutive errors past their limit) is ERROR.
    No measurements at all is INCONCLUSIVE."""
    if not measurements:
        return Verdict.INCONCLUSIVE
    failed = sum(m.verdict == Verdict.FAILED for m in measurements)
    inconclusive = sum(m.verdict == Verdict.INCONCLUSIVE for m in measurements)
    if failed > failure_limit:
        return Verdict.FAILED
    if any(m.verdict == Verdict.ERROR for m in measurements):
        return Verdict.ERROR
    if inconclusive > inconclusive_limit:
        return Verdict.INCONCLUSIVE
    return Verdict.SUCCESSFUL


def aggregate_measurement(rows: Sequence[tuple[str, Mapping[str, float], Mapping[str, float]]], *,
                          abs_tol: float, rel_tol: float, queries: Sequence[str], key: str = "host",
                          explained: Iterable[str] = ()) -> Measurement:
    """Compare per-host aggregates over the whole window, for every host (not only the sampled ones).

    ``rows`` holds ``(what, source_by_host, target_by_host)``, e.g. ``("sum DCGM_FI_DEV_GPU_UTIL", {...}, {...})``.
    A host whose values drifted shows up here even when the raw-sample layer did not sample it.
    """
    differing: dict[str, list[str]] = {}
    compared = 0
    worst: list[dict[str, Any]] = []
    for what, src, tgt in rows:
        for k, s in src.items():
            g = tgt.get(k)
            if g is None:
                continue  # missing hosts are the coverage layers' finding
            compared += 1
            if not values_equal(s, g, abs_tol=abs_tol, rel_tol=rel_tol):
                differing.setdefault(k, []).append(what)
                if len(worst) < 10:
                    rel = abs(s - g) / max(abs(s), abs(g)) if max(abs(s), abs(g)) else 0.0
                    worst.append({"series": f"{what} {{{key}={k!r}}}", "problem": "aggregate differs",
                                  "source": s, "target": g, "relative_delta": rel})
    numbers: dict[str, Any] = {"aggregates_compared": compared, "differing_keys": sorted(differing), "worst": worst}
    if compared == 0:
        return Measurement("aggregates", Verdict.INCONCLUSIVE, "no aggregate present on both sides", tuple(queries),
                           numbers)
    if differing:
        # Hosts already short in the coverage layer differ for that reason; name the others first.
        known = set(explained)
        new = sorted(k for k in differing if k not in known)
        old = sorted(k for k in differing if k in known)
        parts = []
        if new:
            parts.append(f"window aggregates differ for {_some(new, key)} with full coverage")
        if old:
            plural = "s" if len(old) != 1 else ""
            parts.append(f"{len(old)} more {key}{plural} differ where series are missing" if new
                         else f"{_some(old, key)} differ, all where series are missing (see host_coverage)")
        numbers["unexplained_keys"] = new
        return Measurement("aggregates", Verdict.FAILED, "; ".join(parts), tuple(queries), numbers)
    return Measurement("aggregates", Verdict.SUCCESSFUL,
                       f"{compared} per-{key} window aggregates match", tuple(queries), numbers)


# --------------------------------------------------------------------------- golden queries

# What a backend answers for a query it refuses to run: bad_data (400) or an execution error (422).
REJECTED_STATUSES = frozenset({400, 422})


@dataclass(frozen=True)
class GoldenSide:
    """One backend's answer to a golden query: its normalized series, or why it gave none."""

    series: Mapping[LabelSet, Points] | None = None
    error: str | None = None
    http_status: int | None = None
    warnings: tuple[str, ...] = ()
    kind: ErrorKind | None = None  # how the request failed; None with an error: an HTTP error answer

    @property
    def rejected(self) -> bool:
        """The backend refused the query itself (as opposed to timing out or being unreachable)."""
        return (self.error is not None and self.kind in (None, ErrorKind.HTTP)
                and self.http_status in REJECTED_STATUSES)


def _shown(series: Mapping[LabelSet, Points], limit: int = 3) -> list[dict[str, Any]]:
    out = []
    for labels, points in list(series.items())[:limit]:
        out.append({"series": format_labels(labels), "points": len(points),
                    "last": json_number(points[-1][1]) if points else None})
    return out


def golden_failure(name: str, expr: str, source: GoldenSide, target: GoldenSide) -> Measurement | None:
    """The verdict when a backend did not answer a golden query; None when both answered.

    Both refuse with the same error: the query is invalid, not the migration (INCONCLUSIVE,
    whatever the status). Only the target refuses: FAILED. Only the source refuses:
    INCONCLUSIVE naming its error, with the target's answer shown. A timeout, throttling
    or an unreachable backend is an ERROR.
    """
    queries = (expr,)
    if source.error is None and target.error is None:
        return None
    # Errors quote the query and, for matching errors, whole label sets: keep the reason readable.
    source = GoldenSide(source.series, _clip(source.error), source.http_status, source.warnings, source.kind)
    target = GoldenSide(target.series, _clip(target.error), target.http_status, target.warnings, target.kind)
    if source.rejected and target.rejected:
        if (source.http_status, source.error) == (target.http_status, target.error):
            return Measurement(name, Verdict.INCONCLUSIVE, f"invalid on both sides: {source.error}", queries)
        return Measurement(name, Verdict.INCONCLUSIVE,
                           f"invalid on both sides, differently: source: {source.error}; target: {target.error}",
                           queries)
    if source.error is None and target.rejected:
        return Measurement(name, Verdict.FAILED, f"the target rejects a query the source answers: {target.error}",
                           queries, {"source_series": len(source.series or {})})
    if source.rejected and target.error is None:
        answer = target.series or {}
        return Measurement(name, Verdict.INCONCLUSIVE,
                           f"only the source rejects this query ({source.error}); the target answers "
                           f"{len(answer)} series", queries, {"target_series": len(answer), "target": _shown(answer)})
    errors = "; ".join(f"{side}: {s.error}" for side, s in (("source", source), ("target", target)) if s.error)
    return Measurement(name, Verdict.ERROR, f"query failed: {errors}", queries)


def _clip(text: str | None, limit: int = 400) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit] + "..."


def golden_comparison(name: str, expr: str, source: Mapping[LabelSet, Points], target: Mapping[LabelSet, Points],
                      *, behind: tuple[float, float], abs_tol: float, rel_tol: float,
                      answers_without_series: bool = False, numbers: Mapping[str, Any] | None = None,
                      noise_k: float = 0.0, grid: tuple[float, float, float] | None = None,
                      span: tuple[float, float] | None = None, edge_s: float = 0.0) -> Measurement:
    """Compare a golden query's answers, counting them only with the group's series behind them.

    ``behind`` is (source, target) series of the group that the query's selectors read in its
    window. Nothing behind it on the source: INCONCLUSIVE ("no data behind this query"). Nothing
    on the target: a different answer FAILS, the same answer is INCONCLUSIVE (it cannot tell).
    A difference only in ``__name__`` (kept by one backend, dropped by the other) is named. ``grid``, ``span``
    and ``edge_s`` (independent scrapers, ``SampleComparison``'s): a point one side lacks next to a gap on the
    other is their noise.
    """
    queries = (expr,)
    extra = {**(numbers or {}), "behind_source": behind[0], "behind_target": behind[1],
             "answers_without_series": answers_without_series}
    if not behind[0]:
        return Measurement(name, Verdict.INCONCLUSIVE, "no data behind this query: its selectors select none of "
                           "this group's series on the source in its window", queries, extra)
    if not source and not target:
        return Measurement(name, Verdict.INCONCLUSIVE, "matches nothing on either side", queries, extra)
    comparison = SampleComparison(abs_tol=abs_tol, rel_tol=rel_tol, noise_k=noise_k, grid=grid, span=span,
                                  edge_s=edge_s)
    comparison.add(source, target)
    m = comparison.measurement([expr])
    numbers_out = {**m.numbers, **extra}
    if m.verdict == Verdict.FAILED and (comparison.missing_series or comparison.extra_series):
        unnamed = SampleComparison(abs_tol=abs_tol, rel_tol=rel_tol, noise_k=noise_k, grid=grid, span=span,
                                  edge_s=edge_s)
        unnamed.add(_without_name(source), _without_name(target))
        if unnamed.measurement([expr]).verdict == Verdict.SUCCESSFUL and len(source) == len(target):
            keeps = "source" if any(dict(k).get("__name__") for k in source) else "target"
            other = "target" if keeps == "source" else "source"
            return Measurement(name, Verdict.INCONCLUSIVE,
                               f"values match, but only `__name__` differs: the {keeps} keeps the metric name, "
                               f"the {other} drops it", queries, numbers_out)
    if not behind[1]:
        if m.verdict == Verdict.FAILED:
            return Measurement(name, Verdict.FAILED, f"the target has none of this query's series "
                               f"({behind[0]:.0f} on the source): {m.reason}", queries, numbers_out)
        return Measurement(name, Verdict.INCONCLUSIVE, "no data behind this query on the target (the answers agree "
                           "without it)", queries, numbers_out)
    reason = m.reason
    if m.verdict == Verdict.SUCCESSFUL:
        reason += f"; {behind[0]:.0f} source and {behind[1]:.0f} target series behind it"
    return Measurement(name, m.verdict, reason, queries, numbers_out)


def _without_name(series: Mapping[LabelSet, Points]) -> dict[LabelSet, Points]:
    return {tuple(kv for kv in labels if kv[0] != "__name__"): points for labels, points in series.items()}


# --------------------------------------------------------------------------- the parity result


@dataclass(frozen=True)
class ParityWindow:
    """The aligned window every layer compared (unix seconds) and its step."""

    start: float
    end: float
    step: float
    # The source's scrape interval for the group's jobs (its config; None: not read) and where it came from,
    # and why the step differs from the catalog's when it was raised to it.
    scrape_interval_s: float | None = None
    interval_from: str | None = None
    step_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end, "step": self.step}
        for key in ("scrape_interval_s", "interval_from", "step_note"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ParityWindow | None:
        if not d:
            return None
        interval = d.get("scrape_interval_s")
        return cls(float(d["start"]), float(d["end"]), float(d["step"]),
                   float(interval) if interval is not None else None, d.get("interval_from"), d.get("step_note"))


@dataclass(frozen=True)
class GoldenRow:
    """One dashboard expression and what became of it (``core.golden``'s dispositions)."""

    dashboard: str
    panel: str
    expr: str
    disposition: str
    detail: str | None = None
    ref_id: str | None = None
    measurement: str | None = None  # the measurement's name when the expression was compared

    def to_dict(self) -> dict[str, Any]:
        return {"dashboard": self.dashboard, "panel": self.panel, "ref_id": self.ref_id, "expr": self.expr,
                "disposition": self.disposition, "detail": self.detail, "measurement": self.measurement}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GoldenRow:
        return cls(str(d.get("dashboard", "")), str(d.get("panel", "")), str(d.get("expr", "")),
                   str(d.get("disposition", "")), d.get("detail"), d.get("ref_id"), d.get("measurement"))


@dataclass(frozen=True)
class GoldenInventory:
    """Every dashboard expression of the group's golden dashboards, with its disposition."""

    dashboards: tuple[str, ...] = ()
    required: bool = False
    queries: tuple[GoldenRow, ...] = ()
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"dashboards": list(self.dashboards), "required": self.required,
                "queries": [q.to_dict() for q in self.queries], "summary": self.summary}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> GoldenInventory | None:
        if d is None:
            return None
        return cls(tuple(d.get("dashboards") or ()), bool(d.get("required", False)),
                   tuple(GoldenRow.from_dict(q) for q in d.get("queries") or ()), str(d.get("summary") or ""))


@dataclass(frozen=True)
class ParityResult:
    """The parity check's result: its verdict, every layer's measurement, and the samples layer's totals.

    ``to_dict`` is what XCom and the audit log carry; ``from_dict`` reads it back, including
    records written before some fields existed (they read as zero / empty).
    """

    verdict: Verdict
    measurements: tuple[Measurement, ...] = ()
    window: ParityWindow | None = None
    hosts_sampled: tuple[str, ...] = ()
    series_compared: int = 0
    points_compared: int = 0
    mismatches: int = 0
    missing_series: int = 0
    missing_points: int = 0
    extra_series: int = 0
    shards: int = 0
    wall_s: float = 0.0
    backend_query_s: float = 0.0
    queries_sent: int = 0
    golden: GoldenInventory | None = None

    def measurement(self, layer: Layer) -> Measurement | None:
        """The first measurement of ``layer``, or None."""
        return next((m for m in self.measurements if m.layer == layer), None)

    def not_passed(self) -> tuple[Measurement, ...]:
        """The measurements that did not pass, in order."""
        return tuple(m for m in self.measurements if m.verdict != Verdict.SUCCESSFUL)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "window": self.window.to_dict() if self.window else None,
            "hosts_sampled": list(self.hosts_sampled),
            "series_compared": self.series_compared,
            "points_compared": self.points_compared,
            "mismatches": self.mismatches,
            "missing_series": self.missing_series,
            "missing_points": self.missing_points,
            "extra_series": self.extra_series,
            "measurements": [m.to_dict() for m in self.measurements],
            "shards": self.shards,
            "wall_s": json_number(self.wall_s),
            "backend_query_s": json_number(self.backend_query_s),
            "queries_sent": self.queries_sent,
            # Every dashboard expression and what became of it (compared, not this group's, ...).
            "golden": self.golden.to_dict() if self.golden else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParityResult:
        """Read ``to_dict``'s form; a missing or empty record is INCONCLUSIVE (no evidence never passes)."""
        return cls(
            verdict=Verdict(d.get("verdict") or Verdict.INCONCLUSIVE),
            measurements=tuple(Measurement.from_dict(m) for m in d.get("measurements") or ()),
            window=ParityWindow.from_dict(d.get("window")),
            hosts_sampled=tuple(d.get("hosts_sampled") or ()),
            **{k: int(d.get(k) or 0) for k in ("series_compared", "points_compared", "mismatches", "missing_series",
                                               "missing_points", "extra_series", "shards", "queries_sent")},
            wall_s=number_from_json(d.get("wall_s") or 0.0),
            backend_query_s=number_from_json(d.get("backend_query_s") or 0.0),
            golden=GoldenInventory.from_dict(d.get("golden")),
        )


@dataclass(frozen=True)
class ParityPlan:
    """The plan step's result: window, the count/label/golden layers, and the samples layer's host shards.

    ``shards`` stay plain JSON mappings: each is one mapped task's argument.
    """

    window: ParityWindow | None
    measurements: tuple[Measurement, ...]
    shards: tuple[Mapping[str, Any], ...] = ()
    hosts_total: int = 0
    cost: Mapping[str, float] = field(default_factory=dict)
    golden: GoldenInventory | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window.to_dict() if self.window else None,
                "measurements": [m.to_dict() for m in self.measurements], "shards": [dict(s) for s in self.shards],
                "hosts_total": self.hosts_total, "cost": json_safe(dict(self.cost)),
                "golden": self.golden.to_dict() if self.golden else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParityPlan:
        return cls(ParityWindow.from_dict(d.get("window")),
                   tuple(Measurement.from_dict(m) for m in d.get("measurements") or ()),
                   tuple(d.get("shards") or ()), int(d.get("hosts_total") or 0),
                   {k: number_from_json(v) for k, v in (d.get("cost") or {}).items()},
                   GoldenInventory.from_dict(d.get("golden")))


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
