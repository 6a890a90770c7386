"""An AMP workspace, as the control plane describes it: named by id or alias, read into small values.

The boto3 ``amp`` client is passed in (the Airflow hook builds it); every AWS error becomes an
``AmpError`` with one line that names the workspace, the region and what to do, and never the
server's raw message for credential errors (a signature mismatch message can echo the canonical
request, session token included).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

log = logging.getLogger(__name__)

ACTIVE = "ACTIVE"
# Codes AWS answers when the credentials or their signature are refused (never echo their message).
CREDENTIAL_ERRORS = frozenset({"UnrecognizedClientException", "InvalidSignatureException", "SignatureDoesNotMatch",
                               "ExpiredTokenException", "InvalidClientTokenId", "IncompleteSignature",
                               "MissingAuthenticationToken"})
RETRYABLE_ERRORS = frozenset({"ThrottlingException", "InternalServerException", "ServiceUnavailableException"})
# Extra keys an ``amp`` connection may carry besides the amazon provider's own (region_name, role_arn, ...).
AMP_EXTRA_KEYS = ("workspace_id", "workspace_alias", "writer_role_arn", "remote_write_url", "scraper", "quota")


class AmpError(RuntimeError):
    """An AMP workspace cannot be used as asked; the message is one line and holds no secret."""

    def __init__(self, message: str, *, retryable: bool = False, code: str | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.retryable = retryable
        self.code = code


@dataclass(frozen=True)
class AmpTarget:
    """What an ``amp`` connection's extra names: the region and the workspace (by id or alias)."""

    region: str
    workspace_id: str | None = None
    workspace_alias: str | None = None
    role_arn: str | None = None
    # The role the source Prometheus's sigv4 block assumes to write (never ``role_arn``, promshift's own); None:
    # the writer signs with its own identity (its IRSA role), which the docs recommend (docs/aws-setup.md).
    writer_role_arn: str | None = None
    remote_write_url: str | None = None
    timeout_s: float = 60.0

    @property
    def workspace_ref(self) -> str:
        return self.workspace_id or f"alias {self.workspace_alias!r}"


# An AWS region name as the partitions spell them (us-east-1, eu-central-2, us-gov-west-1, cn-north-1,
# eusc-de-east-1).
AWS_REGION_RE = re.compile(r"[a-z]{2,4}(-[a-z]+){1,3}-[0-9]{1,2}")
# An IAM role's ARN in any partition: what STS's AssumeRole takes as RoleArn.
_ROLE_ARN = re.compile(r"arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}")
# botocore's amp model: WorkspaceId is 1 to 64 of these, starting with a letter or digit.
_WORKSPACE_ID = re.compile(r"[0-9A-Za-z][-.0-9A-Z_a-z]{0,63}")
# Keys the amazon provider would read from the extra; in the extra they show in the UI and the connection's JSON.
EXTRA_SECRETS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
MAX_TIMEOUT_S = 3600.0


