"""Retire the source: a real Prometheus 2.42 server switched to agent mode and back (no Airflow).

The source scrapes itself every second and remote-writes two "groups" (keep-filtered entries) to a real
receiving Prometheus. Proven here: the agent subset of the config is accepted by the agent, the source then
refuses queries with 422 "unavailable with Prometheus Agent" while the target keeps receiving each group with
no gap, a second switch is a no-op (the mode is read first), a crash after the config edit resumes from the
saved server bytes, and the undo puts back the config bytes and command line byte for byte, again with no gap.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.source_mode import FileSourceModeSwitch, PopenControl, probe_mode
from promshift.adapters.source_retire import HttpSampleTimes, HttpSourceObserver
from promshift.core.catalog.model import MetricGroup
from promshift.core.events import EventKind
from promshift.core.retire import allowed_gap_s, longest_gap, refused_sections
from promshift.core.stages import Stage
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PROMTOOL_BIN, PrometheusProcess, prometheus_argv
from promshift.steps.retire import RetireRefused, RetireSource

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not Path(PROMETHEUS_BIN).exists(), reason="Prometheus is not installed")]

SCRAPE_S = 1.0

SOURCE_CONFIG = """\
# The retire test's source: comments, order and spacing are the user's.
global:
  scrape_interval: 1s
  evaluation_interval: 1s

rule_files:
  - rules.yml   # a rule the agent would refuse to evaluate

alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:1']

scrape_configs:
  - job_name: self
    static_configs:
      - targets: ['127.0.0.1:{port}']

remote_write:
  # group: build (one keep-filtered entry per group)
  - url: {target}/api/v1/write
    name: promshift-build
    queue_config:
      batch_send_deadline: 1s
    write_relabel_configs:
      - source_labels: [__name__]
        regex: prometheus_build_info
        action: keep
  - url: {target}/api/v1/write
    name: promshift-process
    queue_config:
      batch_send_deadline: 1s
    write_relabel_configs:
      - source_labels: [__name__]
        regex: process_resident_memory_bytes
        action: keep
