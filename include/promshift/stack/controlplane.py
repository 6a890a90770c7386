"""The local AMP control plane: moto's server behind a SigV4-checking proxy that fills in what moto lacks.

``python -m promshift.stack.controlplane --port P --moto-url URL --region R --frontdoor-url URL``
answers the boto3 ``amp`` client pointed at ``http://127.0.0.1:P`` (``endpoint_url``):

- every request's SigV4 signature (service ``aps``, region R) is checked against the pair in
  the process's ``AWS_*`` environment; refusals are 403 with ``x-amzn-ErrorType``
  (``UnrecognizedClientException`` / ``InvalidSignatureException``) and ``{"message": ...}``;
- operations are named by matching method and path against botocore's own ``amp`` model;
- workspace (and other) operations go to moto 5.2.5 in server mode; DescribeWorkspace's
  ``prometheusEndpoint`` is rewritten to the front door (``<frontdoor-url>/workspaces/<id>/``);
- DescribeWorkspaceConfiguration and UpdateWorkspaceConfiguration (moto answers 404) are
  served here, with the request and the response validated against botocore's ``amp`` model;
- ``<state-dir>/faults.json`` (optional, re-read on every request) injects what a test or a
  demo scenario needs: ``{"errors": {"DescribeWorkspace": "ThrottlingException"},
  "workspace_status": {"ws-...": "CREATING"}, "clock_skew_s": 600}`` (the skew applies to the
  front door too: both then refuse every signature as expired).

Where it differs from AWS: one region and one credential pair (no IAM policies: a verified
request may do anything); moto keeps workspaces in memory (a restart forgets them); an
UpdateWorkspaceConfiguration answers UPDATING and the next describe already says ACTIVE.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import threading
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import botocore.session
from botocore.exceptions import ParamValidationError
from botocore.model import OperationModel, ServiceModel
from botocore.validate import ParamValidator

from promshift.stack.aws_http import SigV4Handler, SigV4Server, credentials_from_env
from promshift.stack.frontdoor import run_until_signalled

logger = logging.getLogger(__name__)

DEFAULT_RETENTION_DAYS = 150  # AMP's default retention
SERVED_HERE = ("DescribeWorkspaceConfiguration", "UpdateWorkspaceConfiguration")


@cache
def amp_model() -> ServiceModel:
    """botocore's own ``amp`` service model."""
    return botocore.session.get_session().get_service_model("amp")


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
        found = match_operation(self.command, path)
        return found[0] if found else "unknown"

    def serve_verified(self, path: str, query: str, body: bytes) -> None:
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
        url = f"{self.server.moto_url}{path}" + (f"?{query}" if query else "")
        # moto reads the region from the Authorization header's scope; it does not check the signature.
        response = self.forward(url, self.command, body, keep_signing_headers=True)
        data = response.data
        if operation == "DescribeWorkspace" and response.status == 200:
            document = json.loads(data)
            workspace = document["workspace"]
            workspace["prometheusEndpoint"] = f"{self.server.frontdoor_url}/workspaces/{workspace['workspaceId']}/"
            if status := faults.get("workspace_status", {}).get(workspace["workspaceId"]):
                workspace["status"] = {"statusCode": status}
            data = json.dumps(document).encode()
        headers = {k: v for k, v in response.headers.items() if k.lower() in ("content-type", "x-amzn-errortype")}
        self.send_body(response.status, data, headers)

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
                workspace_id, {"retentionPeriodInDays": DEFAULT_RETENTION_DAYS}
            )
            if operation_name == "UpdateWorkspaceConfiguration":
                for key in ("retentionPeriodInDays", "limitsPerLabelSet"):
                    if key in params:
                        stored[key] = params[key]
                answer: dict[str, Any] = {"status": {"statusCode": "UPDATING"}}
                status = 202
            else:
                answer = {"workspaceConfiguration": {"status": {"statusCode": "ACTIVE"}, **stored}}
                status = 200
        validate_shape(answer, operation, "output")
        self.send_json(status, answer)


class ControlPlaneServer(SigV4Server):
    """The control plane: where moto and the front door are, and the configurations it keeps."""

    def __init__(self, port: int, *, moto_url: str, frontdoor_url: str, **kwargs: object) -> None:
        super().__init__(port, ControlPlaneHandler, **kwargs)  # type: ignore[arg-type]
        self.moto_url = moto_url.rstrip("/")
        self.frontdoor_url = frontdoor_url.rstrip("/")
        self.lock = threading.Lock()
        self.configurations: dict[str, dict[str, Any]] = {}


def main(argv: list[str] | None = None) -> int:
    """``python -m promshift.stack.controlplane``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--moto-url", required=True)
    parser.add_argument("--frontdoor-url", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--state-dir", type=Path, help="where faults.json is looked for")
    parser.add_argument("--credentials-fingerprint", help="digest of the pair, so a changed pair restarts it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = ControlPlaneServer(args.port, moto_url=args.moto_url, frontdoor_url=args.frontdoor_url,
                                state_dir=args.state_dir, credentials=credentials_from_env(), region=args.region)
    logger.info("control plane on 127.0.0.1:%s over moto at %s", args.port, args.moto_url)
    run_until_signalled(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
