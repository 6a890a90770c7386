"""Airflow plugin: the promshift migration board in the Airflow UI's navigation, served under ``/promshift``.

Thin on purpose: the app lives in ``promshift.board`` (installed package). Airflow mounts plugin
FastAPI apps without authentication; every board route checks the caller with Airflow's own
auth dependencies (see ``promshift.board.app``).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from promshift.board import URL_PREFIX

# A small bar-chart glyph in Airflow's nav grey; a data URL, so fetching the icon needs no unauthenticated route.
_ICON = ("data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' "
         "stroke='%2371717a' stroke-width='2' stroke-linecap='round'><path d='M4 20V10M10 20V4M16 20v-7M22 20H2'/>"
         "</svg>")
_ICON_DARK = _ICON.replace("%2371717a", "%23d4d4d8")


class _BoardApps:
    """``fastapi_apps``, built on first read.

    Every Airflow process loads plugins (scheduler, DAG processor, triggerer, task runners), but only
    the API server reads ``fastapi_apps``; importing the web app and Airflow's API security module
    eagerly cost seconds in each of the others.
    """

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, obj: object, owner: type) -> list[dict[str, Any]]:
        if self._apps is None:
            from promshift.board.app import create_app

            self._apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "promshift migration board"}]
        return self._apps


class PromshiftBoardPlugin(AirflowPlugin):
    """Migration board: groups by wave, stages, evidence, approvals, audit history."""

    name = "promshift_board"
    fastapi_apps = _BoardApps()  # type: ignore[assignment]
    # A nav entry whose page is the board in Airflow's plugin iframe (/plugin/promshift).
    external_views = [{"name": "Migration board", "href": f"{URL_PREFIX}/", "url_route": "promshift",
                       "destination": "nav", "icon": _ICON, "icon_dark_mode": _ICON_DARK}]
