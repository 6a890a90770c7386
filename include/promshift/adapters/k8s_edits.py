"""One ``core.queues.ConfigChange`` of the ``Prometheus`` resource's ``spec.remoteWrite`` behind the ``ConfigDeployer``
seam (a queue swap's add, removal or undo on the k8s-cr path), on the CR deployer's own driver
(``adapters.k8s_deploy.PrometheusCRDeployment``: its read, its merge patch under the ``resourceVersion``
precondition, its 409 handling, the source Prometheus's loaded config as the proof).

The swap reads and edits a view of the list (``core.resource_queues.remote_write_view``): ``snapshot`` returns the
view as its content, the list itself (canonical JSON) and the ``resourceVersion`` in its meta. ``deploy`` applies
the change to the view and writes what it makes of the list (``resource_edit``: promshift's entries only, every
other item untouched); a 409 is our own earlier write when the object already holds that list (a retried
phase), else another writer's change, refused in one line with nothing written. ``restore`` writes the
snapshot's list back as it was (the spec byte for byte, again under the lock, re-read on a 409); when someone
else edited the list since, only what the change added is taken out (refused when the swap's removal ran since:
that is a leave swap's work). ``verify`` waits (WAITING, then TIMEOUT at
the deadline) until the loaded config lists the change's ``live`` entries and none of its ``gone`` ones.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from promshift.adapters.k8s_deploy import (
    DEFAULT_TIMEOUT_S,
    RESTORE_ATTEMPTS,
    PrometheusCRDeployment,
    _api_reason,
)
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.deploy import DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.queues import ConfigChange
from promshift.core.redact import redact_text
from promshift.core.render import RenderError, is_promshift_name, remote_write_names, sha256_text
from promshift.core.resource_queues import remote_write_view, resource_edit


def _canonical(entries: list[Any] | None) -> str:
    return "" if entries is None else json.dumps(entries, sort_keys=True, separators=(",", ":"))


class PrometheusCREditDeployment(PrometheusCRDeployment):
    """A ConfigDeployer that puts one ``ConfigChange`` of ``spec.remoteWrite`` live (and takes it back)."""

    def __init__(self, api: Any, *, namespace: str, name: str, change: ConfigChange, prometheus: PrometheusClient,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(api, namespace=namespace, name=name, entry={"name": change.describe}, prometheus=prometheus,
                         timeout_s=timeout_s)
        self.change = change

    def snapshot(self) -> DeploySnapshot:
        entries, version = self._read()
        try:
            view = remote_write_view(entries)
        except RenderError as exc:
            raise DeployError(f"{self.where}: {exc}") from None
        return DeploySnapshot(self.kind, f"{self.namespace}/{self.name}#spec.remoteWrite", view.decode("utf-8"),
                              {"existed": True, "namespace": self.namespace, "name": self.name,
                               "resourceVersion": version, "has_remote_write": entries is not None,
                               "remote_write": _canonical(entries)})

    @staticmethod
    def _entries_of(snapshot: DeploySnapshot) -> list[Any] | None:
        return json.loads(snapshot.meta["remote_write"]) if snapshot.meta.get("has_remote_write") else None

    def _edited(self, entries: list[Any] | None) -> list[Any] | None:
        """What the change makes of ``entries`` (None: the key goes, as it was before promshift added one)."""
        view = remote_write_view(entries)
        new = resource_edit(entries, view, self.change.apply(view))
        if new:
            return new
        return [] if entries == [] else None

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        before = self._entries_of(snapshot)
        try:
            new = self._edited(before)
        except RenderError as exc:
            raise DeployError(f"{self.where}: {exc}; nothing written") from None
        version = str(snapshot.meta.get("resourceVersion") or "")
        if not version:
            raise DeployError(f"{self.where}: the snapshot has no resourceVersion; take a new snapshot")
        try:
            new_version = version if new == before else self._write(new, version)
        except ApiException as exc:
            if exc.status != 409:
                raise DeployError(f"writing {self.where} failed: {_api_reason(exc)}; nothing deployed") from None
            live, live_version = self._read()
            if live != new:  # not our own earlier write (a retried phase): someone else's change
                raise DeployError(f"409 Conflict: {self.where} was changed by another writer since the snapshot "
                                  f"(resourceVersion {version} -> {live_version}); refusing to "
                                  f"{self.change.describe}, nothing written") from None
            new_version = live_version
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for {self.where}: {type(exc).__name__}") from None
        return self._waiting("deploy", "CR_UPDATED", now, f"{self.where} spec.remoteWrite: {self.change.describe}; "
                             "waiting for the operator's reload", resource_version=new_version,
                             remote_write_before_sha256=sha256_text(_canonical(before)),
                             remote_write_after_sha256=sha256_text(_canonical(new)))

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The snapshot's list back as it was, when what is live differs from it by nothing but this change (after
        its deploy) or by what this change takes back (a swap's undo: ``QueueSwap.undo`` restores only when nothing
        else changed since the add); else only the entries the change added are taken out and another writer's
        edit stays (``restored_identical`` says which)."""
        before = self._entries_of(snapshot)
        try:
            ours = self._edited(before)
        except RenderError:
            ours = None
        for _ in range(RESTORE_ATTEMPTS):
            live, version = self._read()
            if live == before:
                break
            try:
                undone = self._edited(live)  # a swap's undo is a change of its own: applied to what is live
            except RenderError:
                undone = None
            if live == ours or undone == before:  # nothing but the change (or its undo) between them
                target = before
            else:  # someone else's edit since: take out only what the change added, by name
                if self._lost_since(before, live):
                    raise DeployError(f"{self.where}: promshift entries of the snapshot are gone since (the swap went "
                                      "on past its add); undo it with a leave swap, nothing written")
                added = {str(e.get("name")) for e in ours or () if isinstance(e, dict)} - {
                    str(e.get("name")) for e in before or () if isinstance(e, dict)}
                rest = [e for e in live or () if not (isinstance(e, dict) and str(e.get("name")) in added)]
                if rest == (live or []):
                    break  # nothing of ours left; their edit stays
                target = rest or None
            if self._restore_write(target, version):
                break
        else:
            raise DeployError(f"{self.where} kept changing under {RESTORE_ATTEMPTS} restores (409 each time); "
                              f"{self.change.describe} may still be live")
        live, version = self._read()
        identical = _canonical(live) == _canonical(before)
        return self._waiting("restore", "CR_RESTORED", now,
                             "spec.remoteWrite written back; waiting for the operator's reload" if identical else
                             f"{self.where} was edited by someone else; only {self.change.describe} taken back",
                             restored_identical=identical, resource_version=version)

    @staticmethod
    def _lost_since(before: list[Any] | None, live: list[Any] | None) -> bool:
        """Whether a promshift entry of ``before`` is no longer in ``live`` (a swap's removal ran since)."""
        names = {str(e.get("name")) for e in live or () if isinstance(e, dict)}
        return any(isinstance(e, dict) and is_promshift_name(str(e.get("name") or "")) and str(e.get("name")) not in
                   names for e in before or ())

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        """One look at the loaded config: the change's ``live`` entries there and its ``gone`` ones not (a swap's
        undo is a change of its own, whose restore is checked the same way); WAITING until then, TIMEOUT at the
        deadline. Reads only."""
        if result.state.final:
            return result
        try:
            live = set(remote_write_names(self.prometheus.config_text()))
        except (PrometheusError, RenderError) as exc:
            raise DeployError(f"cannot read the loaded config of {redact_text(self.prometheus.base_url)}: "
                              f"{' '.join(str(exc).split())[:300]}") from exc
        if self.change.live <= live and not self.change.gone & live:
            return result.observed("LIVE" if result.action == "deploy" else "RESTORED", now, state=DeployState.DONE,
                                   reason=self.change.describe, live_remote_writes=sorted(live))
        deadline = result.details.get("deadline")
        if deadline and now >= datetime.fromisoformat(str(deadline)):
            return result.observed("NOT_LOADED", now, state=DeployState.TIMEOUT, live_remote_writes=sorted(live),
                                   reason=f"Prometheus did not load {self.change.describe} by {deadline}")
        return result.observed("WAITING_FOR_RELOAD", now, state=DeployState.WAITING, live_remote_writes=sorted(live),
                               reason=f"waiting for Prometheus to load {self.change.describe}")
