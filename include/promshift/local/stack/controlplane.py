"""The local AMP control plane: moto's server behind a SigV4-checking proxy that fills in what moto lacks.

``python -m promshift.local.stack.controlplane --port P --moto-url URL --region R --frontdoor-url URL``
answers the boto3 ``amp`` client pointed at ``http://127.0.0.1:P`` (``endpoint_url``):

- every request's SigV4 signature (service ``aps``, region R) is checked against the pair in
  the process's ``AWS_*`` environment; refusals are 403 with ``x-amzn-ErrorType``
  (``UnrecognizedClientException`` / ``InvalidSignatureException``) and ``{"message": ...}``;
- operations are named by matching method and path against botocore's own ``amp`` model;
- workspace (and other) operations go to moto 5.2.5 in server mode; DescribeWorkspace's
  ``prometheusEndpoint`` is rewritten to the front door (``<frontdoor-url>/workspaces/<id>/``);
- DescribeWorkspaceConfiguration and UpdateWorkspaceConfiguration (moto answers 404) are
  served here, with the request and the response validated against botocore's ``amp`` model;
- so are the scraper operations (CreateScraper, DescribeScraper, UpdateScraper, DeleteScraper,
  ListScrapers, GetDefaultScraperConfiguration; moto answers 404), with a real collector behind
  every ACTIVE scraper (``promshift.local.stack.scrapers``);
- Service Quotas' ListServiceQuotas and GetServiceQuota for ``aps`` (JSON protocol, routed by
  ``X-Amz-Target: ServiceQuotasV20190624.<Operation>``, signed for service ``servicequotas``;
  moto answers 500) are served here from ``faults.json``'s ``aps_quotas`` or AMP's defaults,
  validated against botocore's ``service-quotas`` model;
- Create/Describe/Put/DeleteAlertManagerDefinition (moto answers 404) are served here, checked against
  botocore's ``amp`` model; with ``--alertmanager-url`` and ``--alertmanager-config`` the workspace's
  definition configures the stack's Alertmanager (``promshift.local.stack.alert_definitions``);
- CloudWatch requests (signed for service ``monitoring``) go to moto's CloudWatch as they are;
- with ``--target-url`` and ``--target-rules-dir``, rule-groups namespaces are evaluated: moto takes
  Create/Put/DeleteRuleGroupsNamespace as before, then the namespace's rules become a rule file of the
  target Prometheus (promtool-checked, reloaded); rules it refuses leave the namespace
  ``CREATION_FAILED``/``UPDATE_FAILED`` (with ``statusReason``) in DescribeRuleGroupsNamespace and
  ListRuleGroupsNamespaces, the last good rules still evaluated (``promshift.local.stack.rule_namespaces``);
- ``<state-dir>/faults.json`` (optional, re-read on every request) injects what a test or a
  demo scenario needs: ``{"errors": {"DescribeWorkspace": "ThrottlingException"},
  "workspace_status": {"ws-...": "CREATING"}, "clock_skew_s": 600}`` (the skew applies to the
  front door too: both then refuse every signature as expired), ``"scraper": {...}`` (see
  ``promshift.local.stack.scrapers``), ``"aps_quotas": {"active_series": N, "ingestion_rate": N}`` and
  ``"aps_quotas_by_workspace": {"ws-...": {"active_series": N}}`` (what GetServiceQuota answers for a
  ``ContextId`` naming that workspace's ARN: AMP's quotas are per workspace).

Where it differs from AWS: one region and one credential pair (no IAM policies: a verified
request may do anything); moto keeps workspaces in memory (a restart forgets them); an
UpdateWorkspaceConfiguration answers UPDATING and the next describe already says ACTIVE.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import re
import sys
import threading
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import botocore.session
import yaml
from botocore.exceptions import ParamValidationError
from botocore.model import OperationModel, ServiceModel
from botocore.validate import ParamValidator

from promshift.local.stack.alert_definitions import AlertDefinitions, DefinitionInvalid
from promshift.local.stack.amp_limits import (
    APS_QUOTAS,
    DEFAULT_OUT_OF_ORDER_WINDOW_S,
    quota_value,
    read_configurations,
    write_configurations,
)
from promshift.local.stack.aws_http import SigV4Handler, SigV4Server, credentials_from_env
from promshift.local.stack.frontdoor import run_until_signalled
from promshift.local.stack.local import find_free_ports
from promshift.local.stack.rule_namespaces import RuleNamespaces, override_status
from promshift.local.stack.scrapers import (
    DEFAULT_SCRAPER_CONFIGURATION,
    ScraperConflict,
    ScraperNotFound,
    ScraperRegistry,
)

logger = logging.getLogger(__name__)

DEFAULT_RETENTION_DAYS = 150  # AMP's default retention
SERVED_HERE = ("DescribeWorkspaceConfiguration", "UpdateWorkspaceConfiguration")
# Forwarded to moto, then evaluated on (or answered from) the target's rule files (``stack.rule_namespaces``).
RULE_NAMESPACE_OPERATIONS = ("CreateRuleGroupsNamespace", "PutRuleGroupsNamespace", "DeleteRuleGroupsNamespace",
                             "DescribeRuleGroupsNamespace", "ListRuleGroupsNamespaces")
# Served here (moto has none): the workspace's alert manager definition (``stack.alert_definitions``).
ALERT_DEFINITION_OPERATIONS = ("CreateAlertManagerDefinition", "DescribeAlertManagerDefinition",
                               "PutAlertManagerDefinition", "DeleteAlertManagerDefinition")
SCRAPER_OPERATIONS = ("CreateScraper", "DescribeScraper", "UpdateScraper", "DeleteScraper", "ListScrapers",
                      "GetDefaultScraperConfiguration")
_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/[^/]+/([^/]+)/aws4_request")
QUOTAS_TARGET_PREFIX = "ServiceQuotasV20190624."
# Services a request may be signed for here besides ``aps``: Service Quotas and CloudWatch.
OTHER_SERVICES = ("servicequotas", "monitoring")
# The AMP quotas Service Quotas answers here, and their defaults: ``promshift.local.stack.amp_limits`` (the front
# door enforces the same values).
@cache
def amp_model() -> ServiceModel:
    """botocore's own ``amp`` service model."""
    return botocore.session.get_session().get_service_model("amp")


