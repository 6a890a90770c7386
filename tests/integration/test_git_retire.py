"""Retire the source on the git path: ``prometheus.agentMode: true`` committed to the team's kube-prometheus-stack
values through a pull request (the GitHub API contract server) or a direct push, the lab's sync stand-in rendering
an agent from it onto a real Prometheus 2.42, and the revert bringing the server back (``adapters.git_source_mode``;
no Airflow).

The reconciler stand-in does what the chart and the operator would: for values whose ``prometheus.agentMode`` is
true it writes the agent's subset of the config (no ``rule_files``/``alerting``) and restarts the source with
``--enable-feature=agent``; without it, the server's command line again. Proven: the source then refuses queries
with 422 while the target keeps receiving what it forwards, a second switch commits nothing, the undo leaves the
values file byte for byte as it was (the revert's blob is the one before our commit) and the source a server with its
own command line and config bytes; values the switch cannot edit safely are refused with nothing committed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from promshift.adapters.git_deploy import DirectPush, GitHubPullRequests
from promshift.adapters.git_source_mode import GitSourceModeSwitch
from promshift.adapters.source_mode import PopenControl, SourceModeError, probe_mode
from promshift.core.git_agent import set_agent_mode
from promshift.core.git_source import GitSource
from promshift.local.stack.github_api import GitHubContractServer
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PrometheusProcess, prometheus_argv
from promshift.local.stack.reconciler import BRANCH, REPOSITORY, VALUES_PATH, Reconciler, init_repository

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(PROMETHEUS_BIN).exists(), reason="Prometheus is not installed")]

TOKEN = "ghp_localcontracttoken0123456789"
# The source's own config: the stand-in's base is this without remote_write, whose entry moves into the values.
CONFIG = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - rules.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:1']
scrape_configs:
  - job_name: self
    static_configs:
      - targets: ['127.0.0.1:{port}']
remote_write:
  - url: {target}/api/v1/write
    name: promshift-build
    queue_config: {{batch_send_deadline: 1s}}
    write_relabel_configs:
      - source_labels: [__name__]
        regex: prometheus_build_info
        action: keep
"""
RULES = "groups:\n  - name: retire\n    rules:\n      - record: job:up:sum\n        expr: sum by (job) (up)\n"


@dataclass
class Lab:
    repo: Path
    url: str
    config: Path
    control: PopenControl
    reconciler: Reconciler
    github: GitHubContractServer
    target: PrometheusProcess

    def switch(self, backend: str = "github", *, timeout_s: float = 40.0) -> GitSourceModeSwitch:
        source = GitSource(url=str(self.repo), path=VALUES_PATH, shape="helm-values", branch=BRANCH, backend=backend,
                           repository=REPOSITORY if backend == "github" else None, api_url=self.github.base_url,
                           timeout_s=timeout_s)
        change = (GitHubPullRequests(self.github.base_url, REPOSITORY, TOKEN, http_loopback=True)
                  if backend == "github" else DirectPush())
        return GitSourceModeSwitch(source, backend=change, url=self.url, conn_id="promshift_source",
                                   run_id="manual__retire", token=TOKEN, poll_s=0.2)


def _http() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def _samples_after(target: str, after: float) -> int:
    r = _http().get(f"{target}/api/v1/query", params={"query": 'prometheus_build_info{job="self"}[60s]'}, timeout=10)
    r.raise_for_status()
    return len({float(t) for s in r.json()["data"]["result"] for t, _ in s["values"] if float(t) > after})


def _wait(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
    return result


def _tip_file(repo: Path) -> bytes:
    return subprocess.run(["git", "--git-dir", str(repo), "show", f"{BRANCH}:{VALUES_PATH}"], capture_output=True,
                          check=True).stdout


def _log(repo: Path) -> list[str]:
    return subprocess.run(["git", "--git-dir", str(repo), "log", "--format=%an|%s", BRANCH], capture_output=True,
                          text=True, check=True).stdout.splitlines()


def _query_status(url: str) -> tuple[int, str]:
    r = _http().get(f"{url}/api/v1/query", params={"query": "up"}, timeout=5)
    return r.status_code, r.text


def _commit_values(repo: Path, tmp: Path, content: bytes) -> None:
    """Another writer (the team) commits ``content`` as the values file."""
    work = tmp / "team"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "team",
           "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "team", "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True, env=env)
    (work / VALUES_PATH).write_bytes(content)
    subprocess.run(["git", "commit", "-qam", "team edit"], cwd=work, check=True, env=env)
    subprocess.run(["git", "push", "-q", "origin", f"HEAD:{BRANCH}"], cwd=work, check=True, env=env)


