"""A source run by prometheus-operator switched to agent mode and back: its ``Prometheus`` resource becomes a
``PrometheusAgent`` resource (``monitoring.coreos.com/v1alpha1``), and the undo creates the ``Prometheus`` resource
again as its owner wrote it.

``K8sSourceModeSwitch`` is the retire DAG's switch (``core.ports.SourceModeSwitch``) on the k8s-cr path, over the
Kubernetes API through the ``kubernetes`` client the cncf-kubernetes provider's ``KubernetesHook`` builds (the same
as ``adapters.k8s_deploy``). The operator does the rest: for a ``PrometheusAgent`` it runs Prometheus with
``--enable-feature=agent`` (``--agent`` on 3.x) and a config without rules, alerting or remote read; deleting the
``Prometheus`` resource removes the server's StatefulSet (and, by the operator's default, not its volumes).

``to_agent`` (each step reads the state first, so a retry after a crash reaches the same end):

1. read ``Prometheus`` ns/name and ``PrometheusAgent`` ns/name;
2. when no agent exists, create it (``core.retire.agent_resource``: same name, labels, every spec field an agent
   has; the server-only fields dropped and named; the ``Prometheus`` resource itself saved in an annotation of the
   agent, the undo's only input);
3. wait until the source answers as an agent (``/-/ready`` says "Prometheus Agent");
4. delete the ``Prometheus`` resource.

``restore``: create the ``Prometheus`` resource from the agent's annotation (when it is gone), wait until the source
answers as a server, delete the agent; ``byte_identical`` compares the resource read back with the saved one as
its owner wrote it (``core.retire.user_content``: ``resourceVersion``, ``uid``, ``creationTimestamp`` are the API
server's and differ on any re-created object).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from promshift.adapters.k8s_deploy import CR_GROUP, CR_PLURAL, CR_VERSION, _api_reason, api_client_of
from promshift.adapters.source_mode import ModeChange, SourceModeError, probe_mode
from promshift.core.render import sha256_bytes
from promshift.core.retire import agent_resource, canonical, saved_prometheus, user_content

AGENT_VERSION, AGENT_PLURAL = "v1alpha1", "prometheusagents"
DEFAULT_TIMEOUT_S = 300.0  # the operator replacing the pods: a StatefulSet rollout


class K8sSourceModeSwitch:
    """``mode``/``to_agent``/``restore`` of the source behind ``Prometheus`` ``namespace/name``."""

    def __init__(self, api: Any, *, namespace: str, name: str, url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 poll_s: float = 1.0, log: Callable[[str], None] | None = None) -> None:
        self.custom = CustomObjectsApi(api_client_of(api))
        self.namespace, self.name, self.url = namespace, name, url
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._log = log or (lambda _line: None)
        self.dropped: list[str] = []  # the spec fields the last conversion left out (server-only)

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def mode(self) -> str:
        return probe_mode(self.url)

    # the two resources

    def _call(self, what: str, call: Callable[[], Any], *, missing_ok: bool = False) -> Any:
        try:
            return call()
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            raise SourceModeError(f"{what}: {_api_reason(exc)}") from None
        except HTTPError as exc:
            raise SourceModeError(f"{what}: cannot reach the Kubernetes API ({type(exc).__name__})") from None

    def _prometheus(self) -> dict[str, Any] | None:
        return self._call(f"reading Prometheus {self.where}", lambda: self.custom.get_namespaced_custom_object(
            CR_GROUP, CR_VERSION, self.namespace, CR_PLURAL, self.name), missing_ok=True)

    def _agent(self) -> dict[str, Any] | None:
        return self._call(f"reading PrometheusAgent {self.where}", lambda: self.custom.get_namespaced_custom_object(
            CR_GROUP, AGENT_VERSION, self.namespace, AGENT_PLURAL, self.name), missing_ok=True)

    def _wait_mode(self, wanted: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while (mode := self.mode()) != wanted:
            if time.monotonic() > deadline:
                raise SourceModeError(f"the source at {self.url} still answers as {mode!r} {self.timeout_s:.0f}s "
                                      f"after the operator was asked for a {wanted}")
            time.sleep(self.poll_s)

    # the switch

    def to_agent(self) -> ModeChange:
        prometheus, agent = self._prometheus(), self._agent()
        if prometheus is None and agent is None:
            raise SourceModeError(f"neither a Prometheus nor a PrometheusAgent {self.where} exists; not switching")
        if prometheus is None:
            self._wait_mode("agent")
            sha = sha256_bytes(canonical(user_content(agent or {})))
            return ModeChange("agent", False, ("PrometheusAgent", self.where), ("PrometheusAgent", self.where),
                              sha, sha)
        saved = user_content(prometheus)
        body, self.dropped = agent_resource(prometheus)
        created = agent is None
        if agent is None:
            self._log(f"creating PrometheusAgent {self.where} (left out, server-only: {', '.join(self.dropped)})")
            agent = self._call(f"creating PrometheusAgent {self.where}",
                               lambda: self.custom.create_namespaced_custom_object(
                                   CR_GROUP, AGENT_VERSION, self.namespace, AGENT_PLURAL, body))
        elif saved_prometheus(agent) != saved:  # not ours, or made from another Prometheus spec than this one
            raise SourceModeError(f"a PrometheusAgent {self.where} exists that was not made from this Prometheus "
                                  "resource; not replacing it")
        try:
            self._wait_mode("agent")
        except SourceModeError as exc:  # the agent never came up: take it away; the Prometheus resource stays
            if created:
                self._call(f"deleting PrometheusAgent {self.where}",
                           lambda: self.custom.delete_namespaced_custom_object(
                               CR_GROUP, AGENT_VERSION, self.namespace, AGENT_PLURAL, self.name), missing_ok=True)
            raise SourceModeError(f"{exc}; the PrometheusAgent was deleted again, the Prometheus resource "
                                  "kept") from None
        self._log(f"deleting Prometheus {self.where}: the PrometheusAgent runs the source")
        self._call(f"deleting Prometheus {self.where}", lambda: self.custom.delete_namespaced_custom_object(
            CR_GROUP, CR_VERSION, self.namespace, CR_PLURAL, self.name), missing_ok=True)
        return ModeChange("agent", True, ("Prometheus", self.where), ("PrometheusAgent", self.where),
                          sha256_bytes(canonical(saved)), sha256_bytes(canonical(user_content(agent or body))))

    def restore(self) -> ModeChange:
        prometheus, agent = self._prometheus(), self._agent()
        if agent is None:
            if prometheus is None:
                raise SourceModeError(f"neither a Prometheus nor a PrometheusAgent {self.where} exists; restore it "
                                      "by hand")
            sha = sha256_bytes(canonical(user_content(prometheus)))
            return ModeChange("server", False, ("Prometheus", self.where), ("Prometheus", self.where), sha, sha, None)
        saved = saved_prometheus(agent)
        if saved is None:
            raise SourceModeError(f"PrometheusAgent {self.where} carries no saved Prometheus resource; restore it "
                                  "by hand")
        if prometheus is None:
            create = dict(saved)
            self._log(f"creating Prometheus {self.where} again, as saved")
            self._call(f"creating Prometheus {self.where}", lambda: self.custom.create_namespaced_custom_object(
                CR_GROUP, CR_VERSION, self.namespace, CR_PLURAL, create))
        self._wait_mode("server")
        self._call(f"deleting PrometheusAgent {self.where}", lambda: self.custom.delete_namespaced_custom_object(
            CR_GROUP, AGENT_VERSION, self.namespace, AGENT_PLURAL, self.name), missing_ok=True)
        back = self._prometheus()
        identical = back is not None and canonical(user_content(back)) == canonical(saved)
        return ModeChange("server", True, ("PrometheusAgent", self.where), ("Prometheus", self.where),
                          sha256_bytes(canonical(user_content(agent))),
                          sha256_bytes(canonical(user_content(back or {}))), identical)
