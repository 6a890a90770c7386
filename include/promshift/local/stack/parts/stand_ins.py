"""What deployers edit besides the source's own file: the Kubernetes API, the config repository, Grafana.

- ``k8s`` (``kubernetes=True``; ``stack up --k8s``, the demo's ``DEPLOY=k8s-cr``): ``python -m
  promshift.local.stack.k8s_api``, the Kubernetes API contract server with the prometheus-operator stand-in (not
  a cluster), started once the source is up. It holds the ``Prometheus`` resource ``monitoring/k8s`` whose
  ``spec.remoteWrite`` is the source's ``remote_write`` when it starts, renders it onto the source's own
  ``prometheus.yml`` (the base: its scrape configs stay) and reloads it. The source's rule file becomes
  ``PrometheusRule`` ``monitoring/gpu-rules``, rendered back to that file (``source_rules_path``). Its port is
  ``PROMSHIFT_K8S_PORT``, or by default any free one, recorded in ``k8s/api.json``; ``k8s/kubeconfig.json`` points
  at it.
- ``git`` (``git=True``; ``stack up --git``): the bare config repository, its sync stand-in and the GitHub API
  contract server (``promshift.local.stack.reconciler``), started once the source is up.
- Grafana: a provisioned dashboard folder (the read path switch's file mode), the DCGM dashboard copied in once.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import requests

from promshift.local.stack.parts.prometheus import PrometheusPart
from promshift.local.stack.spec import (
    GIT,
    GRAFANA,
    K8S,
    K8S_NAME,
    K8S_NAMESPACE,
    K8S_RULES_NAME,
    SOURCE,
    Component,
    StackError,
)


class StandInsPart(PrometheusPart):
    """The Kubernetes API and operator stand-in, the config repository and its sync, the dashboards folder."""

    @property
    def dashboards_dir(self) -> Path:
        """A provisioned Grafana dashboard folder (file mode of the read path switch): the DCGM dashboard."""
        return self.home / GRAFANA / "dashboards"

    @property
    def kubernetes_dir(self) -> Path:
        """Where the k8s component writes ``api.json`` (where it listens) and ``kubeconfig.json``."""
        return self.home / K8S

    @property
    def kubeconfig_path(self) -> Path:
        """The kubeconfig naming the contract server (``KubernetesHook``'s ``config_file``)."""
        return self.kubernetes_dir / "kubeconfig.json"

    def kubernetes_address(self) -> dict[str, Any] | None:
        """What the running k8s component recorded (``url``, ``port``, ``pid``, ...), or None."""
        try:
            data = json.loads((self.kubernetes_dir / "api.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @property
    def k8s_port(self) -> int:
        """The contract server's port: ``k8s_port`` when set, else the one the running server bound (0 before)."""
        if self.config.k8s_port:
            return self.config.k8s_port
        address = self.kubernetes_address()
        return int(address["port"]) if address and address.get("port") else 0

    @property
    def kubernetes_url(self) -> str:
        return f"http://127.0.0.1:{self.k8s_port}"

    @property
    def prometheus_cr_url(self) -> str:
        """The ``Prometheus`` resource the k8s component serves (``GET`` it to see ``spec.remoteWrite``)."""
        return (f"{self.kubernetes_url}/apis/monitoring.coreos.com/v1/namespaces/{K8S_NAMESPACE}/"
                f"prometheuses/{K8S_NAME}")

    def prometheus_cr(self) -> dict[str, Any]:
        """The ``Prometheus`` resource as the contract server holds it now."""
        if not self.kubernetes_address():
            raise StackError("the Kubernetes contract server is not running: "
                             "run `python -m promshift.local stack up --k8s`")
        response = self._http.get(self.prometheus_cr_url, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def kubernetes_source_extra(self, timeout_s: float = 120.0, *, rules: bool = False) -> dict[str, Any]:
        """The source connection's ``extra.kubernetes`` for the ``Prometheus`` resource (``extra.deploy: k8s-cr``);
        ``rules``: and ``prometheus_rules``, the ``PrometheusRule`` the source's rules live in (a rules move reads
        and edits it)."""
        if not self.kubernetes_address():
            raise StackError("the Kubernetes contract server is not running: "
                             "run `python -m promshift.local stack up --k8s`")
        extra: dict[str, Any] = {"namespace": K8S_NAMESPACE, "name": K8S_NAME,
                                 "config_file": str(self.kubeconfig_path), "timeout_s": timeout_s}
        if rules:
            extra["prometheus_rules"] = [f"{K8S_NAMESPACE}/{K8S_RULES_NAME}"]
        return extra

    def prometheus_rule(self) -> dict[str, Any]:
        """The ``PrometheusRule`` ``monitoring/gpu-rules`` as the contract server holds it now."""
        response = self._http.get(f"{self.kubernetes_url}/apis/monitoring.coreos.com/v1/namespaces/{K8S_NAMESPACE}/"
                                  f"prometheusrules/{K8S_RULES_NAME}", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    @property
    def git_dir(self) -> Path:
        """Where the git component keeps ``config.git``, ``api.json``, ``token`` and ``sync.json``."""
        return self.home / GIT

    def git_address(self) -> dict[str, Any] | None:
        """What the running git component recorded (``url``, ``port``, ``pid``, ``repo``, ...), or None."""
        from promshift.local.stack.reconciler import read_address

        return read_address(self.git_dir)

    @property
    def github_url(self) -> str:
        address = self.git_address() or {}
        port = self.config.github_port or address.get("port") or 0
        return f"http://127.0.0.1:{port}"

    def git_token(self) -> str:
        """The GitHub API contract server's token (Airflow gets it as a connection's password)."""
        return (self.git_dir / "token").read_text().strip()

    def git_source_extra(self, *, backend: str = "github", timeout_s: float = 120.0) -> dict[str, Any]:
        """The source connection's ``extra.git`` for the stack's config repository (``extra.deploy: git``)."""
        address = self.git_address()
        if not address:
            raise StackError("the git component is not running: run `python -m promshift.local stack up --git`")
        extra: dict[str, Any] = {"url": address["repo"], "path": address["path"], "shape": address["shape"],
                                 "branch": address["branch"], "backend": backend, "timeout_s": timeout_s}
        if backend == "github":
            extra.update(github={"repository": address["repository"], "api_url": address["url"]},
                         conn_id="promshift_git", http_loopback=True)  # the contract server: plain http on 127.0.0.1
        return extra

    def _stand_in_components(self) -> dict[str, Component]:
        cfg = self.config
        k8s_argv = (sys.executable, "-m", "promshift.local.stack.k8s_api", "--state-dir", str(self.kubernetes_dir),
                    "--port", str(cfg.k8s_port), "--config", str(self.source_config_path),
                    "--prometheus", self.source_url, "--namespace", K8S_NAMESPACE, "--name", K8S_NAME,
                    # the source's rules as PrometheusRule monitoring/gpu-rules, rendered back to that rule file
                    "--rule-file", str(self.source_rules_path), "--rules-name", K8S_RULES_NAME,
                    # the operator stand-in restarts the source as an agent for a PrometheusAgent (retire)
                    "--mode-switch", json.dumps(self.source_mode_extra(), sort_keys=True))
        git_argv = (sys.executable, "-m", "promshift.local.stack.reconciler", "--state-dir", str(self.git_dir),
                    "--port", str(cfg.github_port), "--config", str(self.source_config_path),
                    "--prometheus", self.source_url, "--interval", str(cfg.reconciler_interval_s),
                    # the sync stand-in restarts the source as an agent for prometheus.agentMode (retire)
                    "--mode-switch", json.dumps(self.source_mode_extra(), sort_keys=True))
        return {
            K8S: Component(K8S, cfg.k8s_port, k8s_argv, self.kubernetes_url, self.prometheus_cr_url,
                           f"promshift.local.stack.k8s_api --state-dir {self.kubernetes_dir}",
                           "PROMSHIFT_K8S_PORT"),
            GIT: Component(GIT, cfg.github_port, git_argv, self.github_url, self.github_url,
                           f"promshift.local.stack.reconciler --state-dir {self.git_dir}",
                           "PROMSHIFT_GITHUB_PORT"),
        }

    def _start_stand_ins(self, components: dict[str, Component], plans: dict[str, tuple[str, int | None]],
                         deadline: float) -> None:
        """The k8s component (kubernetes=True) or the git component (git=True), once the source it renders or
        syncs onto answers; a reused one is restarted when the source was not reused (it takes the file over)."""
        for name, wanted in ((K8S, self.config.kubernetes), (GIT, self.config.git)):
            if not wanted:
                continue
            action, pid = plans[name]
            if action == "reuse" and plans[SOURCE][0] != "reuse":
                action = "restart"  # the operator or the sync renders onto the source's file: take it over again
            self._apply(components[name], (action, pid))
            self._wait_healthy([components[name]], deadline)

    def _healthy(self, component: Component) -> bool:
        if component.name == K8S:
            # Written once the server listens and the operator has rendered the resource onto the source.
            address = self.kubernetes_address()
            if address is None or address.get("pid") != self._read_pid(K8S):
                return False
            if self.config.k8s_port and address.get("port") != self.config.k8s_port:
                return False
            try:
                return self._http.get(self.prometheus_cr_url, timeout=2).status_code == 200
            except requests.RequestException:
                return False
        if component.name == GIT:
            # Written once the API listens and the first sync has been loaded by the source.
            address = self.git_address()
            if address is None or address.get("pid") != self._read_pid(GIT):
                return False
            return not self.config.github_port or address.get("port") == self.config.github_port
        return super()._healthy(component)

    def _before_start(self, component: Component) -> None:
        if component.name in (K8S, GIT):  # a dead contract server's api.json must not pass for the new one's
            (self.kubernetes_dir if component.name == K8S else self.git_dir).joinpath("api.json").unlink(
                missing_ok=True)
        super()._before_start(component)

    def _copy_dashboards(self) -> None:
        from promshift.adapters.settings import REPO_ROOT

        dashboard = REPO_ROOT / "catalog" / "dashboards" / "dcgm-exporter-dashboard.json"
        if dashboard.is_file() and not (self.dashboards_dir / dashboard.name).exists():
            self.dashboards_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dashboard, self.dashboards_dir / dashboard.name)
