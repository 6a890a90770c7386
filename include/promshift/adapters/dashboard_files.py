"""The read path switch on provisioned dashboard files: snapshot, byte-preserving edit, exact restore.

Grafana provisions dashboards from JSON files in a folder; a group's read path is switched by
editing only the ``datasource`` values of its panels in those files (``core.read_path``), and
rolled back by writing each file's snapshotted bytes again.

- ``snapshot(run_id)`` reads every matching file, plans it, and keeps the bytes of each file the
  switch would change in one blob (``adapters.blobs``; an object store every worker reads in
  production) with each file's sha256 before and after, mode and owner. It returns the record the
  audit log keeps (hashes, panels, the blob's reference and sha256; never a file's content).
- ``switch(snapshot)`` writes the planned edit of each file still holding its snapshotted bytes;
  a file already holding the switched bytes is left alone (a retry is a no-op); a file that
  changed since the snapshot stops the switch before anything is written.
- ``restore(snapshot)`` writes each file's snapshotted bytes back when it holds the switched bytes;
  a file already restored is left alone; a file someone changed (or deleted) after the switch is
  not overwritten (or recreated), reported, and the restore fails after restoring the others.

Writes are atomic (write-then-rename in the file's directory), keep the file's mode and owner, and
follow symlinks: the link's target is edited and the link stays a link. A hard-linked file is
replaced by a new inode (its other names keep the old bytes).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from promshift.adapters.blobs import Blobs
from promshift.adapters.deploy import write_atomically
from promshift.adapters.files import read_user_file
from promshift.adapters.snapshot_store import snapshot_key
from promshift.core.catalog import MetricGroup
from promshift.core.horizon import Horizon
from promshift.core.inputs import DASHBOARD, InputRefused
from promshift.core.read_path import (
    DashboardPlan,
    DatasourceRef,
    ReadPathError,
    plan_dashboard,
    unmatched_source,
)

KIND = "grafana-files"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DashboardFilesSwitch:
    """Switch a group's panels in provisioned dashboard files from the source to the AMP datasource."""

    kind = KIND

    def __init__(self, patterns: Sequence[str], group: MetricGroup, *, source: DatasourceRef,
                 target: DatasourceRef, blobs: Blobs, variables: Mapping[str, str] | None = None,
                 default_is_source: bool = True, root: str | os.PathLike[str] | None = None) -> None:
        self.patterns = tuple(patterns)
        self.group = group
        self.source = source
        self.target = target
        self.blobs = blobs
        self.variables = dict(variables or {})
        self.default_is_source = default_is_source
        self.root = Path(root) if root is not None else None

    def unmatched_patterns(self) -> list[str]:
        """One line per pattern that names no dashboard file (a typo, or a folder that moved)."""
        return [f"read_path pattern {pattern!r} matches no dashboard file" for pattern in self.patterns
                if not self._matches(pattern)]

    def _matches(self, pattern: str) -> list[Path]:
        base = Path(pattern)
        if not base.is_absolute() and self.root is not None:
            base = self.root / base
        matches = [str(p) for p in base.glob("*.json")] if base.is_dir() else glob.glob(str(base), recursive=True)
        return [Path(m) for m in matches if Path(m).is_file()]

    def files(self) -> list[Path]:
        """The dashboard files the patterns name (a folder means its ``*.json``), sorted, each once."""
        found: dict[str, Path] = {}
        for pattern in self.patterns:
            base = Path(pattern)
            if not base.is_absolute() and self.root is not None:
                base = self.root / base
            if base.is_dir():
                matches = [str(p) for p in base.glob("*.json")]
            else:
                matches = glob.glob(str(base), recursive=True)
            for m in matches:
                p = Path(m)
                if p.is_file():
                    found.setdefault(os.path.abspath(p), p)
        return [found[k] for k in sorted(found)]

    def _plan(self, path: Path, text: str, horizon: Horizon | None = None) -> DashboardPlan:
        return plan_dashboard(text, self.group, source=self.source, target=self.target, variables=self.variables,
                              default_is_source=self.default_is_source, name=str(path), horizon=horizon)

    def _on_the_way(self, f: Mapping[str, Any], data: bytes | None) -> bool:
        """Whether ``data`` is the snapshot's file, its switched result, or partway (a horizon held panels back):
        the rest of the plan applied to it gives exactly the switched result."""
        if data is None:
            return False
        if sha256_bytes(data) in (f["sha256_before"], f["sha256_after"]):
            return True
        try:
            text = data.decode("utf-8")
            return sha256_bytes(self._plan(Path(f["path"]), text).apply(text).encode("utf-8")) == f["sha256_after"]
        except (UnicodeDecodeError, ReadPathError, ValueError):
            return False

    @staticmethod
    def _read(path: Path) -> tuple[bytes, str]:
        try:
            data = read_user_file(Path(os.path.realpath(path)), DASHBOARD)
        except InputRefused as exc:
            raise ReadPathError(str(exc)) from None
        try:
            return data, data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReadPathError(f"{path}: not UTF-8 (byte {exc.start})") from None

    def _planned(self, paths: Sequence[Path], problems: list[str]) -> Iterator[tuple[Path, bytes, str, DashboardPlan]]:
        """Each file's path, bytes, text and plan; a file that cannot be read or planned goes to ``problems``."""
        for path in paths:
            try:
                data, text = self._read(path)
                p = self._plan(path, text)
            except (OSError, ReadPathError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            yield path, data, text, p

    def plan(self) -> dict[str, Any]:
        """What a switch would do now, per file (no write): the evidence of a dry run."""
        dashboards: list[dict[str, Any]] = []
        problems: list[str] = self.unmatched_patterns()
        plans: list[DashboardPlan] = []
        for path, data, _text, p in self._planned(self.files(), problems):
            plans.append(p)
            dashboards.append({"path": str(path), "sha256": sha256_bytes(data), **p.to_dict()})
        unmatched = unmatched_source(plans, self.source)
        if unmatched:
            problems.append(unmatched)
        return {"mode": "files", "group": self.group.name, "from": self.source.to_dict(), "to": self.target.to_dict(),
                "dashboards": dashboards, "problems": problems}

    # -- snapshot ----------------------------------------------------------------------------------

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """Keep the bytes of every file the switch would change; return the (content-free) record."""
        entries, record_files, not_switched = [], [], []
        problems = self.unmatched_patterns()
        paths = self.files()
        if not paths:
            raise ReadPathError(f"no dashboard file matches {', '.join(self.patterns)}")
        plans: list[DashboardPlan] = []
        for path, data, text, p in self._planned(paths, problems):
            plans.append(p)
            if p.not_switched() or p.library_panels:
                not_switched.append({"path": str(path), "panels": p.not_switched(),
                                     "library_panels": list(p.library_panels)})
            if not p.changes:
                continue
            after = p.apply(text).encode("utf-8")
            real = os.path.realpath(path)
            st = os.stat(real)
            entry = {"path": str(path), "real_path": real, "sha256_before": sha256_bytes(data),
                     "sha256_after": sha256_bytes(after), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
                     "gid": st.st_gid, "symlink": os.path.islink(path),
                     "panels": [{"path": e["path"], "title": e["title"], "edits": e["edits"]}
                                for e in p.to_dict()["switched"]]}
            entries.append({**entry, "content": text})
            record_files.append(entry)
        unmatched = unmatched_source(plans, self.source)
        if unmatched:  # switching nothing now would leave these panels blank once the group leaves the source
            raise ReadPathError(unmatched)
        blob = json.dumps({"kind": KIND, "group": self.group.name, "run_id": run_id, "from": self.source.to_dict(),
                           "to": self.target.to_dict(), "files": entries}, indent=1, ensure_ascii=False).encode()
        ref = self.blobs.put(snapshot_key(self.group.name, run_id, "dashboards.json"), blob)
        return {"kind": KIND, "group": self.group.name, "run_id": run_id, "ref": ref, "sha256": sha256_bytes(blob),
                "from": self.source.to_dict(), "to": self.target.to_dict(), "files": record_files,
                "not_switched": not_switched, "problems": problems}

    def _load(self, snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
        if snapshot.get("kind") != KIND:
            raise ReadPathError(f"not a dashboard-files snapshot (kind {snapshot.get('kind')!r})")
        try:
            data = self.blobs.get(str(snapshot["ref"]))
        except OSError as exc:
            raise ReadPathError(f"dashboard snapshot {snapshot['ref']} cannot be read: {exc.__class__.__name__}") \
                from None
        if sha256_bytes(data) != snapshot.get("sha256"):
            raise ReadPathError(f"dashboard snapshot {snapshot['ref']} does not match its recorded sha256")
        files = json.loads(data)["files"]
        for f in files:
            if sha256_bytes(f["content"].encode("utf-8")) != f["sha256_before"]:
                raise ReadPathError(f"dashboard snapshot of {f['path']} does not match its recorded sha256")
        return list(files)

    @staticmethod
    def _current(f: Mapping[str, Any]) -> bytes | None:
        try:
            return Path(f["real_path"]).read_bytes()
        except FileNotFoundError:
            return None

    @staticmethod
    def _write(f: Mapping[str, Any], data: bytes) -> None:
        real = Path(f["real_path"])
        st = os.stat(real)
        write_atomically(real, data, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)

    # -- switch and restore ------------------------------------------------------------------------

    def switch(self, snapshot: Mapping[str, Any], horizon: Horizon | None = None) -> dict[str, Any]:
        """Edit every snapshotted file; evidence per file (``switched`` / ``already`` / ``partly``) with both hashes.

        With ``horizon`` a panel that reads further back than the target holds stays on the source (listed
        under ``waiting`` with its ready time); switching again later moves it, and the file ends as the
        snapshot's switched result all the same."""
        files = self._load(snapshot)
        current = {f["path"]: self._current(f) for f in files}
        changed = [f["path"] for f in files if not self._on_the_way(f, current[f["path"]])]
        if changed:
            raise ReadPathError(f"{len(changed)} dashboard file(s) changed or vanished since the snapshot "
                                f"({', '.join(changed)}); nothing switched: take a new snapshot")
        out = []
        for f in files:
            data = current[f["path"]]
            assert data is not None
            entry = {"path": f["path"], "sha256_before": f["sha256_before"], "sha256_after": f["sha256_after"],
                     "panels": f["panels"]}
            if sha256_bytes(data) == f["sha256_after"]:
                out.append({**entry, "action": "already"})
                continue
            text = data.decode("utf-8")
            plan = self._plan(Path(f["path"]), text, horizon)
            new = plan.apply(text).encode("utf-8")
            waiting = [{"path": x["path"], "title": x["title"], "reason": x["reason"], "horizon": x["horizon"]}
                       for x in plan.to_dict()["waiting"]]
            if not self._on_the_way(f, new) or (not waiting and sha256_bytes(new) != f["sha256_after"]):
                raise ReadPathError(f"{f['path']}: the switch no longer gives the snapshotted result; nothing "
                                    "written to it")
            if new != data:
                self._write(f, new)
            out.append({**entry, "action": "partly" if waiting else "switched", "waiting": waiting,
                        "sha256_now": sha256_bytes(new)})
        return {"mode": "files", "group": self.group.name, "from": self.source.to_dict(), "to": self.target.to_dict(),
                "snapshot": snapshot.get("ref"), "files": out}

    def restore(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """Write each file's snapshotted bytes back; evidence per file; ReadPathError (with it) on refusals."""
        files = self._load(snapshot)
        out, refused = [], []
        for f in files:
            data = self._current(f)
            entry = {"path": f["path"], "sha256_before": f["sha256_before"], "sha256_after": f["sha256_after"]}
            now = sha256_bytes(data) if data is not None else None
            if now == f["sha256_before"]:
                out.append({**entry, "action": "unchanged"})
            elif self._on_the_way(f, data):  # switched, or partly (panels still waiting for the horizon)
                self._write(f, f["content"].encode("utf-8"))
                out.append({**entry, "action": "restored"})
            else:
                out.append({**entry, "action": "refused", "sha256_now": now,
                            "reason": "deleted after the switch; not recreated" if data is None
                            else "changed after the switch; not overwritten"})
                refused.append(f["path"])
        evidence = {"mode": "files", "group": self.group.name, "snapshot": snapshot.get("ref"), "files": out}
        if refused:
            raise ReadPathError(f"{len(refused)} dashboard file(s) changed after the switch and were not restored: "
                                f"{', '.join(refused)}", evidence=evidence)
        return evidence
