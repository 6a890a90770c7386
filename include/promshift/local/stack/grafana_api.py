"""A local Grafana dashboard API *contract* server for the read path switch (not Grafana).

No Grafana can run on these machines, so ``adapters.grafana`` is tested against this small
``ThreadingHTTPServer`` on 127.0.0.1 (the pattern of ``local.stack.k8s_api``). It serves only the legacy
``/api`` calls the switch makes, with the shapes Grafana documents (cited in ``adapters.grafana``):

- ``GET /api/search?type=dash-db&query=...`` (case-insensitive title substring; ``dashboardUIDs``;
  ``limit`` (default 1000, at most 5000) and ``page`` from 1);
- ``GET /api/dashboards/uid/:uid`` -> ``{dashboard, meta{version, folderUid, provisioned, ...}}``;
- ``POST /api/dashboards/db`` with ``{dashboard, folderUid?, folderId?, message?, overwrite?}``;
- ``GET /api/dashboards/uid/:uid/versions`` -> ``{continueToken, versions}`` (Grafana 12's shape),
  newest first;
- ``POST /api/dashboards/uid/:uid/restore`` with ``{"version": N}``.

and checks what it receives, the way Grafana answers:

- ``Authorization: Bearer <token>`` must carry one of ``tokens``: else 401 ``{"message": "invalid API key"}``;
- bodies are JSON objects of the documented fields (an unknown top-level field is refused with 400,
  stricter than Grafana, so a typo in our own bodies fails a test); the dashboard needs a title, a
  uid of at most 40 characters, an integer ``version`` when updating; its panels (and rows' panels)
  and targets are objects and every ``datasource`` is null, a string or ``{type?, uid?}`` of strings;
- a stale ``dashboard.version`` without ``overwrite`` -> 412 ``version-mismatch``; another dashboard
  with the same title in the folder -> 412 ``name-exists``; an unknown uid -> 404 ``Dashboard not
  found``; a provisioned dashboard -> 400 ``Cannot save provisioned dashboard``; an unknown version
  to restore -> 404 ``Dashboard version not found``;
- every save keeps a version (``id, dashboardId, uid, parentVersion, restoredFrom, version, created,
  createdBy, message``) with its content; a restore saves that content as a new version with
  ``restoredFrom`` and the message "Restored from version N".

Tests seed dashboards with ``seed`` and play another user with ``edit`` (a save as someone else) or
``before_save`` (called just before a POST is served). ``requests`` records (method, path, code),
never a header.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from promshift.local.stack.contract_http import ContractHandler, ContractServer

log = logging.getLogger(__name__)

SAVE_FIELDS = frozenset({"dashboard", "folderUid", "folderId", "message", "overwrite"})
RESTORE_FIELDS = frozenset({"version"})
_UID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
_DASHBOARD = re.compile(r"^/api/dashboards/uid/([^/]+)$")
_VERSIONS = re.compile(r"^/api/dashboards/uid/([^/]+)/versions$")
_RESTORE = re.compile(r"^/api/dashboards/uid/([^/]+)/restore$")


class Refusal(Exception):
    """An answer that is not 200: the HTTP code and Grafana's body."""

    def __init__(self, code: int, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body: dict[str, Any] = {"message": message}
        if status:
            self.body["status"] = status


def _check_datasource(value: Any, where: str) -> None:
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, dict):
        raise Refusal(400, f"bad request data: {where}.datasource must be null, a string or an object")
    for key, item in value.items():
        if key not in ("type", "uid", "apiVersion") or not (item is None or isinstance(item, str)):
            raise Refusal(400, f"bad request data: {where}.datasource.{key}")


def _check_panels(panels: Any, where: str) -> None:
    if panels is None:
        return
    if not isinstance(panels, list):
        raise Refusal(400, f"bad request data: {where} must be a list")
    for i, panel in enumerate(panels):
        at = f"{where}[{i}]"
        if not isinstance(panel, dict):
            raise Refusal(400, f"bad request data: {at} must be an object")
        _check_datasource(panel.get("datasource"), at)
        targets = panel.get("targets")
        if targets is not None:
            if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
                raise Refusal(400, f"bad request data: {at}.targets must be a list of objects")
            for j, t in enumerate(targets):
                _check_datasource(t.get("datasource"), f"{at}.targets[{j}]")
        _check_panels(panel.get("panels"), f"{at}.panels")


