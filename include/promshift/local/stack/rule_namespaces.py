"""The local AMP's rule evaluation: each rule-groups namespace as a rule file of the target Prometheus.

The control plane (``promshift.local.stack.controlplane``) calls :class:`RuleNamespaces` after moto took a
CreateRuleGroupsNamespace, PutRuleGroupsNamespace or DeleteRuleGroupsNamespace:

- create/put: the namespace's YAML (the request's base64 ``data``, decoded) is checked with
  ``promtool check rules``, written to ``<rules-dir>/amp-<workspaceId>-<name>.yml`` and the target
  reloaded (``POST <target-url>/-/reload``; the target's config names ``amp-rules/*.yml``). Rules
  promtool refuses, or a reload that fails, leave the namespace ``CREATION_FAILED`` / ``UPDATE_FAILED``
  with a ``statusReason``, and the file as it was before (the previous rules, or none; reloaded
  again), so the target keeps evaluating the last good rules, as AMP does;
- delete: the file removed, the target reloaded.

A workspace listed in ``<state-dir>/workspace-targets.json`` (``{"<ws-id>": {"target_url": ..., "rules_dir": ...}}``,
written by ``LocalStack.up`` for a second workspace, re-read per operation) has its rules written to its own
directory and evaluated by its own Prometheus; every other workspace's go to the default ones.

The status each namespace reached is kept in ``<state-dir>/rule-namespaces.json`` (so a restarted
control plane still answers it); DescribeRuleGroupsNamespace and ListRuleGroupsNamespaces answer it
instead of moto's (moto says ACTIVE to everything).

Where it differs from AMP: the check and the reload run before the answer (AMP answers CREATING or
UPDATING and evaluates later); the answer then says CREATING/UPDATING when it failed, and the
describe that follows says why. moto forgets its namespaces when it restarts; rule files left from a
previous moto stay under the rules directory until ``stack reset``.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import urllib3

from promshift.adapters.deploy import DeployError, promtool_on, write_keeping
from promshift.core.notify import one_line
from promshift.local.stack.records import JsonRecords

logger = logging.getLogger(__name__)

STATE_FILE = "rule-namespaces.json"
# A second workspace's own Prometheus and rules directory (``LocalStack.up``, ``--target amp --clusters 2``).
WORKSPACE_TARGETS_FILE = "workspace-targets.json"
FILE_PREFIX = "amp-"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_REASON_LIMIT = 600


def _one_line(text: str) -> str:
    return one_line(text, _REASON_LIMIT)


class RuleNamespaces(JsonRecords):
    """Rule-groups namespaces as rule files of the target Prometheus, and the status each reached."""

    def __init__(self, rules_dir: Path, target_url: str, *, state_dir: Path | None = None,
                 promtool: str = "promtool", http: urllib3.PoolManager | None = None) -> None:
        self.rules_dir = Path(rules_dir)
        self.target_url = target_url.rstrip("/")
        self.state_path = (state_dir / STATE_FILE) if state_dir is not None else None
        self.targets_path = (state_dir / WORKSPACE_TARGETS_FILE) if state_dir is not None else None
        self.promtool = promtool
        self.http = http or urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=60))
        self.lock = threading.Lock()
        self._memory: dict[str, dict[str, str]] = {}

    # -- where -----------------------------------------------------------------------------

    def where(self, workspace_id: str) -> tuple[Path, str]:
        """The rules directory and the Prometheus that evaluate this workspace's namespaces."""
        if self.targets_path is not None:
            try:
                found = json.loads(self.targets_path.read_text()).get(workspace_id)
            except (OSError, ValueError, AttributeError):
                found = None
            if isinstance(found, dict) and found.get("rules_dir") and found.get("target_url"):
                return Path(found["rules_dir"]), str(found["target_url"]).rstrip("/")
        return self.rules_dir, self.target_url

    def path(self, workspace_id: str, name: str) -> Path:
        """``<rules-dir>/amp-<workspaceId>-<name>.yml`` (characters a file name should not hold become ``_``)."""
        rules_dir = self.where(workspace_id)[0]
        return rules_dir / f"{FILE_PREFIX}{_SAFE.sub('_', workspace_id)}-{_SAFE.sub('_', name)}.yml"

    @staticmethod
    def _key(workspace_id: str, name: str) -> str:
        return f"{workspace_id}/{name}"

    # -- the status record ----------------------------------------------------------------------

    def status(self, workspace_id: str, name: str) -> dict[str, str] | None:
        """The status this namespace reached here (``{"statusCode": ..., "statusReason"?: ...}``), None if unknown."""
        with self.lock:
            found = self._read().get(self._key(workspace_id, name))
        return dict(found) if found else None

    def _record(self, workspace_id: str, name: str, status: dict[str, str] | None) -> None:
        records = self._read()
        if status is None:
            records.pop(self._key(workspace_id, name), None)
        else:
            records[self._key(workspace_id, name)] = status
        self._write(records)

    # -- the operations -------------------------------------------------------------------------

    def apply(self, workspace_id: str, name: str, data: bytes, *, creating: bool) -> dict[str, str]:
        """Check ``data``, write it as the namespace's rule file and reload; the status the namespace reached.

        On failure the previous file (or none) is back, the target reloaded onto it.
        """
        failed = "CREATION_FAILED" if creating else "UPDATE_FAILED"
        with self.lock:
            path = self.path(workspace_id, name)
            problem = self._check(data)
            if problem is None:
                previous = path.read_bytes() if path.exists() else None
                self._put_file(path, data)
                problem = self._reload(workspace_id)
                if problem is not None:
                    if previous is None:
                        path.unlink(missing_ok=True)
                    else:
                        self._put_file(path, previous)
                    again = self._reload(workspace_id)
                    if again is not None:
                        logger.error("reloading the target onto the previous rules of %s failed too: %s", name, again)
            status = {"statusCode": "ACTIVE"} if problem is None else {"statusCode": failed, "statusReason": problem}
            self._record(workspace_id, name, status)
        if problem is not None:
            logger.warning("rule-groups namespace %s/%s %s: %s", workspace_id, name, failed, problem)
        return status

    def delete(self, workspace_id: str, name: str) -> None:
        """Remove the namespace's rule file (if any) and its record; reload when a file went."""
        with self.lock:
            path = self.path(workspace_id, name)
            existed = path.exists()
            path.unlink(missing_ok=True)
            self._record(workspace_id, name, None)
            if existed and (problem := self._reload(workspace_id)) is not None:
                logger.error("reload after deleting namespace %s failed: %s", name, problem)

    # -- the target -----------------------------------------------------------------------------

    def _check(self, data: bytes) -> str | None:
        """``promtool check rules`` on ``data``: None when it passes, else why (one line)."""
        try:  # the temporary file is outside the rules directory: the target's glob never sees it
            proc, tmp = promtool_on(data, "rules", promtool=self.promtool, prefix=".promshift-namespace-")
        except (DeployError, OSError, subprocess.SubprocessError) as exc:
            return f"the rules could not be checked: {type(exc).__name__}"
        if proc.returncode == 0:
            return None
        out = (proc.stdout + proc.stderr).replace(tmp, "the namespace's data")
        return _one_line(f"invalid rules: {out}")

    @staticmethod
    def _put_file(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_keeping(path, data)  # atomic; its temporary name is outside the *.yml glob until it is complete

    def _reload(self, workspace_id: str) -> str | None:
        """POST ``/-/reload`` to the workspace's Prometheus: None when it took the config and rules, else why."""
        try:
            response = self.http.request("POST", f"{self.where(workspace_id)[1]}/-/reload")
        except urllib3.exceptions.HTTPError as exc:
            return f"the workspace could not load the rules: {type(exc).__name__}"
        if response.status == 200:
            return None
        body = response.data.decode("utf-8", "replace")
        return _one_line(f"the workspace could not load the rules (HTTP {response.status}): {body}")


def override_status(document: dict[str, Any], status: dict[str, str] | None) -> None:
    """Put the recorded ``status`` into a namespace description or summary (in place); None leaves it."""
    if status:
        document["status"] = dict(status)
