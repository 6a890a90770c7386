"""Simulated DCGM fleet: N nodes x 8 GPUs exposing dcgm-exporter's metrics, one scrape target per node.

Metric names, types and HELP texts come from dcgm-exporter's ``default-counters.csv``
(package data). Every value is a deterministic function of (fleet seed, node, GPU,
metric, whole second of ``t``), so two scrapes of the same node in the same second
agree, a replay of the same instant gives the same numbers, and a parity check can
predict what the source should hold. Counters are closed-form integrals of the
gauges they accumulate, so they never decrease as ``t`` grows.

Run it with ``python -m promshift.local.stack.fleet --nodes N --port P``; it serves
``GET /nodes/<hostname>/metrics`` and ``GET /healthz`` on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from promshift.adapters.settings import dcgm_counters
from promshift.core.dcgm import DcgmCounter as CounterSpec

logger = logging.getLogger(__name__)

MODEL_NAME = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "570.133.20"
FB_TOTAL_MIB = 81559  # what nvidia-smi reports as total for an H100 80GB HBM3
FB_RESERVED_MIB = 579
MEM_CLOCK_MHZ = 2619  # HBM3 clock on H100 SXM; it does not move with load
SM_CLOCK_MAX_MHZ = 1980
# PCI bus ids of the 8 GPUs on an HGX H100 board, in nvidia-smi order.
PCI_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# Counters count from a fixed "boot" a few weeks before this instant (2026-01-01T00:00Z),
# so they stay well inside float64's exact-integer range.
BOOT_EPOCH = 1_767_225_600
NODES_PER_JOB = 16
# XIDs that show up on real training fleets (13: graphics engine exception, 31: MMU fault,
# 48: DBE, 63/64: row remapping, 74: NVLink, 79: fallen off the bus, 94/95: contained/uncontained ECC).
XID_CODES = (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class FleetSpec:
    """Shape of the simulated fleet; the same spec always yields the same metrics."""

    nodes: int
    gpus_per_node: int = 8
    seed: int = 0
    hostname_prefix: str = "gpu-node-"
    # dcgm-exporter renamed ``Hostname`` to ``hostname`` in 2026; a fleet can simulate either.
    hostname_label: str = "Hostname"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"a fleet needs at least one node, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= len(PCI_BUS_IDS):
            raise ValueError(f"gpus_per_node must be 1..{len(PCI_BUS_IDS)}, got {self.gpus_per_node}")

    def hostname(self, i: int) -> str:
        """Hostname of node ``i`` (0-based), e.g. ``gpu-node-0001``."""
        if not 0 <= i < self.nodes:
            raise IndexError(f"node {i} is outside a fleet of {self.nodes}")
        return f"{self.hostname_prefix}{i:04d}"

    def hostnames(self) -> list[str]:
        """All hostnames, in node order."""
        return [self.hostname(i) for i in range(self.nodes)]

    def node_index(self, hostname: str) -> int | None:
        """Node index for ``hostname``, or None when the fleet has no such node."""
        return _host_index(self).get(hostname)


def load_counters() -> tuple[CounterSpec, ...]:
    """dcgm-exporter's default counters: the package's one list (``promshift.data``), parsed once."""
    return dcgm_counters()


def gpu_uuid(hostname: str, gpu: int) -> str:
    """Stable fake GPU UUID in nvidia-smi's ``GPU-xxxxxxxx-xxxx-...`` form."""
    digest = hashlib.sha256(f"{hostname}/{gpu}".encode()).digest()
    return f"GPU-{uuid.UUID(bytes=digest[:16])}"


