"""Warm-up assessment: is the target ready to be compared with the source?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from promshift.core.errors import PrometheusError
from promshift.core.ingest_limits import describe_discards
from promshift.core.render import remote_write_name

if TYPE_CHECKING:
    from promshift.core.ports import PrometheusProbe


@dataclass(frozen=True)
class WarmupObservation:
    """One poll of both sides during warm-up."""

    elapsed_s: float
    source_series: int
    target_series: int
    lag_s: float | None
    failed_samples: float | None
    # The workspace's discarded samples by reason since the dual-write began (AMP's DiscardedSamples); None:
    # not read. ``discards_expected``: the target publishes them (an AMP workspace), so None is not "none".
    discarded: Mapping[str, float] | None = None
    discards_expected: bool = False
    # A series of the group the source holds and the target lacks (found once samples were refused), or "".
    example_series: str = ""
    # Why the discards could not be read (one line), when they could not.
    discards_error: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["discarded"] = dict(self.discarded) if self.discarded is not None else None
        return data


@dataclass(frozen=True)
class WarmupStatus:
    """``waiting``, ``ready``, ``timeout`` or ``failed`` (the target refused samples), with the reason."""

    state: str
    reason: str


def assess_warmup(obs: WarmupObservation, *, min_duration_s: float, timeout_s: float,
                  max_lag_s: float | None) -> WarmupStatus:
    """Ready once the minimum warm-up has passed, the target holds at least as many of the
    group's series as the source (and some), and remote-write lag is under the bound.

    ``max_lag_s=None``: the path has no source remote-write queue (a managed collector scrapes
    the group itself), so lag is not part of the check; the series counts still are.

    Any refusal ends the warm-up ``failed`` at once, naming it: failed samples of the group's remote-write queue
    (``prometheus_remote_storage_samples_failed_total``: only non-recoverable answers, i.e. refusals) or samples
    the workspace discarded (by reason, with a series of the group the target lacks). Discards the target should
    publish but that could not be read are a problem, never "no discards"."""
    refused = ingestion_refusal(obs)
    if refused:
        return WarmupStatus("failed", refused)
    problems = []
    if obs.elapsed_s < min_duration_s:
        problems.append(f"warm-up {obs.elapsed_s:.0f}s of {min_duration_s:.0f}s")
    if obs.source_series == 0:
        problems.append("the source has no series of this group")
    elif obs.target_series < obs.source_series:
        problems.append(f"target holds {obs.target_series} of {obs.source_series} series")
    if max_lag_s is not None and obs.lag_s is None:
        problems.append("remote-write lag unknown (queue not reporting yet)")
    elif max_lag_s is not None and obs.lag_s is not None and obs.lag_s > max_lag_s:
        problems.append(f"remote-write lag {obs.lag_s:.1f}s > {max_lag_s:.1f}s")
    if max_lag_s is not None and obs.lag_s is not None and obs.failed_samples is None:
        problems.append("the queue's failed-sample count unknown (prometheus_remote_storage_samples_failed_total)")
    if obs.discards_expected and obs.discarded is None:
        problems.append("the workspace's discarded samples unknown"
                        + (f" ({obs.discards_error})" if obs.discards_error else ""))
    if not problems:
        lag = "no remote-write queue" if max_lag_s is None else f"lag {obs.lag_s:.1f}s"
        return WarmupStatus("ready", f"target holds {obs.target_series}/{obs.source_series} series, "
                                     f"{lag} after {obs.elapsed_s:.0f}s")
    if obs.elapsed_s >= timeout_s:
        return WarmupStatus("timeout", f"not ready after {timeout_s:.0f}s: " + "; ".join(problems))
    return WarmupStatus("waiting", "; ".join(problems))


def ingestion_refusal(obs: WarmupObservation) -> str:
    """One line naming what the target refused of the group (empty: nothing seen refused)."""
    parts = []
    if obs.failed_samples:
        parts.append(f"the writer failed {obs.failed_samples:,.0f} samples (prometheus_remote_storage_samples_"
                     "failed_total: the target refused them)")
    if obs.discarded and any(n > 0 for n in obs.discarded.values()):
        parts.append(f"the workspace discarded {describe_discards(obs.discarded)} (DiscardedSamples)")
    if not parts:
        return ""
    example = f"; e.g. series {obs.example_series}" if obs.example_series else ""
    return "ingestion refused: " + "; ".join(parts) + example


def parse_remote_write_lag(metrics_text: str, remote_name: str) -> tuple[float | None, float | None]:
    """Lag and failed samples of one remote_write queue from a Prometheus ``/metrics`` page.

    lag = prometheus_remote_storage_highest_timestamp_in_seconds
          - prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name=...}
    """
    highest = sent = failed = None
    marker = f'remote_name="{remote_name}"'
    for line in metrics_text.splitlines():
        if line.startswith("prometheus_remote_storage_highest_timestamp_in_seconds"):
            highest = float(line.rsplit(" ", 1)[1])
        elif marker in line:
            if line.startswith("prometheus_remote_storage_queue_highest_sent_timestamp_seconds{"):
                sent = float(line.rsplit(" ", 1)[1])
            elif line.startswith("prometheus_remote_storage_samples_failed_total{"):
                failed = float(line.rsplit(" ", 1)[1])
    if highest is None or sent is None or sent <= 0:
        return None, failed
    return max(0.0, highest - sent), failed


def observe_warmup(*, group_name: str, selector: str, source: PrometheusProbe, target: PrometheusProbe,
                   elapsed_s: float) -> WarmupObservation:
    """Poll both sides once: series counts of the group and the group's remote-write queue lag."""
    count = f"count({selector})"
    src = source.scalar(count) or 0.0
    tgt = target.scalar(count) or 0.0
    lag, failed = parse_remote_write_lag(source.metrics_text(), remote_write_name(group_name))
    return WarmupObservation(elapsed_s=elapsed_s, source_series=int(src), target_series=int(tgt),
                             lag_s=lag, failed_samples=failed)


