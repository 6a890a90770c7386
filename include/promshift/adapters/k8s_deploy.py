"""Deploy a group's ``remote_write`` entry where Prometheus runs on Kubernetes.

Two ``core.deploy.ConfigDeployer`` s, both talking to the Kubernetes API through the ``kubernetes``
client that the pinned cncf-kubernetes provider's ``KubernetesHook`` builds (pass the hook, or an
already-built ``kubernetes.client.ApiClient``):

- ``ConfigMapDeployment``: the Prometheus config lives in a ConfigMap (``data["prometheus.yml"]``)
  that a config-reloader sidecar writes to the server's file. ``snapshot`` is that text and the
  ConfigMap's ``resourceVersion``; ``deploy`` adds our entry to the text byte for byte
  (``core.render.add_remote_write``, the same edit the file deployer makes) and writes it with a merge
  patch that carries the snapshot's ``resourceVersion``, so the API server refuses it (409) if anyone
  wrote in between; ``restore`` writes the snapshot's exact text back (again ``resourceVersion``-checked),
  or, when someone else edited the ConfigMap after our deploy, removes only our entry.
- ``PrometheusCRDeployment``: prometheus-operator's ``Prometheus`` custom resource
  (``monitoring.coreos.com/v1``, ``prometheuses``); the operator renders ``spec.remoteWrite`` into the
  config. ``snapshot`` is ``spec.remoteWrite`` and the ``resourceVersion``; ``deploy`` appends our entry
  (``url``, ``name``, the keep-filter as ``writeRelabelConfigs``, ``sigv4`` for an AMP target) under the
  same lock; ``restore`` removes only our entry (by name) and leaves the rest of the spec as it is.

A 409 on deploy is never retried over the other writer's change: the object is read again to name
what changed and the deploy is refused with a one-line ``DeployError``; nothing of ours is written.
``verify`` is the same for both: the source Prometheus's ``/api/v1/status/config`` must list our entry
(after a restore: must no longer list it); until then the result is WAITING (the sidecar or the
operator has not reloaded yet), and TIMEOUT once the deadline set at deploy time has passed. It never
writes, so a trigger may call it as often as it likes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.deploy import DeployError, DeployKind, DeployResult, DeploySnapshot, DeployState
from promshift.core.git_render import config_entry, operator_entry
from promshift.core.inputs import CONFIG, InputRefused, check_size
from promshift.core.redact import redact_text
from promshift.core.render import (
    RenderError,
    add_remote_write,
    check_remote_write_url,
    remote_write_names,
    remove_remote_write,
    sha256_text,
)

CONFIG_KEY = "prometheus.yml"
CR_GROUP, CR_VERSION, CR_PLURAL = "monitoring.coreos.com", "v1", "prometheuses"
# How long verify waits for the sidecar (or the operator) and Prometheus to load a change: the kubelet
# refreshes a mounted ConfigMap within its sync period plus the cache TTL (about a minute by default).
DEFAULT_TIMEOUT_S = 300.0
MERGE_PATCH = "application/merge-patch+json"
RESTORE_ATTEMPTS = 5


def api_client_of(api: Any) -> ApiClient:
    """The ``kubernetes`` ApiClient of ``api``: an ApiClient as it is, or a ``KubernetesHook``'s ``get_conn()``."""
    if isinstance(api, ApiClient):
        return api
    get_conn = getattr(api, "get_conn", None)
    if callable(get_conn):
        client = get_conn()
        if isinstance(client, ApiClient):
            return client
    raise TypeError(f"need a kubernetes ApiClient or a KubernetesHook, got {type(api).__name__}")


def _api_reason(exc: ApiException) -> str:
    """The API's own ``Status.message`` (one line), else the HTTP reason."""
    message = ""
    try:
        body = json.loads(exc.body or "{}")
        message = str(body.get("message") or "") if isinstance(body, dict) else ""
    except (TypeError, ValueError):
        message = ""
    text = f"HTTP {exc.status} {exc.reason or ''}".strip() + (f": {message}" if message else "")
    return redact_text(" ".join(text.split()))[:400]