@cache
def quotas_model() -> ServiceModel:
    """botocore's own ``service-quotas`` service model."""
    return botocore.session.get_session().get_service_model("service-quotas")


@cache
def _routes() -> tuple[tuple[str, re.Pattern[str], str], ...]:
    routes = []
    for name in amp_model().operation_names:
        http = amp_model().operation_model(name).http
        template = http["requestUri"].split("?", 1)[0]
        pattern = re.sub(r"\{(\w+)\+\}", r"(?P<\1>.+)", template)
        pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
        routes.append((http["method"], re.compile(f"^{pattern}$"), name))
    # Literal segments first, so /workspaces/{id}/configuration never matches a greedier template.
    routes.sort(key=lambda route: -len(route[1].pattern.replace("[^/]+", "")))
    return tuple(routes)


def match_operation(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The ``amp`` operation a raw (percent-encoded) method and path name, and its decoded path parameters."""
    for route_method, pattern, name in _routes():
        if route_method == method and (found := pattern.match(path)):
            return name, {key: unquote(value) for key, value in found.groupdict().items()}
    return None


def validate_shape(params: dict[str, Any], operation: OperationModel, which: str) -> None:
    """Raise ParamValidationError unless ``params`` fit the operation's ``input`` or ``output`` shape."""
    shape = operation.input_shape if which == "input" else operation.output_shape
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())
    _check_enums(params, shape)


def validate_status(status: dict[str, Any]) -> None:
    """Raise ParamValidationError unless ``status`` fits the model's ``RuleGroupsNamespaceStatus`` (enums too).

    Only the status: moto's JSON answers carry blobs and timestamps in their wire form, not the shapes'."""
    shape = amp_model().shape_for("RuleGroupsNamespaceStatus")
    report = ParamValidator().validate(status, shape)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())
    _check_enums(status, shape)


