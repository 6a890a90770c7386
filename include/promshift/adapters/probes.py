"""The measurements behind ``core.ports.Probes``: parity (``parity_check``), latency (``latency_probe``), AMP's
prices (``settings``), the rules and alerts a target holds (``rules_deploy``). The steps order them through the
port; the wiring hands this in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class AdapterProbes:
    """``core.ports.Probes`` over the adapters (each imported when first used)."""

    def parity(self, group: Any, source: Any, target: Any, *, catalog_dir: Path | None, limits: Any = None) -> Any:
        from promshift.adapters.parity_check import ParityCheck

        return ParityCheck(group, source, target, catalog_dir=catalog_dir, limits=limits)

    def ha_parity(self, group: Any, sources: Any, target: Any, *, catalog_dir: Path | None, limits: Any = None) -> Any:
        from promshift.adapters.parity_ha import HaParityCheck

        return HaParityCheck(group, list(sources), target, catalog_dir=catalog_dir, limits=limits)

    def golden_lookbacks(self, group: Any, catalog_dir: Path | None) -> Any:
        from promshift.adapters.parity_check import golden_lookbacks

        return golden_lookbacks(group, catalog_dir)

    def latency(self, source: Any, target: Any, policy: Any, *, min_step_s: float, target_retention: Any,
                target_limits: Any = None) -> Any:
        from promshift.adapters.latency_probe import LatencyProbe

        return LatencyProbe(source, target, policy, min_step_s=min_step_s, target_retention=target_retention,
                            target_limits=target_limits)

    def amp_prices(self) -> Any:
        from promshift.adapters.settings import amp_prices

        return amp_prices()

    def loaded_rules(self, client: Any) -> Any:
        from promshift.adapters.rules_deploy import loaded_rules

        return loaded_rules(client)

    def firing_alerts(self, client: Any) -> Any:
        from promshift.adapters.rules_deploy import firing_alerts

        return firing_alerts(client)

    def rules_snapshot(self, data: Mapping[str, Any]) -> Any:
        from promshift.adapters.rules_deploy import RulesSnapshot

        return RulesSnapshot.from_dict(data)