def _short(value: Any) -> str:
    """A value for a message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_amp_extra(extra: Any, *, conn_id: str = "promshift_target") -> dict[str, Any]:
    """The extra as a dict, or one-line ``AmpError`` naming the field: not an object, access keys in it.

    Access keys in the extra are refused naming the field, never echoing the value: the README keeps them in
    login/password (or a role), where the UI masks them.
    """
    if not isinstance(extra, Mapping):
        raise AmpError(f"connection {conn_id!r}: extra must be a JSON object, got a {type(extra).__name__} "
                       "(e.g. {\"region_name\": \"us-east-1\", \"workspace_id\": \"ws-...\"})")
    for field in EXTRA_SECRETS:
        if extra.get(field):
            raise AmpError(f"connection {conn_id!r}: extra.{field} holds an access key, which the extra shows in "
                           "the UI and the connection's JSON; put the key in login/password, or use role_arn "
                           "or the default credential chain")
    return dict(extra)


def amp_target_from_extra(extra: Any, *, conn_id: str = "promshift_target") -> AmpTarget:
    """Read an ``amp`` connection's extra; a missing or malformed field is a one-line error naming it."""
    extra = check_amp_extra(extra, conn_id=conn_id)
    region = str(extra.get("region_name") or "").strip()
    ws_id = str(extra.get("workspace_id") or "").strip() or None
    alias = str(extra.get("workspace_alias") or "").strip() or None
    if not region:
        raise AmpError(f"connection {conn_id!r} needs extra.region_name (the AMP workspace's region)")
    if not AWS_REGION_RE.fullmatch(region):
        raise AmpError(f"connection {conn_id!r}: extra.region_name {_short(region)} is not an AWS region "
                       "(like us-east-1)")
    if bool(ws_id) == bool(alias):
        raise AmpError(f"connection {conn_id!r} needs exactly one of extra.workspace_id or extra.workspace_alias")
    if ws_id is not None and not _WORKSPACE_ID.fullmatch(ws_id):
        raise AmpError(f"connection {conn_id!r}: extra.workspace_id {_short(ws_id)} is not an AMP workspace id "
                       "(like ws-0123abcd-...; at most 64 of 0-9 A-Z a-z - . _)")
    if alias is not None and len(alias) > 100:
        raise AmpError(f"connection {conn_id!r}: extra.workspace_alias is {len(alias)} characters; AMP allows 100")
    role_arn = str(extra["role_arn"]).strip() if extra.get("role_arn") else None
    if role_arn is not None and not _ROLE_ARN.fullmatch(role_arn):
        raise AmpError(f"connection {conn_id!r}: extra.role_arn {_short(role_arn)} is not an IAM role ARN "
                       "(arn:aws:iam::123456789012:role/NAME)")
    writer = str(extra["writer_role_arn"]).strip() if extra.get("writer_role_arn") else None
    if writer is not None and not _ROLE_ARN.fullmatch(writer):
        raise AmpError(f"connection {conn_id!r}: extra.writer_role_arn {_short(writer)} is not an IAM role ARN "
                       "(arn:aws:iam::123456789012:role/NAME)")
    if writer is not None and writer == role_arn:
        raise AmpError(f"connection {conn_id!r}: extra.writer_role_arn is the connection's own role_arn: the source "
                       "Prometheus would write with promshift's control-plane rights; name a writer role holding "
                       "aps:RemoteWrite only (deploy/iam/source-writer.json), or leave it out")
    return AmpTarget(region=region, workspace_id=ws_id, workspace_alias=alias, role_arn=role_arn,
                     writer_role_arn=writer,
                     remote_write_url=str(extra["remote_write_url"]) if extra.get("remote_write_url") else None,
                     timeout_s=_timeout(extra.get("timeout_s"), conn_id))


def _timeout(value: Any, conn_id: str) -> float:
    if value is None or value == "":
        return 60.0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds <= MAX_TIMEOUT_S:  # NaN fails the comparison too
        raise AmpError(f"connection {conn_id!r}: extra.timeout_s {_short(value)} is not a number of seconds "
                       f"between 0 and {MAX_TIMEOUT_S:g}")
    return seconds


@dataclass(frozen=True)
class Workspace:
    """One workspace's description (``DescribeWorkspace``)."""

    workspace_id: str
    status: str
    prometheus_endpoint: str
    arn: str = ""
    alias: str | None = None

    @property
    def query_url(self) -> str:
        """The base URL ``/api/v1/...`` paths are appended to."""
        return self.prometheus_endpoint.rstrip("/")

    @property
    def remote_write_url(self) -> str:
        return self.query_url + "/api/v1/remote_write"

    @property
    def arn_region(self) -> str | None:
        parts = self.arn.split(":")
        return parts[3] if len(parts) > 5 and parts[3] else None


def workspace_from_description(desc: Mapping[str, Any]) -> Workspace:
    """A ``DescribeWorkspace`` answer's ``workspace`` member as a Workspace."""
    return Workspace(workspace_id=str(desc["workspaceId"]), status=str((desc.get("status") or {}).get("statusCode")),
                     prometheus_endpoint=str(desc.get("prometheusEndpoint") or ""), arn=str(desc.get("arn") or ""),
                     alias=desc.get("alias"))


