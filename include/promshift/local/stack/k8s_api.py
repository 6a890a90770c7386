"""A local Kubernetes API *contract* server for the ConfigMap and Prometheus-CR deployers (not a cluster).

No API server can run on these machines, so the Kubernetes deployers (``adapters.k8s_deploy``) are
tested against this small ``ThreadingHTTPServer`` on 127.0.0.1. It serves only what they use:

- ``GET|PUT|PATCH /api/v1/namespaces/{ns}/configmaps/{name}``
- ``GET|PUT|PATCH /apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheuses/{name}``
- ``GET|PUT|PATCH /apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules/{name}`` (rules moved from a
  ``PrometheusRule``: ``adapters.k8s_rules``; its ``spec.groups`` checked by ``RULE_GROUP``/``RULE`` below)
- ``GET|PUT|PATCH|DELETE /apis/monitoring.coreos.com/v1alpha1/namespaces/{ns}/prometheusagents/{name}`` and
  ``DELETE`` of a ``Prometheus``, ``POST`` to either's collection (retiring the source:
  ``adapters.k8s_source_mode``): a ``PrometheusAgent``'s spec may not carry a field only a ``Prometheus`` has
  (``core.retire.PROMETHEUS_ONLY_SPEC``: strict decoding refuses it as an unknown field); ``mode`` is
  ``StatefulSet`` or ``DaemonSet``; its ``remoteWrite`` is checked as a ``Prometheus``'s

and answers the way the real API server does for them:

- every body is checked before anything is stored: a ConfigMap (the PUT body, or the object a merge
  patch produces) is walked against the models shipped in the ``kubernetes`` client package
  (``V1ConfigMap.openapi_types`` / ``attribute_map``, recursively, then deserialized with
  ``ApiClient().deserialize`` so the models' own required-field checks run). For the ``Prometheus`` CR
  the package has no model: its ``metadata`` is checked against ``V1ObjectMeta`` and every
  ``spec.remoteWrite`` entry against ``REMOTE_WRITE_SPEC`` below, the field names of
  prometheus-operator's ``RemoteWriteSpec``, ``RelabelConfig``, ``Sigv4`` and ``QueueConfig``
  (prometheus-operator, ``Documentation/api-reference/api.md`` / ``pkg/apis/monitoring/v1/types.go``);
- an unknown field is refused with 400 ``BadRequest`` ("strict decoding error: unknown field"), as
  the real server does with ``fieldValidation=Strict`` (stricter than its default ``Warn``, so a typo in
  our own bodies fails a test instead of being dropped silently); a bad value gets 422 ``Invalid``;
  a missing object 404 ``NotFound``; a create of an existing one 409 ``AlreadyExists``, of one with a
  ``resourceVersion`` 500 ("resourceVersion should not be set on objects to be created", the storage layer's
  error), of one without ``metadata.name`` 422; a create sets ``uid`` and ``creationTimestamp``; a stale
  ``metadata.resourceVersion`` (PUT body or merge patch) 409 ``Conflict``; a patch type other than a merge
  patch 415 (only merge patches are served, and a strategic merge patch is refused on the custom resource, as
  the real server refuses it on CRs);
  every answer that is not 200 (201 for a create) is a ``Status`` object;
- every write bumps the object's ``resourceVersion`` (one counter for the server, as etcd's revision).

Behind it, stand-ins for what would act on the objects in a cluster, each writing the local source
Prometheus's config file and then ``POST /-/reload`` (in a background thread, after ``delay_s``, so a
deployer really has to wait for the reload):

- ``ConfigReloader``: the config-reloader sidecar; writes a ConfigMap's ``data[key]`` to the file;
- ``OperatorStandIn``: prometheus-operator, kept simple: the file is a fixed base config (what the
  operator would generate from the rest of the spec) with each ``spec.remoteWrite`` entry added in order,
  in Prometheus-config spelling (``writeRelabelConfigs`` -> ``write_relabel_configs``, ...). Given the source's
  process control (``--mode-switch``, LAB ONLY: the stack's pid file), a ``PrometheusAgent`` of the same name is
  rendered as the operator renders an agent: the same config without ``rule_files``, ``alerting`` and
  ``remote_read`` (``core.retire.agent_config``), and the source restarted with ``--enable-feature=agent``
  (``core.retire.agent_argv``), as the operator replaces the server's pods with the agent's; a ``Prometheus``
  written again restarts it as the server it was. A deletion renders nothing (the other resource's write did).

Tests may change stored objects directly (``edit``), or just before a write is served
(``before_write``), to play another writer.

``python -m promshift.local.stack.k8s_api`` runs the server and the operator stand-in as one process: the
local stack's ``k8s`` component (``python -m promshift.local stack up --k8s``; ``make demo TARGET=amp DEPLOY=k8s-cr``).
At start it moves the local source's config under the operator: the file's own text without its
``remote_write`` entries becomes the operator's base (scrape configs, globals, comments), the entries
become the ``Prometheus`` resource's ``spec.remoteWrite`` (in the operator's spelling), so the first
render is the source's config again. It then writes ``kubeconfig.json`` (what ``KubernetesHook`` takes
as ``config_file``) and ``api.json`` (where it listens, its pid, the resource) under ``--state-dir``.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import signal
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import kubernetes.client.models as k8s_models
import yaml
from kubernetes.client import ApiClient

from promshift.adapters.k8s_deploy import config_remote_write_entry, cr_remote_write_entry
from promshift.adapters.source_mode import probe_mode
from promshift.core.render import add_remote_write, remove_remote_write
from promshift.core.retire import PROMETHEUS_ONLY_SPEC, agent_argv, agent_config, is_agent_argv
from promshift.local.stack.contract_http import ContractHandler, ContractServer

log = logging.getLogger(__name__)

CONFIGMAPS = "configmaps"
PROMETHEUSES = "prometheuses"
PROMETHEUSRULES = "prometheusrules"
PROMETHEUSAGENTS = "prometheusagents"
CR_GROUP = "monitoring.coreos.com"
_PATHS = {
    CONFIGMAPS: re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps/([^/]+)$"),
    PROMETHEUSES: re.compile(r"^/apis/monitoring\.coreos\.com/v1/namespaces/([^/]+)/prometheuses/([^/]+)$"),
    PROMETHEUSRULES: re.compile(r"^/apis/monitoring\.coreos\.com/v1/namespaces/([^/]+)/prometheusrules/([^/]+)$"),
    PROMETHEUSAGENTS: re.compile(
        r"^/apis/monitoring\.coreos\.com/v1alpha1/namespaces/([^/]+)/prometheusagents/([^/]+)$"),
}
# Where a create is POSTed (the collection), and which kinds take a DELETE: the retire switch's only.
_COLLECTIONS = {
    PROMETHEUSES: re.compile(r"^/apis/monitoring\.coreos\.com/v1/namespaces/([^/]+)/prometheuses$"),
    PROMETHEUSAGENTS: re.compile(r"^/apis/monitoring\.coreos\.com/v1alpha1/namespaces/([^/]+)/prometheusagents$"),
}
_API_VERSION = {CONFIGMAPS: "v1", PROMETHEUSES: f"{CR_GROUP}/v1", PROMETHEUSRULES: f"{CR_GROUP}/v1",
                PROMETHEUSAGENTS: f"{CR_GROUP}/v1alpha1"}
_KIND = {CONFIGMAPS: "ConfigMap", PROMETHEUSES: "Prometheus", PROMETHEUSRULES: "PrometheusRule",
         PROMETHEUSAGENTS: "PrometheusAgent"}
_QUALIFIED = {CONFIGMAPS: "configmaps", PROMETHEUSES: f"prometheuses.{CR_GROUP}",
              PROMETHEUSRULES: f"prometheusrules.{CR_GROUP}", PROMETHEUSAGENTS: f"prometheusagents.{CR_GROUP}"}
# PrometheusAgentSpec's ``mode`` (prometheus-operator v0.80+; StatefulSet when unset).
AGENT_MODES = ("StatefulSet", "DaemonSet")
# prometheus-operator's RuleGroup and Rule (monitoring.coreos.com/v1 PrometheusRuleSpec; api-reference).
RULE_GROUP = frozenset({"name", "labels", "interval", "query_offset", "rules", "partial_response_strategy", "limit"})
RULE = frozenset({"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"})
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A ConfigMap's data, binaryData and metadata together must fit in 1 MiB (k8s validation: MaxSecretSize).
CONFIGMAP_MAX_BYTES = 1024 * 1024
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# prometheus-operator monitoring.coreos.com/v1 field names (api-reference: RemoteWriteSpec, RelabelConfig,
# Sigv4, QueueConfig, MetadataConfig). A value "url" in required marks the only required field.
RELABEL_CONFIG = frozenset({"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"})
RELABEL_ACTIONS = frozenset({"replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                             "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                             "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"})
SIGV4 = frozenset({"region", "accessKey", "secretKey", "profile", "roleArn"})
QUEUE_CONFIG = frozenset({"capacity", "minShards", "maxShards", "maxSamplesPerSend", "batchSendDeadline", "maxRetries",
                          "minBackoff", "maxBackoff", "retryOnRateLimit", "sampleAgeLimit"})
METADATA_CONFIG = frozenset({"send", "sendInterval", "maxSamplesPerSend"})
REMOTE_WRITE_SPEC: Mapping[str, frozenset[str] | None] = {
    # field -> the field names of its object (None: not looked into)
    "url": None, "name": None, "messageVersion": None, "sendExemplars": None, "sendNativeHistograms": None,
    "remoteTimeout": None, "headers": None, "writeRelabelConfigs": RELABEL_CONFIG, "oauth2": None,
    "basicAuth": None, "bearerToken": None, "bearerTokenFile": None, "authorization": None, "sigv4": SIGV4,
    "azureAd": None, "tlsConfig": None, "proxyUrl": None, "noProxy": None, "proxyFromEnvironment": None,
    "proxyConnectHeader": None, "followRedirects": None, "enableHTTP2": None, "queueConfig": QUEUE_CONFIG,
    "metadataConfig": METADATA_CONFIG, "roundRobinDNS": None,
}


class ApiRefusal(Exception):
    """An answer that is not 200: the HTTP code, the Status reason and its message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def status_object(code: int, reason: str, message: str, *, name: str = "", kind: str = "") -> dict[str, Any]:
    """A Kubernetes ``Status`` (what the API answers for every failure)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if name or kind:
        body["details"] = {"name": name, "kind": kind}
    return body


# -- validation against the kubernetes package's models --------------------------------------------------------


def _unknown(path: str, key: str) -> ApiRefusal:
    return ApiRefusal(400, "BadRequest", f'strict decoding error: unknown field "{path}{key}"')


def check_model(value: Any, type_name: str, path: str = "") -> None:
    """Walk ``value`` (JSON) against a ``kubernetes.client`` model type name; ApiRefusal on the first fault.

    Unknown fields are 400 (strict decoding); a value of the wrong JSON type is 400 too (the real
    server cannot decode it either).
    """
    list_of = re.fullmatch(r"list\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"dict\(str, (.+)\)|dict\[str, (.+)\]", type_name)
    where = path.rstrip(".") or "body"

    def wrong(expected: str) -> ApiRefusal:
        return ApiRefusal(400, "BadRequest", f"json: cannot unmarshal {type(value).__name__} into "
                                             f"{where} of type {expected}")

    if value is None:
        return
    if list_of:
        if not isinstance(value, list):
            raise wrong("array")
        for i, item in enumerate(value):
            check_model(item, list_of.group(1), f"{path.rstrip('.')}[{i}].")
        return
    if dict_of:
        if not isinstance(value, dict):
            raise wrong("object")
        inner = dict_of.group(1) or dict_of.group(2)
        for key, item in value.items():
            check_model(item, inner, f"{path.rstrip('.')}[{key}].")
        return
    primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str}
    if type_name in primitive:
        if not isinstance(value, primitive[type_name]) or (type_name in ("int", "float") and isinstance(value, bool)):
            raise wrong("string" if type_name in ("str", "datetime", "date") else type_name)
        return
    if type_name == "object":
        return
    model = getattr(k8s_models, type_name, None)
    if model is None:
        raise RuntimeError(f"no kubernetes model {type_name}")
    if not isinstance(value, dict):
        raise wrong("object")
    fields = {json_key: model.openapi_types[attr] for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            raise _unknown(path, key)
        check_model(item, fields[key], f"{path}{key}.")


class _Raw:
    """What ``ApiClient.deserialize`` reads: an object with ``.data`` (the JSON text)."""

    def __init__(self, data: str) -> None:
        self.data = data


_DESERIALIZER = ApiClient()
_DESERIALIZE_LOCK = threading.Lock()


def deserialize(obj: Mapping[str, Any], type_name: str) -> Any:
    """The object as the package's model (its required-field checks run); 422 when a model refuses it."""
    try:
        with _DESERIALIZE_LOCK:
            return _DESERIALIZER.deserialize(_Raw(json.dumps(obj)), type_name)
    except (ValueError, TypeError) as exc:
        raise ApiRefusal(422, "Invalid", f"{type_name[2:] if type_name.startswith('V1') else type_name} is invalid: "
                                         f"{exc}") from None