def _check_enums(value: Any, shape: Any) -> None:
    """botocore's validator skips enums; the model's enums are checked here."""
    if shape is None:
        return
    if shape.type_name == "structure" and isinstance(value, dict):
        for key, member in shape.members.items():
            if key in value:
                _check_enums(value[key], member)
    elif shape.type_name == "list" and isinstance(value, list):
        for item in value:
            _check_enums(item, shape.member)
    elif shape.type_name == "string" and getattr(shape, "enum", None) and value not in shape.enum:
        raise ParamValidationError(report=f"{value!r} is not one of {', '.join(shape.enum)}")


class ControlPlaneHandler(SigV4Handler):
    """Checks, routes by the botocore model, forwards to moto or answers itself."""

    server: ControlPlaneServer
    component = "control plane"

    def kind(self, path: str) -> str:
        target = self.headers.get("X-Amz-Target", "")
        if target.startswith(QUOTAS_TARGET_PREFIX):
            return target.removeprefix(QUOTAS_TARGET_PREFIX)
        if self.signed_service() == "monitoring":
            return "cloudwatch"
        found = match_operation(self.command, path)
        return found[0] if found else "unknown"

    def signed_service(self) -> str | None:
        """The service the Authorization header's scope names (None when there is none)."""
        found = _SCOPE.search(self.headers.get("Authorization", ""))
        return found[1] if found else None

    def expected_service(self) -> str:
        """``aps``, or Service Quotas / CloudWatch when the request is signed for one of them."""
        service = self.signed_service()
        return service if service in OTHER_SERVICES else self.server.service

    def serve_verified(self, path: str, query: str, body: bytes) -> None:
        service = self.signed_service()
        if service == "servicequotas":
            self._service_quotas(body)
            return
        if service == "monitoring":
            response = self.forward(f"{self.server.moto_url}{path}" + (f"?{query}" if query else ""), self.command,
                                    body, keep_signing_headers=True)
            headers = {k: v for k, v in response.headers.items()
                       if k.lower() in ("content-type", "x-amzn-errortype", "smithy-protocol", "x-amzn-query-mode")}
            self.send_body(response.status, response.data, headers)
            return
        found = match_operation(self.command, path)
        if found is None:
            self.send_aws_error(404, "UnknownOperationException", f"No operation {self.command} {path}")
            return
        operation, params = found
        faults = self.server.faults()
        error = faults.get("errors", {}).get(operation)
        if error:
            self._modelled_error(error, f"{operation} failed: {error} (injected by the local control plane)")
            return
        if operation in SERVED_HERE:
            self._workspace_configuration(operation, params["workspaceId"], body)
            return
        if operation in SCRAPER_OPERATIONS:
            self._scraper(operation, params, query, body, faults)
            return
        if operation in ALERT_DEFINITION_OPERATIONS:
            self._alert_definition(operation, params["workspaceId"], body)
            return
        url = f"{self.server.moto_url}{path}" + (f"?{query}" if query else "")
        # moto reads the region from the Authorization header's scope; it does not check the signature.
        response = self.forward(url, self.command, body, keep_signing_headers=True)
        data = response.data
        if operation in RULE_NAMESPACE_OPERATIONS and self.server.rule_namespaces is not None \
                and 200 <= response.status < 300:
            data = self._rule_namespace(operation, params, body, data)
        if operation == "DescribeWorkspace" and response.status == 200:
            document = json.loads(data)
            workspace = document["workspace"]
            workspace["prometheusEndpoint"] = f"{self.server.frontdoor_url}/workspaces/{workspace['workspaceId']}/"
            if status := faults.get("workspace_status", {}).get(workspace["workspaceId"]):
                workspace["status"] = {"statusCode": status}
            data = json.dumps(document).encode()
        headers = {k: v for k, v in response.headers.items() if k.lower() in ("content-type", "x-amzn-errortype")}
        self.send_body(response.status, data, headers)

    def _rule_namespace(self, name: str, params: dict[str, str], body: bytes, answer: bytes) -> bytes:
        """After moto took a namespace operation: evaluate (create/put) or drop (delete) its rules on the target;
        answer describe and list with the status recorded here. Returns the answer to send."""
        rules = self.server.rule_namespaces
        assert rules is not None
        workspace = params["workspaceId"]
        if name == "DeleteRuleGroupsNamespace":
            rules.delete(workspace, params["name"])
            return answer
        document = json.loads(answer) if answer else {}
        if name in ("CreateRuleGroupsNamespace", "PutRuleGroupsNamespace"):
            request = json.loads(body) if body else {}
            namespace = params.get("name") or str(request.get("name") or "")
            data = base64.b64decode(str(request.get("data") or ""))
            creating = name == "CreateRuleGroupsNamespace"
            status = rules.apply(workspace, namespace, data, creating=creating)
            if status["statusCode"] != "ACTIVE":
                # AMP accepts the request and fails later: the answer says so, the next describe says why.
                document["status"] = {"statusCode": "CREATING" if creating else "UPDATING"}
        elif name == "DescribeRuleGroupsNamespace":
            described = document.get("ruleGroupsNamespace") or {}
            override_status(described, rules.status(workspace, params["name"]))
        else:  # ListRuleGroupsNamespaces
            for summary in document.get("ruleGroupsNamespaces") or []:
                override_status(summary, rules.status(workspace, str(summary.get("name"))))
        for found in (document, document.get("ruleGroupsNamespace"), *(document.get("ruleGroupsNamespaces") or [])):
            if isinstance(found, dict) and "status" in found:  # what was answered here fits the model's shape
                validate_status(found["status"])
        return json.dumps(document).encode()

    def _modelled_error(self, error_type: str, message: str, **fields: Any) -> None:
        shape = amp_model().shape_for(error_type)
        status = int(shape.metadata.get("error", {}).get("httpStatusCode", 400))
        self.send_aws_error(status, error_type, message, **fields)

    def _workspace_exists(self, workspace_id: str) -> bool:
        response = self.forward(f"{self.server.moto_url}/workspaces/{workspace_id}", "GET", b"",
                                keep_signing_headers=True)
        return response.status == 200

    def _workspace_configuration(self, operation_name: str, workspace_id: str, body: bytes) -> None:
        operation = amp_model().operation_model(operation_name)
        try:
            params = {**(json.loads(body) if body else {}), "workspaceId": workspace_id}
            validate_shape(params, operation, "input")
        except (ValueError, ParamValidationError) as exc:
            message = str(exc).splitlines()[-1] if str(exc) else "invalid request"
            self._modelled_error("ValidationException", message, reason="CANNOT_PARSE" if isinstance(
                exc, ValueError) else "FIELD_VALIDATION_FAILED")
            return
        if not self._workspace_exists(workspace_id):
            self._modelled_error("ResourceNotFoundException", f"Workspace {workspace_id} not found",
                                 resourceId=workspace_id, resourceType="Workspace")
            return
        with self.server.lock:
            stored = self.server.configurations.setdefault(
                workspace_id, {"retentionPeriodInDays": DEFAULT_RETENTION_DAYS,
                               "outOfOrderTimeWindowInSeconds": DEFAULT_OUT_OF_ORDER_WINDOW_S}
            )
            if operation_name == "UpdateWorkspaceConfiguration":
                for key in ("retentionPeriodInDays", "limitsPerLabelSet", "outOfOrderTimeWindowInSeconds"):
                    if key in params:
                        stored[key] = params[key]
                # The front door enforces what is stored (out-of-order window, limitsPerLabelSet).
                write_configurations(self.server.state_dir, self.server.configurations)
                answer: dict[str, Any] = {"status": {"statusCode": "UPDATING"}}
                status = 202
            else:
                answer = {"workspaceConfiguration": {"status": {"statusCode": "ACTIVE"}, **stored}}
                status = 200
        validate_shape(answer, operation, "output")
        self.send_json(status, answer)

    def _alert_definition(self, name: str, workspace_id: str, body: bytes) -> None:
        """Create/Describe/Put/DeleteAlertManagerDefinition, request and answer checked against the model."""
        operation = amp_model().operation_model(name)
        try:
            params: dict[str, Any] = {**(json.loads(body) if body else {}), "workspaceId": workspace_id}
        except ValueError:
            self._modelled_error("ValidationException", "request body is not JSON", reason="CANNOT_PARSE")
            return
        if not self._validated_input(operation, params):
            return
        if not self._workspace_exists(workspace_id):
            self._modelled_error("ResourceNotFoundException", f"Workspace {workspace_id} not found",
                                 resourceId=workspace_id, resourceType="Workspace")
            return
        store = self.server.alert_definitions
        existing = store.get(workspace_id)
        if name == "DescribeAlertManagerDefinition" or name == "DeleteAlertManagerDefinition":
            if existing is None:
                self._modelled_error("ResourceNotFoundException",
                                     f"Alert manager definition of workspace {workspace_id} not found",
                                     resourceId=workspace_id, resourceType="AlertManagerDefinition")
                return
            if name == "DeleteAlertManagerDefinition":
                store.delete(workspace_id)
                self.send_body(202, b"")
                return
            described = {"status": {"statusCode": "ACTIVE"}, "data": base64.b64decode(existing["data"]),
                         "createdAt": datetime.fromtimestamp(existing["createdAt"], UTC),
                         "modifiedAt": datetime.fromtimestamp(existing["modifiedAt"], UTC)}
            validate_shape({"alertManagerDefinition": described}, operation, "output")
            self.send_json(200, {"alertManagerDefinition": {
                **described, "data": existing["data"], "createdAt": existing["createdAt"],
                "modifiedAt": existing["modifiedAt"]}})
            return
        if name == "CreateAlertManagerDefinition" and existing is not None:
            self._modelled_error("ConflictException", f"workspace {workspace_id} already has an alert manager "
                                 "definition", resourceId=workspace_id, resourceType="AlertManagerDefinition")
            return
        if name == "PutAlertManagerDefinition" and existing is None:
            self._modelled_error("ResourceNotFoundException",
                                 f"Alert manager definition of workspace {workspace_id} not found",
                                 resourceId=workspace_id, resourceType="AlertManagerDefinition")
            return
        encoded = str(params.get("data") or "")
        try:
            data = base64.b64decode(encoded, validate=True)
            store.check(data)
        except (binascii.Error, ValueError) as exc:
            reason = str(exc) if isinstance(exc, DefinitionInvalid) else "data is not base64"
            self._modelled_error("ValidationException", reason, reason="FIELD_VALIDATION_FAILED")
            return
        store.put(workspace_id, data, encoded)
        answer = {"status": {"statusCode": "CREATING" if name == "CreateAlertManagerDefinition" else "UPDATING"}}
        validate_shape(answer, operation, "output")
        self.send_json(202, answer)

    def _validated_input(self, operation: OperationModel, params: dict[str, Any]) -> bool:
        """Check a request against the model; answer ValidationException and return False when it does not fit."""
        try:
            validate_shape(params, operation, "input")
        except ParamValidationError as exc:
            message = str(exc).splitlines()[-1] if str(exc) else "invalid request"
            self._modelled_error("ValidationException", message, reason="FIELD_VALIDATION_FAILED")
            return False
        return True

    def _scraper(self, name: str, path_params: dict[str, str], query: str, body: bytes,
                 faults: dict[str, Any]) -> None:
        operation = amp_model().operation_model(name)
        try:
            params: dict[str, Any] = {**(json.loads(body) if body else {}), **path_params}
        except ValueError:
            self._modelled_error("ValidationException", "request body is not JSON", reason="CANNOT_PARSE")
            return
        if name == "ListScrapers":
            filters: dict[str, list[str]] = {}
            for key, value in parse_qsl(query, keep_blank_values=True):
                filters.setdefault(key, []).append(value)
            params = {"filters": filters} if filters else {}
        if name == "DeleteScraper" and query:
            params.update(dict(parse_qsl(query)))
        if not self._validated_input(operation, params):
            return
        registry = self.server.scrapers
        try:
            if name in ("CreateScraper", "UpdateScraper"):
                problem = self._scraper_request_problem(params)
                if problem:
                    self._modelled_error("ValidationException", problem, reason="FIELD_VALIDATION_FAILED")
                    return
            if name == "CreateScraper":
                answer, status = registry.create(params, faults), 202
            elif name == "DescribeScraper":
                answer, status = registry.describe(params["scraperId"]), 200
            elif name == "UpdateScraper":
                answer, status = registry.update(params["scraperId"], params, faults), 202
            elif name == "DeleteScraper":
                answer, status = registry.delete(params["scraperId"], faults), 202
            elif name == "ListScrapers":
                answer, status = registry.list(params.get("filters") or {}), 200
            else:
                blob = base64.b64encode(DEFAULT_SCRAPER_CONFIGURATION.encode()).decode()
                answer, status = {"configuration": blob}, 200
        except ScraperNotFound:
            self._modelled_error("ResourceNotFoundException", f"Scraper {params.get('scraperId')} not found",
                                 resourceId=str(params.get("scraperId")), resourceType="Scraper")
            return
        except ScraperConflict as exc:
            self._modelled_error("ConflictException", str(exc), resourceId=str(params.get("scraperId")),
                                 resourceType="Scraper")
            return
        validate_shape(answer, operation, "output")
        self.send_json(status, answer)

    def _scraper_request_problem(self, params: dict[str, Any]) -> str | None:
        """What AWS would refuse in a scraper request beyond the model's shapes (None when it is fine)."""
        destination = (params.get("destination") or {}).get("ampConfiguration")
        if destination:
            workspace = str(destination["workspaceArn"]).rsplit("/", 1)[-1]
            if not self._workspace_exists(workspace):
                return f"destination workspace {workspace} does not exist"
        blob = (params.get("scrapeConfiguration") or {}).get("configurationBlob")
        if blob is None:
            return None
        try:
            document = yaml.safe_load(base64.b64decode(str(blob), validate=True))
        except (binascii.Error, ValueError, yaml.YAMLError):
            return "scrapeConfiguration.configurationBlob is not base64-encoded YAML"
        if not isinstance(document, dict) or not document.get("scrape_configs"):
            return "scrape configuration has no scrape_configs"
        extra = sorted(set(document) - {"global", "scrape_configs"})
        if extra:
            return f"scrape configuration has unsupported sections: {', '.join(extra)}"
        if any("file_sd_configs" in job for job in document["scrape_configs"] if isinstance(job, dict)):
            return "scrape configuration uses file_sd_configs, which a managed collector does not support"
        return None

    def _service_quotas(self, body: bytes) -> None:
        name = self.headers.get("X-Amz-Target", "").removeprefix(QUOTAS_TARGET_PREFIX)
        if name not in ("ListServiceQuotas", "GetServiceQuota"):
            self.send_aws_error(400, "UnknownOperationException", f"{name or 'no X-Amz-Target'} is not served here")
            return
        operation = quotas_model().operation_model(name)
        try:
            params = json.loads(body) if body else {}
            report = ParamValidator().validate(params, operation.input_shape)
        except ValueError:
            self.send_aws_error(400, "IllegalArgumentException", "request body is not JSON")
            return
        if report.has_errors():
            self.send_aws_error(400, "IllegalArgumentException", report.generate_report().splitlines()[-1])
            return
        if params.get("ServiceCode") != "aps":
            self.send_aws_error(400, "NoSuchResourceException",
                                f"the local AWS serves quotas for aps only, not {params.get('ServiceCode')!r}")
            return
        # GetServiceQuota's ContextId (a workspace ARN): that workspace's own values, when faults.json sets them.
        context = str(params.get("ContextId") or "").rsplit("/", 1)[-1] if name == "GetServiceQuota" else ""
        quotas = [self._quota(key, context) for key in APS_QUOTAS]
        if name == "ListServiceQuotas":
            answer: dict[str, Any] = {"Quotas": quotas}
        else:
            found = [q for q in quotas if q["QuotaCode"] == params["QuotaCode"]]
            if not found:
                self.send_aws_error(400, "NoSuchResourceException", f"no aps quota {params['QuotaCode']}")
                return
            answer = {"Quota": found[0]}
        report = ParamValidator().validate(answer, operation.output_shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())
        self.send_body(200, json.dumps(answer).encode(), content_type="application/x-amz-json-1.1")

    def _quota(self, key: str, workspace: str = "") -> dict[str, Any]:
        code, name, _default, resource = APS_QUOTAS[key]
        value = quota_value(self.server.faults(), key, workspace)
        region = self.server.region
        return {
            "ServiceCode": "aps", "ServiceName": "Amazon Managed Service for Prometheus", "QuotaCode": code,
            "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:aps/{code}", "QuotaName": name,
            "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
            "QuotaAppliedAtLevel": "RESOURCE",
            "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                            "MetricDimensions": {"Service": "Prometheus", "Type": "Resource", "Resource": resource,
                                                 "Class": "None"},
                            "MetricStatisticRecommendation": "Maximum"},
        }


