"""The operations bad-input corpus (tests/data/bad_inputs_ops.yaml): every row one bad input, one clear line.

A row names a ``surface`` (how promshift meets the input: a CLI command, the AMP connection, the scraper
pre-flight, the catalog, a rule file, a read path), the ``input`` in that surface's shape, and ``contains``:
the text (or texts) the outcome must hold. For every row the harness asserts that

- nothing raised and no traceback was printed (the surface's own entry point is called, as a user reaches it);
- each expected fragment is in the outcome, on one line, and no line of the outcome is longer than 600
  characters;
- ``exit`` (when given) is the command's exit code; ``absent`` (when given) appears nowhere (a secret, a raw
  control character);
- it all took under 2 s of CPU (``seconds`` when given), and, when ``max_rss_mb`` is given, the process's
  resident memory grew by no more than that (native allocations count: the PromQL parser is Rust).

In any input string, ``<<S*N>>`` stands for S repeated N times.

A new surface adds a function to ``SURFACES`` (input -> ``Outcome``) and rows, not a new harness.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

# Imported here, not in the surfaces: an import's first cost is not the input's.
from promshift.adapters.amp_scraper import scraper_source_from_extra
from promshift.adapters.audit_store import AuditStore, audit_events, event_row
from promshift.adapters.blobs import LocalBlobs
from promshift.adapters.dashboard_files import DashboardFilesSwitch
from promshift.adapters.settings import load_catalog
from promshift.board.pages import _env as board_env
from promshift.cli import main as cli_main
from promshift.core.audit import new_event
from promshift.core.deploy import DeployError
from promshift.core.notify import rolled_back
from promshift.core.read_path import DatasourceRef, ReadPathError
from promshift.core.rules import RulesError, parse_rule_file, select_rules
from promshift.core.run_params import RunParamsError, parse_run_params
from promshift.core.scraper_config import ScraperConfigError, validate_scraper_config
from promshift.core.stages import Stage
from promshift.core.text import shown as escaped_text
from promshift.orchestration.amp_hook import AmpHook
from tests.unit.core.test_catalog_bad_inputs import expand

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "data" / "bad_inputs_ops.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))
CPU_BUDGET_S = 2.0
MAX_LINE = 600
KEY = "0123456789abcdef0123456789abcdef"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
GPU_MEMORY = next(g for g in load_catalog(REPO / "catalog" / "metric_groups.yaml").groups if g.name == "gpu-memory")


@dataclass
class Outcome:
    text: str
    exit: int | None = None


def run_cli(argv: list[str]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return Outcome(out.getvalue() + err.getvalue(), code)


# -- audit ----------------------------------------------------------------------------------------------------

def _audit_db(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Five real events of gpu-memory (planned -> dual_writing -> warming -> verified), keyed and anchored."""
    monkeypatch.setenv("PROMSHIFT_AUDIT_KEY", KEY)
    monkeypatch.delenv("PROMSHIFT_AUDIT_ANCHOR_URL", raising=False)
    db = tmp / "audit.db"
    store = AuditStore(f"sqlite:///{db}")
    moves = [(None, Stage.DUAL_WRITING), (Stage.DUAL_WRITING, Stage.WARMING), (Stage.WARMING, Stage.VERIFIED)]
    for i, (frm, to) in enumerate(moves):
        store.append(group="gpu-memory", run_id="r1", kind="stage", actor="promshift", at=T0 + timedelta(minutes=i),
                     evidence={"i": i}, stage_from=frm, stage_to=to)
    store.engine.dispose()
    return db


def _tamper(db: Path, how: str) -> None:
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER promshift_audit_no_update")
    con.execute("DROP TRIGGER promshift_audit_no_delete")
    edits = {
        "at-not-iso": "UPDATE promshift_audit_events SET at = 'last tuesday' WHERE seq = 2",
        "illegal-transition": "UPDATE promshift_audit_events SET stage_to = 'decommissioned' WHERE seq = 2",
        "stage-not-a-stage": "UPDATE promshift_audit_events SET stage_to = 'exploded' WHERE seq = 3",
        "evidence-not-json": "UPDATE promshift_audit_events SET evidence = '{not json' WHERE seq = 3",
        "empty-table": "DELETE FROM promshift_audit_events",
    }
    if how in edits:
        con.execute(edits[how])
    con.commit()
    con.close()


def _forge_with_key(db: Path) -> None:
    """An event made with the key (an insider's), inserted without anchoring its head."""
    store = AuditStore(f"sqlite:///{db}", anchor=None)
    prev = store.events()[-1]
    forged = new_event(prev=prev, group="gpu-memory", run_id="r1", kind="approval", stage_from="verified",
                       stage_to="approved", actor="mallory", at=T0 + timedelta(hours=1),
                       evidence={"decision": "Approve"}, key=KEY.encode())
    with store.engine.begin() as conn:
        conn.execute(audit_events.insert().values(**event_row(forged)))
    store.engine.dispose()


