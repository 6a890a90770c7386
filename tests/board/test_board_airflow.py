"""The board inside a real ``airflow standalone``: auth on every route, the JSON API, and headless Chromium.

One Airflow for the whole module (it takes a minute or two to start). The audit log holds a history
written the way the migration steps write it (tests/board/history.py); the DAG runs it names are
created in Airflow too (paused DAGs keep them queued), so the board's links lead to real run pages.
The board never queries Prometheus, so no metrics stack is started. (It joins no e2e session of
tests/e2e/conftest.py: its users, catalog profile and audit history are its own.)

Users (Simple auth manager): sre-carol (op), oncall-alice / oncall-bob (user), viewer-vic (viewer),
and nobody-nina with no role: signed in, but the auth manager grants her nothing. The Simple auth
manager's roles read every DAG or none (and ``airflow standalone`` insists on it), so one target's
migration DAG denied while others are readable is tested at the dependency level (test_board_access.py).

The shipped catalog sends every group to one workspace: the three runs are runs of its one migration DAG,
``promshift__migrate__promshift_target``, each with its group chosen in the trigger form (conf ``group``).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.local.airflow_lab import APPROVER_USERS, TRIGGER_USER, LocalAirflow
from promshift.local.stack.local import find_free_ports
from tests.board.history import write_history
from tests.board.webdriver import Browser

pytestmark = pytest.mark.e2e
# Seconds between SIGTERM and SIGKILL when the module's Airflow stops: its triggerer and API server ignored SIGTERM
# for LocalAirflow.stop's default 30 s (as at the e2e sessions' end, tests/e2e/conftest.py STOP_WAIT_S).
STOP_WAIT_S = 8.0

VIEWER = "viewer-vic"
NO_ROLE = "nobody-nina"
MIGRATION_DAG = "promshift__migrate__promshift_target"
ARTIFACTS = Path(os.environ.get("PROMSHIFT_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts")) / "board"


class Board:
    """The running Airflow, its users' passwords and the runs the history names."""

    def __init__(self, airflow: LocalAirflow, run_ids: dict[str, str]) -> None:
        self.airflow = airflow
        self.run_ids = run_ids
        self.url = airflow.base_url

    def get(self, path: str, user: str | None = None, token: str | None = None) -> requests.Response:
        headers = {}
        if user or token:
            headers["Authorization"] = f"Bearer {token or self.airflow.token(user or '')}"
        return requests.get(f"{self.url}{path}", headers=headers, timeout=60)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Board]:
    home = tmp_path_factory.mktemp("board")
    audit_url = f"sqlite:///{home / 'audit.db'}"
    airflow_home = home / "airflow"
    airflow_home.mkdir()
    users = [TRIGGER_USER, *APPROVER_USERS, VIEWER, NO_ROLE]
    (airflow_home / "passwords.json").write_text(json.dumps({u: secrets.token_urlsafe(12) for u in users}))
    airflow = LocalAirflow(home=airflow_home, port=find_free_ports(1)[0], extra_env={
        "PROMSHIFT_HOME": str(home),
        "PROMSHIFT_AUDIT_URL": audit_url,
        "PROMSHIFT_CATALOG": str(REPO_ROOT / "catalog" / "metric_groups.yaml"),
        "PROMSHIFT_PROFILE": "",
        # Runs are created but never scheduled: the board is what is under test, not the DAG.
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
            [f"{TRIGGER_USER}:op", *(f"{u}:user" for u in APPROVER_USERS), f"{VIEWER}:viewer", f"{NO_ROLE}:"]),
    })
    catalog = load_catalog()
    try:
        airflow.start(timeout_s=480)  # 2 shared cores: standalone can take minutes to become healthy
        assert {g.dag_id for g in catalog.groups} == {MIGRATION_DAG}
        airflow.wait_for_dag(MIGRATION_DAG)
        start = datetime.now(UTC) - timedelta(hours=4)
        run_ids = {}
        for i, name in enumerate(("gpu-utilization", "gpu-power-thermal", "gpu-memory")):
            run_id = f"manual__{(start + timedelta(hours=i)).isoformat()}"
            airflow.api(TRIGGER_USER, "POST", f"/dags/{catalog.get(name).dag_id}/dagRuns",
                        json={"dag_run_id": run_id, "logical_date": None, "conf": {"group": name}})
            run_ids[name] = run_id
        write_history(AuditStore(audit_url), catalog, start, run_ids)
        yield Board(airflow, run_ids)
    finally:
        airflow.stop(term_wait_s=STOP_WAIT_S)  # its triggerer and API server ignore SIGTERM: killed after this


def test_the_plugin_adds_a_nav_entry_and_mounts_the_board(board: Board) -> None:
    plugins = board.airflow.api(TRIGGER_USER, "GET", "/plugins")["plugins"]
    plugin = next(p for p in plugins if p["name"] == "promshift_board")
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/promshift"]
    view = plugin["external_views"][0]
    assert (view["name"], view["href"], view["url_route"], view["destination"]) == (
        "Migration board", "/promshift/", "promshift", "nav")


