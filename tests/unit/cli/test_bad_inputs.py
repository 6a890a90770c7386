"""The bad-input corpus (tests/data/bad_inputs.yaml): every reader of user or server input, one harness.

Each row names a surface (a runner below) and an input. A refused row must give exactly one line that
contains the row's fragment, never a traceback, within the row's time budget (and memory, when it names
one); an accepted row must go through. To cover a new reader, add a runner to SURFACES and rows to the
corpus.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

# Imported once here, so no case's time budget pays for an import.
import promshift.adapters.k8s_deploy  # noqa: E402, F401
import promshift.adapters.settings  # noqa: E402, F401
import promshift.cli  # noqa: E402, F401
import promshift.local.stack.k8s_api  # noqa: E402, F401
from promshift.core.render import RenderError
from tests.unit.core.test_catalog_bad_inputs import expand

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "data" / "bad_inputs.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))
DEFAULT_SECONDS = 2.0
HANG_S = 60.0
MAX_LINE_CHARS = 600


@dataclass
class Outcome:
    """What the user saw: ``refused`` and the lines of the refusal (or of the output when accepted)."""

    refused: bool
    lines: list[str]


def input_path(case: dict[str, Any], tmp_path: Path, name: str = "input.yml") -> Path:
    """The file a file-reading surface reads: ``text`` written in ``encoding``, or a special path (``file``)."""
    given = case["input"]
    situation = given.get("file")
    if situation is None:
        path = tmp_path / name
        path.write_bytes(str(expand(given["text"])).encode(given.get("encoding", "utf-8")))
        return path
    if situation == "missing":
        return tmp_path / f"no-such-{name}"
    if situation == "directory":
        path = tmp_path / name
        path.mkdir()
        return path
    if situation == "fifo":
        path = tmp_path / name
        os.mkfifo(path)
        return path
    if situation == "dev-zero":
        return Path("/dev/zero")
    raise AssertionError(f"{case['id']}: unknown file situation {situation!r}")


# --------------------------------------------------------------------------- the surfaces

Runner = Callable[[dict[str, Any], Path, pytest.CaptureFixture[str]], Outcome]
SURFACES: dict[str, Runner] = {}


def surface(name: str) -> Callable[[Runner], Runner]:
    def register(runner: Runner) -> Runner:
        SURFACES[name] = runner
        return runner

    return register


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``promshift ARGV`` in this process: refused when the exit code is not 0; the lines are stderr's."""
    from promshift.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return Outcome(code != 0, err.splitlines() if code != 0 else out.splitlines())


@surface("render-cli")
def render_cli(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``promshift render gpu-memory --config FILE``; input keys: the file's, plus ``target_url``."""
    # The unit tier starts no process: promtool's check of the result runs in tests/integration/test_render_promtool.py.
    argv = ["render", "gpu-memory", "--config", str(input_path(case, tmp_path)), "--promtool", "/nonexistent/promtool"]
    if "target_url" in case["input"]:
        argv += ["--target-url", str(expand(case["input"]["target_url"]))]
    return cli(argv, capsys)


def refusal(call: Callable[[], Any], *errors: type[BaseException]) -> Outcome:
    """Run ``call``: refused (with the error's text as the lines) when it raises one of ``errors``."""
    try:
        call()
    except errors as exc:
        return Outcome(True, str(exc).splitlines() or [""])
    return Outcome(False, [])


def entry(case: dict[str, Any]) -> dict[str, Any]:
    from promshift.core.render import remote_write_entry

    return remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                              url=str(expand(case["input"].get("url", "http://127.0.0.1:9/api/v1/write"))))