def _unit(*parts: object) -> float:
    """Deterministic uniform [0, 1) from the parts; used for per-node/GPU constants."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass(frozen=True)
class _GPU:
    """Constants of one GPU that its time series are built from."""

    labels: str  # the rendered ``{...}`` label set
    load_offset: float  # stragglers and fast ranks in the same job
    temp_offset: float  # cooling differs per slot
    fb_used_base: float
    energy_at_boot_mj: float
    pcie_replay_rate: float  # retries per second; 0 for healthy links
    remapped_correctable: int
    remapped_uncorrectable: int
    xid_key: int


@dataclass(frozen=True)
class _Node:
    """Precomputed constants of one node, so a scrape only does arithmetic and joins."""

    index: int
    hostname: str
    boot: float
    load_mean: float  # job-level mean load in [0, 1]
    load_amp: float  # amplitude of the job's slow load swing
    omega: float  # angular frequency of that swing (rad/s)
    phase: float
    gpus: tuple[_GPU, ...]


@functools.lru_cache(maxsize=64)
def _host_index(fleet: FleetSpec) -> dict[str, int]:
    return {fleet.hostname(i): i for i in range(fleet.nodes)}


@functools.lru_cache(maxsize=1)
def _headers() -> tuple[tuple[CounterSpec, ...], dict[str, str]]:
    counters = tuple(c for c in load_counters() if c.kind != "label")
    headers = {
        c.name: f"# HELP {c.name} {_escape_help(c.help)}\n# TYPE {c.name} {c.kind}\n" for c in counters
    }
    return counters, headers


# One entry per (fleet, node), a few KB each (mostly label strings): 2,000 nodes need ~10 MB.
@functools.lru_cache(maxsize=65536)
def _node(fleet: FleetSpec, node_index: int) -> _Node:
    host = fleet.hostname(node_index)
    job, rank = divmod(node_index, NODES_PER_JOB)
    job_key = (fleet.seed, "job", job)
    node_key = (fleet.seed, "node", node_index)
    pod = f"llm-train-{job:04d}-{rank}"
    # Jobs differ in how hard they push the GPUs and how fast their load swings (data-loader
    # stalls, eval phases): a 15-45 minute period keeps rate() windows interesting.
    load_mean = 0.62 + 0.25 * _unit(*job_key, "mean")
    load_amp = 0.05 + 0.12 * _unit(*job_key, "amp")
    period = 900.0 + 1800.0 * _unit(*job_key, "period")
    phase = 2 * math.pi * _unit(*job_key, "phase")
    fb_job = 52_000.0 + 24_000.0 * _unit(*job_key, "fb")
    boot = BOOT_EPOCH - 86_400.0 * (3 + 40 * _unit(*node_key, "boot"))
    gpus: list[_GPU] = []
    for g in range(fleet.gpus_per_node):
        gkey = (*node_key, "gpu", g)
        labels = {
            "gpu": str(g),
            "UUID": gpu_uuid(host, g),
            "pci_bus_id": f"00000000:{PCI_BUS_IDS[g]}:00.0",
            "device": f"nvidia{g}",
            "modelName": MODEL_NAME,
            fleet.hostname_label: host,
            "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
            "container": "trainer",
            "namespace": "training",
            "pod": pod,
        }
        label_text = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"
        flaky_link = _unit(*gkey, "pcie") < 0.04
        remap = _unit(*gkey, "remap")
        gpus.append(
            _GPU(
                labels=label_text,
                load_offset=0.06 * (_unit(*gkey, "load") - 0.5),
                temp_offset=8.0 * (_unit(*gkey, "temp") - 0.5),
                fb_used_base=fb_job + 600.0 * (_unit(*gkey, "fb") - 0.5),
                energy_at_boot_mj=float(int(5e6 * _unit(*gkey, "energy"))),
                pcie_replay_rate=(1 / 3600 + _unit(*gkey, "pcie-rate") / 600) if flaky_link else 0.0,
                remapped_correctable=1 + int(3 * _unit(*gkey, "remap-n")) if remap < 0.05 else 0,
                remapped_uncorrectable=1 if remap < 0.005 else 0,
                xid_key=int(_unit(*gkey, "xid") * 2**31),
            )
        )
    return _Node(
        index=node_index,
        hostname=host,
        boot=boot,
        load_mean=load_mean,
        load_amp=load_amp,
        omega=2 * math.pi / period,
        phase=phase,
        gpus=tuple(gpus),
    )


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def node_values(fleet: FleetSpec, node_index: int, t: float, *, fb_full: int = 0) -> dict[str, list[str]]:
    """Rendered sample values for every metric of one node at time ``t``, one string per GPU.

    ``fb_full``: that many of the node's first GPUs have their framebuffer full (a fault: 8 MiB free)."""
    node = _node(fleet, node_index)
    sec = math.floor(t)
    # One generator per (node, second) instead of hashing every sample: ~60 draws per node.
    rng = random.Random(((fleet.seed * 1_000_003 + node_index) << 40) + (sec & (2**40 - 1)))
    noise = rng.random
    up = max(sec - node.boot, 0.0)
    arg = node.omega * max(sec, node.boot) + node.phase
    swing = math.sin(arg)
    # Closed-form integral of the smooth load since boot, shared by the energy and NVLink counters:
    # its derivative is load_mean + offset + load_amp * sin(...) > 0, so counters only grow.
    swing_integral = (node.load_amp / node.omega) * (
        math.cos(node.omega * node.boot + node.phase) - math.cos(arg)
    )
    hour = sec // 3600
    sm_clock: list[str] = []
    mem_clock: list[str] = []
    mem_temp: list[str] = []
    gpu_temp: list[str] = []
    power: list[str] = []
    energy: list[str] = []
    replay: list[str] = []
    util: list[str] = []
    copy_util: list[str] = []
    xid: list[str] = []
    fb_free: list[str] = []
    fb_used: list[str] = []
    nvlink: list[str] = []
    remap_u: list[str] = []
    remap_c: list[str] = []
    gr_active: list[str] = []
    tensor: list[str] = []
    dram: list[str] = []
    pcie_tx: list[str] = []
    pcie_rx: list[str] = []
    mean = node.load_mean + node.load_amp * swing
    for slot, gpu in enumerate(node.gpus):
        smooth = mean + gpu.load_offset
        load = _clamp(smooth + 0.12 * (noise() - 0.5), 0.0, 1.0)
        watts = _clamp(70.0 + 610.0 * load + 20.0 * (noise() - 0.5), 60.0, 700.0)
        temp = _clamp(33.0 + 46.0 * smooth + gpu.temp_offset + 2.0 * noise(), 30.0, 85.0)
        used = int(gpu.fb_used_base + 160.0 * noise())
        if slot < fb_full:
            used = FB_TOTAL_MIB - 8
        load_integral = (node.load_mean + gpu.load_offset) * up + swing_integral
        dram_ratio = _clamp(0.45 * load + 0.04 * noise(), 0.0, 1.0)

        util.append(str(int(round(100.0 * load))))
        gr_active.append(str(round(0.985 * load, 6)))
        tensor.append(str(round(_clamp(0.58 * load + 0.04 * (noise() - 0.5), 0.0, 1.0), 6)))
        dram.append(str(round(dram_ratio, 6)))
        copy_util.append(str(int(round(100.0 * dram_ratio))))
        power.append(str(round(watts, 3)))
        gpu_temp.append(str(int(temp)))
        mem_temp.append(str(int(_clamp(temp + 5.0 + 3.0 * noise(), 30.0, 85.0))))
        # Boost clock drops in 15 MHz steps as the board nears its 700 W limit.
        sm_clock.append(str(SM_CLOCK_MAX_MHZ - 15 * int(max(0.0, watts - 600.0) / 20.0)))
        mem_clock.append(str(MEM_CLOCK_MHZ))
        fb_used.append(str(used))
        fb_free.append(str(FB_TOTAL_MIB - used))
        energy.append(str(int(gpu.energy_at_boot_mj + 1000.0 * (70.0 * up + 610.0 * load_integral))))
        # ~400 GB/s of NVLink all-reduce traffic at full load, counted in MB.
        nvlink.append(str(int(400_000.0 * load_integral)))
        replay.append(str(int(gpu.pcie_replay_rate * up)))
        pcie_tx.append(str(int(2.0e8 * load + 4.0e7 * noise())))
        pcie_rx.append(str(int(9.0e8 * load + 1.5e8 * noise())))
        remap_u.append(str(gpu.remapped_uncorrectable))
        remap_c.append(str(gpu.remapped_correctable))
        # Roughly one GPU in 2,000 shows an XID for an hour: mostly zeros, never all zeros at scale.
        h = ((gpu.xid_key ^ (hour * 0x9E3779B1)) * 0x85EBCA6B) & 0xFFFFFFFF
        xid.append(str(XID_CODES[h % len(XID_CODES)]) if (h >> 8) % 2000 == 0 else "0")
    zeros = ["0"] * len(node.gpus)
    return {
        "DCGM_FI_DEV_SM_CLOCK": sm_clock,
        "DCGM_FI_DEV_MEM_CLOCK": mem_clock,
        "DCGM_FI_DEV_MEMORY_TEMP": mem_temp,
        "DCGM_FI_DEV_GPU_TEMP": gpu_temp,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": replay,
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": copy_util,
        # Training never touches NVENC/NVDEC.
        "DCGM_FI_DEV_ENC_UTIL": zeros,
        "DCGM_FI_DEV_DEC_UTIL": zeros,
        "DCGM_FI_DEV_XID_ERRORS": xid,
        "DCGM_FI_DEV_FB_FREE": fb_free,
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_RESERVED": [str(FB_RESERVED_MIB)] * len(node.gpus),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": nvlink,
        # Bare metal: no vGPU licence to report.
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": zeros,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": remap_u,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": remap_c,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": zeros,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr_active,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
        "DCGM_FI_PROF_DRAM_ACTIVE": dram,
        "DCGM_FI_PROF_PCIE_TX_BYTES": pcie_tx,
        "DCGM_FI_PROF_PCIE_RX_BYTES": pcie_rx,
    }


