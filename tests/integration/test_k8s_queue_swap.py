"""Bounded write queues on the k8s-cr path: three cut-over groups merged into one entry of the ``Prometheus`` resource
with no gap, then one rolls back out of it; a swap never proven is undone with the spec as it was.

A 2-node lab stack with its ``k8s`` component (the Kubernetes API contract server and the operator stand-in,
which renders ``spec.remoteWrite`` onto the real source Prometheus 2.42 and reloads it), a second Prometheus
receiving remote writes as the target, 1 s scrapes. Every edit goes through the Kubernetes API under the
resource's ``resourceVersion`` (``adapters.k8s_edits``) and is followed until the source's loaded config shows
it; every gap is counted on the target (the samples it holds of each metric against the source's own count).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.config import new_client_from_config

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.k8s_deploy import CR_GROUP, CR_PLURAL, CR_VERSION, MERGE_PATCH, PrometheusCRDeployment
from promshift.adapters.k8s_edits import PrometheusCREditDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.queue_probe import PrometheusQueueProbe, target_out_of_order_window
from promshift.adapters.routing import RoutingStore
from promshift.core.catalog import MetricGroup
from promshift.core.deploy import ConfigDeployer, DeployResult, InMemorySnapshotStore
from promshift.core.queues import ConfigChange, promshift_queues
from promshift.core.render import remote_write_names
from promshift.core.resource_queues import remote_write_view
from promshift.core.stages import Stage
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.orchestration.compose import compose_migration, queue_cap
from promshift.steps.deploy import final_event
from promshift.steps.migration import Backends
from promshift.steps.queues import QueueSwap, SwapFailed
from tests.integration.conftest import eventually
from tests.integration.test_queue_swap import BATCH_DEADLINE_S, DROPS, GROUPS, assert_no_gap

# slow: run by make e2e (.ci/run), which keeps make test inside its 15-minute budget
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NS, NAME = "monitoring", "k8s"


def theirs(stack: LocalStack) -> dict[str, Any]:
    """Another team's queue in the resource (its ``up`` series to the target: a queue to a dead endpoint would hold
    the source's shutdown for its 1-min flush deadline). A swap never touches it: its value stays what it was."""
    return {"name": "team-vm", "url": stack.target_remote_write_url, "remoteTimeout": "30s",
            "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "up", "action": "keep"}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, free_ports: Callable[[int], list[int]]) -> Iterator[LocalStack]:
    fleet, source, target = free_ports(3)
    s = LocalStack(StackConfig(home=tmp_path_factory.mktemp("k8s-queues"), nodes=2, fleet_port=fleet,
                               source_port=source, target_port=target, scrape_interval="1s", kubernetes=True))
    try:
        s.up(timeout=90)
        # The target ingests out of order within a window, as AMP does (60 s by default): the swap's overlap sends
        # each sample twice, and a plain Prometheus receiver refuses a whole batch holding an older duplicate (HTTP
        # 400), so a merged queue's batch straddling the removal would lose its newer samples (measured: 48 of 464).
        config = yaml.safe_load(s.target_config_path.read_text())
        config["storage"] = {"tsdb": {"out_of_order_time_window": "1h"}}
        s.target_config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        requests.post(f"{s.target_url}/-/reload", timeout=30).raise_for_status()
        yield s
    finally:
        s.down()


@pytest.fixture(scope="module")
def api(stack: LocalStack) -> ApiClient:
    client = new_client_from_config(config_file=str(stack.kubeconfig_path))
    CustomObjectsApi(client).patch_namespaced_custom_object(
        CR_GROUP, CR_VERSION, NS, CR_PLURAL, NAME, {"spec": {"remoteWrite": [theirs(stack)]}},
        _content_type=MERGE_PATCH)
    source = PrometheusClient(stack.source_url)
    eventually(lambda: remote_write_names(source.config_text()) == ["team-vm"], 30, "team-vm never loaded")
    return client


def now() -> datetime:
    return datetime.now(UTC)


def spec(stack: LocalStack) -> dict[str, Any]:
    return dict(stack.prometheus_cr()["spec"])


def rest_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec but its ``remoteWrite``: what no swap may change."""
    return {k: v for k, v in spec.items() if k != "remoteWrite"}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def follow(deployer: ConfigDeployer, waiting: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
    result = DeployResult.from_dict(waiting)
    deadline = time.time() + timeout_s
    while not result.state.final:
        assert time.time() < deadline, f"still {result.status} after {timeout_s}s"
        time.sleep(0.2)
        result = deployer.verify(result, now())
    return final_event(result)


def edits(api: ApiClient, source: PrometheusClient) -> Callable[[ConfigChange], ConfigDeployer]:
    return lambda change: PrometheusCREditDeployment(api, namespace=NS, name=NAME, change=change, prometheus=source,
                                                     timeout_s=30)


def test_the_deploy_step_merges_three_cut_over_groups_in_the_resource_then_one_rolls_back_out_of_it(
        stack: LocalStack, api: ApiClient, tmp_path: Path) -> None:
    """A fourth group's snapshot step finds the source at its cap (3) and merges the three cut-over groups' entries
    of ``spec.remoteWrite`` first (add, prove on the target, remove: each an edit through the Kubernetes API), with
    no gap; fb's rollback then leaves the merged entry by one more swap before its own restore. The rest of the
    spec, and the other team's entry, are never touched."""
    source = PrometheusClient(stack.source_url, timeout_s=30)
    target = PrometheusClient(stack.target_url, timeout_s=30)
    others = rest_of(spec(stack))
    audit = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    backends = Backends(source=source, target=target, source_config_path=str(stack.source_config_path),
                        target_remote_write_url=stack.target_remote_write_url)
    metrics = {**GROUPS, "clocks": ("DCGM_FI_DEV_SM_CLOCK",)}

    def deploy(name: str) -> tuple[Any, PrometheusCRDeployment, dict[str, Any]]:
        group = MetricGroup(name=name, metrics=metrics[name], drop_labels=DROPS.get(name, ()), owners=("o",),
                            approvers=("p",), max_queues=3)
        m = compose_migration(group, backends, audit=audit, routing=RoutingStore(audit.url), run_id=f"manual__{name}",
                              snapshots_dir=tmp_path / "snapshots", snapshots=InMemorySnapshotStore(),
                              deployer=lambda: PrometheusCRDeployment(api, namespace=NS, name=NAME, entry=m.entry(),
                                                                      prometheus=source, timeout_s=30),
                              queues=queue_cap(group, backends, audit=audit, file_path=False,
                                               edits=edits(api, source), proof_deadline_s=60, poll_s=1.0))
        info = m.snapshot(now())
        out = m.deploy_dual_write(info, now())
        m.finish_deploy(follow(m.deploy_step.deployer, out["waiting"]), out["quota"], now(), snapshot_info=info)
        return m, m.deploy_step.deployer, info

    try:
        runs = {g: deploy(g) for g in GROUPS}
        start = time.time() + 3  # a new entry starts at its reload (no WAL history): count from wholly after it
        assert [e["name"] for e in spec(stack)["remoteWrite"]] == ["team-vm", *(f"promshift-{g}" for g in GROUPS)]
        eventually(lambda: all(int(target.scalar(f"count({m})") or 0) == int(source.scalar(f"count({m})") or 0) > 0
                               for g in GROUPS for m in GROUPS[g]), 60, "the per-group entries never delivered")
        for m, _, _ in runs.values():  # cut over (the stages the merge reads; reads stay where they are)
            for kind, stage in (("warmup_started", Stage.WARMING), ("gate_passed", Stage.VERIFIED),
                                ("approved", Stage.APPROVED), ("cut_over", Stage.CUT_OVER)):
                m.record(kind, now(), {}, to=stage)

        t0 = time.monotonic()
        _, _, clocks_info = deploy("clocks")  # at the cap: the three are merged first
        merge_s = time.monotonic() - t0
        after = spec(stack)
        names = [e["name"] for e in after["remoteWrite"]]
        merged = clocks_info["queues"]["merged_first"]["add"]
        assert names == ["team-vm", merged, "promshift-clocks"]
        assert after["remoteWrite"][0] == theirs(stack) and rest_of(after) == others
        view = remote_write_view(after["remoteWrite"])
        assert [q.groups() for q in promshift_queues(view)] == [("fb", "gpu-util", "power"), ("clocks",)]
        assert remote_write_names(source.config_text()) == names  # the operator rendered it; the source loaded it
        assert [e.kind for e in audit.events(group="clocks")] == [
            "queue_swap_added", "queue_swap_done", "snapshot_taken", "dual_write_deployed"]
        assert clocks_info["queues"]["merged_first"]["remove"] == [f"promshift-{g}" for g in GROUPS]
        added = audit.events(group="clocks")[0].evidence_data
        assert added["target_out_of_order"] == {  # read from the target's loaded config when the swap started
            "window_s": 3600.0, "origin": f"storage.tsdb.out_of_order_time_window of {stack.target_url}",
            "needed_s": 60.0, "scrape_interval_s": 30.0, "covered": True}
        done = audit.events(group="clocks")[1].evidence_data
        assert set(done["proof"]["per_group"]) == set(GROUPS) and done["deploy"]["kind"] == "k8s-cr"
        time.sleep(BATCH_DEADLINE_S + 4)  # a queue sends a partial batch after batch_send_deadline
        counted = assert_no_gap(source, target, list(GROUPS), start, time.time() - BATCH_DEADLINE_S - 2)

        # fb's bake failed: its rollback leaves the merged entry first, then restores its own (gone) entry.
        m_fb, fb_deployer, info_fb = runs["fb"]
        left_at, t0 = time.time(), time.monotonic()
        out = m_fb.rollback(info_fb, reason="bake failed", now=now())
        rolled = m_fb.finish_rollback(follow(fb_deployer, out["waiting"]), info_fb, reason="bake failed", now=now())
        leave_s = time.monotonic() - t0
        after = spec(stack)
        view = remote_write_view(after["remoteWrite"])
        assert [q.groups() for q in promshift_queues(view)] == [("clocks",), ("gpu-util", "power")]
        assert after["remoteWrite"][0] == theirs(stack) and rest_of(after) == others
        assert rolled["left_merged_entry"]["leaving"] == "fb" and rolled["performed"] is True
        assert [e.kind for e in audit.events(group="fb")][-3:] == ["queue_swap_added", "queue_swap_done", "rolled_back"]
        assert audit.stage_of("fb") is Stage.ROLLED_BACK
        assert remote_write_names(source.config_text()) == [e["name"] for e in after["remoteWrite"]]
        time.sleep(BATCH_DEADLINE_S + 4)
        end = time.time() - BATCH_DEADLINE_S - 2
        assert end > left_at
        assert_no_gap(source, target, ["gpu-util", "power"], start, end)
        eventually(lambda: int(target.scalar("count(count_over_time(DCGM_FI_DEV_FB_USED[3s]))") or 0) == 0,
                   20, "fb still written after its rollback")
        assert audit.verify().ok
        print(f"k8s-cr: merge through the snapshot step {merge_s:.1f}s, leave through the rollback {leave_s:.1f}s; "
              f"samples counted on the target {sum(counted.values())}")
    finally:
        audit.engine.dispose()


def test_a_swap_never_proven_is_undone_with_the_resources_spec_as_it_was(
        stack: LocalStack, api: ApiClient) -> None:
    """A target selector nothing matches: the proof cannot pass, so nothing is removed and the add is undone; the
    resource's spec is canonically what it was (the snapshot's list written back under its lock)."""
    source, target = PrometheusClient(stack.source_url), PrometheusClient(stack.target_url)
    before = copy.deepcopy(spec(stack))
    names = remote_write_names(source.config_text())
    events: list[tuple[Any, ...]] = []
    swaps = QueueSwap(deployer_for=edits(api, source),
                      probe=PrometheusQueueProbe(source, target, target_matchers=',nowhere="x"'),
                      record=lambda kind, at, evidence: events.append((kind, dict(evidence))),
                      out_of_order_window=lambda: target_out_of_order_window(target), scrape_interval_s=1.0,
                      proof_deadline_s=5, poll_s=1.0)
    groups = [q.groups()[0] for q in promshift_queues(swaps.live()) if not q.merged]
    assert groups, "the test before left no group's own entry to merge"
    swap = swaps.plan_merge(url=stack.target_remote_write_url, cut_over=groups)
    assert swap is not None
    with pytest.raises(SwapFailed, match="not proven in 5s"):
        swaps.run(swap, clock=now, wait=time.sleep)
    assert canonical(spec(stack)) == canonical(before)
    eventually(lambda: remote_write_names(source.config_text()) == names, 20, "the undone add is still loaded")
    assert [e[0].value for e in events] == ["queue_swap_added", "queue_swap_undone"]
    assert events[-1][1]["restored_identical"] is True
