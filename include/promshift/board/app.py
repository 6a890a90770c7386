"""The migration board: a FastAPI app that Airflow's API server mounts under ``/promshift`` (see plugins/).

Airflow mounts plugin apps without authentication, so every route here depends on Airflow's own
``GetUserDep`` (the UI's session cookie or a Bearer token; anonymous gets 401) and asks the auth
manager whether the caller may read the group's DAG (``requires_access_dag``; denied gets 403). The
overview lists only groups whose DAG the caller may read.
"""

from __future__ import annotations

import hmac
import logging
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from promshift.adapters.audit_store import AuditStore, ChainWatch
from promshift.adapters.settings import (
    ProductionSettingsMissing,
    default_catalog_path,
    default_profile,
    load_catalog,
    metrics_token,
    require_production_settings,
)
from promshift.board import URL_PREFIX, evidence, pages
from promshift.board.metrics import CONTENT_TYPE, FOLDED_KINDS, exposition
from promshift.core.approvers import TEAM_NAME_RE, ApproversError, TeamDirectory, UnknownTeam
from promshift.core.audit import ChainCheck
from promshift.core.catalog import Catalog, MetricGroup
from promshift.core.memory import cyclic_gc_paused
from promshift.core.stages import Stage, stage_from_moves

log = logging.getLogger(__name__)
_chart_lock = threading.Lock()  # pyplot keeps global state; one chart at a time
# How long the overview waits for the first whole chain verification of a process (then it shows "being verified"
# and the next request has the answer); a group's page waits for it.
OVERVIEW_CHAIN_WAIT_S = 1.0
CHAIN_PENDING = "the audit chain is being verified (the first check since the board started); reload in a moment"




class BoardSource:
    """Catalog and audit store, loaded lazily; the catalog is re-read when its file changes."""

    def __init__(self, *, catalog_path: Path | None = None, audit_url: str | None = None,
                 profile: str | None = None,
                 run_states: Callable[[str, Iterable[str]], dict[str, str]] | None = None,
                 teams: Callable[[], TeamDirectory | None] | None = None) -> None:
        self.catalog_path = catalog_path or default_catalog_path()
        self.run_states = run_states or airflow_run_states
        self.teams = teams or api_server_fab_teams
        self.profile = profile if profile is not None else default_profile()
        self.audit_url = audit_url
        self._audit: AuditStore | None = None
        self._chain: ChainWatch | None = None
        self._catalog: tuple[float, Catalog] | None = None
        self._lock = threading.Lock()

    @property
    def audit(self) -> AuditStore:
        with self._lock:
            if self._audit is None:
                self._audit = AuditStore(self.audit_url)
            return self._audit

    def chain(self, *, wait_s: float | None = None) -> ChainCheck | None:
        """The chain's check, kept current (``ChainWatch``); None while its first whole verification runs longer
        than ``wait_s``."""
        audit = self.audit
        with self._lock:
            if self._chain is None:
                self._chain = ChainWatch(audit)
            watch = self._chain
        return watch.check(wait_s=wait_s)

    def catalog(self) -> Catalog:
        mtime = self.catalog_path.stat().st_mtime
        with self._lock:
            if self._catalog is None or self._catalog[0] != mtime:
                self._catalog = (mtime, load_catalog(self.catalog_path, profile=self.profile))
            return self._catalog[1]

    def state(self, group: str) -> evidence.GroupState:
        try:
            return evidence.GroupState(self.audit.stage_of(group).value)
        except ValueError as exc:  # an illegal replay (IllegalTransition) or an unknown stage
            return evidence.GroupState(None, f"the audit history does not replay: {exc}")

    def states(self) -> dict[str, evidence.GroupState]:
        """Every group's ``state`` from one read of the stage moves (a group with none is planned)."""
        out = {}
        for group, moves in self.audit.stage_moves().items():
            try:
                out[group] = evidence.GroupState(stage_from_moves(moves).value)
            except ValueError as exc:
                out[group] = evidence.GroupState(None, f"the audit history does not replay: {exc}")
        return out


def airflow_root(request: Request) -> str:
    """The Airflow UI's path prefix: this app's mount point without ``/promshift``."""
    root = str(request.scope.get("root_path", ""))
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else root