"""

RULES = """\
groups:
  - name: retire-test
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
"""

GROUPS = {"build": "prometheus_build_info", "process": "process_resident_memory_bytes"}
TARGET_CONFIG = "storage:\n  tsdb:\n    out_of_order_time_window: 10m\n"


def _http() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def _sample_times(target: str, metric: str, window_s: int) -> list[float]:
    r = _http().get(f"{target}/api/v1/query", params={"query": f'{metric}{{job="self"}}[{window_s}s]'}, timeout=10)
    r.raise_for_status()
    result = r.json()["data"]["result"]
    return sorted(float(t) for series in result for t, _ in series["values"])


def _max_gap(times: list[float], since: float) -> float:
    gap = longest_gap(times, since=since, until=max(times))
    assert gap is not None, "too few samples on the target since the switch began"
    return gap


def _wait_for(check, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)
    return result


@pytest.fixture()
def lab(tmp_path: Path, free_ports):  # noqa: ANN001, ANN201
    source_port, target_port = free_ports(2)
    # The target ingests out of order within a window, as AMP does (60 s by default): the consolidation's swap
    # sends each sample twice during its overlap and is not started on a target that would refuse the older copy.
    target = PrometheusProcess("target", tmp_path, port=target_port, config=TARGET_CONFIG,
                               flags=["--web.enable-remote-write-receiver"])
    target.__enter__()
    config = tmp_path / "source" / "prometheus.yml"
    config.parent.mkdir()
    config.write_text(SOURCE_CONFIG.format(port=source_port, target=target.url))
    config.chmod(0o640)
    (config.parent / "rules.yml").write_text(RULES)
    url = f"http://127.0.0.1:{source_port}"
    argv = prometheus_argv(config, tmp_path / "source" / "data", source_port, "--web.enable-lifecycle",
                           "--storage.tsdb.retention.time=15d", "--rules.alert.resend-delay=5s")
    control = PopenControl(argv, url=url, log_path=tmp_path / "source.log")
    control.start()
    switch = FileSourceModeSwitch(url=url, config_path=config, control=control,
                                 agent_path=tmp_path / "source" / "agent")
    try:
        for metric in GROUPS.values():
            _wait_for(lambda m=metric: len(_sample_times(target.url, m, 60)) >= 3)
        yield switch, control, target, config
    finally:
        control.stop()
        target.stop()


def test_switch_to_agent_and_back_keeps_the_target_whole_and_the_server_byte_identical(lab) -> None:  # noqa: ANN001
    switch, control, target, config = lab
    before_bytes, before_argv = config.read_bytes(), control.argv()
    assert refused_sections(before_bytes) == ["rule_files", "alerting"]
    http = _http()
    assert http.get(f"{switch.url}/api/v1/query", params={"query": "up"}, timeout=5).status_code == 200
    assert http.get(f"{switch.url}/api/v1/rules", timeout=5).json()["data"]["groups"]

    began = time.time()
    change = switch.to_agent()
    switched = time.time()
    assert change.changed and change.mode == "agent" and probe_mode(switch.url) == "agent"
    assert "--enable-feature=agent" in control.argv()
    assert not any(a.startswith(("--storage.tsdb.", "--rules.")) for a in control.argv())
    edited = config.read_bytes()
    assert refused_sections(edited) == [] and b"scrape_configs:" in edited and b"promshift-process" in edited
    assert config.stat().st_mode & 0o777 == 0o640
    # the agent stores nothing to query
    answer = http.get(f"{switch.url}/api/v1/query", params={"query": "up"}, timeout=5)
    assert answer.status_code == 422 and "unavailable with Prometheus Agent" in answer.text
    assert http.get(f"{switch.url}/api/v1/rules", timeout=5).status_code == 422
    # the target still receives every group, with no gap across the restart
    for metric in GROUPS.values():
        _wait_for(lambda m=metric: len([t for t in _sample_times(target.url, m, 120) if t > switched]) >= 3)
        gap = _max_gap(_sample_times(target.url, metric, 120), began - 3)
        assert gap <= allowed_gap_s(SCRAPE_S), f"{metric}: a {gap:.1f}s gap on the target across the switch"

    again = switch.to_agent()  # the mode is read first: nothing restarts
    assert not again.changed and again.mode == "agent"

    undone_at = time.time()
    undo = switch.restore()
    switched = time.time()
    assert undo.byte_identical and undo.mode == "server"
    assert config.read_bytes() == before_bytes and control.argv() == before_argv
    assert config.stat().st_mode & 0o777 == 0o640
    assert not switch.snapshot_path.exists()
    assert http.get(f"{switch.url}/api/v1/query", params={"query": "up"}, timeout=5).status_code == 200
    for metric in GROUPS.values():
        _wait_for(lambda m=metric: len([t for t in _sample_times(target.url, m, 120) if t > switched]) >= 3)
        gap = _max_gap(_sample_times(target.url, metric, 120), undone_at - 3)
        assert gap <= allowed_gap_s(SCRAPE_S), f"{metric}: a {gap:.1f}s gap on the target across the undo"
    assert switch.restore().changed is False  # nothing left to undo


def test_a_crash_after_the_edit_resumes_from_the_saved_server_bytes(lab) -> None:  # noqa: ANN001
    switch, control, _target, config = lab
    before_bytes, before_argv = config.read_bytes(), control.argv()
    switch._save_snapshot()
    config.write_bytes(b"# half-edited by a crashed switch\n")  # the server still runs on what it loaded
    assert probe_mode(switch.url) == "server"
    change = switch.to_agent()
    assert change.changed and probe_mode(switch.url) == "agent"
    assert b"scrape_configs:" in config.read_bytes()  # derived from the snapshot, not the broken file
    undo = switch.restore()
    assert undo.byte_identical and config.read_bytes() == before_bytes and control.argv() == before_argv


def test_a_crash_with_the_source_down_is_undone_from_the_snapshot(lab) -> None:  # noqa: ANN001
    switch, control, _target, config = lab
    before_bytes, before_argv = config.read_bytes(), control.argv()
    switch.to_agent()
    control.stop()  # the worker died between stopping the agent and starting anything: nothing runs
    assert probe_mode(switch.url) == "down"
    undo = switch.restore()
    assert undo.byte_identical and config.read_bytes() == before_bytes and control.argv() == before_argv
    assert probe_mode(switch.url) == "server"


def test_an_agent_that_fails_to_start_puts_the_server_back(lab, monkeypatch) -> None:  # noqa: ANN001
    switch, control, _target, config = lab
    before_bytes = config.read_bytes()
    # an edit that leaves a section the agent refuses: the real agent exits, the switch restores the server
    monkeypatch.setattr("promshift.adapters.source_mode.agent_config", lambda data: data)
    with pytest.raises(Exception, match="did not start as an agent"):
        switch.to_agent()
    assert probe_mode(switch.url) == "server" and config.read_bytes() == before_bytes


class _Audit:
    """The audit log's reads and appends (the store itself is tested elsewhere): stages by group."""

    def __init__(self, stages: dict[str, Stage]) -> None:
        self.stages, self.appended = stages, []
        self.url = "memory://"

    def stage_of(self, group: str) -> Stage:
        return self.stages.get(group, Stage.PLANNED)

    def events(self, *, group: str | None = None, run_id: str | None = None) -> list:
        baked = [SimpleNamespace(kind=EventKind.BAKED, at=datetime.now(UTC) - timedelta(seconds=30), group=g)
                 for g, s in self.stages.items() if s == Stage.BAKED]
        return [e for e in [*baked, *self.appended] if group is None or e.group == group]

    def append(self, **event) -> None:  # noqa: ANN003
        self.appended.append(SimpleNamespace(**event))


