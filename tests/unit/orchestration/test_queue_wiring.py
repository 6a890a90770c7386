"""``GroupWiring.queue_cap``: which deploy path gets a merge swap (the file path and the ``Prometheus`` resource) and
which refuses past the cap (the ConfigMap), built from the connections alone (nothing is called)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from promshift.core.queues import ConfigChange
from promshift.local.stack.k8s_api import kubeconfig
from promshift.orchestration.wiring import GroupWiring
from promshift.steps.migration import Backends
from tests.unit.orchestration.test_operators import CATALOG, PROFILE, env  # noqa: F401  (audit DB, connections)


class Wiring(GroupWiring):
    def __init__(self) -> None:
        self._init_group(group_name="gpu-memory", catalog_path=str(CATALOG), profile=PROFILE,
                         source_conn_id="promshift_source", target_conn_id="promshift_target")


def backends() -> Backends:
    from promshift.adapters.prometheus import PrometheusClient

    client = PrometheusClient("http://127.0.0.1:1")
    return Backends(source=client, target=client, source_config_path="",
                    target_remote_write_url="http://127.0.0.1:1/api/v1/write")


def _source(monkeypatch: pytest.MonkeyPatch, env: Path, kind: str) -> None:  # noqa: F811
    config = env / "kubeconfig.json"
    config.write_text(json.dumps(kubeconfig("http://127.0.0.1:1", "monitoring")))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": "http://127.0.0.1:1",
        "extra": {"deploy": kind, "max_queues": 3, "kubernetes": {"namespace": "monitoring", "name": "k8s",
                                                                  "config_file": str(config), "timeout_s": 42}}}))


def test_a_k8s_cr_source_gets_a_swap_whose_edits_go_through_its_prometheus_resource(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from promshift.adapters.k8s_edits import PrometheusCREditDeployment

    _source(monkeypatch, env, "k8s-cr")
    queues: Any = Wiring().queue_cap(backends(), audit=None)
    assert queues.cap() == 3 and queues.swap_ports is not None
    deployer_for, _probe = queues.swap_ports()
    change = ConfigChange("add promshift--merged-x (merge)", lambda data: data)
    deployer = deployer_for(change)
    assert isinstance(deployer, PrometheusCREditDeployment)
    assert (deployer.namespace, deployer.name, deployer.timeout_s, deployer.change) == ("monitoring", "k8s", 42, change)


def test_a_configmap_source_has_no_swap_and_is_refused_past_the_cap(env: Path,  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _source(monkeypatch, env, "k8s-configmap")
    queues: Any = Wiring().queue_cap(backends(), audit=None)
    assert queues.cap() == 3 and queues.swap_ports is None


def test_the_swaps_out_of_order_window_is_read_through_the_target_connections_hook(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Not from the migration's target client (an AMP workspace serves no status/config): the target hook's own
    reader (a Prometheus's loaded config here; an AMP workspace's configuration through ``AmpHook``)."""
    from tests.unit.adapters.test_out_of_order_window import FakePrometheus

    _source(monkeypatch, env, "k8s-cr")
    target = FakePrometheus()
    try:
        target.yaml = "storage:\n  tsdb:\n    out_of_order_time_window: 2m\n"
        monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
            "conn_type": "prometheus", "host": target.url,
            "extra": {"remote_write_url": f"{target.url}/api/v1/write"}}))
        queues: Any = Wiring().queue_cap(backends(), audit=None)
        assert target.asked == 0  # read when a swap is about to start, never when wired
        assert queues.out_of_order_window() == (120.0, f"storage.tsdb.out_of_order_time_window of {target.url}")
        assert queues.scrape_interval_s == Wiring().group.scrape_interval_s
    finally:
        target.close()


@pytest.mark.parametrize(("kind", "has_swap"), [("k8s-cr", True), ("k8s-configmap", False)])
def test_the_retire_builds_one_queue_swap_per_target_from_one_of_its_groups(
        env: Path, monkeypatch: pytest.MonkeyPatch, kind: str, has_swap: bool) -> None:  # noqa: F811
    """``retire_queues``: every group of the source writing to one target shares that target's swap, built from the
    first of them with the group's own wiring (the same path, cap and edits), and only when the consolidation runs."""
    from promshift.adapters.k8s_edits import PrometheusCREditDeployment
    from promshift.adapters.settings import load_catalog
    from promshift.orchestration.wiring import retire_queues

    _source(monkeypatch, env, kind)
    groups = [g for g in load_catalog(str(CATALOG), profile=PROFILE).groups if g.source == "promshift_source"]
    assert len(groups) > 1 and {g.target for g in groups} == {"promshift_target"}
    [queues] = retire_queues(groups, catalog_path=str(CATALOG), profile=PROFILE, audit=None)
    assert queues.target == "promshift_target"
    cap, path = queues.build()
    assert path == kind and cap.scrape_interval_s == groups[0].scrape_interval_s and cap.cap() == 3
    assert (cap.swap_ports is not None) is has_swap
    if has_swap:
        deployer = cap.swap_ports()[0](ConfigChange("add x (merge)", lambda data: data))
        assert isinstance(deployer, PrometheusCREditDeployment) and deployer.name == "k8s"


def test_each_members_scrape_interval_comes_from_the_catalog(env: Path,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlap guard's window is set by a swap's slowest member: the wiring reads each member's from the catalog
    (an unknown name: None, the deploying group's then counts)."""
    from promshift.adapters.settings import load_catalog

    _source(monkeypatch, env, "k8s-cr")
    queues: Any = Wiring().queue_cap(backends(), audit=None)
    catalog = {g.name: g.scrape_interval_s for g in load_catalog(str(CATALOG), profile=PROFILE).groups}
    assert queues.member_interval_s is not None
    for name, interval in catalog.items():
        assert queues.member_interval_s(name) == float(interval)
    assert queues.member_interval_s("not-a-group") is None
