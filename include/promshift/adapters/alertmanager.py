"""An Alertmanager's API v2, read only: which alerts it holds active, and for which receivers.

The bake watch asks it whether a moved alert that fires was *delivered*: held active (not silenced,
not inhibited) by the target's Alertmanager for at least one receiver. On AMP that is the
workspace's own Alertmanager API (``<prometheusEndpoint>alertmanager/api/v2/alerts``, SigV4-signed
like every other workspace read); for a self-hosted target, its Alertmanager's URL.

``GET /api/v2/alerts?filter=alertname="X"&active=true&silenced=false&inhibited=false``: the answer is
bounded (size, count) and read into ``DeliveredAlert`` values; any failure is one ``AlertmanagerError``
line naming the URL, never the credentials.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from promshift.core.errors import AlertmanagerError

MAX_ANSWER_BYTES = 8 * 1024 * 1024
MAX_ALERTS = 10_000


@dataclass(frozen=True)
class DeliveredAlert:
    """One alert an Alertmanager holds: its labels, state and the receivers it is routed to."""

    labels: Mapping[str, str]
    state: str
    receivers: tuple[str, ...]
    starts_at: str = ""

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


def alert_from_api(item: Mapping[str, Any]) -> DeliveredAlert:
    """One element of ``/api/v2/alerts`` (gettableAlert) as a DeliveredAlert."""
    labels = item.get("labels") if isinstance(item.get("labels"), Mapping) else {}
    return DeliveredAlert({str(k): str(v) for k, v in labels.items()},
                          str((item.get("status") or {}).get("state") or ""),
                          tuple(str(r.get("name")) for r in item.get("receivers") or [] if isinstance(r, Mapping)),
                          str(item.get("startsAt") or ""))


def active_alerts(base_url: str, alertname: str, *, session: requests.Session | None = None, auth: Any = None,
                  timeout_s: float = 15.0) -> list[DeliveredAlert]:
    """The alerts named ``alertname`` that ``base_url``'s Alertmanager holds active (not silenced or inhibited)."""
    url = base_url.rstrip("/") + "/api/v2/alerts"
    params = {"filter": f'alertname="{alertname}"', "active": "true", "silenced": "false", "inhibited": "false"}
    http = session or requests.Session()
    try:
        response = http.get(url, params=params, auth=auth, timeout=timeout_s, stream=True)
        body = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
    except requests.RequestException as exc:
        raise AlertmanagerError(f"Alertmanager {url}: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise AlertmanagerError(f"Alertmanager {url}: HTTP {response.status_code}")
    if len(body) > MAX_ANSWER_BYTES:
        raise AlertmanagerError(f"Alertmanager {url}: answer over {MAX_ANSWER_BYTES} bytes")
    try:
        items = json.loads(body)
    except ValueError:
        raise AlertmanagerError(f"Alertmanager {url}: the answer is not JSON") from None
    if not isinstance(items, list):
        raise AlertmanagerError(f"Alertmanager {url}: the answer is not a list of alerts")
    return [alert_from_api(i) for i in items[:MAX_ALERTS] if isinstance(i, Mapping)]
