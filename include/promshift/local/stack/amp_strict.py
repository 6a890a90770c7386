"""The strict local AMP: the front door's write and query paths with AMP's limits, and its DiscardedSamples.

``StrictWorkspaces`` holds each workspace's ingestion state (``amp_ingest.WorkspaceIngest``) and reads its limits
from the control plane's answers (``amp_limits.workspace_limits``, re-read at most once a second). The front door
(``promshift.local.stack.frontdoor``) hands it every verified ``remote_write``, ``query`` and ``query_range``:

- remote write: judged by ``WorkspaceIngest.ingest``; the accepted series go on to the Prometheus behind the
  workspace, the answer is AMP's (200, 400 or 429 with AMP's message as a text body);
- queries: the range over ``query_range``'s limit, the samples a query loaded (Prometheus's own ``stats=all``
  count) over the per-query limit, and a query still running at the timeout are answered 422 with AMP's words
  (``{"status": "error", "errorType": "execution", "error": ...}``).

Discards are counted per workspace and reason: ``GET /-/discarded-samples`` (unsigned, local) answers
``{"<ws>": {"discarded": {reason: n}, "examples": {reason: series}, "active_series": n, "capacity": n}}``, and
with ``cloudwatch`` (the local AWS's URL) every ``PUBLISH_EVERY_S`` the new ones are put to CloudWatch as AMP
vends them: namespace ``AWS/Prometheus``, metric ``DiscardedSamples`` (Sum), dimensions ``Workspace`` and
``Reason``. (The active series are not published here: ``LocalStack.publish_usage`` seeds ``AWS/Usage``.)
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from promshift.core.ingest_limits import (
    WorkspaceLimits,
    query_range_problem,
    query_samples_problem,
    query_timeout_problem,
)
from promshift.local.stack.amp_ingest import WireError, WorkspaceIngest, encode_write_request, snappy_compress
from promshift.local.stack.amp_limits import workspace_limits

logger = logging.getLogger(__name__)

DISCARDS_PATH = "/-/discarded-samples"
PUBLISH_EVERY_S = 5.0
DISCARDED_NAMESPACE, DISCARDED_METRIC = "AWS/Prometheus", "DiscardedSamples"


def _seconds(text: str) -> float | None:
    """A Prometheus API time (unix seconds or RFC 3339) as unix seconds; None when unreadable."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class StrictWorkspaces:
    """The strict workspaces behind one front door."""

    def __init__(self, state_dir: Path | None, *, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.lock = threading.Lock()
        self.workspaces: dict[str, WorkspaceIngest] = {}
        self._limits: dict[str, tuple[float, WorkspaceLimits]] = {}

    def state(self, workspace: str) -> WorkspaceIngest:
        with self.lock:
            return self.workspaces.setdefault(workspace, WorkspaceIngest())

    def limits(self, workspace: str) -> WorkspaceLimits:
        now = time.monotonic()
        cached = self._limits.get(workspace)
        if cached is None or now - cached[0] > 1.0:
            cached = (now, workspace_limits(self.state_dir, workspace))
            self._limits[workspace] = cached
        return cached[1]

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        with self.lock:
            items = list(self.workspaces.items())
        return {ws: state.snapshot(self.limits(ws), now) for ws, state in items}

    # -- remote write ----------------------------------------------------------------------------------------
    def remote_write(self, handler: Any, workspace: str, target_url: str, body: bytes) -> None:
        state = self.state(workspace)
        try:
            outcome = state.ingest(body, self.limits(workspace), self.clock())
        except WireError as exc:
            handler.send_body(400, f"decode error: {exc}\n".encode(), content_type="text/plain")
            return
        if outcome.accepted or outcome.metadata:
            payload = snappy_compress(encode_write_request(outcome.accepted, outcome.metadata))
            forwarded = handler.forward(f"{target_url}/api/v1/write", "POST", payload, extra_headers={
                "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                "X-Prometheus-Remote-Write-Version": "0.1.0"})
            if forwarded.status >= 300 and outcome.status == 200:
                handler.send_body(forwarded.status, forwarded.data, content_type="text/plain")
                return
        if outcome.status != 200:
            logger.info("workspace %s refused samples (%s): %s", workspace, outcome.status, outcome.message[:300])
            handler.send_body(outcome.status, (outcome.message + "\n").encode(), content_type="text/plain")
            return
        handler.send_body(200, b"", content_type="text/plain")

    # -- queries ---------------------------------------------------------------------------------------------
    def query(self, handler: Any, workspace: str, target_url: str, rest: str, query: str, body: bytes) -> None:
        limits = self.limits(workspace)
        form = dict(parse_qsl(query, keep_blank_values=True))
        if handler.command == "POST" and body:
            form.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if rest == "query_range":
            start, end = _seconds(form.get("start", "")), _seconds(form.get("end", ""))
            if start is not None and end is not None and (problem := query_range_problem(start, end, limits)):
                self._refuse_query(handler, problem.message)
                return
        asked_stats = form.get("stats")
        form["stats"] = "all"
        form["timeout"] = f"{limits.query_timeout_s:g}s"
        began = time.monotonic()
        forwarded = handler.forward(f"{target_url}/api/v1/{rest}", "POST", urlencode(form).encode(), extra_headers={
            "Content-Type": "application/x-www-form-urlencoded", "Accept-Encoding": "identity"})
        elapsed = time.monotonic() - began
        try:
            document = json.loads(forwarded.data)
        except ValueError:
            document = None
        if (problem := query_timeout_problem(elapsed, limits)) or (
                isinstance(document, dict) and document.get("errorType") == "timeout"):
            self._refuse_query(handler, (problem.message if problem else "query timed out in query execution"))
            return
        if not isinstance(document, dict) or document.get("status") != "success":
            handler.send_body(forwarded.status, forwarded.data, content_type="application/json")
            return
        data = document.get("data") or {}
        stats = data.get("stats") or {}
        samples = float((stats.get("samples") or {}).get("totalQueryableSamples") or 0)
        if (problem := query_samples_problem(samples, limits)):
            self._refuse_query(handler, problem.message)
            return
        if not asked_stats:
            data.pop("stats", None)
        handler.send_json(200, document)

    @staticmethod
    def _refuse_query(handler: Any, message: str) -> None:
        handler.send_json(422, {"status": "error", "errorType": "execution", "error": message})

    # -- CloudWatch ------------------------------------------------------------------------------------------
    def publish_forever(self, cloudwatch: Any, stop: threading.Event) -> None:
        """Put the new discards to CloudWatch every PUBLISH_EVERY_S until ``stop``."""
        while not stop.wait(PUBLISH_EVERY_S):
            try:
                self.publish(cloudwatch)
            except Exception as exc:  # the next round tries again; the log names the type only
                logger.warning("DiscardedSamples not published: %s", type(exc).__name__)

    def publish(self, cloudwatch: Any) -> None:
        at = datetime.now(UTC)
        with self.lock:
            items = list(self.workspaces.items())
        for workspace, state in items:
            data = [{"MetricName": DISCARDED_METRIC, "Value": float(n), "Unit": "Count", "Timestamp": at,
                     "Dimensions": [{"Name": "Workspace", "Value": workspace}, {"Name": "Reason", "Value": reason}]}
                    for reason, n in state.take_unpublished().items() if n > 0 and math.isfinite(n)]
            for i in range(0, len(data), 20):
                cloudwatch.put_metric_data(Namespace=DISCARDED_NAMESPACE, MetricData=data[i:i + 20])