# Series of one (metric, instance) read on each side to name a missing one.
MAX_EXAMPLE_SERIES = 1000


def _with_matchers(selector: str, matchers: str) -> str:
    """``{a="b"}`` + ``c="d"`` -> ``{a="b",c="d"}`` (the group's selectors end with ``}``)."""
    return selector[:-1] + ("," if selector[:-1].strip().endswith(("\"", "'", "`")) else "") + matchers + "}"


def missing_series_example(source: PrometheusProbe, target: PrometheusProbe, selector: str, *, at: float,
                           lookback_s: float = 300.0) -> str:
    """A series of the group on the source that the target lacks (``name{labels}``), or "" when none is found."""
    if not selector.endswith("}"):
        return ""
    by = f"count by (__name__, instance) ({selector})"
    try:
        have = {(s.labels.get("__name__", ""), s.labels.get("instance", "")): s.points[-1][1]
                for s in target.query(by, at=at).series if s.points}
        short = [(s.labels.get("__name__", ""), s.labels.get("instance", "")) for s in source.query(by, at=at).series
                 if s.points and have.get((s.labels.get("__name__", ""), s.labels.get("instance", "")), 0)
                 < s.points[-1][1]]
        if not short:
            return ""
        name, instance = sorted(short)[0]
        match = _with_matchers(selector, f'__name__="{name}",instance="{instance}"')
        # The series of that metric and instance on each side, by an instant query (AMP's QueryMetrics: no other
        # permission than the checks' own), at most MAX_EXAMPLE_SERIES of them.
        expr = f"topk({MAX_EXAMPLE_SERIES}, last_over_time({match}[{int(lookback_s)}s]))"
        on_target = {tuple(sorted(s.labels.items())) for s in target.query(expr, at=at).series}
        for found in source.query(expr, at=at).series:
            if tuple(sorted(found.labels.items())) not in on_target:  # last_over_time dropped __name__ on both
                rest = ", ".join(f'{k}="{v}"' for k, v in sorted(found.labels.items()) if k != "__name__")
                return f"{name}{{{rest}}}"
    except (PrometheusError, ValueError, TypeError, AttributeError):
        return ""
    return ""
