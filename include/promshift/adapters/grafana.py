"""Grafana's dashboard HTTP API (legacy ``/api``) and the read path switch through it.

Only what the switch needs, with the shapes Grafana documents:

- ``GET /api/search?type=dash-db&query=<q>``: a list of hits ``{id, uid, title, url, type, tags,
  folderUid, folderTitle, ...}`` (https://grafana.com/docs/grafana/v12.4/developer-resources/api-reference/http-api/folder_dashboard_search.md;
  query parameters ``query``, ``tag``, ``type`` = ``dash-db``|``dash-folder``, ``dashboardUIDs``,
  ``folderUIDs``, ``limit`` (default 1000, max 5000), ``page``).
- ``GET /api/dashboards/uid/:uid``: ``{dashboard, meta}``; ``meta`` has ``version``, ``folderUid``,
  ``provisioned``, ``url``, ``slug`` ... (https://grafana.com/docs/grafana/v8.5/http_api/dashboard/).
- ``POST /api/dashboards/db`` with ``{dashboard, folderUid, message, overwrite}``: creates or updates;
  ``dashboard.version`` must be the stored version unless ``overwrite`` is true, else
  ``412 {"status": "version-mismatch", "message": "The dashboard has been changed by someone else"}``
  (other 412 statuses: ``name-exists``, ``plugin-dashboard``); 200 answers
  ``{id, uid, url, status: "success", version, slug}``; 400 for a provisioned dashboard
  (same page; "leaving out folderUid moves the dashboard to the root level": we always send it).
- ``GET /api/dashboards/uid/:uid/versions``: the versions, newest first, each ``{id, dashboardId,
  uid, parentVersion, restoredFrom, version, created, createdBy, message}``; Grafana 12 wraps them
  in ``{continueToken, versions}``, earlier versions answer the bare list (both read here).
- ``POST /api/dashboards/uid/:uid/restore`` with ``{"version": N}``: saves version N's content as a
  new version (https://grafana.com/docs/grafana/v12.4/developer-resources/api-reference/http-api/dashboard_versions.md).
- Authentication: ``Authorization: Bearer <service account token>``; 401 when it is refused.

Grafana 12+ also serves the Kubernetes-style ``/apis/dashboard.grafana.app`` API; Grafana 13 marks
``/api`` as legacy but keeps it working. API mode is tested against ``promshift.local.stack.grafana_api``,
a contract server, not against Grafana (none can run here).

The switch (``GrafanaReadPathSwitch``) edits the dashboard model through the same plan as file
mode (``core.read_path``) and saves it with the version it read; a 412 ``version-mismatch`` (someone
saved in between) is answered by reading again and re-planning, a few times. Grafana keeps every
saved version, so a rollback asks Grafana to restore the version before ours (found in the
version history by the run's marker in the save message). The token is never put in an error,
a log line or a record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from promshift.core.catalog import MetricGroup
from promshift.core.horizon import Horizon
from promshift.core.read_path import (
    DashboardPlan,
    DatasourceRef,
    ReadPathError,
    apply_to_model,
    plan_dashboard,
    unmatched_source,
)
from promshift.core.redact import redact_text

KIND = "grafana-api"
SAVE_ATTEMPTS = 3


class GrafanaError(RuntimeError):
    """A Grafana API call failed; one line, never the token. ``status`` is the HTTP code (None: unreachable),
    ``reason`` Grafana's ``status`` field when it sent one (``version-mismatch``, ...)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(" ".join(redact_text(message).split()))
        self.status = status
        self.reason = reason


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class GrafanaClient:
    """The few dashboard calls the read path switch makes, with a service account token."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0,
                 session: requests.Session | None = None) -> None:
        if not token:
            raise GrafanaError("Grafana connection has no service account token (its password)")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self._session = session or requests.Session()

    def __repr__(self) -> str:
        return f"GrafanaClient({self.base_url!r})"

    def _call(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
              body: Any = None) -> Any:
        where = f"Grafana {method} {path}"
        try:
            resp = self._session.request(method, self.base_url + path, params=params,
                                         data=None if body is None else json.dumps(body),
                                         headers={"Authorization": f"Bearer {self._token}",
                                                  "Accept": "application/json",
                                                  "Content-Type": "application/json"},
                                         timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise GrafanaError(f"{where} at {self.base_url}: unreachable ({exc.__class__.__name__})") from None
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        message = str(answer.get("message") or "") if isinstance(answer, Mapping) else resp.text[:200]
        reason = str(answer.get("status")) if isinstance(answer, Mapping) and answer.get("status") else None
        if resp.status_code == 401:
            raise GrafanaError(f"Grafana at {self.base_url} refused the service account token (HTTP 401: "
                               f"{message or 'Unauthorized'})", status=401, reason=reason)
        if resp.status_code == 403:
            raise GrafanaError(f"{where}: the service account may not do this (HTTP 403: {message})", status=403,
                               reason=reason)
        if resp.status_code >= 400:
            raise GrafanaError(f"{where}: HTTP {resp.status_code}" + (f" {reason}" if reason else "")
                               + (f": {message}" if message else ""), status=resp.status_code, reason=reason)
        if answer is None:
            raise GrafanaError(f"{where}: HTTP {resp.status_code} but not JSON", status=resp.status_code)
        return answer

    def search(self, query: str = "", *, tags: Sequence[str] = (), limit: int = 1000,
               max_pages: int = 100) -> list[dict[str, Any]]:
        """Every ``dash-db`` hit, page by page (``limit`` per page) until a page is not full."""
        out: list[dict[str, Any]] = []
        for page in range(1, max_pages + 1):
            params: dict[str, Any] = {"type": "dash-db", "query": query, "limit": limit, "page": page}
            if tags:
                params["tag"] = list(tags)
            hits = self._call("GET", "/api/search", params=params)
            if not isinstance(hits, list):
                raise GrafanaError("Grafana GET /api/search: the answer is not a list")
            out.extend(h for h in hits if isinstance(h, dict) and h.get("type", "dash-db") == "dash-db")
            if len(hits) < limit:
                return out
        raise GrafanaError(f"Grafana GET /api/search: more than {max_pages} pages of {limit} dashboards")

    def get_dashboard(self, uid: str) -> dict[str, Any]:
        got = self._call("GET", f"/api/dashboards/uid/{uid}")
        if not isinstance(got, dict) or not isinstance(got.get("dashboard"), dict) \
                or not isinstance(got.get("meta"), dict):
            raise GrafanaError(f"Grafana GET /api/dashboards/uid/{uid}: no {{dashboard, meta}} in the answer")
        return got

    def save_dashboard(self, dashboard: Mapping[str, Any], *, folder_uid: str | None, message: str,
                       overwrite: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"dashboard": dict(dashboard), "message": message, "overwrite": overwrite}
        if folder_uid is not None:
            body["folderUid"] = folder_uid
        return dict(self._call("POST", "/api/dashboards/db", body=body))

    def versions(self, uid: str, *, limit: int = 1000) -> list[dict[str, Any]]:
        got = self._call("GET", f"/api/dashboards/uid/{uid}/versions", params={"limit": limit})
        items = got.get("versions") if isinstance(got, dict) else got
        if not isinstance(items, list):
            raise GrafanaError(f"Grafana GET /api/dashboards/uid/{uid}/versions: no version list in the answer")
        return [v for v in items if isinstance(v, dict)]

    def restore_version(self, uid: str, version: int) -> dict[str, Any]:
        return dict(self._call("POST", f"/api/dashboards/uid/{uid}/restore", body={"version": int(version)}))


class GrafanaReadPathSwitch:
    """Switch a group's panels in Grafana-stored dashboards from the source to the AMP datasource.

    The dashboards are ``uids``, or every ``dash-db`` hit of ``query`` (a title search). Records
    hold uids, titles, versions and sha256s of the dashboard JSON (canonical), never content or
    the token.
    """

    kind = KIND

    def __init__(self, client: GrafanaClient, group: MetricGroup, *, source: DatasourceRef, target: DatasourceRef,
                 uids: Sequence[str] = (), query: str | None = None, variables: Mapping[str, str] | None = None,
                 default_is_source: bool = True) -> None:
        if not uids and query is None:
            raise ReadPathError("name the dashboards: uids, or a search query")
        self.client = client
        self.group = group
        self.source = source
        self.target = target
        self.uids = tuple(uids)
        self.query = query
        self.variables = dict(variables or {})
        self.default_is_source = default_is_source

    def dashboard_uids(self) -> list[str]:
        if self.uids:
            return list(self.uids)
        return list(dict.fromkeys(str(h["uid"]) for h in self.client.search(self.query or "") if h.get("uid")))

    def _plan(self, got: Mapping[str, Any], horizon: Horizon | None = None) -> DashboardPlan:
        dashboard = got["dashboard"]
        return plan_dashboard(json.dumps(dashboard, indent=2, ensure_ascii=False), self.group, source=self.source,
                              target=self.target, variables=self.variables, default_is_source=self.default_is_source,
                              name=str(dashboard.get("uid") or ""), horizon=horizon)

    def _head(self) -> dict[str, Any]:
        return {"mode": "api", "group": self.group.name, "grafana": self.client.base_url,
                "from": self.source.to_dict(), "to": self.target.to_dict()}

    def plan(self) -> dict[str, Any]:
        """What a switch would do now, per dashboard (nothing saved)."""
        out, plans = [], []
        uids = self.dashboard_uids()
        problems = [] if uids else [self._none_found()]
        for uid in uids:
            got = self.client.get_dashboard(uid)
            plans.append(self._plan(got))
            out.append({"uid": uid, "version": got["meta"].get("version"),
                        "provisioned": bool(got["meta"].get("provisioned")), **plans[-1].to_dict()})
        unmatched = unmatched_source(plans, self.source)
        if unmatched:
            problems.append(unmatched)
        return {**self._head(), "dashboards": out, "problems": problems}

    def _none_found(self) -> str:
        return f"no Grafana dashboard matches the search {self.query!r}" if not self.uids else "no dashboard uids"

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """The version of each dashboard the switch would change (Grafana keeps the content)."""
        entries, not_switched, plans = [], [], []
        uids = self.dashboard_uids()
        if not uids:
            raise ReadPathError(self._none_found())
        for uid in uids:
            got = self.client.get_dashboard(uid)
            p = self._plan(got)
            plans.append(p)
            if p.not_switched() or p.library_panels:
                not_switched.append({"uid": uid, "title": p.title, "panels": p.not_switched(),
                                     "library_panels": list(p.library_panels)})
            if not p.changes:
                continue
            if got["meta"].get("provisioned"):
                raise ReadPathError(f"dashboard {uid} is provisioned from a file: Grafana refuses API saves; "
                                    "switch it in file mode")
            entries.append({"uid": uid, "title": p.title, "version": got["meta"].get("version"),
                            "folderUid": got["meta"].get("folderUid"), "sha256": canonical_sha256(got["dashboard"]),
                            "panels": [{"path": x["path"], "title": x["title"]} for x in p.to_dict()["switched"]]})
        unmatched = unmatched_source(plans, self.source)
        if unmatched:  # switching nothing now would leave these panels blank once the group leaves the source
            raise ReadPathError(unmatched)
        return {**self._head(), "kind": KIND, "run_id": run_id, "marker": f"promshift:{self.group.name}:{run_id}",
                "dashboards": entries, "not_switched": not_switched}

    def _message(self, snapshot: Mapping[str, Any]) -> str:
        return f"read path of {self.group.name} to datasource {self.target.uid} [{snapshot['marker']}]"

    def switch(self, snapshot: Mapping[str, Any], horizon: Horizon | None = None) -> dict[str, Any]:
        """Save each snapshotted dashboard with its group panels on the target; a stale version is re-read.

        With ``horizon``, panels reading further back than the target holds wait (``waiting``, with their
        ready time); a later switch saves them, each save marked with this run, so a restore goes back to the
        version before the first."""
        if snapshot.get("kind") != KIND:
            raise ReadPathError(f"not a Grafana API snapshot (kind {snapshot.get('kind')!r})")
        out = []
        for entry in snapshot["dashboards"]:
            uid = entry["uid"]
            stale: list[int] = []
            for _attempt in range(SAVE_ATTEMPTS):
                got = self.client.get_dashboard(uid)
                version = got["meta"].get("version")
                p = self._plan(got, horizon)
                record = {"uid": uid, "title": p.title, "snapshot_version": entry["version"],
                          "sha256_before": canonical_sha256(got["dashboard"]),
                          "panels": [{"path": x["path"], "title": x["title"], "edits": x["edits"]}
                                     for x in p.to_dict()["switched"]],
                          "waiting": [{"path": x["path"], "title": x["title"], "reason": x["reason"],
                                       "horizon": x["horizon"]} for x in p.to_dict()["waiting"]]}
                if not p.changes:
                    out.append({**record, "action": "already", "version": version, "stale_versions": stale})
                    break
                dashboard = apply_to_model(json.loads(json.dumps(got["dashboard"])), p.edits)
                dashboard["version"] = version
                try:
                    saved = self.client.save_dashboard(dashboard, folder_uid=got["meta"].get("folderUid"),
                                                       message=self._message(snapshot), overwrite=False)
                except GrafanaError as exc:
                    if exc.status == 412 and exc.reason == "version-mismatch":
                        stale.append(version)
                        continue
                    raise
                out.append({**record, "action": "switched", "version_before": version,
                            "version_after": saved.get("version"), "sha256_after": canonical_sha256(dashboard),
                            "stale_versions": stale})
                break
            else:
                raise GrafanaError(f"dashboard {uid}: saved by someone else {SAVE_ATTEMPTS} times while switching "
                                   f"(versions {stale}); not switched", status=412, reason="version-mismatch")
        return {**self._head(), "run_id": snapshot.get("run_id"), "dashboards": out}

    def restore(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """Restore, per dashboard, the version before this run's switch; ReadPathError (with evidence) on refusals."""
        if snapshot.get("kind") != KIND:
            raise ReadPathError(f"not a Grafana API snapshot (kind {snapshot.get('kind')!r})")
        marker = f"[{snapshot['marker']}]"
        out, refused = [], []
        for entry in snapshot["dashboards"]:
            uid = entry["uid"]
            try:
                versions = self.client.versions(uid)
                current = self.client.get_dashboard(uid)["meta"].get("version")
            except GrafanaError as exc:
                if exc.status != 404:
                    raise
                out.append({"uid": uid, "action": "refused", "reason": "deleted after the switch; not recreated"})
                refused.append(uid)
                continue
            ours = [v for v in versions if marker in str(v.get("message") or "") and not v.get("restoredFrom")]
            if not ours:
                out.append({"uid": uid, "action": "not switched", "version": current})
                continue
            mine = max(ours, key=lambda v: int(v["version"]))
            # A horizon may have switched in several saves: back to the version before the first of them.
            first = min(ours, key=lambda v: int(v["version"]))
            parent = int(first.get("parentVersion") or int(first["version"]) - 1)
            record = {"uid": uid, "switched_version": mine["version"], "restore_to": parent, "version_before": current}
            if current == mine["version"]:
                try:
                    done = self.client.restore_version(uid, parent)
                except GrafanaError as exc:
                    if exc.status != 404:
                        raise
                    out.append({**record, "action": "refused", "reason": f"version {parent} is gone from Grafana's "
                                                                           "history ([dashboards] versions_to_keep)"})
                    refused.append(uid)
                    continue
                out.append({**record, "action": "restored", "version_after": done.get("version")})
                continue
            later = [v for v in versions if int(v["version"]) > int(mine["version"])]
            newest = max(later, key=lambda v: int(v["version"])) if later else None
            if newest is not None and int(newest["version"]) == current and newest.get("restoredFrom") == parent:
                out.append({**record, "action": "already restored"})
                continue
            out.append({**record, "action": "refused", "reason": f"saved again after the switch (now version "
                                                                   f"{current}); not restored over it"})
            refused.append(uid)
        evidence = {**self._head(), "run_id": snapshot.get("run_id"), "dashboards": out}
        if refused:
            raise ReadPathError(f"{len(refused)} dashboard(s) not restored (saved again or deleted after the "
                                f"switch, or the version before it is gone): {', '.join(refused)}", evidence=evidence)
        return evidence
