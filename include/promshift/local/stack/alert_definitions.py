"""The local AMP's alert manager definitions, and the local Alertmanager they configure.

moto 5.2.5 has no alert manager definitions (its server answers 404), so the control plane
(``promshift.local.stack.controlplane``) serves Create/Describe/Put/DeleteAlertManagerDefinition itself,
each request and answer checked against botocore's ``amp`` model there. This module keeps them:

- a definition is checked as AMP reads it: a YAML document with ``alertmanager_config`` (a route tree
  whose receivers exist, ``core.alert_routes``); a bad one is a ``ValidationException`` at once (AMP
  too refuses a malformed definition in the request);
- it is kept in ``<state-dir>/alertmanager-definitions.json`` (ACTIVE, with createdAt/modifiedAt), so a
  restarted control plane still answers it;
- with an Alertmanager (``--alertmanager-url`` and ``--alertmanager-config``), the workspace's definition
  becomes that Alertmanager's configuration: its route tree as written, each receiver kept by name
  but without its integrations (``sns_configs`` and the like: SNS cannot be reached from here), checked
  with ``amtool check-config`` and loaded by ``POST /-/reload``. Without a definition the Alertmanager
  routes everything to ``NO_DEFINITION_RECEIVER``: the alerts still arrive (the target Prometheus sends
  them), and anyone reading ``/api/v2/alerts`` sees they reached no receiver of the workspace's.

Where it differs from AMP: the definition is ACTIVE at once (AMP answers CREATING, then ACTIVE); one
Alertmanager serves the stack's one workspace; nothing is delivered to SNS (a receiver's integrations
are dropped locally, so an alert is "delivered" when Alertmanager holds it active for that receiver).
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml

from promshift.adapters.deploy import write_keeping
from promshift.core.alert_routes import AlertRoutesError, parse_definition
from promshift.local.stack.records import JsonRecords

logger = logging.getLogger(__name__)

STATE_FILE = "alertmanager-definitions.json"
AMTOOL = "/usr/bin/amtool"
NO_DEFINITION_RECEIVER = "promshift-local-no-alert-manager-definition"
# The local Alertmanager's configuration while the workspace has no definition.
NO_DEFINITION_CONFIG = {"route": {"receiver": NO_DEFINITION_RECEIVER, "group_wait": "1s", "group_interval": "5s"},
                        "receivers": [{"name": NO_DEFINITION_RECEIVER}]}


class DefinitionInvalid(ValueError):
    """A definition AMP would refuse (ValidationException); one line."""


def local_config(data: bytes | None) -> dict[str, Any]:
    """The local Alertmanager's configuration for a definition (None: the no-definition one).

    The route tree as written (group_wait shortened to 1 s when unset, so a demo sees its alerts at
    once); the receivers by name only: their integrations cannot be reached from here.
    """
    if data is None:
        return json.loads(json.dumps(NO_DEFINITION_CONFIG))
    document = yaml.safe_load(data)
    config = document["alertmanager_config"]
    if isinstance(config, str | bytes):
        config = yaml.safe_load(config)
    route = dict(config["route"])
    route.setdefault("group_wait", "1s")
    route.setdefault("group_interval", "5s")
    receivers = [{"name": str(r["name"])} for r in config.get("receivers") or [] if isinstance(r, dict)]
    out: dict[str, Any] = {"route": route, "receivers": receivers}
    for key in ("inhibit_rules", "time_intervals", "mute_time_intervals"):  # what the route tree may name
        if config.get(key):
            out[key] = config[key]
    return out


class AlertDefinitions(JsonRecords):
    """Each workspace's alert manager definition, and the local Alertmanager configured from it."""

    def __init__(self, state_dir: Path | None, *, alertmanager_url: str | None = None,
                 alertmanager_config: Path | None = None, amtool: str = AMTOOL) -> None:
        self.state_path = state_dir / STATE_FILE if state_dir is not None else None
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None
        self.alertmanager_config = alertmanager_config
        self.amtool = amtool
        self.lock = threading.Lock()
        self._memory: dict[str, dict[str, Any]] = {}
        self.http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30))

    @staticmethod
    def check(data: bytes) -> None:
        """Raise DefinitionInvalid unless ``data`` reads as an alert manager definition with a route tree."""
        try:
            parse_definition(data)
        except AlertRoutesError as exc:
            raise DefinitionInvalid(str(exc)) from None

    def get(self, workspace_id: str) -> dict[str, Any] | None:
        """``{"data": <base64 text>, "createdAt": ..., "modifiedAt": ...}`` or None."""
        with self.lock:
            found = self._read().get(workspace_id)
        return dict(found) if found else None

    def put(self, workspace_id: str, data: bytes, encoded: str) -> None:
        """Keep the (checked) definition and configure the Alertmanager from it."""
        now = datetime.now(UTC).timestamp()
        with self.lock:
            records = self._read()
            created = (records.get(workspace_id) or {}).get("createdAt", now)
            records[workspace_id] = {"data": encoded, "createdAt": created, "modifiedAt": now}
            self._write(records)
            self._configure(data)

    def delete(self, workspace_id: str) -> bool:
        with self.lock:
            records = self._read()
            existed = records.pop(workspace_id, None) is not None
            self._write(records)
            if existed:
                self._configure(None)
        return existed

    def _configure(self, data: bytes | None) -> None:
        """Write the Alertmanager's configuration (amtool-checked) and reload it; logs, never raises."""
        if self.alertmanager_config is None or self.alertmanager_url is None:
            return
        text = "# Written by the local AMP control plane from the workspace's alert manager definition.\n" + \
            yaml.safe_dump(local_config(data), sort_keys=False)
        with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix=".promshift-am-", delete=True) as tmp:
            tmp.write(text)
            tmp.flush()
            proc = subprocess.run([self.amtool, "check-config", tmp.name], capture_output=True, text=True,  # noqa: S603
                                  timeout=30, check=False)
        if proc.returncode != 0:
            logger.error("amtool refused the local Alertmanager configuration: %s",
                         " ".join((proc.stdout + proc.stderr).split())[:300])
            return
        write_keeping(self.alertmanager_config, text.encode())
        try:
            response = self.http.request("POST", f"{self.alertmanager_url}/-/reload")
        except urllib3.exceptions.HTTPError as exc:
            logger.error("reloading the local Alertmanager failed: %s", type(exc).__name__)
            return
        if response.status != 200:
            logger.error("the local Alertmanager refused its configuration (HTTP %s)", response.status)
