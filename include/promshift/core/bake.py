"""The bake of a cut-over group, judged (pure: the observations are fetched elsewhere, ``now`` is an argument).

Each bake check looks at the target copy of a group that reads from the target:

- ``freshness``: the newest sample of the group on the target is at most ``bake.max_staleness`` old;
  no sample at all FAILS (the readers see nothing);
- ``lag``: the source's remote-write lag for the group's own queue is at most ``bake.max_lag``; on the
  managed-scraper path there is no queue and the check does not apply; a queue that cannot be found on
  the remote_write path is INCONCLUSIVE;
- ``series``: the target holds the source's series count within ``bake.series_tolerance``; a source
  with no series of the group is INCONCLUSIVE (nothing to compare);
- ``parity``: a short parity window on the group (the parity check's own verdict);
- ``entry``: on a path where the source's own queue carries the group, the group's ``remote_write`` entry is
  still in the source's loaded config; gone FAILS and says so: a later sync (Argo CD, Flux, ``helm upgrade``)
  or a hand edit removed it, and the target receives nothing new of the group (omitted where not observed);
- ``rules``: only for a group whose rules moved to the target (omitted otherwise: there is nothing on
  the target to watch): every moved rule is reported by the target's ``/api/v1/rules`` with health
  ``ok`` and a last evaluation at most ``RULE_STALE_INTERVALS`` of its group's intervals old. A moved rule
  missing on the target, with health ``err``, never evaluated although it was loaded more than
  ``RULE_STALE_INTERVALS`` intervals + ``RULE_GRACE_S`` ago, or last evaluated longer ago than that,
  FAILS (the rule's name and ``lastError`` in the line: an alert that does not evaluate never pages); a
  rule not yet evaluated within that grace is INCONCLUSIVE. An empty observation (the handoff moved
  none) is SUCCESSFUL "no rules moved".
- ``delivery``: only while a moved alert fires on the target (omitted otherwise: nothing to deliver, and a
  quiet alert must not hold the bake): each firing moved alert is held active (not silenced or inhibited)
  by the target's Alertmanager for at least one receiver. One that fires longer than ``DELIVERY_GRACE_S``
  and is not held FAILS (it pages nobody); within that grace it is INCONCLUSIVE; a target whose
  Alertmanager is not known is INCONCLUSIVE while an alert fires.

The worst verdict wins (``core.verdicts.worst``). FAILED and ERROR fail the bake: a target the watch
cannot read is a target the readers cannot read either, so reads go back to the source
(``rolled_back_reads``). INCONCLUSIVE neither fails nor counts as clean.

The group is ``baked`` once its clean streak (consecutive SUCCESSFUL checks, none more than
``MAX_GAP_INTERVALS`` intervals apart) covers ``bake.period``: a watch that stopped running does not
bake a group by the clock alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from promshift.core.catalog import BakePolicy
from promshift.core.durations import format_duration
from promshift.core.notify import one_line
from promshift.core.rules import LoadedRule, RuleKind
from promshift.core.verdicts import Verdict, worst

# Two checks further apart than this many intervals break a clean streak.
MAX_GAP_INTERVALS = 3.0
# A moved rule must have been evaluated within this many of its group's evaluation intervals ...
RULE_STALE_INTERVALS = 3.0
# ... and one never evaluated gets this much more time after it was loaded before it counts as failing.
RULE_GRACE_S = 30.0
# Prometheus's default evaluation_interval, for a group whose interval the target did not report.
DEFAULT_RULE_INTERVAL_S = 60.0
# A firing alert reaches the Alertmanager at its next evaluation and re-send (AMP and Prometheus re-send every
# minute by default): one not held after this long is not delivered.
DELIVERY_GRACE_S = 120.0
# How many rules one measurement line names (the rest are counted).
_NAMED_RULES = 3


@dataclass(frozen=True)
class MovedRule:
    """A rule the rules handoff moved to the target (from the group's ``rules_moved`` audit event)."""

    kind: str  # "record" or "alert" (``core.rules.RuleKind`` values)
    name: str  # the recorded metric or the alert name
    group: str = ""  # its rule group's name ("" matches any group)


@dataclass(frozen=True)
class RuleEvaluation:
    """One moved rule as the target reports it on ``/api/v1/rules`` (``found`` False: it does not)."""

    kind: str
    name: str
    group: str = ""
    found: bool = True
    health: str = "unknown"  # ok, err or unknown (Prometheus's rule health)
    last_error: str = ""
    last_evaluation_age_s: float | None = None  # None: never evaluated
    interval_s: float | None = None  # its rule group's evaluation interval


@dataclass(frozen=True)
class RulesObservation:
    """The moved rules on the target, and how long ago the handoff loaded them there (None: unknown)."""

    rules: tuple[RuleEvaluation, ...] = ()
    loaded_age_s: float | None = None


@dataclass(frozen=True)
class AlertDelivery:
    """One moved alert firing on the target, and what its Alertmanager holds for it."""

    name: str
    firing_s: float  # how long it has fired on the target (its longest-firing instance)
    instances: int  # firing instances on the target
    held: int  # instances the Alertmanager holds active
    receivers: tuple[str, ...] = ()  # the receivers those are routed to


@dataclass(frozen=True)
class DeliveryObservation:
    """The firing moved alerts (empty: none fires) and whether the target has a known Alertmanager."""

    alerts: tuple[AlertDelivery, ...] = ()
    alertmanager_known: bool = True


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
    # The moved rules on the target; None when the group moved no rules (no ``rules`` measurement then).
    rules: RulesObservation | None = None
    # The moved alerts firing on the target and their delivery; None when no alert moved.
    delivery: DeliveryObservation | None = None
    # Whether the group's remote_write entry (``entry_name``) is in the source's loaded config; None: not observed.
    entry_loaded: bool | None = None
    entry_name: str = ""
    # The workspace's discarded samples by reason in the bake window (AMP's DiscardedSamples); None: not read.
    # ``discards_expected``: the target publishes them (an AMP workspace), so None is never "no discards".
    discarded: Mapping[str, float] | None = None
    discards_expected: bool = False
    example_series: str = ""
    # Observations that could not be made: (what, one line), what being age, lag, source_series,
    # target_series, parity or rules. The measurement that needed it is ERROR, never judged on a missing value.
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
          "parity": ("parity",), "ingestion": ("discards",), "rules": ("rules",), "delivery": ("delivery",),
          "entry": ("entry",)}


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
    if obs.rules is not None:
        out.append(judge_rules(obs.rules))
    if obs.delivery is not None and obs.delivery.alerts:
        out.append(judge_delivery(obs.delivery))
    ingestion = judge_ingestion(obs)
    if ingestion is not None:
        out.append(ingestion)
    if obs.entry_loaded is True:
        out.append(BakeMeasurement("entry", Verdict.SUCCESSFUL, f"remote_write {obs.entry_name} is in the source's "
                                                                "loaded config"))
    elif obs.entry_loaded is False:
        out.append(BakeMeasurement("entry", Verdict.FAILED,
                                   f"remote_write {obs.entry_name} is no longer in the source's loaded config: a later "
                                   "sync (Argo CD, Flux, helm upgrade) or an edit removed it, so the target gets "
                                   "nothing new of the group"))
    return out


