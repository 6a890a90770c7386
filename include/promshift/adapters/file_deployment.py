"""The ``remote_write`` file path behind the ``core.deploy.ConfigDeployer`` seam, driven by ``steps.deploy.DeployStep``
like every other kind.

``snapshot`` is the config file's exact bytes (with its mode and owner); ``deploy`` adds the group's own
``remote_write`` entry and reloads (``FileConfigDeployer`` promtool-checks, verifies
``/api/v1/status/config`` and puts the bytes back itself on any failure); a retry that finds the file already
holding this deploy's bytes (the edit happened, its event did not) verifies it live instead of deploying
again. ``verify`` re-reads the loaded config; ``restore`` writes the bytes back, or, with ``keep_others`` (a
migration's rollback), removes only our entry when someone else changed the file since the snapshot (another
group's entry, a hand edit); ``withdraw`` removes our entry by name (a lost snapshot, a full rollback by hand).
The file path knows at once, so its results are DONE (or raise) immediately.

``FileBytesSnapshotStore`` keeps the snapshot as the file's own bytes (mode never wider than 0644), readable by
any worker; what the audit recorded of the file (path, mode, owner) goes with it when it is read back
(``with_record``).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from promshift.adapters.blobs import Blobs
from promshift.adapters.deploy import ConfigSnapshot, FileConfigDeployer, write_keeping
from promshift.adapters.prometheus import PrometheusError
from promshift.adapters.snapshot_store import snapshot_key
from promshift.core.deploy import DeployError, DeployKind, DeployResult, DeploySnapshot, DeployState
from promshift.core.inputs import InputRefused, decode_utf8
from promshift.core.redact import redact_text
from promshift.core.render import (
    RenderError,
    add_remote_write,
    remote_write_names,
    remove_remote_write,
    sha256_bytes,
)
from promshift.core.rules import RulesError, add_rule_file, remove_rule_file, rule_file_patterns


@dataclass(frozen=True)
class SourceRuleFile:
    """The group's own rule file on the source (its aggregations' recording rules, issue 40): where it goes,
    how the config's ``rule_files`` names it, its bytes, and the rule group and records ``/api/v1/rules`` must
    then report."""

    path: Path
    listed: str
    data: bytes
    group: str
    records: tuple[str, ...]

    @classmethod
    def beside(cls, config_path: str | os.PathLike[str], *, group: str, document: str,
               records: tuple[str, ...]) -> SourceRuleFile:
        """In ``rules/`` beside the config, named after the rule group, listed relative to the config's folder."""
        path = Path(config_path).parent / "rules" / f"{group}.yml"
        return cls(path, str(Path("rules") / f"{group}.yml"), document.encode("utf-8"), group, records)


