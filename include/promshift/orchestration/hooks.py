"""PrometheusHook: an Airflow connection to a self-hosted Prometheus; ``backend_hook`` picks the hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.orchestration.provider_info import PROMETHEUS_UI, field_behaviour

if TYPE_CHECKING:
    from promshift.orchestration.amp_hook import AmpHook


def backend_hook(conn_id: str) -> PrometheusHook | AmpHook:
    """The hook for a backend connection, by its conn_type: ``amp`` -> AmpHook, else PrometheusHook.

    The one place that choice is made (operators and the warm-up trigger call it).
    """
    conn_type = (BaseHook.get_connection(conn_id).conn_type or "").lower()
    if conn_type == "amp":
        from promshift.orchestration.amp_hook import AmpHook

        return AmpHook(aws_conn_id=conn_id)
    return PrometheusHook(conn_id)


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

    # -- what a migration asks of a backend (AmpHook answers the same) --------------------
    def prometheus_client(self, *, stats: bool = False) -> PrometheusClient:
        return self.get_conn(stats=stats)

    @property
    def remote_write_url(self) -> str | None:
        url = self.extra.get("remote_write_url")
        return str(url) if url else None

    @property
    def sigv4(self) -> dict[str, str] | None:
        return None  # a self-hosted receiver takes unsigned writes

    @property
    def alert_reader(self) -> Callable[[str], list[Any]] | None:
        """A self-hosted target's Alertmanager (``extra.alertmanager_url``): alertname -> the alerts it holds
        active; None when the connection names none."""
        from promshift.adapters.alertmanager import active_alerts

        url = self.extra.get("alertmanager_url")
        return (lambda name: active_alerts(str(url), name)) if url else None

    @property
    def retention_lookup(self) -> Callable[[], tuple[float | None, str]] | None:
        return None  # the server reports it (status/runtimeinfo); the catalog is the fallback

    def out_of_order_window(self) -> tuple[float | None, str]:
        """``(seconds, origin)``: the server's ``storage.tsdb.out_of_order_time_window`` from the config it has
        loaded, ``(None, why)`` when unreadable (a queue swap onto it is then refused)."""
        from promshift.adapters.queue_probe import target_out_of_order_window

        return target_out_of_order_window(self.get_conn())

    def query_limits(self) -> Any:
        """A self-hosted backend's per-query limits: ``extra.query_limits`` (e.g. ``{max_samples: ...}``), else
        none known (a refusal for size is still split and asked again)."""
        from promshift.core.query_limits import QueryLimits

        configured = dict(self.extra.get("query_limits") or {})
        return QueryLimits.from_dict({**configured, "source": dict.fromkeys(configured, "configuration")})

    def identity(self) -> dict[str, Any]:
        """What the audit records about this backend (never credentials)."""
        return {"kind": "prometheus", "url": self.base_url}

    def readiness_problem(self) -> str | None:
        """Why the backend cannot be used now (its ``/-/ready``), or None."""
        client = self.get_conn()
        return None if client.ready() else f"{client.base_url} is unreachable or not ready"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return field_behaviour(PROMETHEUS_UI)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: ``/-/ready`` answers, and one query does."""
        try:
            problem = self.readiness_problem()
            if problem:
                return False, problem
            self.get_conn().query("vector(1)")
        except (PrometheusError, ValueError) as exc:
            return False, str(exc)
        return True, f"{self.base_url} is ready and answers queries"


def connection_secret(conn_id: str) -> str | None:
    """The password of connection ``conn_id`` (a git token, say); ValueError naming the id when it has none."""
    secret = BaseHook.get_connection(conn_id).password
    if not secret:
        raise ValueError(f"connection {conn_id!r} has no password (the token)")
    return str(secret)


def kubernetes_hook(source: Any) -> Any:
    """The cncf-kubernetes provider's ``KubernetesHook`` for a ``core.deploy_kinds.KubernetesSource``.

    ``conn_id`` names a ``kubernetes`` connection (its kubeconfig, context and in-cluster flag);
    without one, ``config_file``/``cluster_context``/``in_cluster`` are given to the hook directly
    (``conn_id=None`` and ``kubernetes_conn_id=None``, so no connection is looked up).
    """
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=source.conn_id, kubernetes_conn_id=source.conn_id,
                          config_file=source.config_file, cluster_context=source.cluster_context,
                          in_cluster=source.in_cluster)
