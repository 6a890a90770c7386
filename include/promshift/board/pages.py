"""HTML of the board: Jinja templates (autoescaped) over the same dicts the JSON API returns."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from jinja2.runtime import Markup

from promshift.core.report import source_failed_label
from promshift.core.text import shown

# Colours follow Airflow's own state colours where a stage has an obvious twin.
STAGE_TONE = {
    "planned": "neutral", "dual_writing": "info", "warming": "info", "verified": "teal", "approved": "teal",
    "cut_over": "success", "baking": "success", "baked": "success", "decommissioned": "neutral",
    "recommissioned": "teal", "rolled_back_reads": "warning", "rolled_back": "warning", "failed": "danger",
}
VERDICT_TONE = {"SUCCESSFUL": "success", "INCONCLUSIVE": "warning", "FAILED": "danger", "ERROR": "danger"}
RUN_TONE = {"success": "success", "failed": "danger", "running": "info", "queued": "neutral"}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _speedup(row: Mapping[str, Any]) -> str:
    if row.get("speedup") is not None:
        return f"{row['speedup']:.2f}x"
    return source_failed_label(row) or "-"


def _when(value: str | None) -> str:
    """ISO time as ``YYYY-MM-DD HH:MM:SS UTC`` (the page's JS shows it relative, too)."""
    if not value:
        return "-"
    at = datetime.fromisoformat(value)
    return at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _visible(value: Any) -> Any:
    """Every text the board prints, with control, bidi-override and line-separator characters escaped (\u202e):
    a reason or comment stored before the input check, or arriving another way, cannot read backwards here."""
    return shown(value) if isinstance(value, str) and not isinstance(value, Markup) else value


@lru_cache(maxsize=1)
def _env() -> Environment:
    env = Environment(loader=PackageLoader("promshift.board", "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True, finalize=_visible)
    env.filters.update(seconds=_seconds, speedup=_speedup, when=_when, money=_money)
    env.globals.update(stage_tone=STAGE_TONE, verdict_tone=VERDICT_TONE, run_tone=RUN_TONE)
    return env


def overview_html(data: Mapping[str, Any], *, base: str) -> str:
    return _env().get_template("overview.html").render(data=data, base=base, user=data["user"])


def group_html(data: Mapping[str, Any], *, user: str, base: str) -> str:
    return _env().get_template("group.html").render(g=data, base=base, user=user)


def error_html(status: int, detail: str, *, airflow_root: str, base: str) -> str:
    return _env().get_template("error.html").render(status=status, detail=detail, airflow_root=airflow_root,
                                                    base=base, user=None)
