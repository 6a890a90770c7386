"""The local AMP scraper API's state, and the real collector that runs behind every ACTIVE scraper.

The control plane (``promshift.local.stack.controlplane``) answers CreateScraper, DescribeScraper,
UpdateScraper, DeleteScraper, ListScrapers and GetDefaultScraperConfiguration from a
``ScraperRegistry``; the requests and answers are validated against botocore's ``amp`` model there.

Statuses move as AWS's do, over a few seconds (``delay_s``, default 2): ``CREATING -> ACTIVE``,
``UPDATING -> ACTIVE``, ``DELETING -> (gone)``. What a test needs is injected through the
control plane's ``faults.json`` under ``"scraper"``, read when the call arrives:
``{"delay_s": 1, "fail_create": "reason", "fail_update": "reason", "fail_delete": "reason",
"stuck": true, "collector_scrape_interval_s": 2}`` (a failure ends in ``CREATION_FAILED`` /
``UPDATE_FAILED`` / ``DELETION_FAILED`` with the reason as ``statusReason``; ``stuck`` never leaves
``CREATING``/``UPDATING``). After ``UPDATE_FAILED`` the scraper keeps its previous configuration
(and its collector keeps running it), as a failed update leaves the old one in place.

The collector: Debian's ``vmagent``, started with the scraper's blob and remote-writing to the
workspace through the front door, SigV4-signed (service ``aps``) with the control plane's own
pair. Where it differs from AWS, said plainly: there is no Kubernetes here, so each job's
``kubernetes_sd_configs`` becomes ``file_sd_configs`` over the local fleet's target file and the
relabel rules that read ``__meta_kubernetes_*`` labels are dropped (they could only drop every
target); ``global.external_labels`` become ``-remoteWrite.label`` flags. ``metric_relabel_configs``
(the group's keep-filter) run as written. ``collector_scrape_interval_s`` lets a test scrape
faster than the 30 s AWS allows (the blob itself is still checked by the client and keeps 30 s).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

ACCOUNT_ID = "123456789012"  # moto's default account, which owns the local workspaces
DEFAULT_DELAY_S = 2.0
# GetDefaultScraperConfiguration: the shape AWS's default has (global interval, kubernetes_sd pods and
# endpoints kept by annotation); promshift renders its own blob for a group (core.scraper_config).
DEFAULT_SCRAPER_CONFIGURATION = """\
global:
  scrape_interval: 30s
scrape_configs:
  - job_name: pod_exporter
    kubernetes_sd_configs:
      - role: pod
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
        action: keep
        regex: true
  - job_name: kubernetes-service-endpoints
    kubernetes_sd_configs:
      - role: endpoints
    relabel_configs:
      - source_labels: [__meta_kubernetes_service_annotation_prometheus_io_scrape]
        action: keep
        regex: true