def _check_metadata(kind: str, obj: Mapping[str, Any], ns: str, name: str) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ApiRefusal(422, "Invalid", f'{_KIND[kind]} "{name}" is invalid: metadata: Required value')
    if meta.get("name") not in (None, name):
        raise ApiRefusal(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name "
                                            f"on the URL ({name})")
    if meta.get("namespace") not in (None, ns):
        raise ApiRefusal(400, "BadRequest", "the namespace of the provided object does not match the namespace sent "
                                            "on the request")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise ApiRefusal(422, "Invalid", f'{_KIND[kind]} "{name}" is invalid: metadata.name: Invalid value: '
                                         f'"{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                                         "alphanumeric characters, '-' or '.'")
    for field in ("apiVersion", "kind"):
        want = _API_VERSION[kind] if field == "apiVersion" else _KIND[kind]
        if obj.get(field) not in (None, want):
            raise ApiRefusal(400, "BadRequest", f"{field} {obj.get(field)!r} does not match the request's {want!r}")


def validate_configmap(obj: Mapping[str, Any], ns: str, name: str) -> None:
    """A whole ConfigMap as the API would store it: model walk, deserialize, and the API's own value checks."""
    if not isinstance(obj, dict):
        raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal body into a ConfigMap (not an object)")
    check_model(obj, "V1ConfigMap")
    _check_metadata(CONFIGMAPS, obj, ns, name)
    deserialize(obj, "V1ConfigMap")
    problems = []
    size = 0
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not _CONFIGMAP_KEY.match(key) or len(key) > 253:
                problems.append(f"{field}[{key}]: Invalid value: {key!r}: a valid config key must consist of "
                                "alphanumeric characters, '-', '_' or '.'")
            if key in (obj.get("data") or {}) and key in (obj.get("binaryData") or {}) and field == "binaryData":
                problems.append(f"{field}[{key}]: Invalid value: {key!r}: duplicate of key present in data")
            size += len(key) + len(str(value).encode("utf-8"))
    if size > CONFIGMAP_MAX_BYTES:
        problems.append(f"[]: Too long: must have at most {CONFIGMAP_MAX_BYTES} bytes")
    if problems:
        raise ApiRefusal(422, "Invalid", f'ConfigMap "{name}" is invalid: ' + "; ".join(problems))


def _check_fields(value: Any, allowed: frozenset[str], path: str) -> None:
    if not isinstance(value, dict):
        raise ApiRefusal(400, "BadRequest", f"json: cannot unmarshal {type(value).__name__} into {path} of type object")
    for key in value:
        if key not in allowed:
            raise _unknown(f"{path}.", key)


def _custom_resource_spec(kind: str, obj: Mapping[str, Any], ns: str, name: str,
                          top: tuple[str, ...]) -> dict[str, Any] | None:
    """A custom resource's envelope checked (its top-level keys ``top``, metadata by ``V1ObjectMeta``); its spec,
    or None when it has none."""
    if not isinstance(obj, dict):
        raise ApiRefusal(400, "BadRequest", f"json: cannot unmarshal body into a {_KIND[kind]} (not an object)")
    for key in obj:
        if key not in top:
            raise _unknown("", key)
    check_model(obj.get("metadata"), "V1ObjectMeta", "metadata.")
    _check_metadata(kind, obj, ns, name)
    deserialize(obj.get("metadata") or {}, "V1ObjectMeta")
    spec = obj.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal spec of type object")
    return spec


def validate_prometheus(obj: Mapping[str, Any], ns: str, name: str) -> None:
    """A ``Prometheus`` CR: metadata by ``V1ObjectMeta``, ``spec.remoteWrite`` by prometheus-operator's field names."""
    spec = _custom_resource_spec(PROMETHEUSES, obj, ns, name, ("apiVersion", "kind", "metadata", "spec", "status"))
    if spec is None:
        return
    _check_remote_write(spec, name, "Prometheus")


def validate_prometheus_agent(obj: Mapping[str, Any], ns: str, name: str) -> None:
    """A ``PrometheusAgent`` CR: as a ``Prometheus``, and its spec has none of the server's own fields (rules,
    alerting, retention, queries, remote read, Thanos: an agent's CRD schema has no such field, so strict decoding
    refuses it as unknown); ``mode`` is one of ``AGENT_MODES``."""
    spec = _custom_resource_spec(PROMETHEUSAGENTS, obj, ns, name,
                                 ("apiVersion", "kind", "metadata", "spec", "status"))
    if spec is None:
        return
    for key in spec:
        if key in PROMETHEUS_ONLY_SPEC:
            raise _unknown("spec.", key)
    if spec.get("mode") not in (None, *AGENT_MODES):
        raise ApiRefusal(422, "Invalid", f'PrometheusAgent.{CR_GROUP} "{name}" is invalid: spec.mode: Unsupported '
                                         f"value: {spec.get('mode')!r}: supported values: "
                                         + ", ".join(f'"{m}"' for m in AGENT_MODES))
    _check_remote_write(spec, name, "PrometheusAgent")


def _check_remote_write(spec: Mapping[str, Any], name: str, kind: str) -> None:
    entries = spec.get("remoteWrite")
    if entries is None:
        return
    if not isinstance(entries, list):
        raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal spec.remoteWrite of type array")
    problems = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"spec.remoteWrite[{i}]"
        _check_fields(entry, frozenset(REMOTE_WRITE_SPEC), where)
        if not isinstance(entry.get("url"), str) or not entry["url"]:
            problems.append(f"{where}.url: Required value")
        if entry.get("name") is not None:
            if entry["name"] in names:
                problems.append(f"{where}.name: Duplicate value: {entry['name']!r}")
            names.add(str(entry["name"]))
        for field, allowed in REMOTE_WRITE_SPEC.items():
            if allowed is None or entry.get(field) is None:
                continue
            items = entry[field] if field == "writeRelabelConfigs" else [entry[field]]
            if not isinstance(items, list):
                raise ApiRefusal(400, "BadRequest", f"json: cannot unmarshal {where}.{field} of type array")
            for j, item in enumerate(items):
                sub = f"{where}.{field}" + (f"[{j}]" if field == "writeRelabelConfigs" else "")
                _check_fields(item, allowed, sub)
                if field == "writeRelabelConfigs" and item.get("action") not in (None, *RELABEL_ACTIONS):
                    problems.append(f"{sub}.action: Unsupported value: {item.get('action')!r}")
        if isinstance(entry.get("sigv4"), dict) and entry["sigv4"].get("region") is not None \
                and not isinstance(entry["sigv4"]["region"], str):
            problems.append(f"{where}.sigv4.region: Invalid value: must be a string")
    if problems:
        raise ApiRefusal(422, "Invalid", f'{kind}.{CR_GROUP} "{name}" is invalid: ' + "; ".join(problems))


def validate_prometheusrule(obj: Mapping[str, Any], ns: str, name: str) -> None:
    """A ``PrometheusRule``: metadata by ``V1ObjectMeta``, ``spec.groups`` by prometheus-operator's field names and
    its CRD's checks (a group needs a unique name; a rule exactly one of record/alert, and an expr)."""
    spec = _custom_resource_spec(PROMETHEUSRULES, obj, ns, name, ("apiVersion", "kind", "metadata", "spec"))
    if spec is None:
        return
    _check_fields(spec, frozenset({"groups"}), "spec")
    groups = spec.get("groups") or []
    if not isinstance(groups, list):
        raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal spec.groups of type array")
    problems, names = [], set()
    for i, group in enumerate(groups):
        where = f"spec.groups[{i}]"
        _check_fields(group, RULE_GROUP, where)
        if not isinstance(group.get("name"), str) or not group["name"]:
            problems.append(f"{where}.name: Required value")
        elif group["name"] in names:
            problems.append(f"{where}.name: Duplicate value: {group['name']!r}")
        names.add(str(group.get("name")))
        rules = group.get("rules") or []
        if not isinstance(rules, list):
            raise ApiRefusal(400, "BadRequest", f"json: cannot unmarshal {where}.rules of type array")
        for j, rule in enumerate(rules):
            at = f"{where}.rules[{j}]"
            _check_fields(rule, RULE, at)
            if ("record" in rule) == ("alert" in rule):
                problems.append(f"{at}: Invalid value: exactly one of record or alert")
            if not isinstance(rule.get("expr"), str | int) or rule.get("expr") == "":
                problems.append(f"{at}.expr: Required value")
    if problems:
        raise ApiRefusal(422, "Invalid", f'PrometheusRule.{CR_GROUP} "{name}" is invalid: ' + "; ".join(problems))


VALIDATORS: Mapping[str, Callable[[Mapping[str, Any], str, str], None]] = {
    CONFIGMAPS: validate_configmap, PROMETHEUSES: validate_prometheus, PROMETHEUSRULES: validate_prometheusrule,
    PROMETHEUSAGENTS: validate_prometheus_agent}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` removes a key; a list replaces the list)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- the store and the server -----------------------------------------------------------------------------------

Watcher = Callable[[str, str, str, dict[str, Any]], None]


class K8sApiServer(ContractServer):
    """The contract server: an object store with the API's checks, and watchers called after each write."""

    name = "k8s-api"
    log = log

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._revision = 100
        self.watchers: list[Watcher] = []
        # Called with (method, kind, ns, name) before a PUT or PATCH is served: a test plays a racing writer.
        self.before_write: Callable[[str, str, str, str], None] | None = None
        super().__init__(host, port)  # requests: (method, path, code), what the deployers sent

    # store operations (also used by tests to seed objects and to play another writer)

    def _store(self, kind: str, ns: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Validate, bump resourceVersion and keep ``obj``; call the watchers. The lock is held by the caller."""
        obj = copy.deepcopy(obj)
        current = self._objects.get((kind, ns, name))
        if kind == CONFIGMAPS and current is not None and current.get("immutable") is True and any(
                obj.get(field) != current.get(field) for field in ("data", "binaryData", "immutable")):
            raise ApiRefusal(422, "Invalid", f'ConfigMap "{name}" is invalid: data: Forbidden: field is immutable '
                                             "when `immutable` is set")
        obj.setdefault("apiVersion", _API_VERSION[kind])
        obj.setdefault("kind", _KIND[kind])
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiRefusal(422, "Invalid", f'{_KIND[kind]} "{name}" is invalid: metadata: Required value')
        meta.setdefault("name", name)
        meta.setdefault("namespace", ns)
        VALIDATORS[kind](obj, ns, name)
        self._revision += 1
        meta["resourceVersion"] = str(self._revision)
        self._objects[(kind, ns, name)] = obj
        return copy.deepcopy(obj)

    def _notify(self, kind: str, ns: str, name: str, obj: dict[str, Any] | None) -> None:
        """Each watcher gets the object as stored, or None when it was deleted."""
        for watcher in self.watchers:
            try:
                watcher(kind, ns, name, copy.deepcopy(obj))
            except Exception:  # a stand-in's failure is logged; the API answer stays as it was
                log.exception("watcher failed for %s %s/%s", kind, ns, name)

    def create(self, kind: str, ns: str, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Seed an object (validated like a write)."""
        with self._lock:
            stored = self._store(kind, ns, name, dict(obj))
        self._notify(kind, ns, name, stored)
        return stored

    def get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self._objects.get((kind, ns, name))
            if obj is None:
                raise ApiRefusal(404, "NotFound", f'{_QUALIFIED[kind]} "{name}" not found')
            return copy.deepcopy(obj)

    def edit(self, kind: str, ns: str, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Another writer: ``change`` edits the stored object in place; validated, resourceVersion bumped."""
        with self._lock:
            obj = self._objects.get((kind, ns, name))
            if obj is None:
                raise ApiRefusal(404, "NotFound", f'{_QUALIFIED[kind]} "{name}" not found')
            obj = copy.deepcopy(obj)
            change(obj)
            stored = self._store(kind, ns, name, obj)
        self._notify(kind, ns, name, stored)
        return stored

    def post(self, kind: str, ns: str, body: Any) -> dict[str, Any]:
        """POST to the collection: create; 409 when it exists, 500 with a ``resourceVersion`` (the storage layer
        refuses it), 422 without a name. The server sets ``uid`` and ``creationTimestamp``."""
        if not isinstance(body, dict):
            raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal body into an object")
        meta = body.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiRefusal(422, "Invalid", f"{_KIND[kind]}.{CR_GROUP} \"\" is invalid: metadata.name: Required "
                                             "value: name or generateName is required")
        VALIDATORS[kind](body, ns, name)
        with self._lock:
            if (kind, ns, name) in self._objects:
                raise ApiRefusal(409, "AlreadyExists", f'{_QUALIFIED[kind]} "{name}" already exists')
            if meta.get("resourceVersion"):
                raise ApiRefusal(500, "InternalError", "resourceVersion should not be set on objects to be created")
            obj = copy.deepcopy(body)
            obj["metadata"]["uid"] = str(uuid.uuid4())
            obj["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            stored = self._store(kind, ns, name, obj)
        self._notify(kind, ns, name, stored)
        return stored

    def delete(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        """DELETE: gone at once (no finalizers here); 404 when missing; the ``Status`` the API answers."""
        with self._lock:
            if self._objects.pop((kind, ns, name), None) is None:
                raise ApiRefusal(404, "NotFound", f'{_QUALIFIED[kind]} "{name}" not found')
            self._revision += 1
        self._notify(kind, ns, name, None)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": CR_GROUP, "kind": kind}}

    def _conflict(self, kind: str, name: str) -> ApiRefusal:
        return ApiRefusal(409, "Conflict", f'Operation cannot be fulfilled on {_QUALIFIED[kind]} "{name}": the object '
                                           "has been modified; please apply your changes to the latest version and "
                                           "try again")

    def put(self, kind: str, ns: str, name: str, body: Any) -> dict[str, Any]:
        """PUT: replace the whole object; a resourceVersion in the body must be the stored one."""
        with self._lock:
            current = self._objects.get((kind, ns, name))
            if current is None:
                raise ApiRefusal(404, "NotFound", f'{_QUALIFIED[kind]} "{name}" not found')
            if not isinstance(body, dict):
                raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal body into an object")
            VALIDATORS[kind](body, ns, name)
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != current["metadata"]["resourceVersion"]:
                raise self._conflict(kind, name)
            stored = self._store(kind, ns, name, body)
        self._notify(kind, ns, name, stored)
        return stored

    def patch(self, kind: str, ns: str, name: str, body: Any, content_type: str) -> dict[str, Any]:
        """PATCH: a merge patch; a resourceVersion in it is a precondition (409 when stale)."""
        media = content_type.split(";")[0].strip().lower()
        allowed = (MERGE_PATCH, STRATEGIC_MERGE_PATCH) if kind == CONFIGMAPS else (MERGE_PATCH,)
        if media not in allowed:
            raise ApiRefusal(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - '
                                                          f'accepted media types include: {", ".join(allowed)}')
        if not isinstance(body, dict):
            raise ApiRefusal(400, "BadRequest", "json: cannot unmarshal patch into an object")
        with self._lock:
            current = self._objects.get((kind, ns, name))
            if current is None:
                raise ApiRefusal(404, "NotFound", f'{_QUALIFIED[kind]} "{name}" not found')
            sent = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body.get("metadata"), dict) \
                else None
            if sent is not None and sent != current["metadata"]["resourceVersion"]:
                raise self._conflict(kind, name)
            merged = merge_patch(copy.deepcopy(current), body)  # the stored object stays as it is until valid
            if not isinstance(merged.get("metadata"), dict):
                raise ApiRefusal(422, "Invalid", f'{_KIND[kind]} "{name}" is invalid: metadata: Required value')
            merged["metadata"].pop("resourceVersion", None)
            stored = self._store(kind, ns, name, merged)
        self._notify(kind, ns, name, stored)
        return stored

    def _handler(self) -> type[ContractHandler]:
        server = self

        class Handler(ContractHandler):
            contract = server
            methods: ClassVar[tuple[str, ...]] = ("GET", "PUT", "PATCH", "POST", "DELETE")

            def _serve(self) -> None:
                path = self.route_path()
                raw = self.read_body()
                if self.command == "POST":
                    self._create(path, raw)
                    return
                match = next(((kind, m) for kind, pattern in _PATHS.items() if (m := pattern.match(path))), None)
                if match is None or (self.command == "DELETE" and match[0] not in _COLLECTIONS):
                    self.answer(404 if match is None else 405, status_object(
                        404 if match is None else 405, "NotFound" if match is None else "MethodNotAllowed",
                        "the server could not find the requested resource" if match is None
                        else "the server does not allow this method on the requested resource"))
                    return
                kind, m = match
                ns, name = m.group(1), m.group(2)
                try:
                    if self.command == "GET":
                        self.answer(200, server.get(kind, ns, name))
                        return
                    if self.command == "DELETE":
                        self.answer(200, server.delete(kind, ns, name))
                        return
                    try:
                        body = json.loads(raw or b"null")
                    except ValueError as exc:
                        raise ApiRefusal(400, "BadRequest", f"invalid JSON body: {exc}") from None
                    if server.before_write is not None:
                        server.before_write(self.command, kind, ns, name)
                    if self.command == "PUT":
                        self.answer(200, server.put(kind, ns, name, body))
                    else:
                        self.answer(200, server.patch(kind, ns, name, body, self.headers.get("Content-Type") or ""))
                except ApiRefusal as refusal:
                    self.answer(refusal.code, status_object(refusal.code, refusal.reason, refusal.message,
                                                             name=name, kind=kind))

            def _create(self, path: str, raw: bytes) -> None:
                match = next(((kind, m) for kind, pattern in _COLLECTIONS.items() if (m := pattern.match(path))),
                             None)
                if match is None:
                    self.answer(405, status_object(405, "MethodNotAllowed", "the server does not allow this method "
                                                                             "on the requested resource"))
                    return
                kind, m = match
                try:
                    try:
                        body = json.loads(raw or b"null")
                    except ValueError as exc:
                        raise ApiRefusal(400, "BadRequest", f"invalid JSON body: {exc}") from None
                    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) \
                            and body["metadata"].get("namespace") not in (None, m.group(1)):
                        raise ApiRefusal(400, "BadRequest", "the namespace of the provided object does not match "
                                                            "the namespace sent on the request")
                    self.answer(201, server.post(kind, m.group(1), body))
                except ApiRefusal as refusal:
                    self.answer(refusal.code, status_object(refusal.code, refusal.reason, refusal.message, kind=kind))

            do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = _serve  # noqa: N815 - http.server's names

        return Handler


# -- what acts on the objects in a cluster -----------------------------------------------------------------------


def _write_file(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".k8s-standin-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _reload(prometheus_url: str) -> None:
    request = urllib.request.Request(f"{prometheus_url.rstrip('/')}/-/reload", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 - a local http URL we were given
        resp.read()


class _FileApplier:
    """Applies the latest wanted config text to a file and reloads Prometheus, in one background thread."""

    def __init__(self, config_path: str | os.PathLike[str], prometheus_url: str, delay_s: float) -> None:
        self.config_path = Path(config_path)
        self.prometheus_url = prometheus_url
        self.delay_s = delay_s
        self.applied: list[str] = []  # texts written, in order
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._pending: Any = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()

    def want(self, text: Any) -> None:
        with self._cond:
            self._pending = text
            self._cond.notify()

    def _apply(self, text: Any) -> None:
        """Write what is wanted and reload (a subclass may restart instead)."""
        _write_file(self.config_path, text)
        _reload(self.prometheus_url)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
            time.sleep(self.delay_s)  # a sidecar notices a change a moment later, never at once
            with self._cond:
                text, self._pending = self._pending, None
            if text is None:
                continue
            try:
                self._apply(text)
                self.applied.append(text[1] if isinstance(text, tuple) else text)
            except Exception as exc:  # a rejected config: Prometheus keeps running its previous one
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("reload after a Kubernetes write failed: %s", exc)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(10)


class ConfigReloader(_FileApplier):
    """The config-reloader sidecar: ConfigMap ``ns/name``'s ``data[key]`` -> the file, then ``/-/reload``."""

    def __init__(self, server: K8sApiServer, *, namespace: str, name: str, config_path: str | os.PathLike[str],
                 prometheus_url: str, key: str = "prometheus.yml", delay_s: float = 0.5) -> None:
        super().__init__(config_path, prometheus_url, delay_s)
        self.target = (CONFIGMAPS, namespace, name)
        self.key = key
        server.watchers.append(self)

    def __call__(self, kind: str, ns: str, name: str, obj: dict[str, Any] | None) -> None:
        if obj is not None and (kind, ns, name) == self.target \
                and isinstance((obj.get("data") or {}).get(self.key), str):
            self.want(obj["data"][self.key])


class OperatorStandIn(_FileApplier):
    """prometheus-operator, kept simple: a fixed base config plus ``spec.remoteWrite`` as ``remote_write`` entries;
    with ``control`` (the source's process, LAB ONLY) a ``PrometheusAgent`` of the same name too: the agent's subset
    of that config, and the source restarted in agent mode (and back to its server command line for a
    ``Prometheus``)."""

    def __init__(self, server: K8sApiServer, *, namespace: str, name: str, base_config: str,
                 config_path: str | os.PathLike[str], prometheus_url: str, delay_s: float = 0.5,
                 control: Any = None, agent_path: str | os.PathLike[str] | None = None) -> None:
        self.target = (PROMETHEUSES, namespace, name)
        self.agent_target = (PROMETHEUSAGENTS, namespace, name)
        self.base_config = base_config
        self.control, self.agent_path = control, agent_path
        # The server's command line, as the operator would derive it from the Prometheus resource: the one the
        # source runs with when the stand-in starts (a source that is an agent then has none: see ``_apply``).
        argv = tuple(control.argv()) if control is not None else ()
        self.server_argv = argv if argv and not is_agent_argv(argv) else ()
        self.restarts: list[str] = []  # the modes the source was restarted in (or is being), in order
        self.prometheus: dict[str, Any] | None = None  # the Prometheus resource as last stored (None: deleted)
        super().__init__(config_path, prometheus_url, delay_s)
        server.watchers.append(self)

    def render(self, obj: Mapping[str, Any]) -> str:
        text = self.base_config
        for entry in (obj.get("spec") or {}).get("remoteWrite") or []:
            text = add_remote_write(text, config_remote_write_entry(entry))
        return text

    def __call__(self, kind: str, ns: str, name: str, obj: dict[str, Any] | None) -> None:
        if (kind, ns, name) == self.target:
            self.prometheus = obj
            if obj is not None:  # a deletion: the agent's write has rendered (or will render) what runs
                self.want(("server", self.render(obj)))
        elif (kind, ns, name) == self.agent_target and self.control is not None:
            if obj is not None:
                self.want(("agent", agent_config(self.render(obj).encode()).decode()))
            elif self.prometheus is not None:  # the agent's pods go; the server's, never removed, run on
                self.want(("server", self.render(self.prometheus)))

    def _apply(self, wanted: Any) -> None:
        mode, text = wanted if isinstance(wanted, tuple) else ("server", wanted)
        running = probe_mode(self.prometheus_url)
        _write_file(self.config_path, text)
        if self.control is None or running == mode:
            _reload(self.prometheus_url)
            return
        if mode == "agent":
            if not self.server_argv:
                raise RuntimeError("the source's server command line is unknown; cannot derive the agent's")
            argv = agent_argv(self.server_argv, str(self.agent_path))
        else:
            if not self.server_argv:
                raise RuntimeError("the stand-in started with the source already an agent: its server command "
                                   "line is unknown (restart the stack's k8s component with the source a server)")
            argv = self.server_argv
        self.restarts.append(mode)  # before the restart: it returns once the new process is ready
        self.control.restart(argv)


class RuleFilesStandIn(_FileApplier):
    """prometheus-operator for ``PrometheusRule`` ``ns/name``: its ``spec`` as the rule file ``<ns>-<name>.yaml`` in the
    folder the source's ``rule_files`` reads (the operator's own files are ``<ns>-<name>-<uid>.yaml``; ``suffix``
    ``.yml`` for a glob ``*.yml``), then ``/-/reload``."""

    def __init__(self, server: K8sApiServer, *, namespace: str, name: str, rules_dir: str | os.PathLike[str],
                 prometheus_url: str, delay_s: float = 0.5, suffix: str = ".yaml") -> None:
        super().__init__(Path(rules_dir) / f"{namespace}-{name}{suffix}", prometheus_url, delay_s)
        self.target = (PROMETHEUSRULES, namespace, name)
        server.watchers.append(self)

    def __call__(self, kind: str, ns: str, name: str, obj: dict[str, Any] | None) -> None:
        if obj is not None and (kind, ns, name) == self.target:
            self.want(yaml.safe_dump(obj.get("spec") or {"groups": []}, sort_keys=False))


# -- the local stack's component: ``python -m promshift.local.stack.k8s_api`` --------------------------------------

HOST = "127.0.0.1"
ADDRESS_FILE = "api.json"
KUBECONFIG_FILE = "kubeconfig.json"
DEFAULT_NAMESPACE, DEFAULT_NAME = "monitoring", "k8s"
# The token the kubeconfig carries: the contract server checks no credentials (there is no cluster to protect).
LOCAL_TOKEN = "promshift-local-contract-server"


def split_source_config(text: str) -> tuple[str, list[dict[str, Any]]]:
    """The source's config as the operator's base (its own text without ``remote_write`` entries) and those
    entries as ``RemoteWriteSpec`` s, in order. An unnamed entry cannot be moved (nothing could remove it
    from the text by name): ValueError."""
    loaded = yaml.safe_load(text) or {}
    if not isinstance(loaded, dict):
        raise ValueError("the source config is not a YAML mapping")
    entries = loaded.get("remote_write") or []
    base, specs = text, []
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not name:
            raise ValueError(f"remote_write[{i}] has no name; name it before moving the config under the operator")
        base = remove_remote_write(base, str(name))
        specs.append(cr_remote_write_entry(entry))
    return base, specs


def server_spec(base_config: str) -> dict[str, Any]:
    """The ``Prometheus`` spec fields that say in the operator's words what the base config says of the server's own
    work: ``evaluationInterval`` (its ``global.evaluation_interval``), ``ruleSelector`` (it has ``rule_files``),
    ``alerting`` (it has ``alerting``). The stand-in renders the base config as it is; these make the resource the
    operator would have rendered it from, and are what a ``PrometheusAgent`` may not carry."""
    loaded = yaml.safe_load(base_config) or {}
    spec: dict[str, Any] = {}
    if not isinstance(loaded, dict):
        return spec
    interval = (loaded.get("global") or {}).get("evaluation_interval")
    if isinstance(interval, str):
        spec["evaluationInterval"] = interval
    if loaded.get("rule_files"):
        spec["ruleSelector"] = {"matchLabels": {"prometheus": "k8s"}}
    if loaded.get("alerting"):
        spec["alerting"] = {"alertmanagers": [{"namespace": "monitoring", "name": "alertmanager-main", "port": "web"}]}
    return spec


def prometheus_resource(namespace: str, name: str, remote_write: list[dict[str, Any]],
                        spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``Prometheus`` resource the component starts with: ``spec`` (``server_spec``) and ``spec.remoteWrite``
    (none when there is none)."""
    body = dict(spec or {})
    if remote_write:
        body["remoteWrite"] = remote_write
    return {"apiVersion": _API_VERSION[PROMETHEUSES], "kind": _KIND[PROMETHEUSES],
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "promshift-local-stack"}},
            "spec": body}


def prometheus_rule_resource(namespace: str, name: str, spec: Mapping[str, Any], *, prometheus: str) -> dict[str, Any]:
    """A ``PrometheusRule`` the ``Prometheus`` resource's ``ruleSelector`` (``server_spec``) selects."""
    return {"apiVersion": _API_VERSION[PROMETHEUSRULES], "kind": _KIND[PROMETHEUSRULES],
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"prometheus": prometheus, "app.kubernetes.io/managed-by": "promshift-local-stack"}},
            "spec": dict(spec)}


def kubeconfig(server_url: str, namespace: str) -> dict[str, Any]:
    """A kubeconfig naming the contract server (plain HTTP on the loopback, a fixed local token)."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "promshift-local",
            "clusters": [{"name": "promshift-local", "cluster": {"server": server_url}}],
            "users": [{"name": "promshift", "user": {"token": LOCAL_TOKEN}}],
            "contexts": [{"name": "promshift-local",
                          "context": {"cluster": "promshift-local", "user": "promshift", "namespace": namespace}}]}


def _write_json(path: Path, document: Mapping[str, Any], mode: int = 0o600) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=2)
        fh.write("\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_address(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a running component wrote to ``api.json`` (url, port, pid, kubeconfig, namespace, name), or None."""
    try:
        data = json.loads((Path(state_dir) / ADDRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m promshift.local.stack.k8s_api",
                                     description="The local Kubernetes API contract server with the prometheus-"
                                                 "operator stand-in over the local source Prometheus (not a cluster).")
    parser.add_argument("--state-dir", required=True, type=Path, help="where api.json and kubeconfig.json go")
    parser.add_argument("--port", type=int, default=0, help=f"port on {HOST} (0: any free one, see api.json)")
    parser.add_argument("--config", required=True, type=Path, help="the source Prometheus's config file")
    parser.add_argument("--prometheus", required=True, help="the source Prometheus's URL (POST /-/reload)")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    parser.add_argument("--name", default=DEFAULT_NAME, help="the Prometheus resource's name")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds before the operator applies a change")
    parser.add_argument("--rule-file", type=Path, default=None,
                        help="a rule file of the source's rule_files taken over as PrometheusRule <namespace>/"
                             "<--rules-name>: the object is created from the file's groups and the operator stand-in "
                             "renders it back as that file, <namespace>-<rules-name>.yml (name the file so)")
    parser.add_argument("--rules-name", default=None, help="the PrometheusRule's name (with --rule-file)")
    parser.add_argument("--mode-switch", default=None, metavar="JSON",
                        help="LAB ONLY: the source's process control (the stack's source_mode_extra), so a "
                             "PrometheusAgent restarts the source as an agent")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state_dir = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / ADDRESS_FILE).unlink(missing_ok=True)  # a dead server's address must not pass for ours
    try:
        base, remote_write = split_source_config(args.config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"k8s-api: cannot take over {args.config}: {exc}", flush=True)
        return 1
    rule_spec: dict[str, Any] | None = None
    if args.rule_file is not None:
        if not args.rules_name or args.rule_file.name != f"{args.namespace}-{args.rules_name}.yml":
            print(f"k8s-api: --rule-file must be named {args.namespace}-<--rules-name>.yml (the file the operator "
                  f"renders the PrometheusRule to), got {args.rule_file.name}", flush=True)
            return 1
        try:
            loaded = yaml.safe_load(args.rule_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            print(f"k8s-api: cannot take over {args.rule_file}: {exc}", flush=True)
            return 1
        rule_spec = {"groups": list(loaded.get("groups") or []) if isinstance(loaded, dict) else []}
    try:
        server = K8sApiServer(HOST, args.port)
    except OSError as exc:
        print(f"k8s-api: cannot listen on {HOST}:{args.port}: {exc}", flush=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    control, agent_path = None, None
    if args.mode_switch:
        from promshift.adapters.source_mode import mode_switch_from_extra

        switch = mode_switch_from_extra(args.prometheus, json.loads(args.mode_switch))
        control, agent_path = switch.control, switch.agent_path
    operator = OperatorStandIn(server, namespace=args.namespace, name=args.name, base_config=base,
                               config_path=args.config, prometheus_url=args.prometheus, delay_s=args.delay,
                               control=control, agent_path=agent_path)
    # The source's rules as a PrometheusRule (kube-prometheus-stack's way), rendered back to the rule file it was.
    rule_files = None if rule_spec is None else RuleFilesStandIn(
        server, namespace=args.namespace, name=str(args.rules_name), rules_dir=args.rule_file.parent,
        prometheus_url=args.prometheus, delay_s=args.delay, suffix=".yml")
    try:
        server.create(PROMETHEUSES, args.namespace, args.name,
                      prometheus_resource(args.namespace, args.name, remote_write, server_spec(base)))
        if rule_files is not None:
            server.create(PROMETHEUSRULES, args.namespace, str(args.rules_name), prometheus_rule_resource(
                args.namespace, str(args.rules_name), rule_spec or {"groups": []}, prometheus=args.name))
        # Ready once the operator has rendered the resources onto the source and the source reloaded them.
        deadline = time.monotonic() + 60
        appliers = [operator, *([rule_files] if rule_files is not None else [])]
        while any(not a.applied and not a.errors for a in appliers) and time.monotonic() < deadline \
                and not stop.is_set():
            time.sleep(0.05)
        if not all(a.applied for a in appliers):
            print(f"k8s-api: the operator stand-in could not render onto {args.config}: "
                  f"{'; '.join(e for a in appliers for e in a.errors) or 'no reload within 60s'}", flush=True)
            return 1
        kube_path = state_dir / KUBECONFIG_FILE
        _write_json(kube_path, kubeconfig(server.base_url, args.namespace))
        _write_json(state_dir / ADDRESS_FILE, {
            "url": server.base_url, "port": int(server.base_url.rsplit(":", 1)[1]), "pid": os.getpid(),
            "kubeconfig": str(kube_path), "namespace": args.namespace, "name": args.name,
            "config": str(args.config.resolve())}, mode=0o644)
        print(f"k8s-api listening on {server.base_url}; Prometheus {args.namespace}/{args.name} rendered onto "
              f"{args.config} ({len(remote_write)} remoteWrite entries)", flush=True)
        stop.wait()
    finally:
        (state_dir / ADDRESS_FILE).unlink(missing_ok=True)
        operator.stop()
        if rule_files is not None:
            rule_files.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