def render_node(fleet: FleetSpec, node_index: int, t: float, *, fb_full: int = 0) -> str:
    """Prometheus text exposition of one node's GPUs at time ``t``, like dcgm-exporter's /metrics."""
    node = _node(fleet, node_index)
    counters, headers = _headers()
    values = node_values(fleet, node_index, t, fb_full=fb_full)
    labels = [gpu.labels for gpu in node.gpus]
    parts: list[str] = []
    append = parts.append
    for counter in counters:
        name = counter.name
        append(headers[name])
        # A CSV metric the model does not know stays at 0 rather than vanishing from the target.
        for label_text, value in zip(labels, values.get(name) or ["0"] * len(labels), strict=True):
            append(f"{name}{label_text} {value}\n")
    return "".join(parts)


def file_sd_groups(fleet: FleetSpec, port: int, host: str = "127.0.0.1") -> list[dict[str, object]]:
    """Prometheus file_sd target groups: one per node, all on one address, told apart by path."""
    return [
        {
            "targets": [f"{host}:{port}"],
            "labels": {"__metrics_path__": f"/nodes/{name}/metrics", "instance": name},
        }
        for name in fleet.hostnames()
    ]


def write_file_sd(fleet: FleetSpec, port: int, path: Path | str) -> Path:
    """Write the fleet's file_sd JSON atomically (Prometheus must never read half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(file_sd_groups(fleet, port), indent=1)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class _FleetHandler(BaseHTTPRequestHandler):
    server: FleetServer
    server_version = "promshift-fleet/1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            return
        parts = path.split("/")
        if len(parts) == 4 and parts[0] == "" and parts[1] == "nodes" and parts[3] == "metrics":
            index = self.server.fleet.node_index(parts[2])
            if index is not None:
                full = self.server.fb_full_gpus()
                gpus = self.server.fleet.gpus_per_node
                body = render_node(self.server.fleet, index, self.server.clock(),
                                   fb_full=max(0, min(gpus, full - index * gpus))).encode()
                self._reply(200, body, CONTENT_TYPE)
                return
        self._reply(404, b"not found\n", "text/plain; charset=utf-8")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # Access logs at ~100 scrapes/s would only burn the one core this runs on.
        pass


class FleetServer(ThreadingHTTPServer):
    """HTTP server for a simulated fleet; each node's metrics live under its own path."""

    daemon_threads = True
    allow_reuse_address = True
    # Prometheus starts all targets' scrape loops at once; a deep backlog avoids SYN retries.
    request_queue_size = 1024

    def __init__(
        self,
        fleet: FleetSpec,
        address: tuple[str, int] = ("127.0.0.1", 0),
        clock: Callable[[], float] = time.time,
        faults_file: Path | None = None,
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self.faults_file = faults_file
        self._faults: tuple[float, dict[str, Any]] = (0.0, {})
        self._faults_lock = threading.Lock()
        super().__init__(address, _FleetHandler)

    def faults(self) -> dict[str, Any]:
        """``--faults-file``'s JSON, re-read at most once a second ({} when absent or unreadable)."""
        if self.faults_file is None:
            return {}
        with self._faults_lock:
            read_at, faults = self._faults
            now = time.monotonic()
            if now - read_at >= 1.0:
                try:
                    loaded = json.loads(self.faults_file.read_text()[:65_536])
                    faults = loaded if isinstance(loaded, dict) else {}
                except (OSError, ValueError):
                    faults = {}
                self._faults = (now, faults)
            return faults

    def fb_full_gpus(self) -> int:
        """How many GPUs (the fleet's first, node by node) report a full framebuffer: ``{"fb_full_gpus": N}``."""
        try:
            return max(0, int(self.faults().get("fb_full_gpus") or 0))
        except (TypeError, ValueError):
            return 0

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        return int(self.server_address[1])


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a simulated fleet until interrupted or terminated."""
    parser = argparse.ArgumentParser(
        prog="python -m promshift.local.stack.fleet", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, required=True, help="number of nodes (8 GPUs each)")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--hostname-label", default="Hostname", help="'Hostname' (classic) or 'hostname'")
    parser.add_argument("--file-sd", type=Path, help="also write a file_sd JSON for this fleet here")
    parser.add_argument("--faults-file", type=Path, help='faults to inject, re-read every second: {"fb_full_gpus": N}')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = FleetSpec(nodes=args.nodes, seed=args.seed, hostname_label=args.hostname_label)
    server = FleetServer(fleet, (args.host, args.port), faults_file=args.faults_file)
    # Build every node's label strings now, so the first round of scrapes is not slow.
    for i in range(fleet.nodes):
        _node(fleet, i)
    if args.file_sd:
        write_file_sd(fleet, server.port, args.file_sd)
    logger.info(
        "serving %s nodes x %s GPUs on http://%s:%s", fleet.nodes, fleet.gpus_per_node, args.host, server.port
    )
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
