"""Parity maths on already-fetched data, and the parity check's result.

This module holds the coverage and aggregate layers' verdicts, the assessment and the result records
(``ParityWindow``, ``ParityResult``, ``ParityPlan``); the rest lives in sibling modules and is re-exported
here, so ``promshift.core.parity`` stays the one name to import from:

- ``parity_labels``: label sets, host sampling, the host label's names, label drift and renames;
- ``parity_window``: the comparison window, step, scrape interval and outage-edge allowance;
- ``parity_noise``: engine rounding, tolerances, the two scrapers' noise and bias model, noisy aggregates;
- ``parity_samples``: the raw-sample comparison (``SampleComparison``);
- ``parity_golden``: golden queries and the golden inventory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.evidence import json_number, json_safe, number_from_json
from promshift.core.parity_golden import (
    REJECTED_STATUSES,
    GoldenInventory,
    GoldenRow,
    GoldenSide,
    golden_comparison,
    golden_failure,
    rewrite_comparison,
)
from promshift.core.parity_labels import (
    KIND_DEFAULT,
    KIND_FROM_DCGM,
    KIND_FROM_METADATA,
    HostLabels,
    LabelSet,
    Points,
    _some,
    count_hosts,
    describe_label_drift,
    format_labels,
    hosts_per_label,
    label_drift,
    label_renames,
    metric_kinds,
    normalize_labels,
    rename_hint,
    sample_hosts,
    undeclared_rename_note,
    without_dropped,
)
from promshift.core.parity_noise import (
    BIAS_K,
    ENGINE_ROUNDING,
    INDEPENDENT_NOISE_K,
    OUTLIER_SHARE,
    bias_findings,
    describe_bias,
    engine_tolerance,
    independent_aggregate_measurement,
    noise_allowance,
    pooled_spreads,
    successive_spread,
    values_equal,
)
from promshift.core.parity_samples import SampleComparison
from promshift.core.parity_window import (
    align_window,
    comparison_step,
    comparison_window,
    edge_allowance,
    near_gap,
    scrape_interval_of,
    settle_time,
)
from promshift.core.verdicts import Layer, Measurement, Verdict

__all__ = [
    "BIAS_K",
    "Counts",
    "ENGINE_ROUNDING",
    "GoldenInventory",
    "GoldenRow",
    "GoldenSide",
    "HostLabels",
    "INDEPENDENT_NOISE_K",
    "KIND_DEFAULT",
    "KIND_FROM_DCGM",
    "KIND_FROM_METADATA",
    "LabelSet",
    "OUTLIER_SHARE",
    "ParityPlan",
    "ParityResult",
    "ParityWindow",
    "Points",
    "REJECTED_STATUSES",
    "SampleComparison",
    "aggregate_measurement",
    "align_window",
    "assess",
    "bias_findings",
    "comparison_step",
    "comparison_window",
    "count_hosts",
    "coverage_measurement",
    "credit_edges",
    "describe_bias",
    "describe_label_drift",
    "edge_allowance",
    "engine_tolerance",
    "format_labels",
    "golden_comparison",
    "rewrite_comparison",
    "golden_failure",
    "hosts_per_label",
    "independent_aggregate_measurement",
    "label_drift",
    "label_renames",
    "metric_kinds",
    "near_gap",
    "noise_allowance",
    "normalize_labels",
    "pooled_spreads",
    "rename_hint",
    "sample_hosts",
    "scrape_interval_of",
    "settle_time",
    "successive_spread",
    "undeclared_rename_note",
    "values_equal",
    "without_dropped",
]


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
    # A source declared as replicas: the replica the shards compare with and why (``core.ha.ReplicaPlan``'s form).
    replicas: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"window": self.window.to_dict() if self.window else None,
               "measurements": [m.to_dict() for m in self.measurements], "shards": [dict(s) for s in self.shards],
               "hosts_total": self.hosts_total, "cost": json_safe(dict(self.cost)),
               "golden": self.golden.to_dict() if self.golden else None}
        if self.replicas is not None:
            out["replicas"] = json_safe(dict(self.replicas))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParityPlan:
        return cls(ParityWindow.from_dict(d.get("window")),
                   tuple(Measurement.from_dict(m) for m in d.get("measurements") or ()),
                   tuple(d.get("shards") or ()), int(d.get("hosts_total") or 0),
                   {k: number_from_json(v) for k, v in (d.get("cost") or {}).items()},
                   GoldenInventory.from_dict(d.get("golden")), d.get("replicas"))