def cr_remote_write_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Our Prometheus-config ``remote_write`` entry as a prometheus-operator ``RemoteWriteSpec``.

    ``write_relabel_configs`` -> ``writeRelabelConfigs`` (``source_labels`` -> ``sourceLabels``),
    ``sigv4.role_arn`` -> ``sigv4.roleArn``, ``queue_config`` -> ``queueConfig`` (``max_samples_per_send``
    -> ``maxSamplesPerSend``): the operator's field names for the same Prometheus settings
    (``core.git_render.operator_entry``, which the git path's manifests use too).
    """
    return operator_entry(entry)


def config_remote_write_entry(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ``RemoteWriteSpec`` back in Prometheus-config spelling (what the operator writes into the config)."""
    return config_entry(spec)


class _StatusConfigVerify:
    """Shared by both deployers: the source Prometheus's loaded config is the proof, with a deadline."""

    kind: str
    entry: dict[str, Any]
    prometheus: PrometheusClient
    timeout_s: float

    @property
    def entry_name(self) -> str:
        return str(self.entry["name"])

    where: str

    def _write(self, body: Any, resource_version: str) -> str:
        raise NotImplementedError

    def _restore_write(self, body: Any, resource_version: str) -> bool:
        """One write of a restore; False when another writer changed the object since it was read (409: re-read)."""
        try:
            self._write(body, resource_version)
        except ApiException as exc:
            if exc.status != 409:
                raise DeployError(f"restoring {self.where} failed: {_api_reason(exc)}") from None
            return False
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API to restore {self.where}: "
                              f"{type(exc).__name__}") from None
        return True

    def _waiting(self, action: str, status: str, now: datetime, reason: str, **details: Any) -> DeployResult:
        deadline = (now + timedelta(seconds=self.timeout_s)).isoformat()
        return DeployResult(self.kind, action, DeployState.WAITING).observed(
            status, now, state=DeployState.WAITING, reason=reason, remote_write=self.entry_name, deadline=deadline,
            **details)

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        """One look at ``/api/v1/status/config`` (``observe_loaded_config``)."""
        return observe_loaded_config(self.prometheus, result, now)


def observe_loaded_config(prometheus: PrometheusClient, result: DeployResult, now: datetime) -> DeployResult:
    """DONE once the loaded config shows the change (our entry after a deploy, none after a restore), WAITING
    before it, TIMEOUT once ``details.deadline`` has passed. Reads only: a trigger may call it again and again.

    The entry's name and the deadline come from the result (``details.remote_write``, ``details.deadline``),
    so a trigger needs nothing but the source's Prometheus client to follow either deployer.
    """
    if result.state.final:
        return result
    try:
        live = remote_write_names(prometheus.config_text())
    except (PrometheusError, RenderError) as exc:
        raise DeployError(f"cannot read the loaded config of {redact_text(prometheus.base_url)}: "
                          f"{' '.join(str(exc).split())[:300]}") from exc
    name = str(result.details["remote_write"])
    deploying = result.action == "deploy"
    if (name in live) == deploying:
        shown = "live" if deploying else "gone"
        return result.observed("LIVE" if deploying else "RESTORED", now, state=DeployState.DONE,
                               reason=f"remote_write {name} is {shown} in the loaded config",
                               live_remote_writes=live)
    deadline = result.details.get("deadline")
    if deadline and now >= datetime.fromisoformat(str(deadline)):
        return result.observed("NOT_LOADED", now, state=DeployState.TIMEOUT, live_remote_writes=live,
                               reason=f"Prometheus did not load the {'new' if deploying else 'restored'} config "
                                      f"(remote_write {name} {'missing' if deploying else 'still present'}) "
                                      f"by {deadline}")
    return result.observed("WAITING_FOR_RELOAD", now, state=DeployState.WAITING, live_remote_writes=live,
                           reason=f"waiting for Prometheus to load the {'new' if deploying else 'restored'} config")