def workspace_problem(ws: Workspace, region: str) -> str | None:
    """Why the workspace cannot take queries and writes now (not ACTIVE, another region), or None."""
    if ws.arn_region and ws.arn_region != region:
        return (f"AMP workspace {ws.workspace_id} is in region {ws.arn_region}, but the connection's "
                f"region_name is {region}")
    if ws.status != ACTIVE:
        return (f"AMP workspace {ws.workspace_id} is {ws.status}, not ACTIVE: wait until it is ACTIVE"
                if ws.status in ("CREATING", "UPDATING") else
                f"AMP workspace {ws.workspace_id} is {ws.status}, not ACTIVE: it cannot be migrated onto")
    if not ws.prometheus_endpoint:
        return f"AMP workspace {ws.workspace_id} has no prometheusEndpoint"
    return None


def workspace_id_for_alias(listed: list[Mapping[str, Any]], alias: str, region: str) -> str:
    """The one workspace whose alias is exactly ``alias`` (ListWorkspaces filters by prefix)."""
    exact = sorted(str(w["workspaceId"]) for w in listed if w.get("alias") == alias)
    if not exact:
        raise AmpError(f"no AMP workspace with alias {alias!r} in region {region} "
                       "(check extra.workspace_alias and extra.region_name)")
    if len(exact) > 1:
        raise AmpError(f"{len(exact)} AMP workspaces have alias {alias!r} in region {region} ({', '.join(exact)}); "
                       "name one by extra.workspace_id")
    return exact[0]


def retention_from_configuration(answer: Mapping[str, Any]) -> float | None:
    """Seconds of retention from a ``DescribeWorkspaceConfiguration`` answer (None when absent)."""
    days = (answer.get("workspaceConfiguration") or {}).get("retentionPeriodInDays")
    return float(days) * 86_400 if days else None


def aws_error_message(exc: Exception, *, action: str, target: AmpTarget, workspace: str | None = None) -> AmpError:
    """One line for an AWS failure: the code, what was asked, where, and what to check; never a secret."""
    where = f"AMP workspace {workspace or target.workspace_ref} in {target.region}"
    if isinstance(exc, NoCredentialsError):
        return AmpError(f"{action} on {where}: no AWS credentials (set the connection's login/password "
                        "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)", code="NoCredentials")
    if isinstance(exc, EndpointConnectionError):
        return AmpError(f"{action} on {where}: cannot reach the AMP control plane for region {target.region} "
                        "(check extra.region_name and extra.endpoint_url)", retryable=True, code="EndpointConnection")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error") or {}
        code = str(err.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "unknown")
        if code in CREDENTIAL_ERRORS:
            hint = _credential_hint(str(err.get("Message") or ""), target)
            return AmpError(f"{action} on {where}: AWS refused the credentials' signature ({code})"
                            + (f": {hint}" if hint else ""), code=code)
        if code == "AccessDeniedException":
            return AmpError(f"{action} on {where}: access denied (AccessDeniedException); the credentials need "
                            f"aps:{action}", code=code)
        if code == "ResourceNotFoundException":
            return AmpError(f"{action}: no {where} (check extra.workspace_id and that extra.region_name is the "
                            "workspace's region)", code=code)
        if code in RETRYABLE_ERRORS:
            return AmpError(f"{action} on {where}: {code} from the AMP control plane; retry later",
                            retryable=True, code=code)
        message = str(err.get("Message") or "").splitlines()[0][:200] if err.get("Message") else ""
        return AmpError(f"{action} on {where}: {code}" + (f": {message}" if message else ""), code=code)
    if isinstance(exc, BotoCoreError):
        return AmpError(f"{action} on {where}: {exc.__class__.__name__}", code=exc.__class__.__name__)
    return AmpError(f"{action} on {where}: {exc.__class__.__name__}", code=exc.__class__.__name__)


def _credential_hint(message: str, target: AmpTarget) -> str:
    """What to check, for the refusals whose cause AWS names in a known opening (the message itself is never
    echoed: a signature mismatch can quote the canonical request, session token included)."""
    if message.startswith(("Signature expired", "Signature not yet current")):
        return "the signature's time is more than 5 minutes off AWS's clock (check this host's clock)"
    if message.startswith("Credential should be scoped to a valid region"):
        return (f"signed for region {target.region}, which is not the endpoint's region "
                "(check extra.region_name)")
    return ""


