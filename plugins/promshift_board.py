"""Airflow plugin: the promshift migration board in the Airflow UI's navigation, served under ``/promshift``.

Thin on purpose: the app lives in ``promshift.board`` (installed package). Airflow mounts plugin
FastAPI apps without authentication; every board route checks the caller with Airflow's own
auth dependencies (see ``promshift.board.app``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from promshift.board.app import URL_PREFIX, create_app

# A small bar-chart glyph in Airflow's nav grey; a data URL, so fetching the icon needs no unauthenticated route.
_ICON = ("data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' "
         "stroke='%2371717a' stroke-width='2' stroke-linecap='round'><path d='M4 20V10M10 20V4M16 20v-7M22 20H2'/>"
         "</svg>")
_ICON_DARK = _ICON.replace("%2371717a", "%23d4d4d8")


class PromshiftBoardPlugin(AirflowPlugin):
    """Migration board: groups by wave, stages, evidence, approvals, audit history."""

    name = "promshift_board"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "promshift migration board"}]
    # A nav entry whose page is the board in Airflow's plugin iframe (/plugin/promshift).
    external_views = [{"name": "Migration board", "href": f"{URL_PREFIX}/", "url_route": "promshift",
                       "destination": "nav", "icon": _ICON, "icon_dark_mode": _ICON_DARK}]