def test_anonymous_and_forged_requests_get_no_data(board: Board) -> None:
    for path in ("/promshift/api/groups", "/promshift/api/groups/gpu-memory", "/promshift/",
                 "/promshift/groups/gpu-memory", "/promshift/groups/gpu-memory/latency.png"):
        resp = board.get(path)
        assert resp.status_code == 401, (path, resp.status_code)
        assert "oncall-alice" not in resp.text and "SUCCESSFUL" not in resp.text
    forged = board.get("/promshift/api/groups", token="eyJhbGciOiJIUzUxMiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl")
    assert forged.status_code in (401, 403) and "groups" not in forged.json()


def test_with_a_token_every_group_with_its_stage_by_wave(board: Board) -> None:
    resp = board.get("/promshift/api/groups", user=APPROVER_USERS[1])
    assert resp.status_code == 200, resp.text
    data = resp.json()
    stages = {g["name"]: g["stage"] for g in data["groups"]}
    assert stages == {"gpu-utilization": "cut_over", "gpu-memory": "verified", "gpu-power-thermal": "rolled_back",
                      "gpu-clocks": "planned"}
    assert [(w["wave"], sorted(g["name"] for g in w["groups"])) for w in data["waves"]] == [
        (1, ["gpu-memory", "gpu-utilization"]), (2, ["gpu-clocks", "gpu-power-thermal"])]
    by_name = {g["name"]: g for g in data["groups"]}
    assert by_name["gpu-utilization"]["approval"]["by"] == "oncall-alice"
    assert by_name["gpu-clocks"]["depends_on"] == ["gpu-power-thermal"]
    pending = by_name["gpu-memory"]["pending_approval"]
    assert pending["waiting_for"] == ["oncall-alice", "oncall-bob"]
    assert pending["airflow_state"] == "queued"  # the run exists in Airflow
    assert pending["link"] == (f"/dags/{MIGRATION_DAG}/runs/{quote(board.run_ids['gpu-memory'], safe='')}"
                               "/tasks/approval/required_actions")
    assert data["chain"]["ok"] is True


def test_group_detail_and_chart_for_a_reader(board: Board) -> None:
    token = board.airflow.token(VIEWER)  # the read-only role is enough
    data = board.get("/promshift/api/groups/gpu-utilization", token=token).json()
    assert data["stage"] == "cut_over" and data["chain"]["ok"] is True
    assert [m["verdict"] for m in data["report"]["parity"]["measurements"]] == ["SUCCESSFUL"] * 5
    assert data["report"]["latency"]["windows"] and data["report"]["cost"]["total_usd"] > 0
    assert "+- name: promshift-gpu-utilization" in data["config_diff"]["lines"]
    assert [(r["run_id"], r["airflow_state"]) for r in data["dag_runs"]] == [
        (board.run_ids["gpu-utilization"], "queued")]
    assert data["timeline"][0]["kind"] == "run_complete"
    png = board.get("/promshift/groups/gpu-utilization/latency.png", token=token)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n" and len(png.content) > 10_000
    page = board.get("/promshift/groups/gpu-utilization", token=token)
    assert page.status_code == 200
    assert all(f'id="{anchor}"' in page.text for anchor in ("parity-layers", "latency-windows", "latency-chart"))
    assert board.get("/promshift/api/groups/no-such-group", token=token).status_code == 404
    assert board.get("/promshift/groups/gpu-clocks/latency.png", token=token).status_code == 404  # never measured


def test_a_user_without_dag_read_access_gets_403_and_an_empty_overview(board: Board) -> None:
    token = board.airflow.token(NO_ROLE)
    # Airflow itself refuses her the DAG: she is the "no read access" case, not a broken login.
    assert board.get(f"/api/v2/dags/{MIGRATION_DAG}", token=token).status_code == 403
    for path in ("/promshift/api/groups/gpu-memory", "/promshift/groups/gpu-memory",
                 "/promshift/groups/gpu-memory/latency.png", "/promshift/api/groups/no-such-group"):
        resp = board.get(path, token=token)
        assert resp.status_code == 403, (path, resp.status_code)
        assert "oncall-alice" not in resp.text and "SUCCESSFUL" not in resp.text
    overview = board.get("/promshift/api/groups", token=token)
    assert overview.status_code == 200 and overview.json()["groups"] == []


