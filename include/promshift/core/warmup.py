"""Warm-up assessment: is the target ready to be compared with the source?"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WarmupStatus:
    """``waiting``, ``ready`` or ``timeout``, with the reason in plain words."""

    state: str
    reason: str


def assess_warmup(obs: WarmupObservation, *, min_duration_s: float, timeout_s: float,
                  max_lag_s: float | None) -> WarmupStatus:
    """Ready once the minimum warm-up has passed, the target holds at least as many of the
    group's series as the source (and some), and remote-write lag is under the bound.

    ``max_lag_s=None``: the path has no source remote-write queue (a managed collector scrapes
    the group itself), so lag is not part of the check; the series counts still are."""
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
    if not problems:
        lag = "no remote-write queue" if max_lag_s is None else f"lag {obs.lag_s:.1f}s"
        return WarmupStatus("ready", f"target holds {obs.target_series}/{obs.source_series} series, "
                                     f"{lag} after {obs.elapsed_s:.0f}s")
    if obs.elapsed_s >= timeout_s:
        return WarmupStatus("timeout", f"not ready after {timeout_s:.0f}s: " + "; ".join(problems))
    return WarmupStatus("waiting", "; ".join(problems))


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
