"""The local source Prometheus scrapes promshift itself: the board's ``/metrics`` on the demo's Airflow API server.

The board answers only a logged-in caller (the same rules as its pages), so the source's job ``promshift`` sends
a bearer token of the demo's ``prometheus`` user (a viewer) from a 0600 file (``authorization: credentials_file``,
read by Prometheus on every scrape). Airflow's tokens expire (``[api_auth] jwt_expiration_time``, a day by
default): ``keep_scraped`` writes a new one when the file's has less than ``min_left_s`` left, and the demo calls
it when its Airflow starts and before each scenario. A stack left running longer than a token lives shows the
job down (``up{job="promshift"} == 0``) until the next demo or ``keep_scraped``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import requests

from promshift.local.airflow_lab import METRICS_USER
from promshift.local.stack.local import PROMSHIFT_JOB

if TYPE_CHECKING:
    from promshift.local.airflow_lab import LocalAirflow
    from promshift.local.stack.local import LocalStack

log = logging.getLogger(__name__)

MIN_TOKEN_LEFT_S = 600.0
# The series the demo's summary counts: how many groups stand in each stage (promshift.board.metrics).
GROUPS_SERIES = "promshift_groups"
MAX_TOKEN_CHARS = 16_384


def jwt_expires_at(token: str) -> float | None:
    """A JWT's ``exp`` claim (Unix seconds), read without checking its signature (the API server checks it);
    None when the token is not a JWT or has no numeric ``exp``."""
    parts = token.strip().split(".")
    if len(parts) != 3 or len(token) > MAX_TOKEN_CHARS:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def keep_scraped(stack: LocalStack, airflow: LocalAirflow, *, now: float,
                 min_left_s: float = MIN_TOKEN_LEFT_S) -> bool:
    """Point the source's job ``promshift`` at ``airflow``, with a token that has ``min_left_s`` left at
    ``now``: the file's own when it has, else a new one. True when a new token was written."""
    try:
        current = stack.promshift_token_path.read_text()[:MAX_TOKEN_CHARS]
    except OSError:
        current = ""
    expires = jwt_expires_at(current) if current else None
    fresh = expires is None or expires - now < min_left_s
    token = airflow.token(METRICS_USER, fresh=True) if fresh else current.strip()
    stack.scrape_promshift(f"127.0.0.1:{airflow.port}", token)
    if fresh:
        left = jwt_expires_at(token)
        log.info("the source scrapes promshift's /metrics on %s as %s (token in %s, 0600, %s)", airflow.base_url,
                 METRICS_USER, stack.promshift_token_path,
                 f"valid {left - now:.0f}s" if left is not None else "no expiry claim")
    return fresh


def _query(stack: LocalStack, promql: str) -> list[dict[str, Any]]:
    resp = requests.get(f"{stack.source_url}/api/v1/query", params={"query": promql}, timeout=10)
    resp.raise_for_status()
    result = resp.json()["data"]["result"]
    return result if isinstance(result, list) else []


def self_metrics_report(stack: LocalStack, *, timeout_s: float = 45.0, poll_s: float = 1.0) -> dict[str, Any]:
    """The report's ``self_metrics`` block, as the source sees promshift: whether its job ``promshift`` is up,
    the scrape's last error, and ``promshift_groups`` summed per stage. Waits up to ``timeout_s`` for a scrape
    that is up and holds the series (the first scrape after a token or a target change)."""
    deadline = time.monotonic() + timeout_s
    block: dict[str, Any] = {"job": PROMSHIFT_JOB, "up": None, "groups_series": 0, "groups_by_stage": {},
                             "last_error": ""}
    while True:
        try:
            up = _query(stack, f'up{{job="{PROMSHIFT_JOB}"}}')
            stages = _query(stack, f'sum by (stage) ({GROUPS_SERIES}{{job="{PROMSHIFT_JOB}"}})')
            count = _query(stack, f'count({GROUPS_SERIES}{{job="{PROMSHIFT_JOB}"}})')
            block.update(
                up=int(float(up[0]["value"][1])) if up else None,
                target=up[0]["metric"].get("instance", "") if up else "",
                groups_series=int(float(count[0]["value"][1])) if count else 0,
                groups_by_stage={s["metric"].get("stage", ""): int(float(s["value"][1])) for s in stages})
            if block["up"] != 1:
                targets = requests.get(f"{stack.source_url}/api/v1/targets", timeout=10).json()["data"]
                errors = [t.get("lastError", "") for t in targets.get("activeTargets", [])
                          if t.get("labels", {}).get("job") == PROMSHIFT_JOB]
                block["last_error"] = next((e for e in errors if e), "")
        except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
            block["last_error"] = f"querying the source failed: {exc.__class__.__name__}"
        if (block["up"] == 1 and block["groups_series"] > 0) or time.monotonic() > deadline:
            return block
        time.sleep(poll_s)


def self_metrics_line(block: dict[str, Any]) -> str:
    """One line for the demo's summary."""
    if block.get("up") != 1:
        state = "no target" if block.get("up") is None else "DOWN"
        return f"job {block.get('job')} {state}" + (f" ({block['last_error']})" if block.get("last_error") else "")
    stages = ", ".join(f"{stage} {n}" for stage, n in sorted(block["groups_by_stage"].items()) if n)
    return (f"the source scrapes {block.get('target')} (job {block['job']} up); {block['groups_series']} "
            f"{GROUPS_SERIES} series; groups per stage: {stages or 'none'}")