def judge_ingestion(obs: BakeObservation) -> BakeMeasurement | None:
    """The ``ingestion`` measurement: FAILED when the target refused samples of the group (the writer's failed
    samples, the workspace's discards by reason); None when neither is a source on this path."""
    from promshift.core.warmup import WarmupObservation, ingestion_refusal

    if not obs.discards_expected and (not obs.queue_expected or (obs.lag_s is None and obs.failed_samples is None)):
        return None  # no source of refusals on this path, or the queue was not found (``lag`` says so)
    refused = ingestion_refusal(WarmupObservation(0, 0, 0, obs.lag_s, obs.failed_samples, obs.discarded,
                                                  obs.discards_expected, obs.example_series))
    if refused:
        return BakeMeasurement("ingestion", Verdict.FAILED, refused,
                               (obs.failed_samples or 0) + sum((obs.discarded or {}).values()))
    if obs.discards_expected and obs.discarded is None:
        return BakeMeasurement("ingestion", Verdict.INCONCLUSIVE, "the workspace's discarded samples were not read")
    if obs.queue_expected and obs.failed_samples is None and not obs.discards_expected:
        return BakeMeasurement("ingestion", Verdict.INCONCLUSIVE, "the group's queue reports no failed-sample count")
    sources = (["no failed samples in the group's queue"] if obs.failed_samples is not None else []) + (
        ["no samples discarded by the workspace"] if obs.discards_expected else [])
    return BakeMeasurement("ingestion", Verdict.SUCCESSFUL, "; ".join(sources), 0.0)