def airflow_run_states(dag_id: str, run_ids: Iterable[str]) -> dict[str, str]:
    """Airflow's own state of each DAG run that the audit log names (missing: Airflow does not know it)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    ids = list(run_ids)
    if not ids:
        return {}
    with create_session() as session:
        rows = session.execute(select(DagRun.run_id, DagRun.state).where(DagRun.dag_id == dag_id,
                                                                          DagRun.run_id.in_(ids)))
        return {run_id: str(state) for run_id, state in rows}


def api_server_fab_teams() -> TeamDirectory | None:
    """FAB's roles and groups, read here on the API server from its own database (``FabTeams``) when FAB is the
    auth manager; else None."""
    # FabAuthManager or a subclass, by name: promshift does not depend on the FAB provider (a deployment chooses it)
    if not any(c.__name__ == "FabAuthManager" for c in type(get_auth_manager()).__mro__):
        return None
    from airflow import settings

    from promshift.adapters.fab_teams import FabTeams

    return FabTeams(settings.engine, source="FAB's users on the API server")


def readable_group(name: str, request: Request, user: GetUserDep) -> MetricGroup:
    """The catalog group ``name`` if the caller may read its DAG: 401 anonymous, 403 denied, 404 unknown."""
    board: BoardSource = request.app.state.board
    try:
        group = board.catalog().get(name)
    except KeyError:
        requires_access_dag("GET")(request, user)  # only a DAG reader learns that a name is unknown
        raise HTTPException(404, f"no metric group {name!r} in the catalog") from None
    requires_access_dag("GET", param_dag_id=group.dag_id)(request, user)
    return group


ReadableGroup = Annotated[MetricGroup, Depends(readable_group)]


def refusing_app(line: str) -> FastAPI:
    """A board that serves nothing: every path is 503 with ``line`` (why it refused to start)."""
    app = FastAPI(title="promshift migration board (refused)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.api_route("/{path:path}", methods=["GET", "HEAD", "POST"])
    def refused(path: str) -> Response:
        return Response(line + "\n", status_code=503, media_type="text/plain; charset=utf-8")

    return app


def create_app(source: BoardSource | None = None) -> FastAPI:
    """The board's FastAPI app; ``source`` defaults to the environment's catalog and audit store.

    Under ``PROMSHIFT_ENV=production`` a store missing from the environment refuses the board as it starts: one
    line in the API server's log, and every route answers 503 with that line; nothing is opened or created."""
    if source is None:
        try:
            require_production_settings("the migration board")
        except ProductionSettingsMissing as exc:
            log.error("%s", exc)
            return refusing_app(str(exc))
    board = source or BoardSource()
    app = FastAPI(title="promshift migration board", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.board = board

    def overview(request: Request, user: Any) -> dict[str, Any]:
        """One row per readable group from O(groups) rows of the audit log (``AuditStore.latest_runs``,
        ``stage_moves``), never a group's whole history; the chain as ``ChainWatch`` keeps it."""
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        root = airflow_root(request)
        checked = board.chain(wait_s=OVERVIEW_CHAIN_WAIT_S)
        chain = checked or ChainCheck(ok=False, events=0, problems=(CHAIN_PENDING,))
        digests = board.audit.latest_runs(evidence.OVERVIEW_KINDS)
        states = board.states()
        planned = evidence.GroupState(Stage.PLANNED.value)
        rows = []
        for group in board.catalog().groups:
            if group.dag_id not in readable:
                continue
            digest = digests.get(group.name)
            row = evidence.overview_row(group, digest.events if digest else [], states.get(group.name, planned),
                                        chain, root=root, runs=digest.runs if digest else 0,
                                        last_event_at=digest.last_event_at if digest else None)
            if row["pending_approval"]:
                run_id = row["pending_approval"]["run_id"]
                row["pending_approval"]["airflow_state"] = board.run_states(group.dag_id, [run_id]).get(run_id)
            rows.append(row)
        waves = sorted({r["wave"] for r in rows})
        return {"user": user.get_name(), "chain": {"ok": chain.ok, "events": chain.events,
                                                   "problems": list(chain.problems), "pending": checked is None},
                "waves": [{"wave": w, "groups": [r for r in rows if r["wave"] == w]} for w in waves],
                "groups": rows}

    def detail(request: Request, group: MetricGroup) -> dict[str, Any]:
        chain = board.chain(wait_s=None) or ChainCheck(ok=False, events=0, problems=(CHAIN_PENDING,))
        data = evidence.group_detail(group, board.audit.events(group=group.name), board.state(group.name), chain,
                                     root=airflow_root(request))
        states = board.run_states(group.dag_id, [r["run_id"] for r in data["dag_runs"]])
        for run in data["dag_runs"]:
            run["airflow_state"] = states.get(run["run_id"])
        if data["pending_approval"]:
            data["pending_approval"]["airflow_state"] = states.get(data["pending_approval"]["run_id"])
        return data

    @app.get("/api/groups", response_class=JSONResponse)
    def api_groups(request: Request, user: GetUserDep) -> JSONResponse:
        """Every catalog group the caller may read, by wave: stage, last verdicts, approvals, dependencies.

        Written as it is built (JSON types only: strings, numbers, lists, dicts): the same bytes FastAPI's
        response model would write, without validating and re-encoding 1,000 rows first."""
        # tens of thousands of objects alive until the answer is written, no cycles (0.5 s of a cold request)
        with cyclic_gc_paused():
            return JSONResponse(overview(request, user))

    @app.get("/api/groups/{name}")
    def api_group(request: Request, group: ReadableGroup) -> dict[str, Any]:
        """One group: audit timeline with chain status, last report pieces, config diff, DAG runs."""
        return detail(request, group)

    @app.get("/api/teams/{team}")
    def team_members(team: str, user: GetUserDep) -> dict[str, Any]:
        """A FAB team's members by FAB id (``adapters/fab_teams.py``), for a worker's approval: workers hold no
        database login, so the API server answers. The caller needs what FAB's ``GET /auth/fab/v1/users`` needs
        (can read on Users): 401 anonymous, 403 without it, 404 an unknown team or no FAB here, 503 unreadable."""
        from promshift.adapters.fab_teams import team_answer

        if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name="Users", user=user):
            raise HTTPException(403, "reading a team's members needs the permission can read on Users")
        if not TEAM_NAME_RE.fullmatch(team):
            raise HTTPException(404, f"team name {team[:80]!r} must match {TEAM_NAME_RE.pattern}")
        directory = board.teams()
        if directory is None:
            raise HTTPException(404, "teams are served here only under the FAB auth manager")
        try:
            return team_answer(team, directory.members(team))
        except UnknownTeam as exc:
            raise HTTPException(404, str(exc)) from None
        except ApproversError as exc:
            raise HTTPException(503, str(exc)) from None

    @app.get("/metrics")
    def metrics(request: Request, user: GetUserDep) -> Response:
        """promshift's own metrics (board/metrics.py) for the groups the caller may read, for Prometheus."""
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        return exposed([(g.name, g.wave) for g in board.catalog().groups if g.dag_id in readable])

    def exposed(groups: list[tuple[str, int]]) -> Response:
        # Only the kinds the exposition folds (and stage moves): not a year of bake checks; totals by SQL.
        count, last = board.audit.totals()
        return Response(exposition(groups, board.audit.events_of_kinds(FOLDED_KINDS), totals=(count, last)),
                        media_type=CONTENT_TYPE)

    @app.get("/scrape/metrics")
    def scrape_metrics(request: Request) -> Response:
        """The same metrics for every group, for a scraper holding the static token (``PROMSHIFT_METRICS_TOKEN``,
        from a Secret): no Airflow login, no JWT that expires daily. The token opens this one read-only route
        and nothing else; without a token configured the route does not exist (404)."""
        token = metrics_token()
        if token is None:
            raise HTTPException(404, "no metrics token is configured (PROMSHIFT_METRICS_TOKEN)")
        scheme, _, sent = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip().encode("utf-8"), token):
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return exposed([(g.name, g.wave) for g in board.catalog().groups])

    @app.get("/", response_class=HTMLResponse)
    def overview_page(request: Request, user: GetUserDep) -> HTMLResponse:
        with cyclic_gc_paused():
            return HTMLResponse(pages.overview_html(overview(request, user),
                                                    base=str(request.scope.get("root_path"))))

    @app.get("/groups/{name}", response_class=HTMLResponse)
    def group_page(request: Request, group: ReadableGroup, user: GetUserDep) -> HTMLResponse:
        return HTMLResponse(pages.group_html(detail(request, group), user=user.get_name(),
                                             base=str(request.scope.get("root_path"))))

    @app.get("/groups/{name}/latency.png")
    def latency_png(group: ReadableGroup) -> Response:
        """The latency chart of the group's last latency evidence, rendered on request."""
        from promshift.adapters.charts import latency_chart

        found = evidence.latency_windows(group, board.audit.events(group=group.name), board.state(group.name),
                                         board.chain(wait_s=None) or ChainCheck(ok=False, events=0, problems=()))
        if not found:
            raise HTTPException(404, f"group {group.name!r} has no latency evidence yet")
        run_id, windows = found
        with _chart_lock, tempfile.TemporaryDirectory(prefix="promshift-chart-") as tmp:
            path = latency_chart(windows, Path(tmp) / "latency.png",
                                 title=f"{group.name}: query time per window, source vs target")
            png = path.read_bytes()
        return Response(png, media_type="image/png",
                        headers={"Cache-Control": "private, no-store", "X-Promshift-Run": run_id})

    @app.get("/groups/{name}/runs/{run_id}/report/{file}")
    def stored_report(group: ReadableGroup, run_id: str, file: str) -> Response:
        """A file of the report a run published (``ObjectStoragePath``), served only while it hashes as audited."""
        from promshift.orchestration.report_store import REPORT_FILES, ReportTampered, read_published

        record = evidence.published_reports(board.audit.events(group=group.name, run_id=run_id)).get(run_id)
        if record is None:
            raise HTTPException(404, f"run {run_id!r} of group {group.name!r} published no report")
        try:
            data = read_published(record, file)
        except FileNotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        except ReportTampered as exc:
            raise HTTPException(409, str(exc)) from None
        return Response(data, media_type=REPORT_FILES[file], headers={"Cache-Control": "private, no-store"})

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """JSON for the API; for pages, a short HTML page that says why and shows no data."""
        headers = getattr(exc, "headers", None)
        if request.url.path.startswith(f"{request.scope.get('root_path', '')}/api/"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)
        return HTMLResponse(pages.error_html(exc.status_code, str(exc.detail), airflow_root=airflow_root(request),
                                             base=str(request.scope.get("root_path"))),
                            status_code=exc.status_code, headers=headers)

    return app
