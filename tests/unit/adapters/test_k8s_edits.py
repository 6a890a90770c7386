"""A queue swap's edit of the ``Prometheus`` resource on the Kubernetes API contract server: written under the
``resourceVersion`` it was read at, a 409 from another writer refused with nothing written, our own earlier write
taken as done, the snapshot's list written back exactly, and another writer's edit kept on a restore."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from promshift.adapters.k8s_edits import PrometheusCREditDeployment
from promshift.adapters.prometheus import PrometheusClient
from promshift.core.deploy import DeployError, DeployState
from promshift.core.git_render import operator_entry
from promshift.core.queues import plan_merge, swap_changes
from promshift.core.render import remote_write_entry
from promshift.core.resource_queues import remote_write_view
from promshift.local.stack.k8s_api import PROMETHEUSES, K8sApiServer

NS, NAME = "monitoring", "k8s"
URL = "http://127.0.0.1:9/api/v1/write"
THEIRS = {"name": "team-vm", "url": "http://127.0.0.1:9/vm", "remoteTimeout": "30s"}
NOW = datetime(2026, 12, 6, 11, 0, tzinfo=UTC)


def entries() -> list[dict[str, Any]]:
    return [copy.deepcopy(THEIRS), *(operator_entry(remote_write_entry(group_name=g, name_regex=f"M_{g}", url=URL))
                                     for g in ("a", "b"))]


@pytest.fixture
def server() -> Iterator[K8sApiServer]:
    s = K8sApiServer().start()
    try:
        s.create(PROMETHEUSES, NS, NAME, {"metadata": {"labels": {"prometheus": "k8s"}},
                                          "spec": {"evaluationInterval": "30s", "remoteWrite": entries()}})
        yield s
    finally:
        s.stop()


def deployers(server: K8sApiServer) -> tuple[Any, Any]:
    """The merge's add and removal, each a ConfigDeployer over the resource (no Prometheus: nothing verified)."""
    api = ApiClient(Configuration(host=server.base_url))
    swap = plan_merge(remote_write_view(entries()), url=URL, cut_over=["a", "b"])
    assert swap is not None
    add, remove = swap_changes(swap)
    prometheus = PrometheusClient("http://127.0.0.1:1")
    return tuple(PrometheusCREditDeployment(api, namespace=NS, name=NAME, change=c, prometheus=prometheus)
                 for c in (add, remove))  # type: ignore[return-value]


def test_the_add_and_removal_edit_only_promshift_entries_and_the_restore_writes_the_list_back(
        server: K8sApiServer) -> None:
    add, remove = deployers(server)
    before = server.get(PROMETHEUSES, NS, NAME)
    snap = add.snapshot()
    assert snap.meta["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert snap.content.encode() == remote_write_view(entries())
    started = add.deploy(snap, NOW)
    assert started.state is DeployState.WAITING and started.status == "CR_UPDATED"
    spec = server.get(PROMETHEUSES, NS, NAME)["spec"]
    assert [e["name"] for e in spec["remoteWrite"][:3]] == ["team-vm", "promshift-a", "promshift-b"]
    assert spec["remoteWrite"][0] == THEIRS and spec["remoteWrite"][3]["name"].startswith("promshift--merged-")
    done = remove.deploy(remove.snapshot(), NOW)
    assert done.state is DeployState.WAITING
    assert [e["name"] for e in server.get(PROMETHEUSES, NS, NAME)["spec"]["remoteWrite"]][:1] == ["team-vm"]
    assert len(server.get(PROMETHEUSES, NS, NAME)["spec"]["remoteWrite"]) == 2
    merged = server.get(PROMETHEUSES, NS, NAME)
    with pytest.raises(DeployError, match="undo it with a leave swap, nothing written"):
        add.restore(snap, NOW)  # past the removal, the add's snapshot would drop the merged entry: refused
    assert server.get(PROMETHEUSES, NS, NAME) == merged


def test_an_undone_add_writes_the_snapshots_list_back_exactly(server: K8sApiServer) -> None:
    add, _ = deployers(server)
    before = server.get(PROMETHEUSES, NS, NAME)
    snap = add.snapshot()
    add.deploy(snap, NOW)
    restored = add.restore(snap, NOW)
    assert restored.state is DeployState.WAITING and restored.details["restored_identical"] is True
    after = server.get(PROMETHEUSES, NS, NAME)
    assert after["spec"] == before["spec"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


def test_a_409_from_another_writer_is_refused_and_our_own_earlier_write_is_taken_as_done(
        server: K8sApiServer) -> None:
    add, _ = deployers(server)
    snap = add.snapshot()
    server.edit(PROMETHEUSES, NS, NAME, lambda obj: obj["spec"].update({"replicas": 3}))
    theirs = server.get(PROMETHEUSES, NS, NAME)
    with pytest.raises(DeployError, match=r"^409 Conflict: prometheus monitoring/k8s was changed by another writer"):
        add.deploy(snap, NOW)
    assert server.get(PROMETHEUSES, NS, NAME) == theirs  # nothing of ours written
    snap = add.snapshot()
    add.deploy(snap, NOW)
    ours = server.get(PROMETHEUSES, NS, NAME)
    again = add.deploy(snap, NOW)  # a retried phase with the old snapshot: 409, but the object holds our write
    assert again.state is DeployState.WAITING and server.get(PROMETHEUSES, NS, NAME) == ours


def test_a_restore_after_another_writer_edited_the_list_takes_out_only_the_added_entry(
        server: K8sApiServer) -> None:
    add, _ = deployers(server)
    snap = add.snapshot()
    add.deploy(snap, NOW)
    vm2 = {"name": "team-vm2", "url": "http://127.0.0.1:9/vm2"}
    server.edit(PROMETHEUSES, NS, NAME, lambda obj: obj["spec"]["remoteWrite"].append(vm2))
    restored = add.restore(snap, NOW)
    assert restored.details["restored_identical"] is False
    assert server.get(PROMETHEUSES, NS, NAME)["spec"]["remoteWrite"] == [*entries(), vm2]