def test_chromium_signs_in_opens_the_board_follows_the_approval_and_loads_the_chart(board: Board,
                                                                                   tmp_path: Path) -> None:
    shots = ARTIFACTS
    browser = Browser(tmp_path / "browser")
    try:
        # Anonymous: the board's page and API show nothing.
        browser.get(f"{board.url}/promshift/")
        assert "Sign in" in browser.text(browser.find("#board-error"))
        body = browser.script("return document.body.innerText")
        assert "gpu-memory" not in body and "oncall" not in body
        browser.screenshot(shots / "00-anonymous.png")
        browser.get(f"{board.url}/promshift/api/groups")
        assert "Not authenticated" in browser.script("return document.body.innerText")

        # Sign in through Airflow's own login form.
        browser.get(f"{board.url}/auth/login")
        browser.type(browser.find("input[name=username]"), APPROVER_USERS[1])
        browser.type(browser.find("input[name=password]"), board.airflow.passwords[APPROVER_USERS[1]])
        browser.click(browser.find("button[type=submit]"))
        browser.wait_for("return document.cookie.includes('_token') || !location.pathname.startsWith('/auth')",
                         what="the login to finish")

        # The nav entry opens the board inside Airflow (plugin iframe).
        browser.get(f"{board.url}/plugin/promshift")
        browser.frame(browser.find("iframe[title='Migration board']", timeout_s=60))
        browser.find("table.groups", timeout_s=30)
        browser.frame(None)
        browser.screenshot(shots / "01-board-in-airflow.png")

        # Overview on its own: every group by wave, the pending approval named.
        browser.get(f"{board.url}/promshift/")
        rows = browser.script("return [...document.querySelectorAll('tr[data-group]')].map(r => r.dataset.group)")
        assert sorted(rows) == ["gpu-clocks", "gpu-memory", "gpu-power-thermal", "gpu-utilization"]
        assert "gpu-memory" in browser.text(browser.find("#pending-approvals"))
        assert browser.script("return document.documentElement.scrollWidth") <= 1280  # no sideways scroll
        browser.screenshot(shots / "02-overview.png")

        # A group with evidence: tables and the chart image, which must actually load.
        browser.click(browser.find("tr[data-group='gpu-utilization'] a.group-link"))
        browser.find("#latency-windows")
        assert browser.wait_for("const i = document.getElementById('latency-chart');"
                                "return i && i.complete && i.naturalWidth", what="the latency chart") > 0
        assert "SUCCESSFUL" in browser.text(browser.find("#parity-layers"))
        assert "verified" in browser.text(browser.find("#chain-status"))
        browser.screenshot(shots / "03-group-cut-over.png")
        browser.script("document.getElementById('latency-windows').scrollIntoView()")
        browser.screenshot(shots / "03b-group-latency-chart.png")

        # Dark mode follows prefers-color-scheme: a dark background, the same content.
        browser.cdp("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        dark_bg = browser.script("return getComputedStyle(document.body).backgroundColor")
        assert dark_bg == "rgb(17, 17, 19)", dark_bg
        browser.screenshot(shots / "04-group-dark.png")
        browser.cdp("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "light"}]})

        # The group waiting for approval: follow its link to Airflow's required action for that run.
        browser.get(f"{board.url}/promshift/")
        browser.click(browser.find("tr[data-group='gpu-memory'] a.group-link"))
        callout = browser.text(browser.find("#pending-approval"))
        assert "oncall-alice or oncall-bob" in callout
        browser.screenshot(shots / "05-group-pending-approval.png")
        browser.click(browser.find("#pending-approval a.required-action"))
        expected = (f"/dags/{MIGRATION_DAG}/runs/{quote(board.run_ids['gpu-memory'], safe='')}"
                    "/tasks/approval/required_actions")
        browser.wait_for("return location.pathname === arguments[0]", expected, what="the required action page")
        browser.wait_for("return document.body.innerText.includes(arguments[0])", MIGRATION_DAG,
                         what="Airflow's run page to render", timeout_s=40)
        browser.screenshot(shots / "06-required-action.png")

        # Inside Airflow's iframe (here in Airflow's dark mode, which the board follows) the same link
        # moves the Airflow UI itself, not the frame.
        browser.cdp("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        browser.get(f"{board.url}/plugin/promshift/promshift/groups/gpu-memory")
        browser.wait_for("return document.documentElement.classList.contains('dark')", what="Airflow's dark mode")
        browser.frame(browser.find("iframe[title='Migration board']", timeout_s=60))
        browser.find("#pending-approval")
        assert browser.script("return document.documentElement.dataset.theme") == "dark"
        assert browser.script("return getComputedStyle(document.body).backgroundColor") == "rgb(17, 17, 19)"
        browser.frame(None)
        browser.screenshot(shots / "07-board-in-airflow-dark.png")
        browser.frame(browser.find("iframe[title='Migration board']"))
        browser.click(browser.find("#pending-approval a.required-action"))
        browser.frame(None)
        browser.wait_for("return location.pathname === arguments[0]", expected, what="the UI to follow the link")
        browser.wait_for("return !document.querySelector(\"iframe[title='Migration board']\")",
                         what="Airflow to leave the board's iframe")
        browser.wait_for("return document.body.innerText.includes(arguments[0])", MIGRATION_DAG,
                         what="Airflow's run page to render", timeout_s=40)
        browser.screenshot(shots / "08-required-action-from-iframe.png")
    except Exception:
        browser.screenshot(shots / "failure.png")
        raise
    finally:
        browser.quit()
