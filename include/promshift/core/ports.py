"""The ports the steps see: what they need of the audit log, the routing state, the blob store, a Prometheus
(source or target) and the measurements they order. Protocols only; ``adapters/`` implements them and
``orchestration.wiring`` (or a test) hands them in. ``steps/`` imports nothing from ``adapters/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from promshift.core.audit import AuditEvent
from promshift.core.stages import Stage


@runtime_checkable
class AuditLog(Protocol):
    """The hash-chained audit log (``adapters.audit_store.AuditStore``)."""

    url: str

    def stage_of(self, group: str) -> Stage: ...

    def events(self, *, group: str | None = None, run_id: str | None = None) -> list[AuditEvent]: ...

    def append(self, *, group: str, run_id: str, kind: str, actor: str, at: datetime, evidence: Mapping[str, Any],
               stage_from: Any, stage_to: Any) -> AuditEvent: ...


@runtime_checkable
class Routing(Protocol):
    """Where each group's reads go (``adapters.routing.RoutingStore``)."""

    where: str

    def route(self, group: str, *, read_from: str, url: str, at: datetime, run_id: str,
              pair: tuple[str, str] | None = None) -> dict[str, Any]: ...

    def read_from(self, group: str) -> str: ...

    def get(self, group: str) -> dict[str, Any] | None: ...


@runtime_checkable
class Blobs(Protocol):
    """Bytes under a key, readable by every worker (``adapters.blobs``, ``orchestration.object_blobs``)."""

    def put(self, key: str, data: bytes, *, mode: int = 0o600) -> str:
        """Store ``data`` under ``key`` (``group/run.yml``); return the reference ``get`` reads."""

    def get(self, ref: str) -> bytes:
        """The bytes ``put`` stored (OSError if they cannot be read)."""


@runtime_checkable
class PrometheusProbe(Protocol):
    """A Prometheus-compatible server as the steps ask it (``adapters.prometheus.PrometheusClient``); a failed
    call raises ``core.errors.PrometheusError``."""

    base_url: str

    def ready(self) -> bool: ...

    def scalar(self, expr: str, at: float | None = None) -> float | None: ...

    def query(self, expr: str, at: float | None = None) -> Any: ...

    def config_text(self) -> str: ...

    def metrics_text(self) -> str: ...

    def reload(self, timeout_s: float | None = None) -> None: ...


@runtime_checkable
class Probes(Protocol):
    """The measurements the steps order over two servers (``adapters.probes.AdapterProbes``): parity, latency
    and cost, the rules and alerts a target holds."""

    def parity(self, group: Any, source: PrometheusProbe, target: PrometheusProbe, *,
               catalog_dir: Path | None, limits: Any = None) -> Any:
        """A parity check with ``run(dual_write_since=, now=) -> core.parity.ParityResult``; ``limits``: the
        target's per-query limits (a callable answering ``core.query_limits.QueryLimits``)."""

    def ha_parity(self, group: Any, sources: Sequence[tuple[str, PrometheusProbe]], target: PrometheusProbe, *,
                  catalog_dir: Path | None, limits: Any = None) -> Any:
        """Parity against the replica the target kept (``core.ha``): ``run(...) -> ParityResult``, and the same
        ``plan`` / ``compare_shard`` / ``reduce`` as ``parity`` (the DAG's mapped parity tasks)."""

    def golden_lookbacks(self, group: Any, catalog_dir: Path | None) -> Sequence[float]: ...

    def latency(self, source: PrometheusProbe, target: PrometheusProbe, policy: Any, *, min_step_s: float,
                target_retention: Any, target_limits: Any = None) -> Any:
        """A latency probe with ``run(now=, queries=, ...) -> core.latency.LatencyResult``."""

    def amp_prices(self) -> Any: ...

    def loaded_rules(self, client: PrometheusProbe) -> Any: ...

    def firing_alerts(self, client: PrometheusProbe) -> Any: ...

    def rules_snapshot(self, data: Mapping[str, Any]) -> Any:
        """A stored rules snapshot read back (``RulesSnapshot.from_dict``)."""


@runtime_checkable
class SourceModeSwitch(Protocol):
    """Turns a source Prometheus into an agent (forwarder only) and back: the lab restarts its process
    (``local.stack.source_mode``), the k8s-cr path applies a ``PrometheusAgent`` resource, the git path commits
    kube-prometheus-stack's ``prometheus.agentMode``. Each call reads
    the current mode first, so a retry after a crash reaches the same end."""

    def mode(self) -> str:
        """``agent``, ``server`` or ``down``."""

    def to_agent(self) -> Any:
        """The change (``as_dict()``, ``changed``); a no-op on an agent."""

    def restore(self) -> Any:
        """The server put back from what ``to_agent`` saved (``as_dict()``, ``byte_identical``)."""


@runtime_checkable
class SourceObserver(Protocol):
    """What a source still does, read before it is retired and measured around it."""

    def rules(self) -> list[str]:
        """``group/rule`` of every rule it evaluates (``/api/v1/rules``; an agent evaluates none)."""

    def reads(self, since: float, until: float) -> tuple[list[str], list[str]]:
        """Metric names its query log shows read by API queries in [since, until], and notes on what was not read."""

    def stored_metrics(self) -> list[str]:
        """Every metric name it stores (``/api/v1/label/__name__/values``)."""

    def usage(self) -> dict[str, float | None]:
        """Its own ``process_resident_memory_bytes`` (MB) and ``process_cpu_seconds_total`` now."""

    def query_answer(self) -> tuple[int, str]:
        """Status and the first words of its answer to an instant query (422 on an agent)."""


@runtime_checkable
class SampleTimes(Protocol):
    """Sample timestamps of an expression's series over the last ``window_s`` seconds (the target)."""

    def sample_times(self, expr: str, window_s: float) -> list[float]: ...
