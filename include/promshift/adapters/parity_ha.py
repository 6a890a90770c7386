"""Parity for a source that runs as replicas (an HA pair): the target against the replica its dedup kept.

Each replica's Prometheus is compared with the target by the whole ``ParityCheck`` (every layer); ``core.ha.elect``
keeps the comparison with the replica the target matches and records it. Before that, the target's series are
counted per replica label (``count by (<replica_label>)``): series of two replicas side by side (written without
AMP's dedup labels) fail on coverage naming them, since the other layers would compare one replica with the sum.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.catalog import MetricGroup
from promshift.core.ha import REPLICAS_MEASUREMENT, doubled_replicas, elect
from promshift.core.parity import ParityResult
from promshift.core.verdicts import Measurement, Verdict

log = logging.getLogger(__name__)


@dataclass
class HaParityCheck:
    """Parity of ``group`` with ``sources``: (replica, its Prometheus) in preference order."""

    group: MetricGroup
    sources: Sequence[tuple[str, PrometheusClient]]
    target: PrometheusClient
    catalog_dir: Path | None = None
    # The target's per-query limits, as ``ParityCheck`` takes them (every replica's comparison plans against them).
    limits: Any = None

    def doubled(self, at: float) -> Measurement | None:
        """The coverage failure when the target holds series of more than one replica at ``at`` (else None)."""
        label = self.group.replicas.replica_label
        query = f"count by ({label}) ({self.group.selector()})"
        per_replica: dict[str, float] = {}
        for series in self.target.query(query, at=at).series:
            replica = str(series.labels.get(label, ""))
            per_replica[replica] = per_replica.get(replica, 0.0) + sum(v for _, v in series.points[-1:])
        return doubled_replicas(per_replica, replica_label=label, query=query)

    def run(self, *, dual_write_since: float, now: float) -> ParityResult:
        if not self.sources:
            raise ValueError(f"group {self.group.name}: no replica to compare the target with")
        at = now - self.group.parity.skip_recent_s
        try:
            doubled = self.doubled(at)
        except PrometheusError as exc:
            doubled = Measurement(REPLICAS_MEASUREMENT, Verdict.ERROR, f"the target's series per replica: {exc}")
        results = {}
        for replica, client in self.sources:
            results[replica] = ParityCheck(self.group, client, self.target, catalog_dir=self.catalog_dir,
                                           limits=self.limits).run(
                dual_write_since=dual_write_since, now=now)
            log.info("parity %s against replica %s: %s", self.group.name, replica, results[replica].verdict.value)
        return elect(results, doubled=doubled)
