"""Move a metric group's recording and alerting rules from the source Prometheus to the target.

The pieces (``core.rules`` decides what moves; this module reads, writes, reloads and asks):

- ``SourceRules``: the source's config file and the rule files it names. ``select`` picks the
  group's rules; ``snapshot`` keeps the exact bytes of every file holding one; ``remove`` writes
  the byte-preserving edit (``promtool check rules`` first), reloads and checks
  ``/api/v1/rules`` that exactly those rules are gone; ``restore`` writes the snapshot's bytes
  back and reloads.
- a ``RulesTarget``: ``PrometheusRulesTarget`` (a self-hosted target: the group's own rule file
  in the target's rule directory, named from its ``rule_files`` by a byte-preserving edit,
  ``promtool`` checks, reload, ``/api/v1/rules``) or ``AmpRulesNamespace`` (an AMP rule-groups
  namespace ``promshift-<group>``: create or put, polled until ACTIVE; CREATION_FAILED and
  UPDATE_FAILED fail with AWS's statusReason; a deadline).
- ``RulesMove``: the order. ``snapshot`` -> ``plan`` (select from the snapshot, render, every
  ``promtool`` check, before anything is deployed) -> ``add_records`` -> ``handoff``; ``rollback``.
- ``rules_parity``: each moved rule's expression on both backends over the comparison window.

Alert overlap. An alert evaluated on both sides pages twice; on neither, not at all. The
handoff is:

1. ``add_records``: the target gets the group's *recording* rules only (verified loaded). Two
   servers recording the same series into their own stores is harmless, and the alerts that
   read them will find them on the target when they arrive.
2. ``handoff``: one step. The source drops every moved rule (recording and alerting; verified
   gone from its ``/api/v1/rules``), then at once the target loads the full document (verified
   loaded). If the target part fails, the source's snapshot is written back and reloaded before
   the step returns, so the alerts are back where they were.

So at every verified step each moved alert is evaluated on exactly one side: source before
``handoff``, target after (``rollback`` runs the same in reverse: the target's alerts go
first, then the source's bytes come back). Between the source's reload and the target's
there is a gap: one reload locally (well under a second, measured in the result as
``gap_s``), the namespace's UPDATING time on AMP. A gap was chosen over an overlap: an alert
with ``for:`` starts pending again on the target either way (Prometheus keeps no ``for``
state across servers), while an overlap sends every firing alert twice through two
Alertmanagers.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from botocore.exceptions import ClientError

from promshift.adapters.deploy import FileConfigDeployer, promtool_on, write_keeping, write_restoring
from promshift.adapters.files import read_user_file
from promshift.adapters.parity_check import each_side
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.aggregation import AGGREGATE_RULE_PREFIX, rewrite_group_read
from promshift.core.alert_routes import AlertRoutesError, alert_route_problem, parse_definition
from promshift.core.bake import parse_rfc3339
from promshift.core.catalog import MetricGroup
from promshift.core.deploy import DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.errors import ErrorKind
from promshift.core.inputs import CONFIG, RULES, InputBudget, InputRefused
from promshift.core.parity import normalize_labels, rewrite_comparison
from promshift.core.promql import PromQLError, lookback_s, metric_names, promql_string, rename_labels_in
from promshift.core.redact import redact_text
from promshift.core.render import sha256_bytes
from promshift.core.rules import (
    LoadedRule,
    Rule,
    RuleKind,
    RulesError,
    Selection,
    add_rule_file,
    inline_recording_rules,
    missing_rules,
    parse_rule_file,
    remove_rules,
    rule_file_patterns,
    rule_kind_of,
    rule_measurement,
    rule_parity_name,
    rules_document,
    rules_verdict,
    select_rules,
)
from promshift.core.verdicts import Measurement, Verdict

log = logging.getLogger(__name__)

NAMESPACE_PREFIX = "promshift-"
DEFAULT_TIMEOUT_S = 300.0
FAILED_STATUSES = frozenset({"CREATION_FAILED", "UPDATE_FAILED"})
# An alert manager definition in these states routes nothing (UPDATE_FAILED keeps the previous one working).
DEFINITION_UNUSABLE = frozenset({"CREATING", "CREATION_FAILED", "DELETING"})


def namespace_name(group_name: str) -> str:
    """The AMP rule-groups namespace (and the target rule file's stem) promshift owns for a group."""
    return f"{NAMESPACE_PREFIX}{group_name}"


def promtool_check_rules(data: bytes, *, name: str, promtool: str = "promtool") -> str:
    """``promtool check rules`` on ``data``; its summary line, or DeployError naming ``name`` and why."""
    proc, tmp = promtool_on(data, "rules", promtool=promtool, prefix=".promshift-rules-")
    out = (proc.stdout + proc.stderr).replace(tmp, name).strip()
    if proc.returncode != 0:
        raise DeployError(redact_text(f"promtool rejected the rules of {name}: {' '.join(out.split())[:600]}"))
    return " ".join(out.split())


def loaded_rules(client: PrometheusClient) -> list[LoadedRule]:
    """What ``/api/v1/rules`` reports loaded: every rule's file, group, kind and name, and its evaluation's health."""
    answer = client._request("GET", "/api/v1/rules")  # noqa: SLF001 - one more read on the shared client
    body = client._success_body(answer, "rules")  # noqa: SLF001
    groups = (body.get("data") or {}).get("groups")
    if not isinstance(groups, list):
        raise PrometheusError(client.base_url, "malformed answer for rules: no data.groups", kind=ErrorKind.MALFORMED,
                              http_status=200)
    return [LoadedRule(str(g.get("file") or ""), str(g.get("name") or ""), rule_kind_of(str(r.get("type"))),
                       str(r.get("name") or ""), health=str(r.get("health") or ""),
                       last_error=str(r.get("lastError") or ""), last_evaluation=str(r.get("lastEvaluation") or ""),
                       interval_s=_seconds(g.get("interval")))
            for g in groups for r in (g.get("rules") or [])]


def firing_alerts(client: PrometheusClient) -> list[tuple[str, float]]:
    """Every firing alert instance the backend evaluates (``/api/v1/rules?type=alert``): (alertname, when it
    started firing: its ``activeAt`` plus its rule's ``for``, epoch seconds)."""
    answer = client._request("GET", "/api/v1/rules", params={"type": "alert"})  # noqa: SLF001
    body = client._success_body(answer, "rules")  # noqa: SLF001
    groups = (body.get("data") or {}).get("groups")
    if not isinstance(groups, list):
        raise PrometheusError(client.base_url, "malformed answer for rules: no data.groups", kind=ErrorKind.MALFORMED,
                              http_status=200)
    out: list[tuple[str, float]] = []
    for group in groups:
        for rule in group.get("rules") or []:
            if rule.get("type") != "alerting":
                continue
            hold = _seconds(rule.get("duration")) or 0.0
            for alert in rule.get("alerts") or []:
                since = parse_rfc3339(str(alert.get("activeAt") or ""))
                if alert.get("state") == "firing" and since is not None:
                    out.append((str(rule.get("name") or ""), since + hold))
    return out


def _seconds(value: Any) -> float | None:
    """A rule group's ``interval`` (seconds, a number) as reported; None when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _same_file(config_dir: Path) -> Callable[[str, str], bool]:
    def same(ours: str, reported: str) -> bool:
        path = Path(reported)
        return os.path.realpath(path if path.is_absolute() else config_dir / path) == os.path.realpath(ours)

    return same


def _result(kind: str, action: str, status: str, now: datetime, reason: str, **details: Any) -> DeployResult:
    return DeployResult(kind, action, DeployState.WAITING).observed(status, now, state=DeployState.DONE,
                                                                    reason=reason, **details)


def _reload_restored(kind: str, client: PrometheusClient, now: datetime, what: str,
                     identical: Callable[[], bool]) -> DeployResult:
    """Reload after a restore; the result says whether ``what`` holds the snapshot's bytes again."""
    try:
        client.reload()
    except PrometheusError as exc:
        raise DeployError(f"restored {what} but the reload failed: {exc}") from exc
    same = identical()
    return DeployResult(kind, "restore", DeployState.WAITING).observed(
        "RESTORED" if same else "DIFFERS", now, state=DeployState.DONE if same else DeployState.FAILED,
        reason=f"{what} restored byte for byte" if same else f"{what} differ from the snapshot",
        restored_identical=same)


def _restore_or_say(restore: Callable[[], Any], what: str, reason: str) -> None:
    """Run ``restore`` after a failed ``what``; when it fails too, one error naming both."""
    try:
        restore()
    except Exception as exc:
        raise DeployError(f"{what} failed ({reason}) and restoring the snapshot failed too: "
                          f"{redact_text(str(exc))}") from None


def _revert_and_raise(exc: BaseException, what: str, restore: Callable[[], Any], snapshot: str) -> NoReturn:
    """Called in the ``except`` of a failed ``what``: ``restore`` (``snapshot`` names it in the log), then the
    failure again: a DeployError or a kill as it is, any other error as a DeployError saying it was reverted."""
    reason = redact_text(f"{type(exc).__name__}: {exc}")
    log.error("%s failed (%s); restoring %s", what, reason, snapshot)
    _restore_or_say(restore, what, reason)
    if isinstance(exc, DeployError) or not isinstance(exc, Exception):
        raise exc
    raise DeployError(f"{what} failed and was reverted: {reason}") from exc


# --------------------------------------------------------------------------- the source



def _read(path: Path, budget: InputBudget) -> bytes:
    """A config or rule file within its input budget (regular files only); a refusal is a DeployError."""
    try:
        return read_user_file(path, budget)
    except InputRefused as exc:
        raise DeployError(str(exc)) from None

class SourceRules:
    """The source Prometheus's rule files (found through its config's ``rule_files``) and the server."""

    kind = "rules-source"

    def __init__(self, config_path: str | os.PathLike[str], client: PrometheusClient, *,
                 promtool: str = "promtool") -> None:
        self.config_path = Path(config_path)
        self.client = client
        self.promtool = promtool

    @property
    def config_dir(self) -> Path:
        return self.config_path.parent

    def rule_files(self) -> list[Path]:
        """Every file the config's ``rule_files`` globs match (relative to the config's folder), sorted; never a
        group's aggregation rules (``promshift-aggregate-<group>.yml``, deployed with its dual-write: they stay)."""
        found: list[Path] = []
        for pattern in rule_file_patterns(_read(self.config_path, CONFIG)):
            full = pattern if os.path.isabs(pattern) else str(self.config_dir / pattern)
            found += [Path(p) for p in sorted(glob.glob(full))
                      if Path(p).is_file() and not Path(p).name.startswith(AGGREGATE_RULE_PREFIX)]
        return list(dict.fromkeys(found))

    def loaded(self) -> list[LoadedRule]:
        return loaded_rules(self.client)

    def snapshot(self, claims: Callable[[str], bool], candidates: Sequence[str] = ()) -> DeploySnapshot:
        """The exact bytes of every rule file that holds a rule of the group, in ``rule_files`` order.

        JSON keeps CR and every other character; ``selection_of`` reads the selection back from it,
        so every later step (on any worker, on a retry) moves exactly what was snapshotted.
        """
        files = {str(p): _read(p, RULES) for p in self.rule_files()}
        try:
            chosen = select_rules([parse_rule_file(p, d) for p, d in files.items()], claims,
                                  candidates=candidates).files
        except RulesError as exc:
            raise DeployError(str(exc)) from None
        content = json.dumps({"files": [[p, files[p].decode("utf-8")] for p in chosen]})
        return DeploySnapshot(self.kind, str(self.config_path), content,
                              {"existed": True, "sha256": {p: sha256_bytes(files[p]) for p in chosen}})

    @staticmethod
    def snapshot_files(snapshot: DeploySnapshot) -> dict[str, bytes]:
        return {p: text.encode("utf-8") for p, text in json.loads(snapshot.content or '{"files": []}')["files"]}

    def selection_of(self, snapshot: DeploySnapshot, claims: Callable[[str], bool],
                     candidates: Sequence[str] = ()) -> Selection:
        """The group's rules as they were in the snapshot's files."""
        try:
            return select_rules([parse_rule_file(p, d) for p, d in self.snapshot_files(snapshot).items()], claims,
                                candidates=candidates)
        except RulesError as exc:
            raise DeployError(str(exc)) from None

    def edits(self, snapshot: DeploySnapshot, selection: Selection) -> dict[str, bytes]:
        """Each snapshotted file without the selected rules, each checked by ``promtool check rules``."""
        out = {}
        for path, data in self.snapshot_files(snapshot).items():
            try:
                out[path] = remove_rules(data, path, selection)
            except RulesError as exc:
                raise DeployError(str(exc)) from None
            promtool_check_rules(out[path], name=path, promtool=self.promtool)
        return out

    def remove(self, snapshot: DeploySnapshot, selection: Selection, edits: Mapping[str, bytes],
               now: datetime) -> DeployResult:
        """Write ``edits``, reload, and verify the moved rules are gone and the others still loaded.

        Retry-safe: a file already holding its edit is left as it is; a file that is neither the
        snapshot nor the edit is refused before anything is written. Any failure after the
        first write restores the snapshot and reloads.
        """
        before = self.snapshot_files(snapshot)
        for path, data in before.items():
            current = Path(path).read_bytes()
            if current not in (data, edits[path]):
                raise DeployError(f"{path} changed since the snapshot was taken (sha256 {sha256_bytes(current)[:12]} "
                                  f"!= {sha256_bytes(data)[:12]}); refusing to edit it")
        try:
            for path, data in edits.items():
                if Path(path).read_bytes() != data:
                    write_keeping(Path(path), data)
            self.client.reload()
            loaded = self.loaded()
            still = [r.label for r in selection.rules if not missing_rules([r], loaded, same_file=self._same)]
            if still:
                raise DeployError(f"the source still evaluates {len(still)} moved rules after the reload: "
                                  f"{', '.join(still[:3])}")
            kept = [r for p, d in edits.items() for r in parse_rule_file(p, d).rules]
            lost = missing_rules(kept, loaded, same_file=self._same)
            if lost:
                raise DeployError(f"the source lost {len(lost)} rules that stay after the reload: "
                                  f"{', '.join(r.label for r in lost[:3])}")
        except BaseException as exc:
            _revert_and_raise(exc, "removing the rules from the source", lambda: self.restore(snapshot, now),
                              "the snapshot")
        return _result(self.kind, "deploy", "RULES_REMOVED", now, f"{len(selection.rules)} rules removed from "
                       f"{len(edits)} source rule files", files={p: sha256_bytes(d) for p, d in edits.items()},
                       rules=[r.label for r in selection.rules])

    @property
    def _same(self) -> Callable[[str, str], bool]:
        return _same_file(self.config_dir)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The snapshot's exact bytes back in every file, then a reload."""
        files = self.snapshot_files(snapshot)
        for path, data in files.items():
            if not Path(path).exists() or Path(path).read_bytes() != data:
                write_keeping(Path(path), data)
        return _reload_restored(self.kind, self.client, now, "the source's rule files",
                                lambda: all(Path(p).read_bytes() == d for p, d in files.items()))


# --------------------------------------------------------------------------- the targets


class PrometheusRulesTarget:
    """A self-hosted target Prometheus: the group's rule file in its rule directory, named by its config."""

    kind = "rules-prometheus"

    def __init__(self, config_path: str | os.PathLike[str], client: PrometheusClient, *, group_name: str,
                 rules_dir: str | os.PathLike[str] | None = None, promtool: str = "promtool") -> None:
        self.config = FileConfigDeployer(config_path, client, promtool=promtool)
        self.client = client
        self.promtool = promtool
        self.rules_dir = Path(rules_dir) if rules_dir else Path(config_path).parent / "rules"
        self.rule_path = self.rules_dir / f"{namespace_name(group_name)}.yml"

    @property
    def config_path(self) -> Path:
        return self.config.config_path

    @property
    def listed_path(self) -> str:
        """The rule file as the config names it: relative to the config's folder when it lies under it."""
        try:
            return str(self.rule_path.relative_to(self.config_path.parent))
        except ValueError:
            return str(self.rule_path)

    def loaded(self) -> list[LoadedRule]:
        return loaded_rules(self.client)

    def snapshot(self) -> DeploySnapshot:
        config = self.config.snapshot()
        rule = self.rule_path.read_bytes().decode("utf-8") if self.rule_path.exists() else None
        content = json.dumps({"config": config.data.decode("utf-8"), "rule_file": rule}, sort_keys=True)
        return DeploySnapshot(self.kind, str(self.rule_path), content,
                              {"existed": rule is not None, "mode": config.mode, "uid": config.uid, "gid": config.gid})

    def put(self, snapshot: DeploySnapshot, document: str, expect: Selection, now: datetime) -> DeployResult:
        """Write the group's rule file and (once) its ``rule_files`` entry; check, reload, verify every rule loaded.

        Any failure restores the snapshot (config and rule file) and reloads.
        """
        data = document.encode("utf-8")
        promtool_check_rules(data, name=str(self.rule_path), promtool=self.promtool)
        config = self.config_path.read_bytes()
        try:
            new_config = config if self._covered(config) else add_rule_file(config, self.listed_path)
        except RulesError as exc:
            raise DeployError(f"{self.config_path}: {exc}") from None
        try:
            self.rules_dir.mkdir(parents=True, exist_ok=True)
            write_keeping(self.rule_path, data)
            # promtool checks the config with the rule files it names: the group's file must exist first.
            self.config.check(new_config)
            if new_config != config:
                write_keeping(self.config.real_path, new_config)
            self.client.reload()
            missing = missing_rules(expect.rules, self.loaded(), same_file=lambda _o, r: self._is_ours(r))
            if missing:
                raise DeployError(f"the target does not report {len(missing)} rules loaded after the reload: "
                                  f"{', '.join(r.label for r in missing[:3])}")
        except BaseException as exc:
            _revert_and_raise(exc, "loading the rules on the target", lambda: self.restore(snapshot, now),
                              "its snapshot")
        return _result(self.kind, "deploy", "RULES_LOADED", now, f"{len(expect.rules)} rules loaded from "
                       f"{self.rule_path}", rule_file=str(self.rule_path), rule_file_sha256=sha256_bytes(data),
                       config_sha256=sha256_bytes(new_config), rules=[r.label for r in expect.rules])

    def _covered(self, config: bytes) -> bool:
        """Whether a ``rule_files`` glob of the config already matches the group's rule file."""
        base = self.config_path.parent
        for pattern in rule_file_patterns(config):
            full = pattern if os.path.isabs(pattern) else str(base / pattern)
            if fnmatch.fnmatchcase(str(self.rule_path), full):
                return True
        return False

    def _is_ours(self, reported: str) -> bool:
        return _same_file(self.config_path.parent)(str(self.rule_path), reported)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The config's snapshot bytes back, the rule file back (or removed when it did not exist); reload."""
        saved = json.loads(snapshot.content)
        config = str(saved["config"]).encode("utf-8")
        if self.config.real_path.read_bytes() != config:
            # The stricter of (snapshot, now) for the mode; owner and ACLs as they are now.
            mode = snapshot.meta.get("mode")
            write_restoring(self.config.real_path, config, snapshot_mode=None if mode is None else int(mode))
        if saved.get("rule_file") is None:
            self.rule_path.unlink(missing_ok=True)
        else:
            write_keeping(self.rule_path, str(saved["rule_file"]).encode("utf-8"))
        rule = saved.get("rule_file")
        return _reload_restored(self.kind, self.client, now, "the target's config and rule file",
                                lambda: self.config.real_path.read_bytes() == config and (
                                    not self.rule_path.exists() if rule is None
                                    else self.rule_path.read_bytes() == str(rule).encode("utf-8")))


class AmpRulesNamespace:
    """The group's AMP rule-groups namespace (``promshift-<group>``) through a boto3 ``amp`` client."""

    kind = "rules-amp"

    def __init__(self, client: Any, workspace_id: str, group_name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 poll_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.amp = client
        self.workspace_id = workspace_id
        self.name = namespace_name(group_name)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.sleep = sleep
        self.clock = clock

    def describe(self) -> dict[str, Any] | None:
        """The namespace's description, None when it does not exist."""
        try:
            return dict(self.amp.describe_rule_groups_namespace(workspaceId=self.workspace_id,
                                                                name=self.name)["ruleGroupsNamespace"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return None
            raise DeployError(self._aws(exc, "DescribeRuleGroupsNamespace")) from None

    def _aws(self, exc: ClientError, action: str) -> str:
        err = exc.response.get("Error") or {}
        message = str(err.get("Message") or "").splitlines()[0][:200] if err.get("Message") else ""
        return (f"{action} {self.name} on AMP workspace {self.workspace_id}: {err.get('Code') or 'error'}"
                + (f": {message}" if message else ""))

    def alert_delivery_problem(self, alerts: Sequence[Rule]) -> str | None:
        """Why the moved ``alerts`` would page nobody on this workspace, or None.

        ``DescribeAlertManagerDefinition``: none (or one that never became ACTIVE) routes nothing; a
        definition whose route tree sends an alert only to receivers without an integration pages
        nobody either (``core.alert_routes``). AWS errors other than not-found are one line too.
        """
        if not alerts:
            return None
        first = alerts[0].name
        try:
            found = self.amp.describe_alert_manager_definition(workspaceId=self.workspace_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return (f"AMP workspace {self.workspace_id} has no alert manager definition: moved alert {first} "
                        f"would page nobody (create one with CreateAlertManagerDefinition, or keep the group's "
                        f"alerts on the source)")
            return self._aws(exc, "DescribeAlertManagerDefinition")
        definition = found.get("alertManagerDefinition") or {}
        status = str((definition.get("status") or {}).get("statusCode") or "UNKNOWN")
        if status in DEFINITION_UNUSABLE:
            return (f"AMP workspace {self.workspace_id}'s alert manager definition is {status}: moved alert "
                    f"{first} would page nobody")
        data = definition.get("data") or b""
        try:
            routing = parse_definition(data)
        except AlertRoutesError as exc:
            return f"AMP workspace {self.workspace_id}'s alert manager definition: {exc}"
        problem = alert_route_problem(routing, [(r.name, r.body.get("labels")) for r in alerts])
        return f"AMP workspace {self.workspace_id}: {problem}" if problem else None

    def snapshot(self) -> DeploySnapshot:
        desc = self.describe()
        if desc is None:
            return DeploySnapshot(self.kind, None, "", {"existed": False, "namespace": self.name})
        data = desc.get("data") or b""
        return DeploySnapshot(self.kind, self.name, data.decode("utf-8") if isinstance(data, bytes) else str(data),
                              {"existed": True, "namespace": self.name})

    def put(self, snapshot: DeploySnapshot, document: str, expect: Selection, now: datetime) -> DeployResult:
        """Create the namespace (put when it exists) with ``document`` and wait until it is ACTIVE with it.

        A FAILED status or the deadline restores the snapshot (the namespace deleted, or its previous
        rules put back) before the error is raised, as the local target does.
        """
        data = document.encode("utf-8")
        result = DeployResult(self.kind, "deploy", DeployState.WAITING)
        try:
            if self.describe() is None:
                try:
                    answer = self.amp.create_rule_groups_namespace(workspaceId=self.workspace_id, name=self.name,
                                                                   data=data)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") != "ConflictException":
                        raise
                    answer = self.amp.put_rule_groups_namespace(workspaceId=self.workspace_id, name=self.name,
                                                                data=data)
            else:
                answer = self.amp.put_rule_groups_namespace(workspaceId=self.workspace_id, name=self.name, data=data)
        except ClientError as exc:
            raise DeployError(self._aws(exc, "PutRuleGroupsNamespace")) from None
        result = result.observed(str((answer.get("status") or {}).get("statusCode") or "UNKNOWN"), now,
                                 state=DeployState.WAITING, namespace=self.name, arn=answer.get("arn"))
        try:
            return self.wait(result, now, data=data, rules=[r.label for r in expect.rules])
        except DeployError as exc:
            log.error("rule-groups namespace %s did not take the rules (%s); restoring its snapshot", self.name, exc)
            _restore_or_say(lambda: self.restore(snapshot, now), f"putting rule-groups namespace {self.name}",
                            str(exc))
            raise

    def wait(self, result: DeployResult, now: datetime, *, data: bytes | None, rules: Sequence[str] = ()
             ) -> DeployResult:
        """Poll until ACTIVE (with ``data``, when given); FAILED statuses and the deadline raise DeployError."""
        deadline = self.clock() + self.timeout_s
        while True:
            desc = self.describe()
            if desc is None:
                raise DeployError(f"rule-groups namespace {self.name} disappeared while waiting for it")
            status = desc.get("status") or {}
            code = str(status.get("statusCode") or "UNKNOWN")
            result = result.observed(code, now, state=DeployState.WAITING, namespace=self.name)
            if code in FAILED_STATUSES:
                why = str(status.get("statusReason") or "no reason given")
                raise DeployError(f"rule-groups namespace {self.name} is {code}: {why}")
            if code == "ACTIVE":
                if data is not None and desc.get("data") not in (data, None):
                    raise DeployError(f"rule-groups namespace {self.name} is ACTIVE with other rules than sent")
                return result.observed(code, now, state=DeployState.DONE, reason=f"namespace {self.name} is ACTIVE",
                                       sha256=sha256_bytes(data) if data is not None else None, rules=list(rules))
            if self.clock() >= deadline:
                raise DeployError(f"rule-groups namespace {self.name} still {code} after {self.timeout_s:g}s")
            self.sleep(self.poll_s)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The previous rules back (put, then ACTIVE), or the namespace deleted when there was none."""
        if snapshot.existed:
            try:
                self.amp.put_rule_groups_namespace(workspaceId=self.workspace_id, name=self.name,
                                                   data=snapshot.content.encode("utf-8"))
            except ClientError as exc:
                raise DeployError(self._aws(exc, "PutRuleGroupsNamespace")) from None
            done = self.wait(DeployResult(self.kind, "restore", DeployState.WAITING), now,
                             data=snapshot.content.encode("utf-8"))
            return done.observed("RESTORED", now, state=DeployState.DONE, reason="previous rules restored",
                                 restored_identical=True)
        if self.describe() is not None:
            try:
                self.amp.delete_rule_groups_namespace(workspaceId=self.workspace_id, name=self.name)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                    raise DeployError(self._aws(exc, "DeleteRuleGroupsNamespace")) from None
        gone = self.describe() is None or str((self.describe() or {}).get("status", {}).get("statusCode")) == "DELETING"
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
            "DELETED" if gone else "NOT_DELETED", now, state=DeployState.DONE if gone else DeployState.FAILED,
            reason=f"namespace {self.name} deleted" if gone else f"namespace {self.name} still exists",
            restored_identical=gone)


# --------------------------------------------------------------------------- the move


@dataclass(frozen=True)
class RulesPlan:
    """What moves: a pure function of the source's snapshot (``RulesMove.plan``), so any task rebuilds it.

    ``document`` is the full rule file for the target, ``records_document`` its recording rules
    only, ``edits`` each source rule file without the moved rules; ``checks`` the ``promtool``
    summaries of the documents and edited files.
    """

    group: str
    selection: Selection
    document: str
    records_document: str
    edits: Mapping[str, bytes] = field(default_factory=dict)
    checks: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.selection.rules

    def to_dict(self) -> dict[str, Any]:
        """What the audit records: the rules, the documents, the edited files' sha256 and the checks."""
        return {"group": self.group, "selection": self.selection.to_dict(), "document": self.document,
                "records_document": self.records_document,
                "edits": {p: sha256_bytes(d) for p, d in self.edits.items()}, "checks": dict(self.checks)}


@dataclass(frozen=True)
class RulesSnapshot:
    """Both sides before the move: the source's rule files and the target's rules (each a DeploySnapshot)."""

    source: DeploySnapshot
    target: DeploySnapshot

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source.to_dict(), "target": self.target.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RulesSnapshot:
        return cls(DeploySnapshot.from_dict(data["source"]), DeploySnapshot.from_dict(data["target"]))


class RulesMove:
    """One group's rules, from the source's files to the target, in the order the module docstring gives.

    ``on_step(name)`` is called after each verified step (``records_on_target``, ``loaded_on_target``;
    ``source_restored`` after a failed handoff; ``rolled_back``): tests record both sides there.
    """

    def __init__(self, source: SourceRules, target: PrometheusRulesTarget | AmpRulesNamespace, *, group_name: str,
                 claims: Callable[[str], bool], candidates: Sequence[str] = (),
                 on_step: Callable[[str], None] | None = None, aggregates: Sequence[Any] = ()) -> None:
        self.source = source
        self.target = target
        self.group_name = group_name
        self.claims = claims
        self.candidates = tuple(candidates)
        self.on_step = on_step or (lambda _step: None)
        # The group's aggregations (``core.catalog.Aggregate``): a moved rule that reads one of their raw metrics
        # goes to the target rewritten to read the recorded series.
        self.aggregates = tuple(aggregates)

    @classmethod
    def for_group(cls, source: SourceRules, target: PrometheusRulesTarget | AmpRulesNamespace, group: MetricGroup,
                  *, on_step: Callable[[str], None] | None = None, lookback_s: float = 3600.0) -> RulesMove:
        """The move for a catalog group: its ``claims``; as candidate names for selectors without a metric
        name, its explicit ``metrics`` plus, with a ``metric_regex``, the names the source has for it now."""
        names = list(group.metrics)
        if group.metric_regex is not None:
            now = time.time()
            try:
                names += source.client.label_values("__name__", group.selector(), start=now - lookback_s, end=now)
            except PrometheusError as exc:
                log.warning("cannot list the group's metric names on the source (%s); selectors without a "
                            "metric name are matched against the catalog's names only", exc)
        return cls(source, target, group_name=group.name, claims=group.reads,
                   candidates=tuple(dict.fromkeys(names)), on_step=on_step, aggregates=group.aggregations)

    def snapshot(self) -> RulesSnapshot:
        """Both sides now: the source's rule files holding the group's rules, the target's current rules."""
        return RulesSnapshot(self.source.snapshot(self.claims, self.candidates), self.target.snapshot())

    def plan(self, snapshot: RulesSnapshot) -> RulesPlan:
        """Select from the snapshot; render the target's documents and the edited source files, and
        ``promtool check rules`` each. Nothing is written; any refusal raises DeployError here."""
        selection = self.source.selection_of(snapshot.source, self.claims, self.candidates)
        header = f"rules of metric group {self.group_name}, moved by promshift (do not edit: rollback restores)"
        moved = rewritten_for_target(selection, self.aggregates)
        try:
            document = rules_document(moved, header=header)
            records = rules_document(moved.only(RuleKind.RECORD), header=header)
        except RulesError as exc:
            raise DeployError(str(exc)) from None
        checks: dict[str, str] = {}
        edits: dict[str, bytes] = {}
        # Before anything moves, and again at every step that rebuilds the plan: the moved alerts page someone.
        delivery = getattr(self.target, "alert_delivery_problem", None)
        if selection.alerts and delivery is not None:
            problem = delivery(selection.alerts)
            if problem:
                raise DeployError(problem)
            checks["alert_delivery"] = f"{len(selection.alerts)} moved alerts routed to a receiver"
        if selection.rules:
            name = f"{namespace_name(self.group_name)}.yml"
            checks["document"] = promtool_check_rules(document.encode(), name=name, promtool=self.source.promtool)
            if selection.records:
                checks["records_document"] = promtool_check_rules(records.encode(), name=name,
                                                                  promtool=self.source.promtool)
            edits = self.source.edits(snapshot.source, selection)
            checks.update({path: "promtool check rules: SUCCESS" for path in edits})
        return RulesPlan(self.group_name, selection, document, records, edits, checks)

    def add_records(self, plan: RulesPlan, snapshot: RulesSnapshot, now: datetime) -> DeployResult | None:
        """Step 1: the recording rules on the target (none: nothing to do, None)."""
        records = plan.selection.only(RuleKind.RECORD)
        if not records.rules:
            return None
        done = self.target.put(snapshot.target, plan.records_document, records, now)
        self.on_step("records_on_target")
        return done

    def handoff(self, plan: RulesPlan, snapshot: RulesSnapshot, now: datetime) -> dict[str, Any]:
        """Step 2: the source drops every moved rule (verified), then the target loads them all (verified).

        When the target part fails the source's snapshot is restored (and reloaded) before the
        error is raised, so the alerts are evaluated where they were.
        """
        if plan.empty:
            return {"rules": 0, "gap_s": 0.0}
        started = time.monotonic()
        removed = self.source.remove(snapshot.source, plan.selection, plan.edits, now)
        try:
            loaded = self.target.put(snapshot.target, plan.document, plan.selection, now)
        except BaseException:
            log.error("the target did not take the rules; putting them back on the source")
            self.source.restore(snapshot.source, now)
            self.on_step("source_restored")
            raise
        gap = time.monotonic() - started
        self.on_step("loaded_on_target")
        return {"rules": len(plan.selection.rules), "gap_s": round(gap, 3), "source": removed.to_dict(),
                "target": loaded.to_dict()}

    def rollback(self, snapshot: RulesSnapshot, now: datetime) -> dict[str, Any]:
        """The target's rules go first (its snapshot back), then the source's files (their bytes back).

        When the target cannot be restored the error is raised before the source is touched: the
        alerts stay evaluated on the target alone (never on both); a retry does both steps again.
        """
        target = self.target.restore(snapshot.target, now)
        source = self.source.restore(snapshot.source, now)
        self.on_step("rolled_back")
        return {"target": target.to_dict(), "source": source.to_dict(),
                "restored_identical": bool(source.details.get("restored_identical"))
                and bool(target.details.get("restored_identical"))}


def _rewritten_rule_parity(source: PrometheusClient, target: PrometheusClient, rule: Rule, expr: str,
                           target_expr: str, aggregates: Sequence[Any], *, start: float, end: float, step: float,
                           abs_tol: float, rel_tol: float, norm: Mapping[str, Any]) -> Measurement:
    """A rule over an aggregated metric: as written on the source, rewritten on the target, on the recording's
    own evaluation instants (phased to its newest sample on the target)."""
    name = rule_parity_name(rule)
    recorded = next((r for a in aggregates if a.metric in metric_names(expr) for r in a.recorded), None)
    try:
        newest = target.scalar(f"max(timestamp({{__name__={promql_string(recorded)}}}))", at=end) if recorded \
            else None
        if newest is None:
            return Measurement(name, Verdict.INCONCLUSIVE, "the target holds no evaluation of the recorded series "
                               "this rule reads", (expr, target_expr))
        first = start + (newest - start) % step
        src, tgt = each_side(lambda: source.query_range(expr, start=first, end=end, step=step),
                             lambda: target.query_range(target_expr, start=first, end=end, step=step))
    except PrometheusError as exc:
        return Measurement(name, Verdict.ERROR, f"query failed: {exc}", (expr, target_expr))
    if src.warnings or tgt.warnings:
        return Measurement(name, Verdict.INCONCLUSIVE, "backend warnings (partial data): "
                           + "; ".join([*src.warnings, *tgt.warnings]), (expr, target_expr))
    source_series = {normalize_labels(x.labels, **norm): x.points for x in src.series}
    target_series = {normalize_labels(x.labels, **norm): x.points for x in tgt.series}
    behind = (float(len(source_series)), float(len(target_series)))
    if not source_series and not target_series:
        what = "the alert is quiet on both sides" if rule.kind is RuleKind.ALERT else "no data on either side"
        return Measurement(name, Verdict.INCONCLUSIVE, f"{what}: nothing to compare", (expr, target_expr))
    return rewrite_comparison(name, expr, target_expr, source_series, target_series, behind=behind, step=step,
                              abs_tol=abs_tol, rel_tol=rel_tol, phase=newest)


def rewritten_for_target(selection: Selection, aggregates: Sequence[Any]) -> Selection:
    """The selection as the target evaluates it: each rule that reads the raw series of an aggregated metric reads
    its recorded series instead (``core.aggregation.rewrite_group_read``; its body's ``expr`` replaced, its key
    kept). DeployError naming the rule when one cannot be: it needs the raw series, which stay on the source."""
    if not aggregates:
        return selection
    rules = []
    for rule in selection.rules:
        try:
            expr = rewrite_group_read(rule.expr, aggregates)
        except PromQLError as exc:
            raise DeployError(f"{rule.label} reads the raw series of a metric the group ships aggregated and cannot "
                              f"move to the target: {str(exc).splitlines()[0][:200]}") from None
        rules.append(rule if expr == rule.expr else dataclasses.replace(rule, expr=expr,
                                                                       body={**rule.body, "expr": expr}))
    return dataclasses.replace(selection, rules=tuple(rules))


# --------------------------------------------------------------------------- parity


def rules_parity(source: PrometheusClient, target: PrometheusClient, selection: Selection, *, start: float,
                 end: float, step: float, abs_tol: float, rel_tol: float, ignore_labels: Sequence[str] = (),
                 rename_labels: Sequence[tuple[str, str]] = (), noise_k: float = 0.0,
                 aggregates: Sequence[Any] = (), recording_step: float = 0.0) -> list[Measurement]:
    """Each moved rule's expression evaluated on both backends over [start, end], then the layer's line.

    ``noise_k``: the jitter allowance of two independent scrapers (``core.parity.INDEPENDENT_NOISE_K`` on the
    managed-scraper path, 0 for dual-write, where both sides hold the same samples).

    Run before the move (during dual-write): reads of moved recording rules are inlined
    (``core.rules.inline_recording_rules``), since the target records nothing yet. Each rule is
    evaluated from ``start`` + its look-back, so every sample it reads lies in the window.

    ``aggregates`` (the group's aggregations): a rule that reads one of their raw metrics is asked as written of
    the source and rewritten over the recorded series of the target (as it moves), on the recording's evaluation
    grid (``recording_step``, the group's scrape interval), compared by ``core.parity.rewrite_comparison``.
    """
    records = {r.name: r for r in selection.records}
    rename = dict(rename_labels)
    to_target = {new: old for old, new in rename_labels}
    out: list[Measurement] = []
    for rule in selection.rules:
        name = rule_parity_name(rule)
        try:
            expr = inline_recording_rules(rule.expr, records)
            back = lookback_s(expr) or 0.0
            rewritten = rewrite_group_read(expr, aggregates) if aggregates else expr
            target_expr = rename_labels_in(rewritten, to_target)
        except PromQLError as exc:
            out.append(Measurement(name, Verdict.INCONCLUSIVE, f"not comparable before the move: {exc}",
                                   (rule.expr,)))
            continue
        if rewritten != expr:
            out.append(_rewritten_rule_parity(source, target, rule, expr, target_expr, aggregates, start=start + back,
                                              end=end, step=recording_step or step, abs_tol=abs_tol,
                                              rel_tol=rel_tol, norm={"ignore": ignore_labels, "rename": rename}))
            continue
        first = step * -(-(start + back) // step)
        if first > end:
            out.append(Measurement(name, Verdict.INCONCLUSIVE, f"the window ({end - start:g}s) is shorter than "
                                   f"the rule's look-back ({back:g}s)", (expr,), {"lookback_s": back}))
            continue
        try:
            src, tgt = each_side(lambda e=expr, f=first: source.query_range(e, start=f, end=end, step=step),
                                 lambda e=target_expr, f=first: target.query_range(e, start=f, end=end, step=step))
        except PrometheusError as exc:
            out.append(Measurement(name, Verdict.ERROR, f"query failed: {exc}", (expr,)))
            continue
        if src.warnings or tgt.warnings:
            out.append(Measurement(name, Verdict.INCONCLUSIVE, "backend warnings (partial data): "
                                   + "; ".join([*src.warnings, *tgt.warnings]), (expr,)))
            continue
        norm = {"ignore": ignore_labels, "rename": rename}
        out.append(rule_measurement(
            rule, expr, {normalize_labels(s.labels, **norm): s.points for s in src.series},
            {normalize_labels(s.labels, **norm): s.points for s in tgt.series},
            abs_tol=abs_tol, rel_tol=rel_tol, window={"start": first, "end": end, "step": step}, noise_k=noise_k))
    return [rules_verdict(out), *out]
