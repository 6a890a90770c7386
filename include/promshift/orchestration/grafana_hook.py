"""GrafanaHook: the ``grafana_default`` connection (conn type ``http``) as a ``GrafanaClient``.

The connection's ``host`` (with or without a scheme), ``port`` and ``schema`` (the URL scheme, as
Airflow's http connections use it: ``https``) name Grafana, or ``extra.base_url`` does (a Grafana
served under a path); the ``password`` is a service account token, sent as ``Authorization: Bearer``.
``extra.timeout_s`` (default 30). The token is never logged or recorded; ``identity()`` is what the
audit may keep.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from promshift.adapters.grafana import GrafanaClient, GrafanaError


def grafana_base_url(host: str | None, port: int | None, schema: str | None, extra: dict[str, Any]) -> str:
    """``extra.base_url`` wins; else ``host`` (a scheme in it wins over ``schema``, default http) and ``port``."""
    if extra.get("base_url"):
        return str(extra["base_url"]).rstrip("/")
    if not host:
        raise GrafanaError("Grafana connection needs a host or extra.base_url")
    url = host if "://" in host else f"{schema or 'http'}://{host}"
    if port:
        url = f"{url.rstrip('/')}:{port}"
    return url.rstrip("/")


class GrafanaHook(BaseHook):
    """A Grafana HTTP API connection: host/port, the service account token as password."""

    conn_name_attr = "grafana_conn_id"
    default_conn_name = "grafana_default"
    conn_type = "http"
    hook_name = "Grafana (promshift)"

    def __init__(self, grafana_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grafana_conn_id = grafana_conn_id

    @property
    def base_url(self) -> str:
        conn = self.get_connection(self.grafana_conn_id)
        return grafana_base_url(conn.host, conn.port, conn.schema, conn.extra_dejson)

    def get_conn(self) -> GrafanaClient:
        conn = self.get_connection(self.grafana_conn_id)
        extra = conn.extra_dejson
        return GrafanaClient(grafana_base_url(conn.host, conn.port, conn.schema, extra), conn.password or "",
                             timeout_s=float(extra.get("timeout_s", 30)))

    def identity(self) -> dict[str, Any]:
        """What the audit records about this Grafana (never the token)."""
        return {"kind": "grafana", "conn_id": self.grafana_conn_id, "url": self.base_url}

    def test_connection(self) -> tuple[bool, str]:
        """One search with the token."""
        try:
            self.get_conn().search("", limit=1)
        except GrafanaError as exc:
            return False, str(exc)
        return True, f"{self.base_url} answers dashboard searches with this token"