def test_the_retire_step_refuses_until_baked_and_accepted_then_proves_and_undoes(lab) -> None:  # noqa: ANN001
    switch, control, target, config = lab
    before_bytes, before_argv = config.read_bytes(), control.argv()
    groups = [MetricGroup(name=name, metrics=(metric,)) for name, metric in GROUPS.items()]
    audit = _Audit({"build": Stage.BAKED, "process": Stage.BAKING})
    step = RetireSource(conn_id="promshift_source", groups=groups, audit=audit, switch=switch,
                        source=HttpSourceObserver(PrometheusClient(switch.url), query_log=None, cpu_window_s=2.0),
                        target=HttpSampleTimes(PrometheusClient(target.url)), run_id="r1",
                        scrape_interval_s=SCRAPE_S)
    with pytest.raises(RetireRefused, match=r"not every group of promshift_source has baked: process \(baking\)"):
        step.prepare(datetime.now(UTC))
    audit.stages["process"] = Stage.BAKED
    prepared = step.prepare(datetime.now(UTC))
    names = prepared["names"]
    # the source's own rule, and every metric it stores that neither group carries (the fleet's are Prometheus's
    # own here, which never count), are what retiring ends
    assert "rule:retire-test/job:up:sum" in names
    assert prepared["usage_before"]["rss_mb"] > 0
    with pytest.raises(RetireRefused, match="not accepted by name: rule:retire-test/job:up:sum"):
        step.retire(datetime.now(UTC), accepted="metric:nothing-like-it")
    assert probe_mode(switch.url) == "server"
    proof = step.retire(datetime.now(UTC), accepted=",".join(names), settle_s=30)
    assert proof["mode"] == "agent" and proof["target_receiving"] and not proof["source_storing"]
    assert proof["query_status"] == 422 and proof["usage_after"]["rss_mb"] > 0
    assert proof["usage_after"]["cpu_share"] is not None and prepared["usage_before"]["cpu_share"] is not None
    print("retire usage before/after:", prepared["usage_before"], proof["usage_after"])
    assert step.retire(datetime.now(UTC), accepted="")["change"]["changed"] is False  # a retry: nothing restarts
    undo = step.unretire(datetime.now(UTC), reason="test", settle_s=30)
    assert undo["byte_identical"] and undo["target_receiving"] and undo["source_storing"]
    assert config.read_bytes() == before_bytes and control.argv() == before_argv
    kinds = [e.kind for e in audit.appended]
    assert kinds == [EventKind.SOURCE_RETIRE_REFUSED, EventKind.SOURCE_RETIRE_PREPARED,
                     EventKind.SOURCE_RETIRE_REFUSED, EventKind.SOURCE_RETIRE_APPROVED, EventKind.SOURCE_RETIRED,
                     EventKind.SOURCE_RETIRED, EventKind.SOURCE_UNRETIRED]


def test_the_local_stack_source_becomes_an_agent_stays_one_across_up_and_comes_back(stack_config_factory,  # noqa: ANN001
                                                                                   monkeypatch) -> None:  # noqa: ANN001
    from promshift.adapters.source_mode import _environ
    from promshift.local.stack.local import LocalStack

    stack = LocalStack(stack_config_factory(nodes=2))
    try:
        stack.up(timeout=90)
        switch = stack.source_mode_switch()
        before_bytes, before_argv = stack.source_config_path.read_bytes(), switch.control.argv()
        server_env = _environ(switch.control._pid())
        # the caller's environment is not the source's (a worker without the source's AWS credentials): the agent
        # gets the server's, as a service restart keeps the unit's
        monkeypatch.setenv("PROMSHIFT_RETIRE_CALLER_ONLY", "1")
        assert switch.to_agent().changed and probe_mode(stack.source_url) == "agent"
        agent_env = _environ(switch.control._pid())
        assert server_env and agent_env == server_env and "PROMSHIFT_RETIRE_CALLER_ONLY" not in agent_env
        assert b"rule_files" not in stack.source_config_path.read_bytes().replace(b"`rule_files:`", b"")
        agent_argv_now = switch.control.argv()
        plan = stack._plan(stack._components()["source"])  # the stack keeps the agent: its flags file says so
        assert plan[0] == "reuse" and switch.control.argv() == agent_argv_now
        undo = switch.restore()
        assert undo.byte_identical and stack.source_config_path.read_bytes() == before_bytes
        assert switch.control.argv() == before_argv and probe_mode(stack.source_url) == "server"
        assert stack._plan(stack._components()["source"])[0] == "reuse"
    finally:
        stack.down()


