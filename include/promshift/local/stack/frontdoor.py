"""The local AMP front door: a workspace's query and remote-write API, SigV4-checked, over the target Prometheus.

``python -m promshift.local.stack.frontdoor --port P --target-url URL --region R --workspace-id ws-...
[--workspace-target ws-...=URL ...]`` serves
``/workspaces/<ws-id>/api/v1/{query,query_range,series,labels,label/<name>/values,remote_write}``
(GET and POST, as AMP does) and ``/workspaces/<ws-id>/api/v1/{rules,alerts}`` (GET: what the workspace's
rule-groups namespaces evaluate, see ``promshift.local.stack.rule_namespaces``) on 127.0.0.1:P. Every
request's signature is recomputed with botocore (service ``aps``, region R) from the pair in the
process's ``AWS_*`` environment; a refused one gets HTTP 403 and an AMP-style ``{"message": ...}``
body. Verified requests are forwarded to the Prometheus backing the workspace named in the path
(``remote_write`` becomes its ``/api/v1/write``): ``--target-url`` for the ``--workspace-id`` ones, the URL of
a ``--workspace-target`` for each of those (a second workspace, ``stack up --target amp --clusters 2``). One
front door for every workspace, as AMP has one endpoint per region; a workspace it does not serve is answered
404 ``ResourceNotFoundException`` once the signature has passed (AMP checks the signature first too).
``GET /workspaces/<ws-id>/alertmanager/api/v2/alerts`` (AMP's ListAlerts on the workspace's Alertmanager) is
forwarded to the stack's Alertmanager (``--alertmanager-url``) while the workspace has an alert manager
definition (``promshift.local.stack.alert_definitions``), else answered 404 ``ResourceNotFoundException``.
``GET /-/sigv4-stats`` (unsigned, local only) returns the counters.

Strict (``--strict``, what ``stack up --target amp`` runs): ``remote_write``, ``query`` and ``query_range`` go
through ``promshift.local.stack.amp_strict`` first, which refuses what AMP refuses with AMP's status codes and
words (limits from the control plane's Service Quotas and workspace configuration answers) and counts every
discard by reason (``GET /-/discarded-samples``; with ``--cloudwatch-url`` also CloudWatch ``DiscardedSamples``).

Measured with Debian's Prometheus 2.42 (`prometheus` 2.42.0+ds-5+deb12u1): see
``DEBIAN_PROMETHEUS_SIGV4`` below.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from pathlib import Path

from promshift.local.stack.amp_strict import DISCARDS_PATH, StrictWorkspaces
from promshift.local.stack.aws_http import SigV4Handler, SigV4Server, credentials_from_env

logger = logging.getLogger(__name__)

# What Debian's Prometheus 2.42 (2.42.0+ds-5+deb12u1) does with `sigv4: {region: ...}` in a remote_write
# entry pointed straight at this front door, measured here (the first and last in
# tests/integration/test_amp_local.py):
# - `promtool check config` accepts the block;
# - with no AWS credentials in the server's environment, loading the config fails ("could not get SigV4
#   credentials: NoCredentialProviders"): a reload answers HTTP 500 and the old config stays;
# - with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY set, it loads and sends every write with no
#   Authorization or X-Amz-* header at all (header names seen: Content-Encoding, Content-Length,
#   Content-Type, Host, User-Agent, X-Prometheus-Remote-Write-Version). The front door refuses each as
#   missing_authorization (403), Prometheus treats 403 as non-recoverable and drops the samples
#   (prometheus_remote_storage_samples_failed_total rises); nothing lands.
DEBIAN_PROMETHEUS_SIGV4 = (
    "loads only with AWS credentials in its environment, then sends unsigned: refused with 403, samples dropped"
)

_API = re.compile(r"^/workspaces/(?P<ws>[A-Za-z0-9_-]+)/api/v1/(?P<rest>.*)$")
_ENDPOINTS = {"query", "query_range", "series", "labels", "remote_write", "rules", "alerts"}
# The rules API is read-only (AMP's ListRules, ListAlerts).
_GET_ONLY = {"rules", "alerts"}
_LABEL_VALUES = re.compile(r"^label/[^/]+/values$")
_ALERTMANAGER = re.compile(r"^/workspaces/(?P<ws>[A-Za-z0-9_-]+)/alertmanager/api/v2/alerts$")


def api_kind(path: str) -> str:
    """The counter key of a front-door path: ``query``, ``query_range``, ..., ``label_values``, or ``other``."""
    if _ALERTMANAGER.match(path):
        return "alertmanager_alerts"
    match = _API.match(path)
    if match is None:
        return "other"
    rest = match["rest"]
    if rest in _ENDPOINTS:
        return rest
    return "label_values" if _LABEL_VALUES.match(rest) else "other"


class FrontDoorHandler(SigV4Handler):
    """Forwards verified workspace API calls to the target Prometheus."""

    server: FrontDoorServer
    component = "front door"

    def kind(self, path: str) -> str:
        return api_kind(path)

    def serve_verified(self, path: str, query: str, body: bytes) -> None:
        if (alerts := _ALERTMANAGER.match(path)) is not None:
            self._alertmanager(alerts["ws"], query)
            return
        match = _API.match(path)
        kind = api_kind(path)
        if match is None or kind == "other":
            self.send_aws_error(404, "ResourceNotFoundException", "Not Found")
            return
        target_url = self.server.targets.get(match["ws"])
        if target_url is None:
            self.send_aws_error(404, "ResourceNotFoundException", f"Workspace not found: {match['ws']}",
                                resourceId=match["ws"], resourceType="Workspace")
            return
        if self.command not in ("GET", "POST") or (kind == "remote_write" and self.command != "POST") \
                or (kind in _GET_ONLY and self.command != "GET"):
            self.send_aws_error(405, "ValidationException", f"{self.command} is not allowed here")
            return
        strict = self.server.strict
        if strict is not None and kind == "remote_write":
            strict.remote_write(self, match["ws"], target_url, body)
            return
        if strict is not None and kind in ("query", "query_range"):
            strict.query(self, match["ws"], target_url, kind, query, body)
            return
        rest = "write" if kind == "remote_write" else match["rest"]
        url = f"{target_url}/api/v1/{rest}" + (f"?{query}" if query else "")
        response = self.forward(url, self.command, body)
        headers = {
            key: value for key, value in response.headers.items()
            if key.lower() in ("content-type", "content-encoding")
        }
        self.send_body(response.status, response.data, headers)


    def _handle(self) -> None:
        if self.command == "GET" and self.path.partition("?")[0] == DISCARDS_PATH and self.server.strict:
            self._read_body()
            self.send_json(200, self.server.strict.snapshot())
            return
        super()._handle()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    def _alertmanager(self, workspace: str, query: str) -> None:
        """ListAlerts on the workspace's Alertmanager: the stack's, while the workspace has a definition."""
        from promshift.local.stack.alert_definitions import AlertDefinitions

        if workspace not in self.server.targets:
            self.send_aws_error(404, "ResourceNotFoundException", f"Workspace not found: {workspace}",
                                resourceId=workspace, resourceType="Workspace")
            return
        if self.command != "GET":
            self.send_aws_error(405, "ValidationException", f"{self.command} is not allowed here")
            return
        if self.server.alertmanager_url is None or AlertDefinitions(self.server.state_dir).get(workspace) is None:
            self.send_aws_error(404, "ResourceNotFoundException",
                                f"Alert manager definition of workspace {workspace} not found",
                                resourceId=workspace, resourceType="AlertManagerDefinition")
            return
        response = self.forward(f"{self.server.alertmanager_url}/api/v2/alerts" + (f"?{query}" if query else ""),
                                "GET", b"")
        headers = {k: v for k, v in response.headers.items() if k.lower() == "content-type"}
        self.send_body(response.status, response.data, headers)


class FrontDoorServer(SigV4Server):
    """The front door: the workspace ids it serves, the Prometheus behind each, and the stack's Alertmanager."""

    def __init__(self, port: int, *, target_url: str, workspace_ids: set[str], alertmanager_url: str | None = None,
                 workspace_targets: dict[str, str] | None = None, strict: bool = False,
                 cloudwatch: object | None = None, **kwargs: object) -> None:
        super().__init__(port, FrontDoorHandler, **kwargs)  # type: ignore[arg-type]
        # AMP's data-plane limits and DiscardedSamples (``amp_strict``); None: forwards everything as it comes.
        self.strict = StrictWorkspaces(self.state_dir) if strict else None
        self._publishing = threading.Event()
        if self.strict is not None and cloudwatch is not None:
            threading.Thread(target=self.strict.publish_forever, args=(cloudwatch, self._publishing), daemon=True,
                             name="discarded-samples").start()
        self.target_url = target_url.rstrip("/")
        # workspace id -> the base URL of the Prometheus standing in for it
        self.targets = {ws: self.target_url for ws in workspace_ids}
        self.targets.update({ws: url.rstrip("/") for ws, url in (workspace_targets or {}).items()})
        self.workspace_ids = set(self.targets)
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None

    def server_close(self) -> None:
        self._publishing.set()
        super().server_close()