class ControlPlaneServer(SigV4Server):
    """The control plane: where moto and the front door are, and the configurations it keeps."""

    def __init__(self, port: int, *, moto_url: str, frontdoor_url: str, targets_file: str | None = None,
                 vmagent_bin: str = "/usr/bin/vmagent", target_url: str | None = None,
                 target_rules_dir: Path | None = None, promtool: str = "promtool",
                 alertmanager_url: str | None = None, alertmanager_config: Path | None = None,
                 **kwargs: Any) -> None:
        super().__init__(port, ControlPlaneHandler, **kwargs)
        self.alert_definitions = AlertDefinitions(self.state_dir, alertmanager_url=alertmanager_url,
                                                  alertmanager_config=alertmanager_config)
        self.moto_url = moto_url.rstrip("/")
        self.frontdoor_url = frontdoor_url.rstrip("/")
        # Rule-groups namespaces evaluated by the target (both given), else only stored in moto.
        self.rule_namespaces = (
            RuleNamespaces(Path(target_rules_dir), target_url, state_dir=self.state_dir, promtool=promtool)
            if target_url and target_rules_dir else None)
        self.lock = threading.Lock()
        # What UpdateWorkspaceConfiguration stored (kept in the state dir for the front door, and across restarts).
        self.configurations: dict[str, dict[str, Any]] = read_configurations(self.state_dir)
        self.scrapers = ScraperRegistry(
            region=self.region, frontdoor_url=self.frontdoor_url,
            state_dir=self.state_dir or Path(f"/tmp/promshift-controlplane-{port}"), targets_file=targets_file,
            vmagent_bin=vmagent_bin, find_port=lambda: find_free_ports(1)[0])
        self._ticking = threading.Event()
        threading.Thread(target=self._tick, daemon=True, name="scraper-transitions").start()

    def _tick(self) -> None:
        """Move scrapers through their statuses (and start their collectors) even when nobody describes them."""
        while not self._ticking.wait(0.25):
            try:
                self.scrapers.tick()
            except Exception as exc:  # the next tick tries again; the log names the type only
                logger.error("scraper transitions failed: %s", type(exc).__name__)

    def server_close(self) -> None:
        self._ticking.set()
        self.scrapers.stop_all()
        super().server_close()


