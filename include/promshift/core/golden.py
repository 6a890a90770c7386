"""Golden queries: the dashboard queries a group's users run, taken from Grafana dashboard JSON."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# $var, ${var}, ${var:format} and the deprecated [[var]].
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


class GoldenQueryError(ValueError):
    """A dashboard query that cannot be turned into PromQL (e.g. a variable with no value)."""


@dataclass(frozen=True)
class DashboardQuery:
    """One panel target: where it came from and its raw (templated) expression."""

    panel: str
    ref_id: str
    expr: str


def _panels(panels: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # rows nest their panels


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every Prometheus target expression of every panel (rows included), in dashboard order."""
    out = []
    for panel in _panels(list(dashboard.get("panels") or [])):
        for target in panel.get("targets") or []:
            expr = (target.get("expr") or "").strip()
            if expr:
                out.append(DashboardQuery(panel=str(panel.get("title") or panel.get("id") or "?"),
                                          ref_id=str(target.get("refId") or ""), expr=expr))
    return out


def substitute(expr: str, values: Mapping[str, str], *, builtins: Mapping[str, str] | None = None) -> str:
    """Replace Grafana template variables; a variable with no value raises GoldenQueryError.

    Built-ins (``$__rate_interval``, ``$__interval``, ``$__range``) come from ``builtins``;
    multi-value variables are given as a regex (``a|b``), as Grafana renders them for ``=~``.
    """
    known = {**(builtins or {}), **values}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in known:
            raise GoldenQueryError(f"template variable ${name} has no value (set parity.golden_variables.{name})")
        return known[name]

    return _VARIABLE.sub(repl, expr)


def queries_for_group(dashboard: Mapping[str, Any], claims: Callable[[str], bool]) -> list[DashboardQuery]:
    """The dashboard queries that read at least one metric the group claims."""
    return [q for q in dashboard_queries(dashboard) if any(claims(name) for name in _IDENTIFIER.findall(q.expr))]


def grafana_builtins(step_s: float, window_s: float) -> dict[str, str]:
    """What Grafana would put in its built-in interval variables for this step and window."""
    step = f"{max(1, int(step_s))}s"
    return {"__interval": step, "__rate_interval": f"{max(1, int(4 * step_s))}s", "__range": f"{int(window_s)}s",
            "__range_s": str(int(window_s))}
