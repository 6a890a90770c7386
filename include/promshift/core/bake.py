"""The bake of a cut-over group, judged (pure: the observations are fetched elsewhere, ``now`` is an argument).

Each bake check looks at the target copy of a group that reads from the target:

- ``freshness``: the newest sample of the group on the target is at most ``bake.max_staleness`` old;
  no sample at all FAILS (the readers see nothing);
- ``lag``: the source's remote-write lag for the group's own queue is at most ``bake.max_lag``; on the
  managed-scraper path there is no queue and the check does not apply; a queue that cannot be found on
  the remote_write path is INCONCLUSIVE;
- ``series``: the target holds the source's series count within ``bake.series_tolerance``; a source
  with no series of the group is INCONCLUSIVE (nothing to compare);
- ``parity``: a short parity window on the group (the parity check's own verdict).

The worst verdict wins (``core.verdicts.worst``). FAILED and ERROR fail the bake: a target the watch
cannot read is a target the readers cannot read either, so reads go back to the source
(``rolled_back_reads``). INCONCLUSIVE neither fails nor counts as clean.

The group is ``baked`` once its clean streak (consecutive SUCCESSFUL checks, none more than
``MAX_GAP_INTERVALS`` intervals apart) covers ``bake.period``: a watch that stopped running does not
bake a group by the clock alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.catalog import BakePolicy
from promshift.core.durations import format_duration
from promshift.core.verdicts import Verdict, worst

# Two checks further apart than this many intervals break a clean streak.
MAX_GAP_INTERVALS = 3.0


@dataclass(frozen=True)
class BakeObservation:
    """What one bake check saw (None: not observed)."""

    target_newest_age_s: float | None = None
    lag_s: float | None = None
    failed_samples: float | None = None
    source_series: int | None = None
    target_series: int | None = None
    parity: Verdict | None = None
    parity_reason: str = ""
    # False on the managed-scraper path: the source has no remote-write queue for the group.
    queue_expected: bool = True
    # Observations that could not be made: (what, one line), what being age, lag, source_series,
    # target_series or parity. The measurement that needed it is ERROR, never judged on a missing value.
    errors: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BakeMeasurement:
    name: str
    verdict: Verdict
    reason: str
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict.value, "reason": self.reason, "value": self.value}


@dataclass(frozen=True)
class BakeCheckResult:
    verdict: Verdict
    measurements: tuple[BakeMeasurement, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> bool:
        return self.verdict in (Verdict.FAILED, Verdict.ERROR)

    def not_passed(self) -> list[BakeMeasurement]:
        return [m for m in self.measurements if m.verdict != Verdict.SUCCESSFUL]

    def reason(self) -> str:
        bad = self.not_passed()
        return "; ".join(f"{m.name} {m.verdict.value}: {m.reason}" for m in bad) or "every bake check passed"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "reason": self.reason(),
                "measurements": [m.to_dict() for m in self.measurements]}


# Which observations each measurement needs.
_NEEDS = {"freshness": ("age",), "lag": ("lag",), "series": ("source_series", "target_series"),
          "parity": ("parity",)}


def judge(obs: BakeObservation, policy: BakePolicy) -> BakeCheckResult:
    """Each measurement's verdict, and the worst of them."""
    errors = dict(obs.errors)
    out: list[BakeMeasurement] = []
    for name, needs in _NEEDS.items():
        failed = [f"{need}: {errors[need]}" for need in needs if need in errors]
        if failed:
            out.append(BakeMeasurement(name, Verdict.ERROR, "; ".join(failed)))
    unobserved = {m.name for m in out}
    out.extend(m for m in _judge_observed(obs, policy) if m.name not in unobserved)
    out.sort(key=lambda m: list(_NEEDS).index(m.name))
    return BakeCheckResult(worst(m.verdict for m in out), tuple(out))


def _judge_observed(obs: BakeObservation, policy: BakePolicy) -> list[BakeMeasurement]:
    out: list[BakeMeasurement] = []
    if obs.target_newest_age_s is None:
        out.append(BakeMeasurement("freshness", Verdict.FAILED, "the target has no sample of the group"))
    elif obs.target_newest_age_s > policy.max_staleness_s:
        out.append(BakeMeasurement("freshness", Verdict.FAILED,
                                   f"newest sample on the target is {format_duration(round(obs.target_newest_age_s))} "
                                   f"old (limit {format_duration(policy.max_staleness_s)})", obs.target_newest_age_s))
    else:
        out.append(BakeMeasurement("freshness", Verdict.SUCCESSFUL,
                                   f"newest sample {obs.target_newest_age_s:.0f}s old", obs.target_newest_age_s))
    if not obs.queue_expected:
        out.append(BakeMeasurement("lag", Verdict.SUCCESSFUL, "no remote-write queue (managed scraper path)"))
    elif obs.lag_s is None:
        out.append(BakeMeasurement("lag", Verdict.INCONCLUSIVE, "the group's remote-write queue was not found on the "
                                                                "source"))
    elif obs.lag_s > policy.max_lag_s:
        out.append(BakeMeasurement("lag", Verdict.FAILED, f"remote-write lag {obs.lag_s:.0f}s (limit "
                                                          f"{format_duration(policy.max_lag_s)})", obs.lag_s))
    else:
        out.append(BakeMeasurement("lag", Verdict.SUCCESSFUL, f"remote-write lag {obs.lag_s:.1f}s", obs.lag_s))
    if not obs.source_series:
        out.append(BakeMeasurement("series", Verdict.INCONCLUSIVE, "the source has no series of the group to "
                                                                   "compare with"))
    else:
        target = obs.target_series or 0
        drift = abs(target - obs.source_series) / obs.source_series
        verdict = Verdict.SUCCESSFUL if drift <= policy.series_tolerance else Verdict.FAILED
        out.append(BakeMeasurement("series", verdict, f"target {target} of {obs.source_series} source series "
                                                      f"({drift:.2%}, limit {policy.series_tolerance:.2%})", drift))
    if obs.parity is None:
        out.append(BakeMeasurement("parity", Verdict.INCONCLUSIVE, obs.parity_reason or "no parity window ran"))
    else:
        out.append(BakeMeasurement("parity", obs.parity, obs.parity_reason or obs.parity.value))
    return out


def clean_streak_start(checks: Sequence[tuple[float, Verdict]], *, interval_s: float) -> float | None:
    """When the current clean streak began (the time of its first check), or None if the latest check is not clean.

    ``checks`` are (time, verdict) oldest first, since the bake started. Any non-SUCCESSFUL check, or a gap
    of more than ``MAX_GAP_INTERVALS`` intervals between two checks, ends a streak.
    """
    start: float | None = None
    previous: float | None = None
    for at, verdict in checks:
        gap = previous is not None and at - previous > MAX_GAP_INTERVALS * interval_s
        if verdict != Verdict.SUCCESSFUL:
            start = None
        elif start is None or gap:
            start = at
        previous = at
    return start


def baked(checks: Sequence[tuple[float, Verdict]], policy: BakePolicy, *, now: float) -> bool:
    """True once the clean streak covers the bake period (and the latest check is recent)."""
    start = clean_streak_start(checks, interval_s=policy.interval_s)
    if start is None or not checks:
        return False
    if now - checks[-1][0] > MAX_GAP_INTERVALS * policy.interval_s:
        return False
    return checks[-1][0] - start >= policy.period_s