def main(argv: list[str] | None = None) -> int:
    """``python -m promshift.local.stack.controlplane``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--moto-url", required=True)
    parser.add_argument("--frontdoor-url", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--state-dir", type=Path, help="where faults.json is looked for")
    parser.add_argument("--credentials-fingerprint", help="digest of the pair, so a changed pair restarts it")
    parser.add_argument("--targets-file", help="file_sd JSON of the local fleet, scraped by scrapers' collectors")
    parser.add_argument("--vmagent-bin", default="/usr/bin/vmagent")
    parser.add_argument("--target-url", help="the target Prometheus (its /-/reload loads the namespaces' rules)")
    parser.add_argument("--target-rules-dir", type=Path,
                        help="where each rule-groups namespace becomes amp-<workspaceId>-<name>.yml (the target's "
                             "rule_files glob)")
    parser.add_argument("--promtool", default="promtool")
    parser.add_argument("--alertmanager-url", help="the local Alertmanager the workspace's definition configures")
    parser.add_argument("--alertmanager-config", type=Path, help="that Alertmanager's configuration file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = ControlPlaneServer(args.port, moto_url=args.moto_url, frontdoor_url=args.frontdoor_url,
                                targets_file=args.targets_file, vmagent_bin=args.vmagent_bin,
                                target_url=args.target_url, target_rules_dir=args.target_rules_dir,
                                promtool=args.promtool, alertmanager_url=args.alertmanager_url,
                                alertmanager_config=args.alertmanager_config,
                                state_dir=args.state_dir, credentials=credentials_from_env(), region=args.region)
    logger.info("control plane on 127.0.0.1:%s over moto at %s", args.port, args.moto_url)
    run_until_signalled(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