"""


class ScraperNotFound(KeyError):
    """No scraper with that id."""


class ScraperConflict(RuntimeError):
    """The scraper is not in a status that allows the call (AWS answers ConflictException)."""


def local_collector_config(blob: str, targets_file: str, interval_s: float | None = None
                           ) -> tuple[dict[str, Any], dict[str, str]]:
    """The blob as vmagent here can run it, and its external labels (see the module docstring)."""
    document = yaml.safe_load(blob) or {}
    global_section = dict(document.get("global") or {})
    external = {str(k): str(v) for k, v in (global_section.pop("external_labels", None) or {}).items()}
    if interval_s:
        global_section["scrape_interval"] = f"{interval_s:g}s"
        global_section["scrape_timeout"] = f"{max(interval_s - 0.5, 0.5):g}s"
    jobs = []
    for job in document.get("scrape_configs") or []:
        job = dict(job)
        if job.pop("kubernetes_sd_configs", None) is not None:
            job.setdefault("file_sd_configs", []).append({"files": [targets_file]})
            job["relabel_configs"] = [
                rule for rule in job.get("relabel_configs") or []
                if not any(str(label).startswith("__meta_kubernetes_") for label in rule.get("source_labels") or [])
            ]
        if interval_s:
            job.pop("scrape_interval", None)
            job.pop("scrape_timeout", None)
        jobs.append(job)
    return {"global": global_section, "scrape_configs": jobs}, external


@dataclass
class _Scraper:
    scraper_id: str
    arn: str
    alias: str | None
    blob: str  # the configuration in force (base64, as sent)
    source: dict[str, Any]
    destination: dict[str, Any]
    tags: dict[str, str]
    created_at: datetime
    modified_at: datetime
    status: str = "CREATING"
    status_reason: str | None = None
    # The transition in flight: (status it ends in, reason, monotonic time it happens or None when stuck).
    pending: tuple[str, str | None, float | None] | None = None
    pending_blob: str | None = None
    collector: subprocess.Popen[bytes] | None = None
    collector_interval_s: float | None = None

    def description(self, role_arn: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "scraperId": self.scraper_id, "arn": self.arn, "roleArn": role_arn,
            "status": {"statusCode": self.status}, "createdAt": self.created_at.isoformat(),
            "lastModifiedAt": self.modified_at.isoformat(), "tags": dict(self.tags),
            "scrapeConfiguration": {"configurationBlob": self.blob}, "source": self.source,
            "destination": self.destination,
        }
        if self.alias:
            data["alias"] = self.alias
        if self.status_reason:
            data["statusReason"] = self.status_reason
        return data


@dataclass
class ScraperRegistry:
    """The local scrapers, their status transitions, and their collectors."""

    region: str
    frontdoor_url: str
    state_dir: Path
    targets_file: str | None = None
    vmagent_bin: str = "/usr/bin/vmagent"
    find_port: Callable[[], int] | None = None
    now: Callable[[], float] = time.monotonic
    _scrapers: dict[str, _Scraper] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def role_arn(self) -> str:
        return (f"arn:aws:iam::{ACCOUNT_ID}:role/aws-service-role/scraper.aps.amazonaws.com/"
                "AWSServiceRoleForAmazonPrometheusScraper")

    # -- API ---------------------------------------------------------------------------------
    def create(self, params: Mapping[str, Any], faults: Mapping[str, Any]) -> dict[str, Any]:
        scraper_id = "s-" + str(uuid.uuid4())
        stamp = datetime.now(UTC)
        scraper = _Scraper(
            scraper_id=scraper_id, arn=f"arn:aws:aps:{self.region}:{ACCOUNT_ID}:scraper/{scraper_id}",
            alias=params.get("alias"), blob=str(params["scrapeConfiguration"]["configurationBlob"]),
            source=dict(params["source"]), destination=dict(params["destination"]),
            tags=dict(params.get("tags") or {}), created_at=stamp, modified_at=stamp)
        scraper.pending = self._plan(faults, "fail_create", "CREATION_FAILED")
        scraper.collector_interval_s = _collector_interval(faults)
        with self._lock:
            self._scrapers[scraper_id] = scraper
        return {"scraperId": scraper_id, "arn": scraper.arn, "status": {"statusCode": "CREATING"},
                "tags": dict(scraper.tags)}

    def describe(self, scraper_id: str) -> dict[str, Any]:
        self.tick()
        with self._lock:
            return {"scraper": self._get(scraper_id).description(self.role_arn)}

    def update(self, scraper_id: str, params: Mapping[str, Any], faults: Mapping[str, Any]) -> dict[str, Any]:
        self.tick()
        with self._lock:
            scraper = self._get(scraper_id)
            if scraper.status not in ("ACTIVE", "UPDATE_FAILED"):
                raise ScraperConflict(f"scraper {scraper_id} is {scraper.status}; it can be updated only when "
                                      "ACTIVE or UPDATE_FAILED")
            if "alias" in params:
                scraper.alias = params["alias"]
            if "destination" in params:
                scraper.destination = dict(params["destination"])
            if "scrapeConfiguration" in params:
                scraper.pending_blob = str(params["scrapeConfiguration"]["configurationBlob"])
            scraper.status, scraper.status_reason = "UPDATING", None
            scraper.modified_at = datetime.now(UTC)
            scraper.pending = self._plan(faults, "fail_update", "UPDATE_FAILED")
            scraper.collector_interval_s = _collector_interval(faults) or scraper.collector_interval_s
            return {"scraperId": scraper_id, "arn": scraper.arn, "status": {"statusCode": "UPDATING"},
                    "tags": dict(scraper.tags)}

    def delete(self, scraper_id: str, faults: Mapping[str, Any]) -> dict[str, Any]:
        self.tick()
        with self._lock:
            scraper = self._get(scraper_id)
            if scraper.status == "DELETING":
                raise ScraperConflict(f"scraper {scraper_id} is already DELETING")
            self._stop_collector(scraper)
            scraper.status, scraper.status_reason = "DELETING", None
            scraper.pending = self._plan(faults, "fail_delete", "DELETION_FAILED", success="DELETED")
            return {"scraperId": scraper_id, "status": {"statusCode": "DELETING"}}

    def list(self, filters: Mapping[str, list[str]]) -> dict[str, Any]:
        self.tick()
        with self._lock:
            found = []
            for scraper in self._scrapers.values():
                if "alias" in filters and scraper.alias not in filters["alias"]:
                    continue
                if "status" in filters and scraper.status not in filters["status"]:
                    continue
                description = scraper.description(self.role_arn)
                description.pop("scrapeConfiguration")
                found.append(description)
            return {"scrapers": found}

    # -- transitions and collectors ------------------------------------------------------------
    def _plan(self, faults: Mapping[str, Any], failure_key: str, failed: str,
              success: str = "ACTIVE") -> tuple[str, str | None, float | None]:
        settings = faults.get("scraper") or {}
        delay = float(settings.get("delay_s", DEFAULT_DELAY_S))
        at = None if settings.get("stuck") else self.now() + delay
        reason = settings.get(failure_key)
        return (failed, str(reason), at) if reason else (success, None, at)

    def _get(self, scraper_id: str) -> _Scraper:
        try:
            return self._scrapers[scraper_id]
        except KeyError:
            raise ScraperNotFound(scraper_id) from None

    def tick(self) -> None:
        """Finish every transition whose time has come; start, restart or stop collectors to match."""
        with self._lock:
            for scraper in list(self._scrapers.values()):
                if scraper.pending is None:
                    self._watch_collector(scraper)
                    continue
                status, reason, at = scraper.pending
                if at is None or self.now() < at:
                    continue
                scraper.pending = None
                scraper.modified_at = datetime.now(UTC)
                if status == "DELETED":
                    del self._scrapers[scraper.scraper_id]
                    continue
                scraper.status, scraper.status_reason = status, reason
                if status == "ACTIVE":
                    if scraper.pending_blob is not None:
                        scraper.blob, scraper.pending_blob = scraper.pending_blob, None
                    self._start_collector(scraper)
                elif status == "UPDATE_FAILED":
                    scraper.pending_blob = None  # the previous configuration stays in force

    def _watch_collector(self, scraper: _Scraper) -> None:
        if scraper.status == "ACTIVE" and scraper.collector is not None and scraper.collector.poll() is not None:
            logger.warning("collector of scraper %s exited (%s); restarting it", scraper.scraper_id,
                           scraper.collector.returncode)
            self._start_collector(scraper)

    def _start_collector(self, scraper: _Scraper) -> None:
        self._stop_collector(scraper)
        if self.targets_file is None or self.find_port is None or not shutil.which(self.vmagent_bin):
            logger.warning("scraper %s is ACTIVE but no collector runs (no targets file or vmagent)",
                           scraper.scraper_id)
            return
        workspace_arn = scraper.destination.get("ampConfiguration", {}).get("workspaceArn", "")
        workspace_id = workspace_arn.rsplit("/", 1)[-1]
        blob = base64.b64decode(scraper.blob).decode()
        config, external = local_collector_config(blob, self.targets_file, scraper.collector_interval_s)
        home = self.state_dir / "scrapers" / scraper.scraper_id
        home.mkdir(parents=True, exist_ok=True)
        (home / "scrape.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            self.vmagent_bin, f"-promscrape.config={home / 'scrape.yml'}",
            f"-remoteWrite.url={self.frontdoor_url}/workspaces/{workspace_id}/api/v1/remote_write",
            "-remoteWrite.aws.useSigv4=true", f"-remoteWrite.aws.region={self.region}",
            "-remoteWrite.aws.service=aps", "-remoteWrite.flushInterval=1s",
            f"-remoteWrite.tmpDataPath={home / 'data'}", f"-httpListenAddr=127.0.0.1:{self.find_port()}",
            *(f"-remoteWrite.label={k}={v}" for k, v in sorted(external.items())),
        ]
        log = (home / "vmagent.log").open("ab")
        # Same process group as the control plane: stopping the stack stops its collectors too.
        scraper.collector = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=dict(os.environ))
        log.close()
        logger.info("scraper %s: collector vmagent pid %s writing to %s", scraper.scraper_id,
                    scraper.collector.pid, workspace_id)

    @staticmethod
    def _stop_collector(scraper: _Scraper) -> None:
        proc, scraper.collector = scraper.collector, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop_all(self) -> None:
        with self._lock:
            for scraper in self._scrapers.values():
                self._stop_collector(scraper)

    def collector_pids(self) -> dict[str, int]:
        """Running collectors by scraper id (local-only, for tests)."""
        with self._lock:
            return {s.scraper_id: s.collector.pid for s in self._scrapers.values()
                    if s.collector is not None and s.collector.poll() is None}


def collector_processes(scrapers_dir: Path, scraper_id: str = "") -> list[int]:
    """Pids of the running collectors (vmagent) of the scrapers under ``scrapers_dir`` (``<state-dir>/scrapers``),
    or of one scraper: the ``-promscrape.config`` in their argv names its folder. For tests and demo faults,
    which run outside the control plane's process (its ``ScraperRegistry.collector_pids``)."""
    marker = f"-promscrape.config={scrapers_dir}/" + (f"{scraper_id}/" if scraper_id else "")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").startswith(marker) for arg in argv):
            pids.append(int(entry.name))
    return sorted(pids)


def _collector_interval(faults: Mapping[str, Any]) -> float | None:
    value = (faults.get("scraper") or {}).get("collector_scrape_interval_s")
    return float(value) if value else None