def _samples(url: str, metric: str, start: float, end: float) -> int:
    r = _http().get(f"{url}/api/v1/query", timeout=10, params={
        "query": f'sum(count_over_time({metric}{{job="self"}}[{int(end - start)}s]))', "time": f"{end:.3f}"})
    r.raise_for_status()
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def test_the_retire_merges_the_groups_entries_into_one_with_no_gap_and_the_agent_forwards_through_it(
        lab) -> None:  # noqa: ANN001
    """The file path (``compose.queue_cap`` over the source's config file, the real reload): before the switch the two
    baked groups' entries become one by the lossless swap, every sample of both counted on the target across it as
    on the source; the agent forwards through that one queue; the undo gives back the server as it was right before
    the switch (the merged entry in it: the swap is not the retire's to undo)."""
    from promshift.core.queues import promshift_queues
    from promshift.orchestration.compose import queue_cap
    from promshift.steps.migration import Backends
    from promshift.steps.retire import SourceQueues

    switch, control, target, config = lab
    source_client, target_client = PrometheusClient(switch.url), PrometheusClient(target.url)
    groups = [MetricGroup(name=name, metrics=(metric,)) for name, metric in GROUPS.items()]
    audit = _Audit({"build": Stage.BAKED, "process": Stage.BAKED})
    backends = Backends(source=source_client, target=target_client, source_config_path=str(config),
                        target_remote_write_url=f"{target.url}/api/v1/write", promtool=PROMTOOL_BIN)
    cap = queue_cap(groups[0], backends, audit=audit, proof_deadline_s=60, poll_s=1.0)
    step = RetireSource(conn_id="promshift_source", groups=groups, audit=audit, switch=switch,
                        source=HttpSourceObserver(source_client, query_log=None, cpu_window_s=2.0),
                        target=HttpSampleTimes(target_client), run_id="r1", scrape_interval_s=SCRAPE_S,
                        queues=[SourceQueues(target="promshift_target", build=lambda: (cap, "remote_write"))])
    began = time.time()
    result = step.consolidate(datetime.now(UTC))
    ended = time.time()
    r = result["targets"]["promshift_target"]
    assert r["state"] == "merged", r
    assert (r["entries_before"], r["entries_after"], r["members"]) == (2, 1, ["build", "process"])
    [merged] = promshift_queues(config.read_bytes())
    assert merged.merged and merged.groups() == ("build", "process")
    assert [e.evidence["swap"]["kind"] for e in audit.appended if e.kind == EventKind.QUEUE_SWAP_DONE] == ["merge"]
    added = next(e for e in audit.appended if e.kind == EventKind.QUEUE_SWAP_ADDED).evidence
    assert added["target_out_of_order"]["window_s"] == 600.0 and added["target_out_of_order"]["covered"] is True
    # no gap: every sample of both groups across the swap on the target, as on the source (a partial batch waits
    # its 1 s deadline, then a scrape)
    start, end = began - 5, ended + 5
    time.sleep(end + 4 - time.time())
    for metric in GROUPS.values():
        held, got = _samples(switch.url, metric, start, end), _samples(target.url, metric, start, end)
        assert held > 0 and got == held, f"{metric}: the target holds {got} samples of the source's {held}"
    consolidated_bytes, argv = config.read_bytes(), control.argv()

    proof = step.retire(datetime.now(UTC), accepted=",".join(step.prepare(datetime.now(UTC))["names"]), settle_s=30)
    assert proof["mode"] == "agent" and proof["target_receiving"] and not proof["source_storing"]
    assert [q.groups() for q in promshift_queues(config.read_bytes())] == [("build", "process")]
    undo = step.unretire(datetime.now(UTC), reason="test", settle_s=30)
    assert undo["byte_identical"] and config.read_bytes() == consolidated_bytes and control.argv() == argv
    assert step.consolidate(datetime.now(UTC))["targets"]["promshift_target"]["state"] == "already"