def describe_workspace(client: Any, target: AmpTarget) -> Workspace:
    """Resolve the target's workspace (alias via ``ListWorkspaces``) and describe it, whatever its status."""
    ws_id = target.workspace_id
    if ws_id is None:
        assert target.workspace_alias is not None
        try:
            listed: list[Mapping[str, Any]] = []
            for page in client.get_paginator("list_workspaces").paginate(alias=target.workspace_alias):
                listed.extend(page.get("workspaces") or [])
        except Exception as exc:
            raise aws_error_message(exc, action="ListWorkspaces", target=target) from None
        ws_id = workspace_id_for_alias(listed, target.workspace_alias, target.region)
    try:
        answer = client.describe_workspace(workspaceId=ws_id)
    except Exception as exc:
        raise aws_error_message(exc, action="DescribeWorkspace", target=target, workspace=ws_id) from None
    return workspace_from_description(answer["workspace"])


def active_workspace(client: Any, target: AmpTarget) -> Workspace:
    """The target's workspace, only if it can take queries and writes now (ACTIVE, in the region)."""
    ws = describe_workspace(client, target)
    problem = workspace_problem(ws, target.region)
    if problem:
        raise AmpError(problem, retryable=ws.status in ("CREATING", "UPDATING"), code=ws.status)
    return ws


def _workspace_configuration(client: Any, target: AmpTarget, workspace_id: str, *,
                             what: str) -> tuple[dict[str, Any] | None, str]:
    """``DescribeWorkspaceConfiguration``'s answer, or ``(None, why)`` (the AWS error, redacted) logged as ``what``
    being unavailable."""
    try:
        return client.describe_workspace_configuration(workspaceId=workspace_id), ""
    except Exception as exc:
        why = str(aws_error_message(exc, action="DescribeWorkspaceConfiguration", target=target,
                                    workspace=workspace_id))
        log.info("AMP %s unavailable: %s", what, why)
        return None, why


def workspace_retention(client: Any, target: AmpTarget, workspace_id: str) -> tuple[float | None, str]:
    """``(seconds, origin)`` from ``DescribeWorkspaceConfiguration``; ``(None, why)`` when it is unavailable.

    Unavailable is not an error: the caller falls back to the catalog (moto 5.2.5, for one,
    answers this call with a bare 404).
    """
    answer, why = _workspace_configuration(client, target, workspace_id, what="retention")
    if answer is None:
        return None, f"unavailable ({why})"
    seconds = retention_from_configuration(answer)
    if seconds is None:
        return None, "unavailable (the workspace configuration has no retentionPeriodInDays)"
    return seconds, f"from the workspace configuration ({seconds / 86_400:g} days)"


# "All workspaces have a default out-of-order time window of 60 seconds. Setting this value to 0 disables the
# feature" (the AMP user guide, "Configure your workspace"): an answer without the field has that default.
AMP_DEFAULT_OUT_OF_ORDER_WINDOW_S = 60.0


def workspace_out_of_order_window(client: Any, target: AmpTarget, workspace_id: str) -> tuple[float | None, str]:
    """``(seconds, origin)``: the workspace's ``outOfOrderTimeWindowInSeconds`` from
    ``DescribeWorkspaceConfiguration`` (AMP's documented default, 60 s, when the answer has none). ``(None, why)``
    when the call fails: the window may have been set to 0, so a swap is refused (fail closed), never assumed."""
    answer, why = _workspace_configuration(client, target, workspace_id, what="out-of-order window")
    if answer is None:
        return None, f"unavailable: {why}"
    value = (answer.get("workspaceConfiguration") or {}).get("outOfOrderTimeWindowInSeconds")
    if value is None:
        return AMP_DEFAULT_OUT_OF_ORDER_WINDOW_S, ("AMP's documented default: the workspace configuration names no "
                                                   "outOfOrderTimeWindowInSeconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"unavailable: outOfOrderTimeWindowInSeconds is {_short(value)}, not a number"
    return float(value), f"outOfOrderTimeWindowInSeconds of AMP workspace {workspace_id}"
