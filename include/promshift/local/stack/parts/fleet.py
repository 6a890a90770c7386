"""The simulated fleet: one scrape target per node (``python -m promshift.local.stack.fleet``) and its faults."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from promshift.local.stack.fleet import FleetSpec
from promshift.local.stack.processes import StackProcesses
from promshift.local.stack.spec import FLEET, Component

logger = logging.getLogger(__name__)


class FleetPart(StackProcesses):
    """The fleet's address, its faults file and its process."""

    @property
    def fleet(self) -> FleetSpec:
        """The fleet this stack simulates."""
        return FleetSpec(nodes=self.config.nodes, seed=self.config.seed)

    @property
    def fleet_url(self) -> str:
        """Base URL of the fleet simulator."""
        return f"http://127.0.0.1:{self.config.fleet_port}"

    @property
    def fleet_faults_path(self) -> Path:
        """The fleet's faults (``promshift.local.stack.fleet``), re-read every second."""
        return self.home / "fleet-faults.json"

    def set_fleet_faults(self, *, fb_full_gpus: int = 0) -> None:
        """Inject (or, with 0, clear) the fleet's faults: the first ``fb_full_gpus`` GPUs report a full framebuffer,
        so gpu-memory's ``GpuMemoryNearlyFull`` fires for them once its ``for:`` has passed."""
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.fleet_faults_path.with_name(".fleet-faults.json.tmp")
        tmp.write_text(json.dumps({"fb_full_gpus": int(fb_full_gpus)}) + "\n")
        os.replace(tmp, self.fleet_faults_path)

    def _fleet_components(self) -> dict[str, Component]:
        cfg = self.config
        fleet_argv = (
            sys.executable,
            "-m",
            "promshift.local.stack.fleet",
            "--nodes",
            str(cfg.nodes),
            "--port",
            str(cfg.fleet_port),
            "--seed",
            str(cfg.seed),
            f"--faults-file={self.fleet_faults_path}",
        )
        return {
            FLEET: Component(
                FLEET,
                cfg.fleet_port,
                fleet_argv,
                self.fleet_url,
                f"{self.fleet_url}/healthz",
                "promshift.local.stack.fleet",
                "PROMSHIFT_FLEET_PORT",
            ),
        }