@pytest.fixture()
def lab(tmp_path: Path, free_ports: Any) -> Iterator[Lab]:
    source_port, target_port = free_ports(2)
    target = PrometheusProcess("target", tmp_path, port=target_port, flags=["--web.enable-remote-write-receiver"])
    target.__enter__()
    config = tmp_path / "source" / "prometheus.yml"
    config.parent.mkdir()
    config.write_text(CONFIG.format(port=source_port, target=target.url))
    (config.parent / "rules.yml").write_text(RULES)
    repo, base = init_repository(tmp_path / "git", config)  # the entry moves into values.yaml's remoteWrite
    url = f"http://127.0.0.1:{source_port}"
    control = PopenControl(prometheus_argv(config, tmp_path / "source" / "data", source_port, "--web.enable-lifecycle",
                                           "--storage.tsdb.retention.time=15d"),
                           url=url, log_path=tmp_path / "source.log")
    reconciler = github = None
    try:
        control.start()
        reconciler = Reconciler(repo, base=base, config_path=config, prometheus_url=url, interval_s=0.3,
                                control=control, agent_path=tmp_path / "agent")
        reconciler.sync_once()
        reconciler.start()
        github = GitHubContractServer(repo, repository=REPOSITORY, token=TOKEN, merge_after_s=0.5).start()
        _wait(lambda: _samples_after(target.url, time.time() - 30) >= 2)
        yield Lab(repo, url, config, control, reconciler, github, target)
    finally:
        if reconciler is not None:
            reconciler.stop()
        if github is not None:
            github.stop()
        control.stop()
        target.stop()


@pytest.mark.slow
def test_agent_mode_through_a_pull_request_then_the_revert_gives_the_values_back_byte_for_byte(lab: Lab) -> None:
    started = time.monotonic()
    values_before, config_before, argv_before = _tip_file(lab.repo), lab.config.read_bytes(), lab.control.argv()
    assert _query_status(lab.url)[0] == 200 and b"rule_files:" in config_before
    switch = lab.switch("github")

    change = switch.to_agent()
    switched = time.time()
    took_retire = time.monotonic() - started
    assert change.changed and change.mode == "agent" and probe_mode(lab.url) == "agent"
    request = change.change
    assert request["kind"] == "github-pull-request" and request["merged"] and request["number"] == 1
    assert request["branch"] == "promshift/source-promshift_source/agent-mode"
    assert _tip_file(lab.repo) == set_agent_mode(values_before, True)  # that one key, every other byte kept
    assert b"  agentMode: true  # added by promshift\n" in _tip_file(lab.repo)
    # what the sync stand-in did, as the chart and the operator would: an agent's command line and config
    assert "--enable-feature=agent" in lab.control.argv()
    assert not any(a.startswith(("--storage.tsdb.", "--rules.")) for a in lab.control.argv())
    assert b"rule_files:\n" not in lab.config.read_bytes() and b"promshift-build" in lab.config.read_bytes()
    assert lab.reconciler.restarts == ["agent"] and not lab.reconciler.errors
    status, text = _query_status(lab.url)
    assert status == 422 and "unavailable with Prometheus Agent" in text
    _wait(lambda: _samples_after(lab.target.url, switched) >= 2)  # the agent forwards: the target still receives

    commits = len(_log(lab.repo))
    again = switch.to_agent()  # the values are read first: nothing committed, nothing restarted
    assert not again.changed and again.change["ours"] and len(_log(lab.repo)) == commits
    assert lab.reconciler.restarts == ["agent"]

    began = time.monotonic()
    undo = switch.restore()
    undone = time.time()
    took_unretire = time.monotonic() - began
    assert undo.changed and undo.byte_identical is True and probe_mode(lab.url) == "server"
    assert undo.change["method"] == "revert" and undo.change["number"] == 2 and undo.change["merged"]
    assert _tip_file(lab.repo) == values_before
    assert _log(lab.repo)[0].startswith('promshift|Revert "promshift: retire source promshift_source')
    assert lab.control.argv() == argv_before and lab.config.read_bytes() == config_before
    assert lab.reconciler.restarts == ["agent", "server"]
    assert _query_status(lab.url)[0] == 200
    _wait(lambda: _samples_after(lab.target.url, undone) >= 2)
    nothing = switch.restore()  # nothing left to undo
    assert not nothing.changed and nothing.byte_identical is True and len(_log(lab.repo)) == commits + 1
    print(f"git retire: {took_retire:.1f}s to an agent, unretire {took_unretire:.1f}s (sync every 0.3s, "
          "review stand-in 0.5s)")


