"""The DCGM fleet simulator: exposition format, dcgm-exporter labels, determinism and value physics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from promshift.core.dcgm import parse_counters
from promshift.local.stack.fleet import (
    FB_TOTAL_MIB,
    XID_CODES,
    FleetServer,
    FleetSpec,
    load_counters,
    node_values,
    render_node,
    write_file_sd,
)

T0 = 1_790_000_000.0  # 2026-09-21, after every simulated node's boot
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')
DCGM_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "namespace",
    "pod",
}
COUNTERS = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
)


def parse(text: str) -> tuple[dict[str, tuple[str, str]], list[tuple[str, dict[str, str], float]]]:
    """Minimal text-format parser: ({name: (type, help)}, [(name, labels, value)]); asserts layout."""
    meta: dict[str, tuple[str, str]] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    helps: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            assert name not in helps, f"HELP twice for {name}"
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            assert name in helps and name not in meta, f"TYPE out of order for {name}"
            meta[name] = (kind, helps[name])
        else:
            match = SAMPLE.match(line)
            assert match, f"not a timestamp-free sample line: {line!r}"
            labels = {m["key"]: m["value"] for m in LABEL.finditer(match["labels"])}
            assert match["name"] in meta, f"sample before its TYPE: {line!r}"
            samples.append((match["name"], labels, float(match["value"])))
    return meta, samples


def series(text: str, metric: str) -> dict[str, float]:
    """Values of one metric keyed by the ``gpu`` label."""
    return {labels["gpu"]: value for name, labels, value in parse(text)[1] if name == metric}


@pytest.fixture(scope="module")
def fleet() -> FleetSpec:
    return FleetSpec(nodes=40)


def test_counters_come_from_dcgm_exporters_csv_with_names_stripped() -> None:
    counters = {c.name: c for c in load_counters()}
    assert "DCGM_FI_DEV_DEC_UTIL" in counters  # listed as "DCGM_FI_DEV_DEC_UTIL ," in the CSV
    assert counters["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].kind == "counter"
    assert counters["DCGM_FI_DEV_GPU_UTIL"].kind == "gauge"
    assert counters["DCGM_FI_DRIVER_VERSION"].kind == "label"
    # Commented-out lines (the PCIe counters, POWER_VIOLATION) stay out; the gauge PCIe rates stay in.
    assert counters["DCGM_FI_PROF_PCIE_TX_BYTES"].kind == "gauge"
    assert "DCGM_FI_DEV_POWER_VIOLATION" not in counters
    assert all(name == name.strip() for name in counters)


def test_parse_counters_rejects_unknown_types_and_keeps_commas_in_help() -> None:
    parsed = parse_counters("# comment\n\nDCGM_X , gauge, a, b\n")
    assert parsed[0].name == "DCGM_X" and parsed[0].help == "a, b"
    with pytest.raises(ValueError, match="unsupported metric type"):
        parse_counters("DCGM_X, histogram, nope\n")


def test_exposition_has_one_help_and_type_per_metric_then_every_gpu(fleet: FleetSpec) -> None:
    text = render_node(fleet, 3, T0)
    meta, samples = parse(text)
    expected = {c.name: (c.kind, c.help) for c in load_counters() if c.kind != "label"}
    assert meta == expected
    for name in expected:
        assert sorted(labels["gpu"] for n, labels, _ in samples if n == name) == [str(g) for g in range(8)]
    assert text.endswith("\n")


def test_labels_are_dcgm_exporters(fleet: FleetSpec) -> None:
    _, samples = parse(render_node(fleet, 17, T0))
    for _, labels, _ in samples:
        assert set(labels) == DCGM_LABELS
        gpu = labels["gpu"]
        assert labels["device"] == f"nvidia{gpu}"
        assert re.fullmatch(
            r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", labels["UUID"]
        )
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["Hostname"] == "gpu-node-0017" == fleet.hostname(17)
        assert labels["namespace"] == "training" and labels["container"] == "trainer"
        assert re.fullmatch(r"llm-train-\d{4}-\d+", labels["pod"])
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])


def test_gpu_uuids_are_unique_and_stable_across_the_fleet(fleet: FleetSpec) -> None:
    def uuids() -> list[str]:
        return [
            labels["UUID"]
            for node in range(fleet.nodes)
            for name, labels, _ in parse(render_node(fleet, node, T0))[1]
            if name == "DCGM_FI_DEV_GPU_UTIL"
        ]

    first = uuids()
    assert len(set(first)) == fleet.nodes * 8
    assert uuids() == first


def test_hostname_label_can_follow_the_2026_rename() -> None:
    renamed = FleetSpec(nodes=2, hostname_label="hostname")
    _, samples = parse(render_node(renamed, 1, T0))
    assert all(labels["hostname"] == "gpu-node-0001" and "Hostname" not in labels for _, labels, _ in samples)


def test_render_is_deterministic_per_second(fleet: FleetSpec) -> None:
    assert render_node(fleet, 5, T0) == render_node(fleet, 5, T0)
    assert render_node(fleet, 5, T0 + 0.1) == render_node(fleet, 5, T0 + 0.9)
    assert render_node(fleet, 5, T0) == render_node(FleetSpec(nodes=40), 5, T0)
    assert render_node(fleet, 5, T0) != render_node(fleet, 5, T0 + 1)
    assert render_node(fleet, 5, T0) != render_node(FleetSpec(nodes=40, seed=7), 5, T0)


def test_counters_never_decrease(fleet: FleetSpec) -> None:
    steps = [0.0, 0.3, 1.0, 1.7, 5.0, 15.0, 15.2, 60.0, 61.0, 3600.0, 86_400.0, 3 * 86_400.0 + 0.5]
    for node in (0, 9, 39):
        previous: dict[str, list[int]] = {}
        for step in steps:
            values = node_values(fleet, node, T0 + step)
            for name in COUNTERS:
                current = [int(v) for v in values[name]]
                if name in previous:
                    assert all(c >= p for c, p in zip(current, previous[name], strict=True)), (name, step)
                previous[name] = current


def test_energy_counter_integrates_power(fleet: FleetSpec) -> None:
    """rate(energy) in W matches the average power gauge over an hour, as on a real GPU."""
    hour = 3600
    start = node_values(fleet, 2, T0)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    end = node_values(fleet, 2, T0 + hour)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    watts = [node_values(fleet, 2, T0 + s)["DCGM_FI_DEV_POWER_USAGE"] for s in range(0, hour, 15)]
    for gpu in range(8):
        rate_w = (int(end[gpu]) - int(start[gpu])) / 1000 / hour
        mean_w = sum(float(w[gpu]) for w in watts) / len(watts)
        assert rate_w == pytest.approx(mean_w, rel=0.03)


def test_values_stay_in_physical_ranges_and_move(fleet: FleetSpec) -> None:
    utils: list[float] = []
    xid_nonzero = xid_total = 0
    for node in range(0, fleet.nodes, 3):
        for step in range(0, 6 * 3600, 600):
            values = {k: [float(x) for x in v] for k, v in node_values(fleet, node, T0 + step).items()}
            for gpu in range(8):
                util = values["DCGM_FI_DEV_GPU_UTIL"][gpu]
                assert 0 <= util <= 100 and util == int(util)
                utils.append(util)
                assert 30 <= values["DCGM_FI_DEV_GPU_TEMP"][gpu] <= 85
                assert 30 <= values["DCGM_FI_DEV_MEMORY_TEMP"][gpu] <= 85
                assert 60 <= values["DCGM_FI_DEV_POWER_USAGE"][gpu] <= 700
                assert 210 <= values["DCGM_FI_DEV_SM_CLOCK"][gpu] <= 1980
                used, free = values["DCGM_FI_DEV_FB_USED"][gpu], values["DCGM_FI_DEV_FB_FREE"][gpu]
                assert used + free == FB_TOTAL_MIB and used > 0 and free > 0
                for ratio in ("GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE"):
                    assert 0.0 <= values[f"DCGM_FI_PROF_{ratio}"][gpu] <= 1.0
                xid = int(values["DCGM_FI_DEV_XID_ERRORS"][gpu])
                assert xid == 0 or xid in XID_CODES
                xid_total += 1
                xid_nonzero += xid != 0
    assert xid_nonzero / xid_total < 0.01
    assert max(utils) - min(utils) > 20  # the fleet's load actually swings


def test_xid_errors_do_happen_at_fleet_scale() -> None:
    big = FleetSpec(nodes=2000)
    nonzero = sum(
        v != "0" for node in range(big.nodes) for v in node_values(big, node, T0)["DCGM_FI_DEV_XID_ERRORS"]
    )
    assert 0 < nonzero < 100


@pytest.mark.integration  # starts a process
def test_exposition_parses_with_promtool(fleet: FleetSpec) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    proc = subprocess.run(
        ["promtool", "check", "metrics"],
        input=render_node(fleet, 11, T0),
        capture_output=True,
        text=True,
        timeout=30,
    )
    output = proc.stdout + proc.stderr
    # Exit 3 means lint findings only (dcgm-exporter's camelCase labels, counters without _total);
    # a parse failure exits 1 with "error while linting".
    assert proc.returncode in (0, 3), output
    assert "error while linting" not in output


def test_hostnames_and_indexes() -> None:
    spec = FleetSpec(nodes=3)
    assert spec.hostnames() == ["gpu-node-0000", "gpu-node-0001", "gpu-node-0002"]
    assert spec.node_index("gpu-node-0002") == 2
    assert spec.node_index("gpu-node-0003") is None
    with pytest.raises(IndexError):
        spec.hostname(3)
    with pytest.raises(ValueError):
        FleetSpec(nodes=0)


def test_write_file_sd_lists_one_target_group_per_node(tmp_path: Path) -> None:
    path = write_file_sd(FleetSpec(nodes=3), 9400, tmp_path / "targets" / "dcgm.json")
    groups = json.loads(path.read_text())
    assert groups[1] == {
        "targets": ["127.0.0.1:9400"],
        "labels": {"__metrics_path__": "/nodes/gpu-node-0001/metrics", "instance": "gpu-node-0001"},
    }
    assert len(groups) == 3
    assert [p.name for p in path.parent.iterdir()] == ["dcgm.json"]  # no temp files left behind


@pytest.fixture
def server() -> Iterator[FleetServer]:
    srv = FleetServer(FleetSpec(nodes=4), ("127.0.0.1", 0), clock=lambda: T0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_server_serves_each_node_at_its_own_path(server: FleetServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    http = requests.Session()
    http.trust_env = False
    assert http.get(f"{base}/healthz", timeout=5).status_code == 200
    response = http.get(f"{base}/nodes/gpu-node-0002/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert response.text == render_node(server.fleet, 2, T0)
    assert http.get(f"{base}/nodes/gpu-node-0004/metrics", timeout=5).status_code == 404
    assert http.get(f"{base}/metrics", timeout=5).status_code == 404


def test_render_is_fast_enough_for_two_thousand_nodes() -> None:
    """2,000 nodes every 15 s is ~135 scrapes/s; rendering must take a small part of one core."""
    big = FleetSpec(nodes=2000)
    for node in range(200):
        render_node(big, node, T0)  # label strings are built once per node
    started = time.perf_counter()
    for node in range(200):
        render_node(big, node, T0 + 15)
    per_second = 200 / (time.perf_counter() - started)
    assert per_second > 1000, f"only {per_second:.0f} renders/s"


def test_a_full_framebuffer_fault_fills_the_fleets_first_gpus_and_clears(tmp_path: Path) -> None:
    """``{"fb_full_gpus": N}`` in the faults file: the first N GPUs, node by node, report 8 MiB free (so
    ``gpu:fb_used:ratio > 0.98``); every other GPU is untouched; an empty fault clears it."""
    faults = tmp_path / "fleet-faults.json"
    faults.write_text(json.dumps({"fb_full_gpus": 10}))
    srv = FleetServer(FleetSpec(nodes=3), ("127.0.0.1", 0), clock=lambda: T0, faults_file=faults)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    http = requests.Session()
    http.trust_env = False

    def ratios(node: int) -> list[float]:
        text = http.get(f"http://127.0.0.1:{srv.port}/nodes/gpu-node-{node:04d}/metrics", timeout=5).text
        used = [float(v) for v in re.findall(r"^DCGM_FI_DEV_FB_USED\{.*\} (\S+)$", text, re.M)]
        free = [float(v) for v in re.findall(r"^DCGM_FI_DEV_FB_FREE\{.*\} (\S+)$", text, re.M)]
        return [u / (u + f) for u, f in zip(used, free, strict=True)]

    try:
        assert [r > 0.98 for r in ratios(0)] == [True] * 8
        assert [r > 0.98 for r in ratios(1)] == [True, True] + [False] * 6
        assert not any(r > 0.98 for r in ratios(2))
        assert ratios(2) == [u / (u + f) for u, f in zip(*(  # untouched GPUs render as without a fault
            [float(v) for v in re.findall(rf"^{m}\{{.*\}} (\S+)$", render_node(srv.fleet, 2, T0), re.M)]
            for m in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")), strict=True)]
        faults.write_text(json.dumps({"fb_full_gpus": 0}))
        srv._faults = (0.0, {})  # noqa: SLF001 - skip the one-second re-read
        assert not any(r > 0.98 for r in ratios(0))
    finally:
        srv.shutdown()
        srv.server_close()