class ConfigMapDeployment(_StatusConfigVerify):
    """A ConfigDeployer over a ConfigMap holding ``prometheus.yml``, reloaded by a sidecar."""

    kind = DeployKind.K8S_CONFIGMAP.value

    def __init__(self, api: Any, *, namespace: str, name: str, entry: Mapping[str, Any],
                 prometheus: PrometheusClient, key: str = CONFIG_KEY, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.core = CoreV1Api(api_client_of(api))
        self.namespace = namespace
        self.name = name
        self.key = key
        self.entry = dict(entry)
        self.prometheus = prometheus
        self.timeout_s = timeout_s

    @property
    def where(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def _read(self) -> tuple[str | None, str]:
        """The ConfigMap's ``data[key]`` (None when the key is missing) and its ``resourceVersion``."""
        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as exc:
            raise DeployError(f"cannot read {self.where}: {_api_reason(exc)}") from None
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for {self.where}: {type(exc).__name__}") from None
        return (cm.data or {}).get(self.key), str(cm.metadata.resource_version)

    def _write(self, text: str, resource_version: str) -> str:
        """Merge-patch ``data[key]`` under the ``resourceVersion`` precondition; the new ``resourceVersion``."""
        body = {"metadata": {"resourceVersion": resource_version}, "data": {self.key: text}}
        cm = self.core.patch_namespaced_config_map(self.name, self.namespace, body, _content_type=MERGE_PATCH)
        return str(cm.metadata.resource_version)

    def snapshot(self) -> DeploySnapshot:
        text, version = self._read()
        if text is None:
            raise DeployError(f"{self.where} has no data[{self.key!r}]; nothing to deploy into")
        try:
            check_size(text, CONFIG)
        except InputRefused as exc:
            raise DeployError(f"{self.where}: {exc}") from None
        return DeploySnapshot(self.kind, f"{self.namespace}/{self.name}#{self.key}", text,
                              {"existed": True, "namespace": self.namespace, "name": self.name, "key": self.key,
                               "resourceVersion": version})

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        try:
            new_text = add_remote_write(snapshot.content, self.entry)
        except RenderError as exc:
            raise DeployError(f"{self.where}: {exc}") from None
        version = str(snapshot.meta.get("resourceVersion") or "")
        if not version:
            raise DeployError(f"{self.where}: the snapshot has no resourceVersion; take a new snapshot")
        try:
            new_version = self._write(new_text, version)
        except ApiException as exc:
            if exc.status != 409:
                raise DeployError(f"writing {self.where} failed: {_api_reason(exc)}; nothing deployed") from None
            live, live_version = self._read()
            if live != new_text:  # not our own earlier write (a retried deploy): someone else's change
                edited = "its data changed" if live != snapshot.content else "its data is the same"
                raise DeployError(f"409 Conflict: {self.where} was changed by another writer since the snapshot "
                                  f"(resourceVersion {version} -> {live_version}, {edited}); refusing to deploy, "
                                  "nothing written") from None
            new_version = live_version
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for {self.where}: {type(exc).__name__}") from None
        return self._waiting("deploy", "CONFIGMAP_UPDATED", now, f"{self.where} updated; waiting for the reload",
                             resource_version=new_version, config_before_sha256=snapshot.sha256,
                             config_after_sha256=sha256_text(new_text))

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The snapshot's exact text back; if someone else edited since our deploy, only our entry goes."""
        name = self.entry_name
        ours = None
        try:
            ours = add_remote_write(snapshot.content, self.entry)
        except RenderError:
            ours = None
        for _ in range(RESTORE_ATTEMPTS):
            live, version = self._read()
            if live is None:
                raise DeployError(f"{self.where} lost data[{self.key!r}]; restore refused, nothing written")
            if live == snapshot.content:
                break
            try:
                if name not in remote_write_names(live):
                    break  # nothing of ours left; someone else's edit stays
                target = snapshot.content if live == ours else remove_remote_write(live, name)
            except RenderError as exc:
                raise DeployError(f"{self.where}: cannot remove remote_write {name}: {exc}") from None
            if self._restore_write(target, version):
                break
        else:
            raise DeployError(f"{self.where} kept changing under {RESTORE_ATTEMPTS} restores (409 each time); "
                              f"remote_write {name} may still be there")
        live, version = self._read()
        identical = live == snapshot.content
        return self._waiting("restore", "CONFIGMAP_RESTORED", now,
                             "snapshot written back; waiting for the reload" if identical else
                             f"{self.where} was edited by someone else; only remote_write {name} removed",
                             restored_identical=identical, resource_version=version)


class PrometheusCRDeployment(_StatusConfigVerify):
    """A ConfigDeployer over prometheus-operator's ``Prometheus`` resource: our entry in ``spec.remoteWrite``."""

    kind = DeployKind.K8S_CR.value

    def __init__(self, api: Any, *, namespace: str, name: str, entry: Mapping[str, Any],
                 prometheus: PrometheusClient, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.custom = CustomObjectsApi(api_client_of(api))
        self.namespace = namespace
        self.name = name
        self.entry = dict(entry)
        self.cr_entry = cr_remote_write_entry(entry)
        self.prometheus = prometheus
        self.timeout_s = timeout_s

    @property
    def where(self) -> str:
        return f"prometheus {self.namespace}/{self.name}"

    def _read(self) -> tuple[list[Any] | None, str]:
        """``spec.remoteWrite`` (None when the key is absent) and the ``resourceVersion``."""
        try:
            obj = self.custom.get_namespaced_custom_object(CR_GROUP, CR_VERSION, self.namespace, CR_PLURAL, self.name)
        except ApiException as exc:
            raise DeployError(f"cannot read {self.where}: {_api_reason(exc)}") from None
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for {self.where}: {type(exc).__name__}") from None
        spec = obj.get("spec") or {}
        entries = spec.get("remoteWrite")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if not version:
            raise DeployError(f"{self.where} came back without metadata.resourceVersion; cannot lock a write on it")
        return (list(entries) if isinstance(entries, list) else None), str(version)

    def _write(self, entries: list[Any] | None, resource_version: str) -> str:
        """Merge-patch ``spec.remoteWrite`` (None removes the key) under the ``resourceVersion`` precondition."""
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"remoteWrite": entries}}
        obj = self.custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, self.namespace, CR_PLURAL, self.name,
                                                         body, _content_type=MERGE_PATCH)
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")

    @staticmethod
    def _text(entries: list[Any] | None) -> str:
        return "" if entries is None else json.dumps(entries, sort_keys=True, separators=(",", ":"))

    def snapshot(self) -> DeploySnapshot:
        entries, version = self._read()
        return DeploySnapshot(self.kind, f"{self.namespace}/{self.name}#spec.remoteWrite", self._text(entries),
                              {"existed": True, "namespace": self.namespace, "name": self.name,
                               "resourceVersion": version, "has_remote_write": entries is not None})

    @staticmethod
    def _entries_of(snapshot: DeploySnapshot) -> list[Any] | None:
        return json.loads(snapshot.content) if snapshot.meta.get("has_remote_write") else None

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        try:
            check_remote_write_url(self.entry.get("url"))
        except RenderError as exc:
            raise DeployError(f"{self.where}: {exc}; nothing written") from None
        before = self._entries_of(snapshot) or []
        name = self.entry_name
        present = [e for e in before if isinstance(e, Mapping) and e.get("name") == name]
        if present and present != [self.cr_entry]:
            raise DeployError(f"{self.where} already has a different remoteWrite {name}; editing a live queue loses "
                              "samples, refusing to deploy")
        new = before if present else [*before, self.cr_entry]  # the same entry already there: a retried deploy
        version = str(snapshot.meta.get("resourceVersion") or "")
        if not version:
            raise DeployError(f"{self.where}: the snapshot has no resourceVersion; take a new snapshot")
        try:
            new_version = version if present else self._write(new, version)
        except ApiException as exc:
            if exc.status != 409:
                raise DeployError(f"writing {self.where} failed: {_api_reason(exc)}; nothing deployed") from None
            live, live_version = self._read()
            if live != new:  # not our own earlier write (a retried deploy): someone else's change
                raise DeployError(f"409 Conflict: {self.where} was changed by another writer since the snapshot "
                                  f"(resourceVersion {version} -> {live_version}); refusing to deploy, "
                                  "nothing written") from None
            new_version = live_version
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for {self.where}: {type(exc).__name__}") from None
        return self._waiting("deploy", "CR_UPDATED", now, f"{self.where} spec.remoteWrite updated; waiting for "
                             "the operator's reload", resource_version=new_version,
                             remote_write_before_sha256=snapshot.sha256)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """Remove only our entry (by name); the rest of ``spec.remoteWrite`` and of the spec stays as it is."""
        name = self.entry_name
        before = self._entries_of(snapshot)
        for _ in range(RESTORE_ATTEMPTS):
            live, version = self._read()
            if not any(isinstance(e, Mapping) and e.get("name") == name for e in live or []):
                break
            rest = [e for e in live or [] if not (isinstance(e, Mapping) and e.get("name") == name)]
            if self._restore_write(rest if rest or before is not None else None, version):
                break
        else:
            raise DeployError(f"{self.where} kept changing under {RESTORE_ATTEMPTS} restores (409 each time); "
                              f"remoteWrite {name} may still be there")
        live, version = self._read()
        identical = live == before
        return self._waiting("restore", "CR_RESTORED", now,
                             "our remoteWrite removed; waiting for the operator's reload" if identical else
                             f"{self.where} was edited by someone else; only remoteWrite {name} removed",
                             restored_identical=identical, resource_version=version)


def kubernetes_deployer(kind: str, api: Any, *, namespace: str, name: str, entry: Mapping[str, Any],
                        prometheus: PrometheusClient, key: str = CONFIG_KEY,
                        timeout_s: float = DEFAULT_TIMEOUT_S) -> ConfigMapDeployment | PrometheusCRDeployment:
    """The deployer for ``kind`` (``k8s-configmap`` or ``k8s-cr``) over ``api`` (a KubernetesHook or an ApiClient)."""
    if kind == DeployKind.K8S_CONFIGMAP.value:
        return ConfigMapDeployment(api, namespace=namespace, name=name, entry=entry, prometheus=prometheus, key=key,
                                   timeout_s=timeout_s)
    if kind == DeployKind.K8S_CR.value:
        return PrometheusCRDeployment(api, namespace=namespace, name=name, entry=entry, prometheus=prometheus,
                                      timeout_s=timeout_s)
    raise DeployError(f"no Kubernetes deployer for {kind!r}")