def serve_in_thread(server: SigV4Server) -> threading.Thread:
    """Run ``server`` in a daemon thread (tests); stop it with ``server.shutdown()`` then ``server.server_close()``."""
    thread = threading.Thread(target=server.serve_forever, name=type(server).__name__, daemon=True)
    thread.start()
    return thread


def run_until_signalled(server: SigV4Server) -> None:
    """Serve until SIGTERM/SIGINT, then close the socket."""

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    """``python -m promshift.local.stack.frontdoor``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target-url", required=True, help="base URL of the target Prometheus's API")
    parser.add_argument("--region", required=True)
    parser.add_argument("--workspace-id", action="append", required=True, help="a workspace id served (repeatable)")
    parser.add_argument("--workspace-target", action="append", default=[], metavar="WS=URL",
                        help="another workspace id served, and the base URL of the Prometheus behind it (repeatable)")
    parser.add_argument("--state-dir", type=Path, help="where faults.json (clock_skew_s) is looked for")
    parser.add_argument("--credentials-fingerprint", help="digest of the pair, so a changed pair restarts it")
    parser.add_argument("--alertmanager-url", help="the stack's Alertmanager")
    parser.add_argument("--strict", action="store_true", help="enforce AMP's data-plane limits (amp_strict)")
    parser.add_argument("--cloudwatch-url", help="the local AWS, where DiscardedSamples is put (with --strict)")
    args = parser.parse_args(argv)
    others: dict[str, str] = {}
    for spec in args.workspace_target:
        workspace, sep, url = spec.partition("=")
        if not sep or not workspace or not url.startswith("http"):
            parser.error(f"--workspace-target must be WS=URL, got {spec!r}")
        others[workspace] = url
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    credentials = credentials_from_env()
    cloudwatch = None
    if args.strict and args.cloudwatch_url:
        import boto3

        cloudwatch = boto3.client("cloudwatch", region_name=args.region, endpoint_url=args.cloudwatch_url,
                                  aws_access_key_id=credentials.access_key,
                                  aws_secret_access_key=credentials.secret_key,
                                  aws_session_token=credentials.session_token)
    server = FrontDoorServer(args.port, target_url=args.target_url, workspace_ids=set(args.workspace_id),
                             workspace_targets=others, credentials=credentials, region=args.region,
                             state_dir=args.state_dir, alertmanager_url=args.alertmanager_url, strict=args.strict,
                             cloudwatch=cloudwatch)
    for workspace, url in sorted(server.targets.items()):
        logger.info("front door on 127.0.0.1:%s: %s -> %s", args.port, workspace, url)
    run_until_signalled(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