@surface("render-core")
def render_core(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``add_remote_write`` then ``remove_remote_write`` on the file's bytes; input keys: the file's, plus ``url``."""
    from promshift.core.render import RenderError, add_remote_write, remove_remote_write

    data = input_path(case, tmp_path).read_bytes()

    def edit() -> None:
        added = add_remote_write(data, entry(case))
        assert remove_remote_write(added, "promshift-gpu-memory") == data

    return refusal(edit, RenderError)


@surface("decommission")
def decommission(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """The decommission edit (``add_scrape_drop``) on the file's bytes; input keys: the file's, plus ``job``."""
    from promshift.core.render import RenderError
    from promshift.core.scrape_drop import add_scrape_drop, drop_rule

    data = input_path(case, tmp_path).read_bytes()
    return refusal(lambda: add_scrape_drop(data, case["input"].get("job", "node"), drop_rule("DCGM_.*")), RenderError)


@surface("k8s-configmap")
def k8s_configmap(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """A ConfigMap whose ``prometheus.yml`` is ``text``: snapshot and deploy through the Kubernetes API contract
    server (in this process); input keys: ``text``, ``url``."""
    from kubernetes.client import ApiClient, Configuration

    from promshift.adapters.k8s_deploy import ConfigMapDeployment
    from promshift.core.deploy import DeployError
    from promshift.local.stack.k8s_api import CONFIGMAPS, K8sApiServer

    class LoadedConfig:
        base_url = "http://127.0.0.1:1"

        def config_text(self) -> str:
            return "global: {}\n"

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prom", "namespace": "monitoring"},
          "data": {"prometheus.yml": str(expand(case["input"]["text"]))}}
    with K8sApiServer() as server:
        server.create(CONFIGMAPS, "monitoring", "prom", cm)

        def deploy() -> None:
            deployer = ConfigMapDeployment(ApiClient(Configuration(host=server.base_url)), namespace="monitoring",
                                           name="prom", entry=entry(case), prometheus=LoadedConfig())  # type: ignore[arg-type]
            deployer.deploy(deployer.snapshot(), datetime.now(UTC))

        return refusal(deploy, DeployError, RenderError)


@surface("file-deploy")
def file_deploy(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """The file deployer's snapshot of the config (what every deploy, rollback and decommission starts with)."""
    from promshift.adapters.deploy import FileConfigDeployer
    from promshift.adapters.file_deployment import FileDeployment
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.core.deploy import DeployError

    deployer = FileConfigDeployer(input_path(case, tmp_path), PrometheusClient("http://127.0.0.1:1"))
    return refusal(lambda: FileDeployment(deployer, entry(case)).snapshot(), DeployError)


@surface("catalog-file")
def catalog_file(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``check_catalog_file`` (the DAG file's and ``catalog check``'s reader); refused: its first problem."""
    from promshift.adapters.settings import check_catalog_file

    result = check_catalog_file(input_path(case, tmp_path, "metric_groups.yaml"))
    return Outcome(bool(result.problems), [result.problems[0]] if result.problems else [])


@surface("rule-files")
def rule_files(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """The source's rule files: a config whose ``rule_files`` names the input file, then the rules snapshot."""
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.adapters.rules_deploy import SourceRules
    from promshift.core.deploy import DeployError
    from promshift.core.rules import RulesError

    rules = input_path(case, tmp_path, "rules.yml")
    config = tmp_path / "prometheus.yml"
    config.write_text(f"rule_files:\n  - {json.dumps(str(rules))}\n", encoding="utf-8")
    source = SourceRules(config, PrometheusClient("http://127.0.0.1:1"))
    return refusal(lambda: source.snapshot(lambda name: True), DeployError, RulesError)


@surface("dashboard-file")
def dashboard_file(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """A provisioned Grafana dashboard file, read as the read-path switch reads it."""
    from promshift.adapters.dashboard_files import DashboardFilesSwitch
    from promshift.core.read_path import ReadPathError

    return refusal(lambda: DashboardFilesSwitch._read(input_path(case, tmp_path, "dashboard.json")), ReadPathError)


@surface("scraper-blob")
def scraper_blob(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """A managed collector's configuration blob, validated before any API call; input keys: ``text``."""
    from promshift.core.scraper_config import ScraperConfigError, validate_scraper_config

    return refusal(lambda: validate_scraper_config(str(expand(case["input"]["text"]))), ScraperConfigError)


# --------------------------------------------------------------------------- git deploy: the team's repository

GOOD_GIT_EXTRA = {"url": "https://git.example/acme/monitoring.git", "path": "clusters/prod/values.yaml",
                  "shape": "helm-values", "backend": "github", "conn_id": "promshift_git",
                  "github": {"repository": "acme/monitoring", "api_url": "https://api.github.example"}}


@surface("git-deploy")
def git_deploy(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``extra``: merged over a good ``extra.git`` and read by ``git_source_of`` (refused: its one line). Else a
    clone's work tree (laid out as git checks it out; the unit tier runs no git) whose
    ``clusters/prod/values.yaml`` is ``values`` (or, with ``symlinked_dir``, whose ``clusters`` is a symlink to a
    folder outside the clone holding that file): the deployer finds the file, edits it (``add_entry``) and writes
    it back, as ``deploy`` does before ``git add``. Nothing outside the clone may change.
    tests/integration/test_git_deploy.py runs the same symlink through a real clone and push."""
    from promshift.adapters.git_deploy import DirectPush, GitDeployment
    from promshift.adapters.prometheus import PrometheusClient
    from promshift.core.deploy import DeployError
    from promshift.core.git_render import GitRenderError, add_entry
    from promshift.core.git_source import git_source_of
    from promshift.core.render import remote_write_entry

    given = case["input"]
    if "extra" in given:
        extra = {**GOOD_GIT_EXTRA, **expand(given["extra"])}
        return refusal(lambda: git_source_of({"git": extra}), ValueError)
    values = str(expand(given.get("values", "prometheus:\n  prometheusSpec:\n    retention: 15d\n")))
    clone, outside = tmp_path / "clone", tmp_path / "outside"
    (outside / "prod").mkdir(parents=True)
    clone.mkdir()
    if given.get("symlinked_dir"):
        (outside / "prod" / "values.yaml").write_text(values)
        (clone / "clusters").symlink_to(outside)
    else:
        (clone / "clusters" / "prod").mkdir(parents=True)
        (clone / "clusters" / "prod" / "values.yaml").write_text(values)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    source = git_source_of({"git": {"url": str(tmp_path / "repo.git"), "path": "clusters/prod/values.yaml",
                                    "shape": "helm-values"}})
    entry = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_.*",
                               url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write")
    deployer = GitDeployment(source, entry=entry, prometheus=PrometheusClient("http://127.0.0.1:1"),
                             backend=DirectPush(), group="gpu-memory", run_id="manual__1")

    def edit() -> None:
        path = deployer._inside(clone)
        try:
            edited = add_entry(source.shape, path.read_bytes(), entry)
        except GitRenderError as exc:
            raise DeployError(f"{deployer.where}: {exc}") from None
        path.write_bytes(edited)

    outcome = refusal(edit, DeployError)
    after = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    assert after == before, f"{case['id']}: a file outside the clone changed"
    return outcome


# --------------------------------------------------------------------------- plan: a source that answers


SOURCE_CONFIG = "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: dcgm\n"
GOOD_RULE_FILE = ("groups:\n  - name: gpu\n    rules:\n      - record: gpu:util:avg\n"
                  "        expr: avg(DCGM_FI_DEV_GPU_UTIL)\n")
GOOD_LOG_LINE = ('{"params":{"end":"2026-12-05T01:00:00.000Z","query":"DCGM_FI_DEV_GPU_UTIL","start":'
                 '"2026-12-05T01:00:00.000Z","step":0},"ts":"2026-12-05T01:00:00.000Z"}\n')
PLAN_NOW = datetime(2026, 12, 5, 2, 0, tzinfo=UTC).timestamp()


class _Source:
    """A Prometheus API for ``plan``: one metric of two series; ``answers`` replaces an endpoint's raw body."""

    def __init__(self, answers: dict[str, str]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        series = [{"__name__": "DCGM_FI_DEV_GPU_UTIL", "job": "dcgm", "Hostname": f"h{i}", "gpu": "0"}
                  for i in range(2)]
        canned = {"/api/v1/status/runtimeinfo": {"storageRetention": "15d"},
                  "/api/v1/status/tsdb": {"seriesCountByMetricName": [{"name": "DCGM_FI_DEV_GPU_UTIL", "value": 2}]},
                  "/api/v1/metadata": {"DCGM_FI_DEV_GPU_UTIL": [{"type": "gauge", "help": "", "unit": ""}]},
                  "/api/v1/status/config": {"yaml": SOURCE_CONFIG},
                  "/api/v1/label/__name__/values": ["DCGM_FI_DEV_GPU_UTIL"],
                  "/api/v1/series": series, "/api/v1/rules": {"groups": []}}
        bodies = {path: json.dumps({"status": "success", "data": data}) for path, data in canned.items()}
        bodies.update(answers)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                body = bodies.get(self.path.split("?")[0])
                data = (body if body is not None else '{"status":"error","error":"not found"}').encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@surface("plan")
def plan_cli(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``promshift plan`` against a source answering as ``_Source`` (``answers``: path -> raw body), with
    ``query_log`` (the file's keys: text, file), ``dashboard`` and ``rule_file`` (text or file) and ``args``.
    ``out``: ``existing-file`` or a path instead of a fresh folder. A partial plan (exit 2) is refused: its
    stderr is the lines, and all four files must be written with plan.md saying PARTIAL; nothing else is
    written anywhere in the case's folder."""
    given = case["input"]
    source = _Source({path: str(expand(body)) for path, body in (given.get("answers") or {}).items()})
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    argv = ["plan", "--source", source.url, "--prices", str(REPO / "catalog" / "amp_prices.yaml"),
            "--no-rules-api", "--period", "7d"]
    for key, flag, name in (("query_log", "--query-log", "q.log"), ("dashboard", "--dashboards", "d.json"),
                            ("rule_file", "--rule-file", "r.yml")):
        # By default a good query log and a good rule file, so each row's one bad input is the only problem.
        spec = given.get(key, {"query_log": {"text": GOOD_LOG_LINE}, "rule_file": {"text": GOOD_RULE_FILE}}.get(key))
        if spec is not None:
            argv += [flag, str(input_path({"id": case["id"], "input": spec}, inputs, name))]
    out = tmp_path / "plan"
    if given.get("out") == "existing-file":
        out.write_text("keep me\n")
    elif given.get("out"):
        out = Path(given["out"])
    argv += ["--out", str(out), *[str(expand(a)) for a in given.get("args", [])]]
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    import promshift.adapters.usage as usage

    real_build = usage.build_plan
    try:
        usage.build_plan = lambda client, inputs, *, prices, now: real_build(client, inputs, prices=prices,
                                                                             now=PLAN_NOW)
        from promshift.cli import main

        code = main(argv)
    finally:
        usage.build_plan = real_build
        source.close()
    out_text, err = capsys.readouterr()
    changed = {p for p in tmp_path.rglob("*") if before.get(p) != p.stat().st_mtime_ns}
    written = {out / name for name in usage.PLAN_FILES} | {out}
    assert changed <= written, f"{case['id']}: written outside the plan: {sorted(changed - written)}"
    if code == 2:
        assert written <= changed, f"{case['id']}: a partial plan must still be written whole"
        assert "PARTIAL" in (out / "plan.md").read_text()
    if code not in (0, 2):
        assert not changed & written, f"{case['id']}: refused, yet wrote {sorted(changed & written)}"
    return Outcome(code != 0, err.splitlines() if code != 0 else [*err.splitlines(), *out_text.splitlines()])


# --------------------------------------------------------------------------- the harness


def test_the_corpus_is_well_formed() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in CASES:
        assert case["surface"] in SURFACES, f"{case['id']}: no runner for surface {case['surface']!r}"
        assert case.get("expect", "refused") in ("refused", "accepted"), case["id"]
        assert case.get("expect", "refused") == "accepted" or case.get("contains"), case["id"]
        assert isinstance(case.get("input"), dict), case["id"]


class _PeakMemory:
    """Peak Python allocations while a case runs (only when the row asks: tracing slows everything)."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.peak_mb = 0.0

    def __enter__(self) -> _PeakMemory:
        if self.wanted:
            tracemalloc.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.wanted:
            self.peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_bad_input(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    runner = SURFACES[case["surface"]]
    budget_s = float(case.get("seconds", DEFAULT_SECONDS))
    outcome: list[Outcome] = []
    failure: list[str] = []
    cpu_s: list[float] = []

    def run() -> None:
        started = time.thread_time()
        try:
            outcome.append(runner(case, tmp_path, capsys))
        except BaseException:  # noqa: BLE001 - the point: nothing may escape as a traceback
            failure.append(traceback.format_exc())
        cpu_s.append(time.thread_time() - started)

    with _PeakMemory("max_mb" in case) as memory:
        # In a thread, so a reader that hangs (a FIFO with no writer) fails the case instead of the run.
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(HANG_S)
    assert not worker.is_alive(), f"{case['id']}: still running after {HANG_S}s (hangs?)"
    assert not failure, f"{case['id']}: raised instead of refusing:\n{failure[0]}"
    # CPU time of the reading thread: the shared machine's load does not count against the input.
    assert cpu_s[0] <= budget_s, f"{case['id']}: {cpu_s[0]:.2f}s of CPU (budget {budget_s}s)"
    if "max_mb" in case:
        assert memory.peak_mb <= float(case["max_mb"]), f"{case['id']}: {memory.peak_mb:.0f} MB allocated"
    result = outcome[0]
    if case.get("expect", "refused") == "accepted":
        assert not result.refused, f"{case['id']}: refused: {result.lines}"
        if "contains" in case:  # a note the accepted input must still give
            assert [line for line in result.lines if case["contains"] in line], (case["id"], result.lines[:8])
        return
    assert result.refused, f"{case['id']}: accepted silently: {result.lines[:5]}"
    assert len(result.lines) == 1, f"{case['id']}: {len(result.lines)} lines: {result.lines[:5]}"
    line = result.lines[0]
    assert "Traceback" not in line and len(line) <= MAX_LINE_CHARS, line[:300]
    assert case["contains"] in line, f"{case['id']}: {line!r} lacks {case['contains']!r}"