def judge_delivery(obs: DeliveryObservation) -> BakeMeasurement:
    """The ``delivery`` measurement of the firing moved alerts (value: how many are behind the verdict)."""
    if not obs.alertmanager_known:
        names = [a.name for a in obs.alerts]
        return BakeMeasurement("delivery", Verdict.INCONCLUSIVE, f"{_named(names)} fire on the target, but its "
                               "Alertmanager is not known: delivery not checked", len(names))
    failed: list[str] = []
    pending: list[str] = []
    delivered: list[str] = []
    for alert in obs.alerts:
        what = f"alert {alert.name}"
        if alert.held and alert.receivers:
            delivered.append(f"{what} to {', '.join(alert.receivers)}")
        elif alert.firing_s > DELIVERY_GRACE_S:
            failed.append(f"{what} fires on the target ({alert.instances} instances, "
                          f"{format_duration(round(alert.firing_s))}) but its Alertmanager holds none: it pages nobody")
        else:
            pending.append(f"{what} fires on the target since {format_duration(round(alert.firing_s))}, not in its "
                           "Alertmanager yet")
    if failed:
        return BakeMeasurement("delivery", Verdict.FAILED, _named(failed), len(failed))
    if pending:
        return BakeMeasurement("delivery", Verdict.INCONCLUSIVE, _named(pending), len(pending))
    return BakeMeasurement("delivery", Verdict.SUCCESSFUL, f"{len(delivered)} firing moved alerts delivered: "
                           + _named(delivered), len(delivered))


def observe_delivery(moved_alerts: Sequence[str], firing: Sequence[tuple[str, float]],
                     held: Mapping[str, Sequence[tuple[str, ...]]] | None, *, now: float) -> DeliveryObservation:
    """The moved alerts that fire on the target (``firing``: (alertname, activeAt epoch s) of its firing
    instances) and what the Alertmanager holds for each (``held``: alertname -> each held instance's
    receivers; None: no Alertmanager known)."""
    out: list[AlertDelivery] = []
    for name in dict.fromkeys(moved_alerts):
        since = [at for n, at in firing if n == name]
        if not since:
            continue
        instances = list((held or {}).get(name) or [])
        receivers = tuple(dict.fromkeys(r for inst in instances for r in inst))
        out.append(AlertDelivery(name, max(0.0, now - min(since)), len(since), len(instances), receivers))
    return DeliveryObservation(tuple(out), held is not None)


def _named(items: Sequence[str]) -> str:
    more = len(items) - _NAMED_RULES
    return "; ".join(items[:_NAMED_RULES]) + (f" (and {more} more)" if more > 0 else "")


