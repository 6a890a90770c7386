"""GrafanaHook: the ``grafana_default`` connection (conn type ``http``) as a ``GrafanaClient``.

The connection's ``host`` (with or without a scheme), ``port`` and ``schema`` (the URL scheme, as
Airflow's http connections use it: ``https``) name Grafana, or ``extra.base_url`` does (a Grafana
served under a path); the ``password`` is a service account token, sent as ``Authorization: Bearer``.
``extra.timeout_s`` (default 30). The token is never logged or recorded; ``identity()`` is what the
audit may keep.

``read_path_switch(group)`` builds the read path switch from ``extra.read_path``::

    {"source_datasource": {"uid": "prometheus", "name": "Prometheus"},   # what panels read now
     "target_datasource": {"uid": "amp-gpu-fleet", "name": "AMP"},       # the AMP datasource
     "query": "",                 # API mode: every dash-db dashboard whose title matches ("" = all)
     "uids": ["Oxed_c6Wz"],       # API mode, instead of query: these dashboards
     "files": ["/var/lib/grafana/dashboards/*.json"],  # file mode (provisioned files) instead of the API
     "default_is_source": true}   # a panel with no datasource reads Grafana's default = the source

File mode needs a ``Blobs`` for its snapshots (the deploy snapshots' store); API mode keeps
nothing (Grafana keeps the versions).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from promshift.adapters.blobs import Blobs
from promshift.adapters.dashboard_files import DashboardFilesSwitch
from promshift.adapters.grafana import GrafanaClient, GrafanaError, GrafanaReadPathSwitch
from promshift.core.catalog import MetricGroup
from promshift.core.read_path import DatasourceRef, ReadPathError, ReadPathSwitch


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


def datasource_ref(value: Any, what: str) -> DatasourceRef:
    """``{"uid": ..., "name"?: ..., "type"?: "prometheus"}`` from the connection's extra."""
    if not isinstance(value, dict) or not isinstance(value.get("uid"), str) or not value["uid"]:
        raise ReadPathError(f"grafana connection extra.read_path.{what} needs a uid ({{\"uid\": ..., \"name\": ...}})")
    name = value.get("name")
    return DatasourceRef(uid=value["uid"], type=str(value.get("type") or "prometheus"),
                         name=str(name) if name else None)


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

    def read_path_switch(self, group: MetricGroup, *, blobs: Blobs | None = None) -> ReadPathSwitch:
        """The group's read path switch as ``extra.read_path`` configures it (file or API mode)."""
        conn = self.get_connection(self.grafana_conn_id)
        config = conn.extra_dejson.get("read_path")
        if not isinstance(config, dict):
            raise ReadPathError(f"connection {self.grafana_conn_id} has no extra.read_path")
        source = datasource_ref(config.get("source_datasource"), "source_datasource")
        target = datasource_ref(config.get("target_datasource"), "target_datasource")
        common: dict[str, Any] = {"source": source, "target": target,
                                  "variables": dict(group.parity.golden_variables),
                                  "default_is_source": bool(config.get("default_is_source", True))}
        files = config.get("files")
        if files:
            if blobs is None:
                raise ReadPathError("file mode keeps snapshots: give the snapshot store's blobs")
            patterns = [files] if isinstance(files, str) else [str(f) for f in files]
            return DashboardFilesSwitch(patterns, group, blobs=blobs, **common)
        uids = [str(u) for u in config.get("uids") or []]
        return GrafanaReadPathSwitch(self.get_conn(), group, uids=uids,
                                     query=None if uids else str(config.get("query") or ""), **common)

    def test_connection(self) -> tuple[bool, str]:
        """One search with the token."""
        try:
            self.get_conn().search("", limit=1)
        except GrafanaError as exc:
            return False, str(exc)
        return True, f"{self.base_url} answers dashboard searches with this token"