class FileDeployment:
    """A ConfigDeployer that adds one group's ``remote_write`` entry to a Prometheus config file.

    ``record``: what the audit's ``dual_write_deployed`` says besides (keep regex, url, sigv4, dropped labels).
    ``keep_others``: a restore keeps what others changed since the snapshot and removes only our entry.
    ``rules``: the group's aggregations' recording rules, deployed with the entry in the same config edit (their
    file written first, ``promtool check rules``, then the ``rule_files`` entry beside the ``remote_write`` one,
    one ``promtool check config`` and one reload, then ``/api/v1/rules`` must report every record); undone with
    it (the config's bytes back, then the file removed), so the recorded series exist exactly while the keep
    filter ships them.
    """

    kind = DeployKind.FILE.value

    def __init__(self, deployer: FileConfigDeployer, entry: Mapping[str, Any], *,
                 record: Mapping[str, Any] | None = None, keep_others: bool = False,
                 rules: SourceRuleFile | None = None) -> None:
        self.deployer = deployer
        self.entry = dict(entry)
        self.record = dict(record or {})
        self.keep_others = keep_others
        self.rules = rules

    @property
    def name(self) -> str:
        return str(self.entry["name"])

    @staticmethod
    def _file_snapshot(snapshot: DeploySnapshot) -> ConfigSnapshot:
        # The protocol's content is text; the file deployer works on the file's exact bytes (UTF-8, as
        # the editor requires), and keeps the file's mode and owner from the snapshot's meta.
        meta = snapshot.meta
        return ConfigSnapshot.of(str(snapshot.ref), snapshot.content.encode("utf-8"), mode=meta.get("mode"),
                                 uid=meta.get("uid"), gid=meta.get("gid"))

    def _bytes(self) -> bytes:
        return self.deployer.real_path.read_bytes()

    def snapshot(self) -> DeploySnapshot:
        snap = self.deployer.snapshot()
        try:
            text = decode_utf8(snap.data, f"source config {snap.path}")
        except InputRefused as exc:
            raise DeployError(str(exc)) from None
        return DeploySnapshot(self.kind, snap.path, text, {
            "existed": True, "mode": snap.mode, "uid": snap.uid, "gid": snap.gid,
            # What the audit's snapshot_taken says of the file (``DeployStep.snapshot``).
            "record": {"config_path": snap.path, "bytes": len(snap.data),
                       "mode": f"{snap.mode:04o}" if snap.mode is not None else None, "uid": snap.uid,
                       "gid": snap.gid, **self._rules_record()}})

    def _rules_record(self) -> dict[str, Any]:
        """What the snapshot says of the group's rule file: where, and whether it was there (a rollback removes
        only a file the deploy created)."""
        if self.rules is None:
            return {}
        return {"rule_file": str(self.rules.path), "rule_file_existed": self.rules.path.exists()}

    def _with_rules(self, data: bytes) -> bytes:
        """The config with the group's rule file named in ``rule_files`` (unless a glob there already covers it)."""
        if self.rules is None:
            return data
        base = self.deployer.config_path.parent
        try:
            for pattern in rule_file_patterns(data):
                full = pattern if os.path.isabs(pattern) else str(base / pattern)
                if fnmatch.fnmatchcase(str(self.rules.path), full):
                    return data
            return add_rule_file(data, self.rules.listed)
        except RulesError as exc:
            raise DeployError(f"{self.deployer.config_path}: {exc}") from None

    def _without_rules(self, data: bytes) -> bytes:
        if self.rules is None:
            return data
        try:
            return remove_rule_file(data, self.rules.listed)
        except RulesError as exc:
            raise DeployError(f"{self.deployer.config_path}: {exc}") from None

    def _write_rules(self) -> None:
        """The rule file, ``promtool``-checked, written unless it already holds these bytes; refused when it holds
        someone else's."""
        from promshift.adapters.rules_deploy import promtool_check_rules

        assert self.rules is not None
        path = self.rules.path
        if path.exists():
            if path.read_bytes() == self.rules.data:
                return
            raise DeployError(f"{path} exists and is not this group's aggregation rules; refusing to overwrite it")
        promtool_check_rules(self.rules.data, name=str(path), promtool=self.deployer.promtool)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_keeping(path, self.rules.data, mode=0o644)

    def _remove_rules(self, existed: bool) -> None:
        """The rule file gone (after the config no longer names it), unless it was there before the deploy or no
        longer holds what the deploy wrote (someone's edit is left, inert: no ``rule_files`` entry names it)."""
        if self.rules is None or existed or not self.rules.path.exists():
            return
        if self.rules.path.read_bytes() == self.rules.data:
            self.rules.path.unlink(missing_ok=True)

    @staticmethod
    def _existed(snapshot: DeploySnapshot) -> bool:
        """Whether the group's rule file was there when the snapshot was taken (as the audit recorded it)."""
        meta = snapshot.meta
        return bool(meta.get("rule_file_existed", (meta.get("record") or {}).get("rule_file_existed")))

    def _rules_loaded(self) -> list[str]:
        """The records the source does not report loaded from the group's rule group (``/api/v1/rules``)."""
        from promshift.adapters.rules_deploy import loaded_rules

        if self.rules is None:
            return []
        loaded = {rule.name for rule in loaded_rules(self.deployer.client) if rule.group == self.rules.group}
        return [r for r in self.rules.records if r not in loaded]

    def confirm_live(self) -> tuple[str, ...]:
        """The source's loaded remote_write names, which must include ours; reloads once if it is missing (an
        attempt that wrote the file may have died before the reload)."""
        client = self.deployer.client
        live = remote_write_names(client.config_text())
        if self.name not in live:
            client.reload()
            live = remote_write_names(client.config_text())
        if self.name not in live:
            raise DeployError(f"remote_write {self.name} is in {self.deployer.config_path} but not in the "
                              f"loaded config of {redact_text(client.base_url)}")
        return tuple(live)

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        data = snapshot.content.encode("utf-8")
        try:
            new_data = self._with_rules(add_remote_write(data, self.entry))
        except RenderError as exc:
            raise DeployError(str(exc)) from exc
        record = dict(self.record)
        existed = self._existed(snapshot)
        if self._bytes() == new_data != data:
            # An earlier attempt of this run wrote the file and died before its event: verify, never redeploy.
            if self.rules is not None:
                self._write_rules()
            live = self.confirm_live()
            before, after = snapshot.sha256, sha256_bytes(new_data)
            record["resumed"] = "the config already held this entry from an earlier attempt; verified live"
        else:
            try:
                if self.rules is not None:  # promtool checks the config with the files it names: this one first
                    self._write_rules()
                done = self.deployer.deploy(new_data, snapshot=self._file_snapshot(snapshot),
                                            expect_remote_writes={self.name})
            except DeployError as exc:
                # Not deployed (the deployer put the snapshot back): the audit says so, with the file's hashes.
                self._remove_rules(existed)
                raise DeployError(redact_text(str(exc)), details={
                    "remote_write": self.name, "config_sha256": sha256_bytes(self._bytes()),
                    "snapshot_sha256": snapshot.sha256}) from exc
            live, before, after = done.live_remote_writes, done.before_sha256, done.after_sha256
        if self.rules is not None:
            missing = self._rules_loaded()
            if missing:
                self.deployer.restore(self._file_snapshot(snapshot))
                self._remove_rules(existed)
                raise DeployError(f"the source does not report the aggregation rules {', '.join(missing[:3])} loaded "
                                  f"from {self.rules.path} after the reload; the snapshot is back",
                                  details={"remote_write": self.name, "rule_file": str(self.rules.path)})
            record.update(rule_file=str(self.rules.path), rule_file_sha256=sha256_bytes(self.rules.data),
                          recording_rules=list(self.rules.records))
        evidence = {"remote_write": self.name, **record, "config_before_sha256": before,
                    "config_after_sha256": after, "live_remote_writes": list(live)}
        return DeployResult(self.kind, "deploy", DeployState.WAITING).observed(
            "LIVE", now, state=DeployState.DONE, reason=f"remote_write {self.name} is live",
            remote_write=self.name, config_before_sha256=before, config_after_sha256=after,
            live_remote_writes=list(live), record=evidence)

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        try:
            live = remote_write_names(self.deployer.client.config_text())
        except PrometheusError as exc:
            raise DeployError(f"cannot read the loaded config: {exc}") from exc
        if self.name in live:
            return result.observed("LIVE", now, state=DeployState.DONE, reason=f"remote_write {self.name} "
                                   "is live", live_remote_writes=live)
        return result.observed("NOT_LIVE", now, state=DeployState.FAILED,
                               reason=f"remote_write {self.name} is not in the loaded config",
                               live_remote_writes=live)

    def _changes_since(self, data: bytes) -> list[str] | None:
        """None when the file is the snapshot, with or without our entry (restoring the snapshot undoes only
        us); else the remote_write names added since the snapshot other than ours (possibly none: a hand edit)."""
        current = self._bytes()
        if current == data or self._without_rules(remove_remote_write(current, self.name)) == data:
            return None
        before = set(remote_write_names(data))
        return [n for n in remote_write_names(current) if n != self.name and n not in before]

    def _remove_own_entry(self) -> bytes:
        """Remove our entry by name (deployed and verified; reloaded when the file was already without it);
        the file's bytes after."""
        current = self.deployer.snapshot()
        new_data = self._without_rules(remove_remote_write(current.data, self.name))
        if new_data != current.data:
            self.deployer.deploy(new_data, snapshot=current, expect_remote_writes=set(), expect_absent={self.name})
        else:
            self.deployer.client.reload()  # the file may be right and the server not: load it
        return self._bytes()

    def _still_live(self, record: dict[str, Any]) -> bool | None:
        try:
            return self.name in remote_write_names(self.deployer.client.config_text())
        except (PrometheusError, RenderError, KeyError, TypeError, ValueError) as exc:
            record["live_config_error"] = f"{type(exc).__name__}: {exc}"
            return None

    def _restored(self, record: dict[str, Any], identical: bool, now: datetime) -> DeployResult:
        still_live = self._still_live(record)
        record.update(restored_identical=identical and still_live is False, remote_write_still_live=still_live)
        if "kept_changes_since_snapshot" in record:
            # Not the snapshot's bytes, by design (another writer's change is kept); safe when our entry is gone
            # from both the file and the loaded config.
            record["own_entry_removed"] = still_live is False and self.name not in remote_write_names(self._bytes())
        return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
            "RESTORED" if record["restored_identical"] else "DIFFERS", now, state=DeployState.DONE,
            reason=f"{record['method']}: restored_identical={record['restored_identical']}",
            restored_identical=record["restored_identical"], record=record)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The snapshot's bytes back, reloaded and verified; with ``keep_others``, only our entry removed when the
        file changed since the snapshot beyond it. DONE either way: ``restored_identical`` says how it ended."""
        record: dict[str, Any] = {"method": "snapshot", "config_sha256": snapshot.sha256}
        data = snapshot.content.encode("utf-8")
        existed = self._existed(snapshot)
        if self.keep_others and (kept := self._changes_since(data)) is not None:
            record.update(method="removed_entry", kept_changes_since_snapshot=kept)
            self._remove_own_entry()
            self._remove_rules(existed)
            return self._restored(record, False, now)
        identical = self.deployer.restore(self._file_snapshot(snapshot))
        self._remove_rules(existed)  # the config no longer names it (reloaded): its rules are unloaded
        if self.rules is not None:
            record["rule_file_removed"] = not self.rules.path.exists()
        if not self.keep_others:  # the seam's plain restore: the bytes back, or FAILED
            return DeployResult(self.kind, "restore", DeployState.WAITING).observed(
                "RESTORED" if identical else "DIFFERS", now,
                state=DeployState.DONE if identical else DeployState.FAILED, restored_identical=identical,
                reason="config restored byte for byte" if identical else "restored file differs from the snapshot")
        return self._restored(record, identical, now)

    def withdraw(self, now: datetime, *, expect_sha256: str | None = None) -> DeployResult:
        """Remove our entry by name, whatever else the file holds (a lost snapshot; a full rollback by hand):
        the exact inverse of the deploy, so the file is the snapshot when it hashes to ``expect_sha256``."""
        before = sha256_bytes(self._bytes())
        after = sha256_bytes(self._remove_own_entry())
        self._remove_rules(False)  # a lost snapshot: the file is ours by name and content
        record: dict[str, Any] = {"method": "removed_entry", "config_sha256": expect_sha256,
                                  "config_before_sha256": before, "config_after_sha256": after}
        return self._restored(record, expect_sha256 is not None and after == expect_sha256, now)

    def rolled_back_found(self, snapshot_sha256: str) -> dict[str, Any] | None:
        """What a repeated rollback finds when our entry is gone from both the file and the loaded config; None
        when it is not (roll back again)."""
        try:
            data = self._bytes()
            if self.name in remote_write_names(data) or self.name in remote_write_names(
                    self.deployer.client.config_text()):
                return None
            if self.rules is not None and self.rules.listed in rule_file_patterns(data):
                return None
        except (OSError, PrometheusError, RenderError, KeyError, TypeError, ValueError):
            return None
        return {"config_sha256": sha256_bytes(data), "identical_to_snapshot": sha256_bytes(data) == snapshot_sha256,
                "remote_write_live": False}


class FileBytesSnapshotStore:
    """A ``core.deploy.SnapshotStore`` for the file path: the config's own bytes under ``<group>/<run>.yml`` (mode
    the source's or stricter, never wider than 0644, never executable: it holds the config's credentials); its
    path, mode and owner are in the audit's ``snapshot_taken`` (``with_record``)."""

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs

    def put(self, group: str, run_id: str, snapshot: DeploySnapshot) -> str:
        mode = snapshot.meta.get("mode")
        return self.blobs.put(snapshot_key(group, run_id, "yml"), snapshot.content.encode("utf-8"),
                              mode=(mode if mode is not None else 0o600) & 0o644)

    def get(self, ref: str) -> DeploySnapshot:
        try:
            data = self.blobs.get(ref)
        except OSError as exc:
            raise DeployError(f"snapshot {ref} cannot be read: {exc.strerror or exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise DeployError(f"snapshot {ref} is not UTF-8 text") from None
        return DeploySnapshot(DeployKind.FILE.value, None, text, {"existed": True})

    @staticmethod
    def with_record(snapshot: DeploySnapshot, info: Mapping[str, Any]) -> DeploySnapshot:
        """The stored bytes with what the audit recorded of the file when they were taken: its path, mode and
        owner (a restore keeps the stricter mode)."""
        mode = info.get("mode")
        return DeploySnapshot(snapshot.kind, info.get("config_path") or info.get("ref"), snapshot.content, {
            **snapshot.meta, "mode": int(mode, 8) if isinstance(mode, str) and mode else None,
            "uid": info.get("uid"), "gid": info.get("gid"), "rule_file_existed": bool(info.get("rule_file_existed"))})
