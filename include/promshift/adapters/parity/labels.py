"""Layer 2, labels: label names per metric on both sides after normalization; drift is named."""

from __future__ import annotations

from typing import Any

from promshift.adapters.parity.common import ParityLayer, on_both
from promshift.adapters.prometheus import PrometheusError
from promshift.core.parity import describe_label_drift, label_drift, label_renames
from promshift.core.promql import promql_string
from promshift.core.verdicts import Measurement, Verdict


class LabelsLayer(ParityLayer):
    """``labels``: which label names each side's series carry, per metric."""

    def measure(self, start: float, end: float) -> Measurement:
        """Label names per metric on both sides, after ignore/rename rules; drift is named."""
        queries = []
        try:
            metrics = self.ctx.metric_names(start, end)
            names: list[dict[str, list[str]]] = [{}, {}]
            for metric in metrics:
                match = f"{{__name__={promql_string(metric)}}}"
                queries.append(f"labels {match}")
                names[0][metric], names[1][metric] = on_both(
                    self.source, self.target, lambda c, m=match: c.label_names(m, start=start, end=end))
        except PrometheusError as exc:
            return Measurement("labels", Verdict.ERROR, str(exc), tuple(queries))
        if not metrics:
            return Measurement("labels", Verdict.INCONCLUSIVE, "the source has no metric of this group in the window",
                               tuple(queries))
        drift = label_drift(names[0], names[1], ignore=self.policy.ignore_labels,
                            rename=dict(self.policy.rename_labels), dropped=self.group.drop_labels)
        numbers: dict[str, Any] = {"metrics": len(metrics), "drift": drift,
                                   "labels": sorted({n for ns in names[0].values() for n in ns})}
        if drift:
            try:
                hosts = self._hosts_under_renames(drift, start, end, queries)
            except PrometheusError as exc:
                return Measurement("labels", Verdict.ERROR, str(exc), tuple(queries), numbers)
            if hosts:
                numbers["renamed_hosts"] = hosts
            return self.ctx.with_hosts_per_name(Measurement(
                "labels", Verdict.FAILED, "label drift: " + describe_label_drift(drift, hosts), tuple(queries),
                numbers))
        return self.ctx.with_hosts_per_name(Measurement(
            "labels", Verdict.SUCCESSFUL, f"label names of {len(metrics)} metrics match after normalization",
            tuple(queries), numbers))

    def _hosts_under_renames(self, drift: dict[str, Any], start: float, end: float,
                             queries: list[str]) -> dict[str, list[str]]:
        """For each suspected rename, the hosts whose series carry the renamed name (on that side).

        The values of the name itself when it is a name of the host label (``hostname``), else the
        hosts of the series that carry it. One label-values call per name, only when drift is found.
        """
        hosts = self.ctx.host_labels
        out: dict[str, list[str]] = {}
        for (frm, _to), side in sorted(label_renames(drift).items()):
            client = self.target if side == "target" else self.source
            match = f"{{__name__=~{promql_string(self.group.name_regex())}, {frm}!=\"\"}}"
            found: set[str] = set()
            for label in ([frm] if frm in hosts.names else list(hosts.declared)):
                queries.append(f"label values {label} on the {side} {match}")
                found.update(client.label_values(label, match, start=start, end=end))
            out[frm] = sorted(found)
        return out
