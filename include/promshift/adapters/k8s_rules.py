"""A source's rules kept in prometheus-operator ``PrometheusRule`` objects (kube-prometheus-stack fleets).

``PrometheusRuleSource`` is ``rules_deploy.SourceRules`` for rules that live in the Kubernetes API instead of rule
files on disk: each named ``PrometheusRule`` (``monitoring.coreos.com/v1``) plays one rule file, its ``spec``
(``groups: [...]``, the rule file's own shape) read as that file's text. The rest of a rules move is the same:

- ``snapshot``: every object holding a rule of the group, its spec's text and ``resourceVersion``;
- ``edits``: the same byte-preserving removal as a rule file (``core.rules.remove_rules``), each checked with
  ``promtool check rules``; the object's spec is then exactly the edit's, every other group, rule, label and
  annotation as it was (the object is read back and compared after the write);
- ``remove``: a merge patch of ``spec.groups`` under the ``resourceVersion`` the snapshot (or a retry) read, so
  another writer's change in between is a 409 and a one-line refusal, never overwritten; no reload: the operator
  renders the object into a rule file and its config-reloader reloads Prometheus, so ``/api/v1/rules`` is polled
  until the moved rules are gone and the others still loaded (a deadline); any failure restores the snapshot;
- ``restore``: the snapshot's spec written back, polled until its rules are loaded again.

The rule files the operator writes are named ``<namespace>-<name>-<uid>.yaml``: a loaded rule is matched to its
object by that prefix. Tested on the Kubernetes contract server (``local/stack/k8s_api.py``), not a cluster.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

import yaml
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from promshift.adapters.k8s_deploy import MERGE_PATCH, _api_reason, api_client_of
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.rules_deploy import SourceRules, _result, _revert_and_raise, loaded_rules
from promshift.core.deploy import DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.inputs import RULES, InputRefused, check_size
from promshift.core.render import sha256_text
from promshift.core.rules import LoadedRule, Rule, RulesError, missing_rules, parse_rule_file, select_rules

CR_GROUP, CR_VERSION, RULES_PLURAL = "monitoring.coreos.com", "v1", "prometheusrules"
KEY_PREFIX = "prometheusrule/"
DEFAULT_TIMEOUT_S = 300.0


def spec_text(spec: Any) -> str:
    """A ``PrometheusRule``'s spec as a rule file's text (what ``core.rules`` reads and edits)."""
    return yaml.safe_dump(spec if isinstance(spec, dict) else {"groups": []}, sort_keys=False, allow_unicode=True,
                          width=1 << 20)


def spec_of(text: str) -> dict[str, Any]:
    loaded = yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else {"groups": []}


def object_key(namespace: str, name: str) -> str:
    return f"{KEY_PREFIX}{namespace}/{name}"


def _named(key: str) -> tuple[str, str]:
    namespace, _, name = key.removeprefix(KEY_PREFIX).partition("/")
    return namespace, name


class PrometheusRuleSource(SourceRules):
    """The source's rules in ``PrometheusRule`` objects ``objects`` (``(namespace, name)``); see the module."""

    kind = "rules-source-prometheusrule"

    def __init__(self, api: Any, objects: Sequence[tuple[str, str]], client: PrometheusClient, *,
                 promtool: str = "promtool", timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        if not objects:
            raise DeployError("no PrometheusRule named: extra.kubernetes.prometheus_rules lists [namespace, name]")
        self.custom = CustomObjectsApi(api_client_of(api))
        self.objects = [(str(ns), str(name)) for ns, name in objects]
        self.client = client
        self.promtool = promtool
        self.timeout_s, self.poll_s, self._sleep, self._clock = timeout_s, poll_s, sleep, clock
        self.config_path = object_key(*self.objects[0])  # what a snapshot names as its place

    # -- the API ------------------------------------------------------------------------------------------------

    def _get(self, key: str) -> tuple[str, str]:
        """The object's spec as text (within the rules budget) and its ``resourceVersion``."""
        ns, name = _named(key)
        try:
            obj = self.custom.get_namespaced_custom_object(CR_GROUP, CR_VERSION, ns, RULES_PLURAL, name)
        except ApiException as exc:
            raise DeployError(f"cannot read PrometheusRule {ns}/{name}: {_api_reason(exc)}") from None
        except HTTPError as exc:
            raise DeployError(f"cannot reach the Kubernetes API for PrometheusRule {ns}/{name}: "
                              f"{type(exc).__name__}") from None
        text = spec_text(obj.get("spec"))
        try:
            check_size(text, RULES)
        except InputRefused as exc:
            raise DeployError(f"PrometheusRule {ns}/{name}: {exc}") from None
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if not version:
            raise DeployError(f"PrometheusRule {ns}/{name} came back without metadata.resourceVersion")
        return text, str(version)

    def _put(self, key: str, text: str, resource_version: str) -> None:
        """``spec.groups`` := the text's groups, only if the object is still at ``resource_version``; read back."""
        ns, name = _named(key)
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"groups": spec_of(text).get("groups")
                                                                                     or []}}
        try:
            self.custom.patch_namespaced_custom_object(CR_GROUP, CR_VERSION, ns, RULES_PLURAL, name, body,
                                                       _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status == 409:
                raise DeployError(f"PrometheusRule {ns}/{name} was changed by another writer (resourceVersion "
                                  f"{resource_version} is stale); nothing of ours written") from None
            raise DeployError(f"cannot write PrometheusRule {ns}/{name}: {_api_reason(exc)}") from None
        written, _ = self._get(key)
        if written != text:
            raise DeployError(f"PrometheusRule {ns}/{name} reads back other than written (sha256 "
                              f"{sha256_text(written)[:12]} != {sha256_text(text)[:12]})")

    # -- SourceRules ------------------------------------------------------------------------------------------------

    def snapshot(self, claims: Callable[[str], bool], candidates: Sequence[str] = ()) -> DeploySnapshot:
        read = {object_key(ns, name): self._get(object_key(ns, name)) for ns, name in self.objects}
        files = {key: text for key, (text, _) in read.items()}
        try:
            chosen = select_rules([parse_rule_file(k, t) for k, t in files.items()], claims,
                                  candidates=candidates).files
        except RulesError as exc:
            raise DeployError(str(exc)) from None
        content = json.dumps({"files": [[k, files[k]] for k in chosen]})
        return DeploySnapshot(self.kind, self.config_path, content,
                              {"existed": True, "sha256": {k: sha256_text(files[k]) for k in chosen},
                               "resourceVersion": {k: read[k][1] for k in chosen}})

    def _texts(self, snapshot: DeploySnapshot) -> dict[str, str]:
        return {k: v.decode("utf-8") for k, v in self.snapshot_files(snapshot).items()}

    def remove(self, snapshot: DeploySnapshot, selection: Any, edits: Mapping[str, bytes],
               now: datetime) -> DeployResult:
        """Write each object's edit (refused if another writer changed it since), then wait for the operator and
        the reloader: the moved rules gone from ``/api/v1/rules``, the others still there. Any failure after the
        first write restores the snapshot."""
        before = self._texts(snapshot)
        wanted = {k: v.decode("utf-8") for k, v in edits.items()}
        current = {k: self._get(k) for k in before}
        for key, (text, _) in current.items():
            if text not in (before[key], wanted[key]):
                raise DeployError(f"PrometheusRule {'/'.join(_named(key))} changed since the snapshot was taken "
                                  f"(sha256 {sha256_text(text)[:12]} != {sha256_text(before[key])[:12]}); refusing "
                                  "to edit it")
        try:
            for key, (text, version) in current.items():
                if text != wanted[key]:
                    self._put(key, wanted[key], version)
            kept = [r for k, t in wanted.items() for r in parse_rule_file(k, t).rules]
            self._wait("the moved rules to go and the others to stay", selection.rules, kept)
        except BaseException as exc:
            _revert_and_raise(exc, "removing the rules from the source's PrometheusRule objects",
                              lambda: self.restore(snapshot, now), "the snapshot")
        return _result(self.kind, "deploy", "RULES_REMOVED", now, f"{len(selection.rules)} rules removed from "
                       f"{len(edits)} PrometheusRule objects", files={k: sha256_text(t) for k, t in wanted.items()},
                       rules=[r.label for r in selection.rules])

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The snapshot's spec back in every object (under its current ``resourceVersion``), then wait until its
        rules are loaded again."""
        texts = self._texts(snapshot)
        for key, text in texts.items():
            current, version = self._get(key)
            if current != text:
                self._put(key, text, version)
        rules = [r for k, t in texts.items() for r in parse_rule_file(k, t).rules]
        same = all(self._get(k)[0] == t for k, t in texts.items())
        self._wait("the snapshot's rules to be loaded again", [], rules)
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
            "RESTORED" if same else "DIFFERS", now, state=DeployState.DONE if same else DeployState.FAILED,
            reason="the PrometheusRule objects restored as snapshotted" if same else "the objects differ from the "
                   "snapshot", restored_identical=same)

    def _wait(self, what: str, gone: Sequence[Rule], present: Sequence[Rule]) -> list[LoadedRule]:
        """Poll ``/api/v1/rules`` until none of ``gone`` and all of ``present`` are loaded; DeployError at the
        deadline, naming what is still wrong."""
        deadline = self._clock() + self.timeout_s
        while True:
            try:
                loaded = loaded_rules(self.client)
                still = [r for r in gone if not missing_rules([r], loaded, same_file=self._same)]
                lost = missing_rules(present, loaded, same_file=self._same)
                if not still and not lost:
                    return loaded
                why = (f"{len(still)} moved rules still evaluated ({', '.join(r.label for r in still[:3])})" if still
                       else f"{len(lost)} rules not loaded ({', '.join(r.label for r in lost[:3])})")
            except PrometheusError as exc:
                why = f"the source's /api/v1/rules: {exc}"
            if self._clock() >= deadline:
                raise DeployError(f"waited {self.timeout_s:g} s for {what}: {why}")
            self._sleep(self.poll_s)

    @property
    def _same(self) -> Callable[[str, str], bool]:
        def same(ours: str, reported: str) -> bool:
            ns, name = _named(ours)
            stem = PurePosixPath(reported).name
            return stem in (f"{ns}-{name}.yaml", f"{ns}-{name}.yml") or bool(
                re.fullmatch(re.escape(f"{ns}-{name}-") + r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.ya?ml", stem))

        return same