def audit_surface(command: str) -> Callable[[Any, Path, pytest.MonkeyPatch], Outcome]:
    def run(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
        db = _audit_db(tmp, monkeypatch)
        for how in spec.get("tamper", []):
            if how == "delete-anchor":
                shutil.rmtree(tmp / "anchors")
            elif how == "forge-with-key":
                _forge_with_key(db)
            elif how == "anchor-dir-0777":
                (tmp / "anchors").chmod(0o777)
            elif how == "rewrite-past-the-anchor":  # the writer goes on after the table was emptied
                store = AuditStore(f"sqlite:///{db}")
                for i in range(5):
                    with contextlib.suppress(Exception):  # anchoring the new chain's heads conflicts: not our point
                        store.append(group="gpu-memory", run_id="r2", kind="stage", actor="promshift",
                                     at=T0 + timedelta(hours=2, minutes=i), evidence={"i": i},
                                     stage_from=None if i == 0 else Stage.DUAL_WRITING, stage_to=Stage.DUAL_WRITING)
                store.engine.dispose()
            else:
                _tamper(db, how)
        url = spec.get("url", f"sqlite:///{db}")
        argv = ["audit", command, *(["gpu-memory"] if command == "show" else []), "--url", url,
                *spec.get("args", [])]
        return run_cli(argv)
    return run


# -- the AMP connection (its UI Test button) -------------------------------------------------------------------

def amp_connection(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``spec.extra`` merged over a good extra (a non-mapping replaces it); the Test button's answer."""
    good = {"region_name": "eu-west-1", "workspace_id": "ws-0123abcd"}
    extra = {**good, **spec["extra"]} if isinstance(spec["extra"], dict) else spec["extra"]
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": "AKIDTEST", "password": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "extra": extra}))
    ok, message = AmpHook().test_connection()
    return Outcome(message, 0 if ok else 1)


# -- the managed-collector pre-flight ---------------------------------------------------------------------------

GOOD_SCRAPER = {"cluster_arn": "arn:aws:eks:eu-west-1:123456789012:cluster/gpu-fleet", "subnet_ids": ["subnet-0abc"]}


def scraper_preflight(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``spec.scraper`` merged over a good ``extra.scraper`` (workspace region ``spec.region``, default
    eu-west-1), or ``spec.blob``: a scrape configuration; the pre-flight's one line (exit 1) or "accepted"."""
    try:
        if "blob" in spec:
            validate_scraper_config(spec["blob"])
        else:
            scraper_source_from_extra({"scraper": {**GOOD_SCRAPER, **spec["scraper"]}},
                                      region=spec.get("region", "eu-west-1"))
    except (DeployError, ScraperConfigError) as exc:
        return Outcome(str(exc), 1)
    return Outcome("accepted", 0)


# -- promshift check -----------------------------------------------------------------------------------------

def check_cli(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``promshift check parity --group gpu-memory`` on the shipped catalog with ``spec.args`` added; nothing
    listens on the URLs, so a bad input must be refused before any request."""
    catalog = str(REPO / "catalog" / "metric_groups.yaml")
    return run_cli(["check", "parity", "--group", "gpu-memory", "--catalog", catalog,
                    "--source", "http://127.0.0.1:9", "--target", "http://127.0.0.1:9", *spec["args"]])


# -- promshift catalog check -----------------------------------------------------------------------------------

def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def catalog_check(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``promshift catalog check`` on the shipped catalog with ``spec.group`` merged into gpu-memory,
    ``spec.defaults`` into its defaults and ``spec.top`` into the document; ``spec.dashboard`` ({panel title:
    expr}) becomes gpu-memory's only golden dashboard."""
    doc = yaml.safe_load((REPO / "catalog" / "metric_groups.yaml").read_text())
    victim = next(g for g in doc["groups"] if g["name"] == "gpu-memory")
    _merge(victim, spec.get("group", {}))
    _merge(doc.setdefault("defaults", {}), spec.get("defaults", {}))
    _merge(doc, spec.get("top", {}))
    if "dashboard" in spec:
        panels = [{"title": title, "type": "timeseries", "targets": [{"expr": expr, "refId": "A"}]}
                  for title, expr in spec["dashboard"].items()]
        (tmp / "golden.json").write_text(json.dumps({"title": "golden", "panels": panels}))
        victim.setdefault("parity", {})["golden_dashboards"] = ["golden.json"]
    path = tmp / "metric_groups.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.delenv("PROMSHIFT_PROFILE", raising=False)
    return run_cli(["catalog", "check", str(path)])


# -- rule files ---------------------------------------------------------------------------------------------

def rule_file(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """A source rule file (``spec.text``) read as the rules move reads it, and the rules gpu-memory would move."""
    try:
        parsed = parse_rule_file("rules/gpu.yml", spec["text"])
    except RulesError as exc:
        return Outcome(str(exc), 1)
    selection = select_rules([parsed], GPU_MEMORY.claims)
    return Outcome("moves: " + ", ".join(r.name for r in selection.rules), 0)


# -- the read path (dashboard files) ---------------------------------------------------------------------------

def read_path(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``spec.panels`` ({title: [datasource uid or None, expr]}) as dashboard ``board.json``; the files switch of
    gpu-memory from datasource ``spec.source`` (default prom-src) through ``spec.patterns`` (default
    ["*.json"]): its plan's problems, then its snapshot (a refusal is one line, exit 1)."""
    panels = [{"id": i + 1, "title": title, "type": "timeseries",
               **({"datasource": {"type": "prometheus", "uid": ds}} if ds else {}),
               "targets": [{"expr": expr, "refId": "A"}]}
              for i, (title, (ds, expr)) in enumerate(spec.get("panels", {}).items())]
    (tmp / "board.json").write_text(json.dumps({"uid": "board", "title": "board", "panels": panels}))
    switch = DashboardFilesSwitch(spec.get("patterns", ["*.json"]), GPU_MEMORY,
                                  source=DatasourceRef(spec.get("source", "prom-src")), target=DatasourceRef("amp"),
                                  blobs=LocalBlobs(tmp / "snapshots"), root=tmp)
    lines = [f"problem: {p}" for p in switch.plan()["problems"]]
    try:
        switch.snapshot("r1")
    except ReadPathError as exc:
        return Outcome("\n".join([*lines, f"refused: {exc}"]), 1)
    return Outcome("\n".join([*lines, "snapshot taken"]), 0)


# -- the approvers' teams (the Airflow Variable promshift_teams) --------------------------------------------------

def teams(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``spec.text`` as the Variable ``promshift_teams`` holds it, read as the approval step reads it."""
    from promshift.core.approvers import ApproversError, parse_teams, teams_json

    source = "the Airflow Variable promshift_teams"
    try:
        parsed = parse_teams(teams_json(spec["text"], source=source), source=source)
    except ApproversError as exc:
        return Outcome(str(exc), 1)
    return Outcome(f"teams: {sorted(parsed)}", 0)


# -- free text: refused at input, escaped wherever shown --------------------------------------------------------

def free_text(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """``spec.param``'s trigger value ``spec.value`` as the run's validate step reads it (refused: exit 1), or, with
    ``spec.shown_in`` (mail, board, cli), the value as that surface displays it when it arrived by another way."""
    value = spec["value"]
    where = spec.get("shown_in")
    if where == "mail":
        notice = rolled_back(group="gpu-memory", run_id="r1", reason=value, performed=True, restored_identical=True)
        return Outcome(notice.subject + "\n" + notice.text + notice.html, 0)
    if where == "board":
        return Outcome(board_env().from_string("<p>{{ reason }}</p>").render(reason=value), 0)
    if where == "cli":
        return Outcome(escaped_text(value), 0)
    try:
        params = parse_run_params({spec["param"]: value}, scrape_interval_s=30.0)
    except RunParamsError as exc:
        return Outcome(str(exc), 1)
    return Outcome(f"accepted: {params.to_dict()}", 0)


SURFACES: dict[str, Callable[[Any, Path, pytest.MonkeyPatch], Outcome]] = {
    "audit-verify": audit_surface("verify"),
    "audit-show": audit_surface("show"),
    "amp-connection": amp_connection,
    "scraper-preflight": scraper_preflight,
    "check": check_cli,
    "catalog": catalog_check,
    "rules": rule_file,
    "read-path": read_path,
    "free-text": free_text,
    "teams": teams,
}


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one."""
    Path("/proc/self/clear_refs").write_text("5")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_gives_one_clear_line(case: dict[str, Any], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    surface = SURFACES[case["surface"]]
    if "max_rss_mb" in case:
        _reset_peak_rss()
        rss_before = _rss_mb("VmRSS")
    started = time.process_time()
    try:
        outcome = surface(expand(case["input"]), tmp_path, monkeypatch)
    except Exception:  # noqa: BLE001 - the point of the corpus: show what escaped
        pytest.fail(f"{case['id']}: raised instead of one line:\n{traceback.format_exc()}")
    spent = time.process_time() - started
    text = outcome.text
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert all(len(line) <= MAX_LINE for line in lines), max(lines, key=len)
    wanted = case["contains"] if isinstance(case["contains"], list) else [case["contains"]]
    for fragment in wanted:
        assert any(fragment in line for line in lines), f"{fragment!r} not on any line of:\n{text}"
    for fragment in case.get("absent", []):
        assert fragment not in text, f"{fragment!r} must not appear in:\n{text}"
    if "exit" in case:
        assert outcome.exit == case["exit"], f"exit {outcome.exit}, wanted {case['exit']}:\n{text}"
    assert spent < float(case.get("seconds", CPU_BUDGET_S)), f"{spent:.2f} s of CPU"
    if "max_rss_mb" in case:
        grew = _rss_mb("VmHWM") - rss_before
        assert grew <= float(case["max_rss_mb"]), f"resident memory grew {grew:.0f} MB"


def test_every_surface_has_rows_and_every_row_a_surface() -> None:
    used = {c["surface"] for c in CASES}
    assert used == set(SURFACES), (used ^ set(SURFACES))
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