@pytest.mark.slow
def test_values_it_cannot_edit_safely_are_refused_a_team_edit_is_kept_and_an_agent_that_never_starts_is_reverted(
        lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = _tip_file(lab.repo)
    # the owner spelled the switch as a string: the chart reads "false" as true (an agent); nothing is committed
    odd = values.replace(b"prometheus:\n", b"prometheus:\n  agentMode: \"false\"\n", 1)
    _commit_values(lab.repo, tmp_path, odd)
    _wait(lambda: probe_mode(lab.url) == "agent")  # the stand-in reads it as the chart does
    commits = len(_log(lab.repo))
    switch = lab.switch("direct", timeout_s=20)
    with pytest.raises(SourceModeError, match="not a plain true or false"):
        switch.to_agent()
    with pytest.raises(SourceModeError, match="not a plain true or false"):
        switch.restore()
    assert len(_log(lab.repo)) == commits
    _commit_values(lab.repo, tmp_path / "2", values)
    _wait(lambda: probe_mode(lab.url) == "server")

    change = switch.to_agent()  # a direct push
    assert change.changed and change.change["kind"] == "direct-push" and probe_mode(lab.url) == "agent"
    # the team edits the same key's neighbour since: the revert conflicts, only our key goes
    edited = _tip_file(lab.repo).replace(b"  agentMode: true  # added by promshift\n",
                                         b"  agentMode: true  # added by promshift\n  annotations: {team: gpu}\n")
    _commit_values(lab.repo, tmp_path / "3", edited)
    undo = switch.restore()
    assert undo.changed and undo.change["method"] == "unset_key" and probe_mode(lab.url) == "server"
    assert _tip_file(lab.repo) == values.replace(b"grafana:", b"  annotations: {team: gpu}\ngrafana:", 1)
    assert undo.byte_identical is False  # the team's line stays: not the bytes before our commit, and said so

    # the sync renders a config the agent refuses (rule_files kept): the real agent exits at start; the switch
    # reverts its commit and the source is a server again
    monkeypatch.setattr("promshift.local.stack.reconciler.agent_config", lambda data: data)
    edited = _tip_file(lab.repo)
    failing = lab.switch("direct", timeout_s=6)
    with pytest.raises(SourceModeError, match="was reverted and the source answers as a server again"):
        failing.to_agent()
    assert _tip_file(lab.repo) == edited and probe_mode(lab.url) == "server"
    assert _log(lab.repo)[0].startswith('promshift|Revert "promshift: retire source')
    assert lab.reconciler.restarts[-1] == "server" and lab.reconciler.errors  # the agent's failed start, logged


@pytest.mark.slow
def test_the_stacks_git_component_retires_its_source_through_the_connection_the_demo_gives(
        stack_config_factory: Any) -> None:
    """The stack's ``git`` component (``python -m promshift.local.stack.reconciler --mode-switch``) over its source:
    the switch built from the source connection's ``extra.git`` as the retire DAG's wiring builds it."""
    from promshift.adapters.git_deploy import change_backend
    from promshift.core.git_source import git_source_of
    from promshift.local.stack.local import LocalStack

    stack = LocalStack(stack_config_factory(nodes=2, git=True, reconciler_interval_s=0.5))
    try:
        stack.up(timeout=120)
        argv_before, config_before = stack.source_mode_switch().control.argv(), stack.source_config_path.read_bytes()
        source = git_source_of({"deploy": "git", "git": stack.git_source_extra(backend="github", timeout_s=90)})
        token = stack.git_token()
        switch = GitSourceModeSwitch(source, backend=change_backend(source, token), url=stack.source_url,
                                     conn_id="promshift_source", run_id="manual__stack", token=token, poll_s=0.5)
        values_before = _tip_file(Path(source.url))
        assert switch.to_agent().changed and probe_mode(stack.source_url) == "agent"
        assert "--enable-feature=agent" in stack.source_mode_switch().control.argv()
        assert _query_status(stack.source_url)[0] == 422
        undo = switch.restore()
        assert undo.byte_identical is True and probe_mode(stack.source_url) == "server"
        assert _tip_file(Path(source.url)) == values_before
        assert stack.source_mode_switch().control.argv() == argv_before
        assert stack.source_config_path.read_bytes() == config_before
    finally:
        stack.down()
