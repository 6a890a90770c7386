"""What faces the local Airflow: the source's scrape of promshift's own ``/metrics``, and Airflow's process group.

The source scrapes the board's ``/metrics`` on the local Airflow's API server (job ``promshift``) with a bearer
token from a file (``scrape_promshift``); its target list stays empty until an Airflow is there. The demo's
Airflow (``promshift.local.airflow_lab``: ``airflow standalone``, or the celery executor's api-server, scheduler,
dag-processor, triggerer and workers, all in one process group) records its process group in ``airflow.pid``, so
``stack down`` stops it with the rest; a recycled pid is signalled only if a member of that group runs Airflow.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

from promshift.local.stack.processes import _CHILDREN, StackProcesses, _cmdline
from promshift.local.stack.spec import AIRFLOW, AIRFLOW_MARKER, PROMSHIFT_JOB, SOURCE, StackError

logger = logging.getLogger(__name__)


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (read from /proc: the leader may have exited before them)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _airflow_group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member running Airflow (or one of its Celery workers)."""
    for pid in _group_members(pgid):
        cmdline = " ".join(_cmdline(pid))
        if AIRFLOW_MARKER in cmdline or "[celeryd:" in cmdline:
            return True
    return False


def _stop_group(pgid: int, timeout: float) -> None:
    """SIGTERM the whole group, wait until no member is left, SIGKILL what remains."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while _group_members(pgid) and time.monotonic() < deadline:
            child = _CHILDREN.get(pgid)
            if child is not None:
                child.poll()
            time.sleep(0.2)
        left = _group_members(pgid)
        if not left:
            return
        logger.warning("airflow process group %s ignored %s for %ss: %s", pgid, signal.Signals(sig).name, wait_s,
                       "; ".join(" ".join(_cmdline(pid))[:80] or str(pid) for pid in left))


class AirflowPart(StackProcesses):
    """The source's scrape of promshift's ``/metrics`` and stopping the local Airflow with the stack."""

    @property
    def promshift_sd_path(self) -> Path:
        """The file_sd JSON naming the Airflow API server whose board the source scrapes (job ``promshift``)."""
        return self.home / SOURCE / "targets" / f"{PROMSHIFT_JOB}.json"

    @property
    def promshift_token_path(self) -> Path:
        """The bearer token the source sends to promshift's ``/metrics`` (0600; ``scrape_promshift`` writes it)."""
        return self.home / SOURCE / "promshift.token"

    def scrape_promshift(self, address: str, token: str) -> None:
        """Have the source scrape promshift's own metrics at ``address`` (``host:port`` of an Airflow API server)
        with ``token``: the token file first (0600, replaced whole: a scrape never reads half of one), then the
        target. Prometheus reads both files as they change, so a refreshed token needs no reload."""
        if not token or any(c.isspace() for c in token):
            raise StackError("the token for promshift's /metrics is empty or not one word")
        path = self.promshift_token_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.chmod(tmp, 0o600)  # an existing tmp keeps its old mode through O_CREAT
        os.replace(tmp, path)
        targets = [{"targets": [address], "labels": {}}]
        sd = self.promshift_sd_path
        sd.parent.mkdir(parents=True, exist_ok=True)
        if not sd.exists() or json.loads(sd.read_text() or "[]") != targets:
            sd_tmp = sd.with_name(f".{sd.name}.tmp")
            sd_tmp.write_text(json.dumps(targets))
            os.replace(sd_tmp, sd)

    def _write_promshift_scrape_files(self) -> None:
        """An empty target list and an empty token file while no Airflow is there (``scrape_promshift`` fills them)."""
        if not self.promshift_sd_path.exists():  # no Airflow yet: job promshift has no target (scrape_promshift)
            self.promshift_sd_path.parent.mkdir(parents=True, exist_ok=True)
            self.promshift_sd_path.write_text("[]")
        if not self.promshift_token_path.exists():  # promtool (every deployer's check) stats the credentials file
            os.close(os.open(self.promshift_token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    def _stop_airflow(self, timeout: float) -> None:
        """Stop the local Airflow's process group when one is recorded and still runs Airflow."""
        airflow = self._read_pid(AIRFLOW)
        if airflow is not None and _airflow_group_alive(airflow):
            logger.info("stopping airflow (process group %s)", airflow)
            _stop_group(airflow, timeout)
        self.pid_path(AIRFLOW).unlink(missing_ok=True)