def check_dashboard(dashboard: Any) -> None:
    """The parts of a dashboard model Grafana (and the switch) relies on."""
    if not isinstance(dashboard, dict):
        raise Refusal(400, "bad request data: dashboard must be an object")
    title = dashboard.get("title")
    if not isinstance(title, str) or not title.strip():
        raise Refusal(400, "Dashboard title cannot be empty", "empty-name")
    uid = dashboard.get("uid")
    if uid is not None and (not isinstance(uid, str) or not _UID.match(uid)):
        raise Refusal(400, "uid contains illegal characters or is longer than 40", "bad-uid")
    version = dashboard.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise Refusal(400, "bad request data: dashboard.version must be an integer")
    _check_panels(dashboard.get("panels"), "dashboard.panels")
    for i, row in enumerate(dashboard.get("rows") or []):
        if not isinstance(row, dict):
            raise Refusal(400, f"bad request data: dashboard.rows[{i}] must be an object")
        _check_panels(row.get("panels"), f"dashboard.rows[{i}].panels")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GrafanaApiServer(ContractServer):
    """The contract server: dashboards with their versions, the API's checks, on 127.0.0.1."""

    name = "grafana-api"
    log = log

    def __init__(self, tokens: Mapping[str, str], host: str = "127.0.0.1", port: int = 0) -> None:
        self.tokens = dict(tokens)  # token -> the service account's login (createdBy)
        self._lock = threading.Lock()
        self._dashboards: dict[str, dict[str, Any]] = {}
        self._next_id = 1
        self._next_version_id = 1
        self.before_save: Callable[[str], None] | None = None  # called with the uid before a POST is served
        super().__init__(host, port)

    # -- the store ---------------------------------------------------------------------------------

    def seed(self, dashboard: Mapping[str, Any], *, folder_uid: str = "", provisioned: bool = False,
             by: str = "admin") -> dict[str, Any]:
        """Store a dashboard as a first save (version 1)."""
        with self._lock:
            stored = self._save(dict(dashboard), folder_uid=folder_uid, message="Initial save", overwrite=True,
                                by=by)
            if provisioned:
                self._dashboards[stored["uid"]]["provisioned"] = True
            return stored

    def edit(self, uid: str, change: Callable[[dict[str, Any]], None], *, by: str = "someone-else") -> dict[str, Any]:
        """Another user saves: ``change`` edits the current model, stored as a new version."""
        with self._lock:
            entry = self._get(uid)
            model = copy.deepcopy(entry["dashboard"])
            change(model)
            return self._save(model, folder_uid=entry["folderUid"], message="edited", overwrite=True, by=by)

    def delete(self, uid: str) -> None:
        """Another user deletes the dashboard (and its versions, as Grafana does)."""
        with self._lock:
            self._get(uid)
            del self._dashboards[uid]

    def prune(self, uid: str, keep: int) -> None:
        """Keep only the newest ``keep`` versions, as Grafana's ``[dashboards] versions_to_keep`` does."""
        with self._lock:
            entry = self._get(uid)
            entry["versions"] = entry["versions"][-keep:]

    def dashboard(self, uid: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._get(uid)["dashboard"])

    def version_list(self, uid: str) -> list[dict[str, Any]]:
        with self._lock:
            return [self._version_meta(v) for v in reversed(self._get(uid)["versions"])]

    def _get(self, uid: str) -> dict[str, Any]:
        entry = self._dashboards.get(uid)
        if entry is None:
            raise Refusal(404, "Dashboard not found", "not-found")
        return entry

    @staticmethod
    def _version_meta(v: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v[k] for k in ("id", "dashboardId", "uid", "parentVersion", "restoredFrom", "version", "created",
                                  "createdBy", "message")}

    def _save(self, dashboard: dict[str, Any], *, folder_uid: str, message: str, overwrite: bool, by: str,
              restored_from: int = 0) -> dict[str, Any]:
        """Validate and store a new version; the lock is held by the caller."""
        check_dashboard(dashboard)
        uid = dashboard.get("uid")
        entry = self._dashboards.get(uid) if uid else None
        if entry is None and dashboard.get("id") not in (None, 0):
            raise Refusal(404, "Dashboard not found", "not-found")
        if entry is not None:
            if entry.get("provisioned"):
                raise Refusal(400, "Cannot save provisioned dashboard")
            if not overwrite and dashboard.get("version") != entry["version"]:
                raise Refusal(412, "The dashboard has been changed by someone else", "version-mismatch")
        for other_uid, other in self._dashboards.items():
            if other_uid != uid and other["folderUid"] == folder_uid and \
                    other["dashboard"]["title"].lower() == dashboard["title"].strip().lower():
                if not overwrite:
                    raise Refusal(412, "A dashboard with the same name in the folder already exists", "name-exists")
        if entry is None:
            uid = uid or f"gen{self._next_id:06d}"
            entry = {"id": self._next_id, "uid": uid, "version": 0, "versions": [], "folderUid": folder_uid,
                     "created": _now()}
            self._next_id += 1
            self._dashboards[uid] = entry
        parent = entry["version"]
        stored = copy.deepcopy(dashboard)
        stored.update({"id": entry["id"], "uid": uid, "version": parent + 1})
        entry.update({"dashboard": stored, "version": parent + 1, "folderUid": folder_uid, "updated": _now(),
                      "updatedBy": by})
        entry["versions"].append({"id": self._next_version_id, "dashboardId": entry["id"], "uid": uid,
                                  "parentVersion": parent, "restoredFrom": restored_from, "version": parent + 1,
                                  "created": _now(), "createdBy": by, "message": message,
                                  "data": copy.deepcopy(stored)})
        self._next_version_id += 1
        slug = re.sub(r"[^a-z0-9]+", "-", stored["title"].lower()).strip("-")
        return {"id": entry["id"], "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success",
                "version": parent + 1, "slug": slug}

    # -- the API -----------------------------------------------------------------------------------

    def _search(self, query: Mapping[str, list[str]]) -> list[dict[str, Any]]:
        kinds = query.get("type") or ["dash-db"]
        if "dash-db" not in kinds:
            return []
        text = (query.get("query") or [""])[0].lower()
        uids = set(query.get("dashboardUIDs") or [])
        with self._lock:
            hits = []
            for uid, entry in sorted(self._dashboards.items()):
                title = entry["dashboard"]["title"]
                if text in title.lower() and (not uids or uid in uids):
                    hits.append({"id": entry["id"], "uid": uid, "title": title, "url": f"/d/{uid}",
                                 "type": "dash-db", "tags": list(entry["dashboard"].get("tags") or []),
                                 "isStarred": False, "folderUid": entry["folderUid"]})
        limit = max(1, min(5000, int((query.get("limit") or ["1000"])[0] or 1000)))
        page = max(1, int((query.get("page") or ["1"])[0] or 1))
        return hits[(page - 1) * limit:page * limit]

    def _get_dashboard(self, uid: str) -> dict[str, Any]:
        with self._lock:
            entry = self._get(uid)
            return {"dashboard": copy.deepcopy(entry["dashboard"]),
                    "meta": {"type": "db", "canSave": True, "canEdit": True, "slug": uid, "url": f"/d/{uid}",
                             "version": entry["version"], "folderUid": entry["folderUid"], "created": entry["created"],
                             "updated": entry["updated"], "updatedBy": entry["updatedBy"],
                             "provisioned": bool(entry.get("provisioned"))}}

    def _post_save(self, body: Any, by: str) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refusal(400, "bad request data: the body must be a JSON object")
        unknown = sorted(set(body) - SAVE_FIELDS)
        if unknown:
            raise Refusal(400, f"bad request data: unknown field(s) {', '.join(unknown)}")
        if "dashboard" not in body:
            raise Refusal(400, "bad request data: dashboard is required")
        for key, kind in (("folderUid", str), ("message", str), ("overwrite", bool)):
            if key in body and not isinstance(body[key], kind):
                raise Refusal(400, f"bad request data: {key} must be a {kind.__name__}")
        check_dashboard(body["dashboard"])
        uid = body["dashboard"].get("uid")
        if uid and self.before_save is not None:
            self.before_save(uid)
        with self._lock:
            return self._save(copy.deepcopy(body["dashboard"]), folder_uid=body.get("folderUid", ""),
                              message=body.get("message", ""), overwrite=bool(body.get("overwrite")), by=by)

    def _versions(self, uid: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        limit = int((query.get("limit") or ["1000"])[0] or 1000)
        return {"continueToken": "", "versions": self.version_list(uid)[:limit]}

    def _restore(self, uid: str, body: Any, by: str) -> dict[str, Any]:
        if not isinstance(body, dict) or set(body) - RESTORE_FIELDS or isinstance(body.get("version"), bool) \
                or not isinstance(body.get("version"), int):
            raise Refusal(400, "bad request data: the body must be {\"version\": <integer>}")
        with self._lock:
            entry = self._get(uid)
            found = next((v for v in entry["versions"] if v["version"] == body["version"]), None)
            if found is None:
                raise Refusal(404, "Dashboard version not found", "not-found")
            model = copy.deepcopy(found["data"])
            model["version"] = entry["version"]
            return self._save(model, folder_uid=entry["folderUid"], message=f"Restored from version {found['version']}",
                              overwrite=False, by=by, restored_from=found["version"])

    def _handler(self) -> type[ContractHandler]:
        server = self

        class Handler(ContractHandler):
            contract = server
            methods: ClassVar[tuple[str, ...]] = ("GET", "POST")

            def route_path(self) -> str:
                return urlsplit(self.path).path

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                path, query = parts.path, parse_qs(parts.query)
                raw = self.read_body()
                try:
                    auth = self.headers.get("Authorization") or ""
                    scheme, _, token = auth.partition(" ")
                    if scheme != "Bearer" or token not in server.tokens:
                        raise Refusal(401, "invalid API key")
                    by = server.tokens[token]
                    body = None
                    if self.command == "POST":
                        try:
                            body = json.loads(raw or b"null")
                        except ValueError:
                            raise Refusal(400, "bad request data: not JSON") from None
                    if self.command == "GET" and path in ("/api/search", "/api/search/"):
                        self.answer(200, server._search(query))
                    elif self.command == "GET" and (m := _DASHBOARD.match(path)):
                        self.answer(200, server._get_dashboard(m.group(1)))
                    elif self.command == "GET" and (m := _VERSIONS.match(path)):
                        self.answer(200, server._versions(m.group(1), query))
                    elif self.command == "POST" and path == "/api/dashboards/db":
                        self.answer(200, server._post_save(body, by))
                    elif self.command == "POST" and (m := _RESTORE.match(path)):
                        self.answer(200, server._restore(m.group(1), body, by))
                    else:
                        raise Refusal(404, "Not found")
                except Refusal as refusal:
                    self.answer(refusal.code, refusal.body)

            do_GET = do_POST = _serve  # noqa: N815 - http.server's names

        return Handler