def judge_rules(obs: RulesObservation) -> BakeMeasurement:
    """The ``rules`` measurement: FAILED names the failing rules (with ``lastError``), INCONCLUSIVE the ones not
    evaluated yet; its value is the number of rules behind the verdict (every moved rule when SUCCESSFUL)."""
    if not obs.rules:
        return BakeMeasurement("rules", Verdict.SUCCESSFUL, "no rules moved", 0)
    failed: list[str] = []
    pending: list[str] = []
    for rule in obs.rules:
        interval = rule.interval_s if rule.interval_s and rule.interval_s > 0 else DEFAULT_RULE_INTERVAL_S
        limit = RULE_STALE_INTERVALS * interval
        what = f"{rule.kind} {rule.name}"
        if not rule.found:
            failed.append(f"{what} missing on the target")
        elif rule.health == "err":
            failed.append(f"{what} health err: {one_line(rule.last_error, 300) or 'no lastError given'}")
        elif rule.last_evaluation_age_s is None:
            loaded = obs.loaded_age_s
            if loaded is None or loaded < limit + RULE_GRACE_S:
                since = "" if loaded is None else f", loaded {format_duration(round(loaded))} ago"
                pending.append(f"{what} not evaluated yet{since} (interval {format_duration(round(interval))})")
            else:
                failed.append(f"{what} never evaluated since it was loaded {format_duration(round(loaded))} ago "
                              f"(interval {format_duration(round(interval))})")
        elif rule.last_evaluation_age_s > limit:
            failed.append(f"{what} last evaluated {format_duration(round(rule.last_evaluation_age_s))} ago "
                          f"(limit {format_duration(round(limit))}: {RULE_STALE_INTERVALS:g} x its interval)")
    if failed:
        return BakeMeasurement("rules", Verdict.FAILED, _named(failed), len(failed))
    if pending:
        return BakeMeasurement("rules", Verdict.INCONCLUSIVE, _named(pending), len(pending))
    return BakeMeasurement("rules", Verdict.SUCCESSFUL, f"{len(obs.rules)} moved rules healthy, each evaluated within "
                                                        f"{RULE_STALE_INTERVALS:g} x its interval", len(obs.rules))


_ZERO_TIME_YEAR = 1  # Prometheus reports a rule never evaluated with lastEvaluation 0001-01-01T00:00:00Z


def parse_rfc3339(text: str) -> float | None:
    """A Prometheus RFC 3339 time (nanoseconds allowed) as epoch seconds; None for the zero time or no time."""
    if not text:
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    head, dot, rest = value.partition(".")
    if dot:  # keep at most microseconds: datetime takes no more
        digits = len(rest) - len(rest.lstrip("0123456789"))
        value = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.year <= _ZERO_TIME_YEAR:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def observe_rules(moved: Sequence[MovedRule], loaded: Sequence[LoadedRule], *, now: float,
                  loaded_at: float | None) -> RulesObservation:
    """Each moved rule as the target reports it (matched by kind, name and, when known, rule group)."""
    out: list[RuleEvaluation] = []
    for rule in moved:
        kind = RuleKind(rule.kind)
        found = [lr for lr in loaded if lr.kind == kind and lr.name == rule.name
                 and (not rule.group or lr.group == rule.group)]
        if not found:
            out.append(RuleEvaluation(rule.kind, rule.name, rule.group, found=False))
            continue
        # Two copies (two groups of that name): the worst one is judged.
        worst_first = sorted(found, key=lambda lr: (lr.health != "err", parse_rfc3339(lr.last_evaluation) or 0.0))
        lr = worst_first[0]
        at = parse_rfc3339(lr.last_evaluation)
        out.append(RuleEvaluation(rule.kind, rule.name, lr.group, found=True, health=lr.health or "unknown",
                                  last_error=lr.last_error, last_evaluation_age_s=None if at is None else max(0.0,
                                                                                                              now - at),
                                  interval_s=lr.interval_s))
    return RulesObservation(tuple(out), None if loaded_at is None else max(0.0, now - loaded_at))


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


def bake_window_problem(policy: BakePolicy, *, step_s: float, lookbacks: Mapping[str, float],
                        min_points: int) -> str | None:
    """Why a bake's parity window can never hold a golden query of the group (one line), or None.

    Each bake check compares the last ``parity_window`` of data; a golden query that looks back further than
    that window minus the points it needs never fits, so its measurement stays INCONCLUSIVE and the group
    can never bake. ``lookbacks`` maps a golden query's name to its look-back in seconds.
    """
    needed = {name: back + (min_points - 1) * step_s for name, back in lookbacks.items()}
    worst = max(needed, key=lambda name: needed[name], default=None)
    if worst is None or needed[worst] <= policy.parity_window_s:
        return None
    return (f"golden query {worst} looks back {format_duration(lookbacks[worst])}, and needs "
            f"{format_duration(needed[worst])} with {min_points} points at step {format_duration(step_s)}; "
            f"bake.parity_window is {format_duration(policy.parity_window_s)}, so this group can never bake: set "
            f"bake.parity_window to at least {format_duration(needed[worst])}")
