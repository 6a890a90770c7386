"""The swap proof's reads (``core.queues.QueueProbe``) over the source's and the target's HTTP APIs; read only.

``source_series``: the group's series on the source now; ``target_fresh``: its series on the target with a
sample newer than a time (the merged entry's start); ``queue_sent``: the merged queue's sent samples from the
source's own ``/metrics``. ``target_matchers`` narrows the target's selectors (``,cluster="a"`` when several
sources write one workspace: their external labels tell them apart); a callable is read on first use.
``target_out_of_order_window``: a self-hosted target's out-of-order window, from the config it has loaded (the
swap's guard, ``core.queues.overlap_refusal``).
"""

from __future__ import annotations

from collections.abc import Callable

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.queues import fresh_series_query, out_of_order_window_of, queue_sent_samples, series_query
from promshift.core.render import QueueMember


class PrometheusQueueProbe:
    """A ``QueueProbe`` over two Prometheus-compatible clients (the target may be an AMP workspace)."""

    def __init__(self, source: PrometheusClient, target: PrometheusClient, *,
                 target_matchers: str | Callable[[], str] = "") -> None:
        self.source = source
        self.target = target
        self._matchers = target_matchers

    @property
    def target_matchers(self) -> str:
        """The matchers, worked out on first use when given as a callable (a swap that never runs reads nothing)."""
        if callable(self._matchers):
            self._matchers = self._matchers()
        return self._matchers

    def source_series(self, member: QueueMember) -> int:
        return int(self.source.scalar(series_query(member)) or 0)

    def target_fresh(self, member: QueueMember, since: float) -> int:
        return int(self.target.scalar(fresh_series_query(member, since=since,
                                                         extra_matchers=self.target_matchers)) or 0)

    def queue_sent(self, name: str) -> float | None:
        return queue_sent_samples(self.source.metrics_text(), name)


def target_out_of_order_window(target: PrometheusClient) -> tuple[float | None, str]:
    """``(seconds, origin)``: a self-hosted target's ``storage.tsdb.out_of_order_time_window`` from its
    ``/api/v1/status/config`` (absent: 0); ``(None, why)`` when it cannot be read, which refuses a swap."""
    try:
        seconds = out_of_order_window_of(target.config_text())
    except (PrometheusError, ValueError) as exc:  # InputRefused is a ValueError: a config past its budget
        return None, f"unavailable: {' '.join(str(exc).split())[:300]}"
    return seconds, f"storage.tsdb.out_of_order_time_window of {target.base_url}"
