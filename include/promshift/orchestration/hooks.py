"""PrometheusHook: an Airflow connection to a Prometheus-compatible API (source or AMP target)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from promshift.adapters.prometheus import PrometheusClient


def base_url_from(host: str | None, port: int | None, schema: str | None, extra: dict[str, Any]) -> str:
    """One parsing rule for every caller: ``extra.base_url`` wins, else host (with scheme) and port."""
    if extra.get("base_url"):
        return str(extra["base_url"]).rstrip("/")
    if not host:
        raise ValueError("Prometheus connection needs a host or extra.base_url")
    url = host if "://" in host else f"http://{host}"
    if port:
        url = f"{url}:{port}"
    if schema:
        url = f"{url}/{schema.strip('/')}"
    return url.rstrip("/")


class PrometheusHook(BaseHook):
    """Talks to one Prometheus HTTP API; the connection's extra carries deploy settings.

    Extra fields: ``base_url`` (with a path, e.g. an AMP workspace), ``config_path`` (the
    source's config file, for the file deployer), ``remote_write_url`` (the target's write
    endpoint), ``promtool``, ``timeout_s``.
    """

    conn_name_attr = "prometheus_conn_id"
    default_conn_name = "promshift_source"
    conn_type = "prometheus"
    hook_name = "Prometheus (promshift)"

    def __init__(self, prometheus_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prometheus_conn_id = prometheus_conn_id

    @property
    def extra(self) -> dict[str, Any]:
        return self.get_connection(self.prometheus_conn_id).extra_dejson

    @property
    def base_url(self) -> str:
        conn = self.get_connection(self.prometheus_conn_id)
        return base_url_from(conn.host, conn.port, conn.schema, conn.extra_dejson)

    def get_conn(self, *, stats: bool = False) -> PrometheusClient:
        """A client; with ``stats`` every query asks for ``stats=all`` (the server's own timings)."""
        return PrometheusClient(self.base_url, timeout_s=float(self.extra.get("timeout_s", 60)), always_stats=stats)

    def test_connection(self) -> tuple[bool, str]:
        client = self.get_conn()
        if client.ready():
            return True, f"{client.base_url} is ready"
        return False, f"{client.base_url} is unreachable or not ready"
