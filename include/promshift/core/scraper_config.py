"""The AMP managed collector's scrape configuration for a group: render, check, and read its status.

The blob is a Prometheus scrape configuration (YAML, sent base64-encoded as
``scrapeConfiguration.configurationBlob`` of ``CreateScraper``/``UpdateScraper``). It has the
shape of the one ``GetDefaultScraperConfiguration`` returns: ``global.scrape_interval`` and
``scrape_configs`` whose jobs discover pods with ``kubernetes_sd_configs`` and keep them with
``relabel_configs`` on ``__meta_kubernetes_*`` labels. The group's keep-filter is the job's
``metric_relabel_configs`` (``action: keep`` on ``__name__``), so the collector writes only the
group's metrics to the workspace.

Limits a blob is checked against before any API call (``validate_scraper_config``):

- only ``global`` and ``scrape_configs`` at the top level, so no ``remote_write`` (the
  destination is the scraper's ``destination``, not the blob), no ``rule_files``/``alerting``:
  AWS's page "Scraper configuration" (Amazon CloudWatch user guide, managed Prometheus
  collectors, which use the same ``CreateScraper`` API and blob) lists ``global`` and
  ``scrape_configs`` as the supported top-level sections;
- service discovery: ``kubernetes_sd_configs`` (what an EKS-sourced scraper discovers with, as
  in ``GetDefaultScraperConfiguration``) and ``static_configs``; ``file_sd_configs`` and every
  other ``*_sd_configs`` are refused (a managed collector has no file system of ours to read);
- scrape interval at least 30 s, global and per job (the managed collector's minimum, as
  recorded in promshift's DESIGN.md "Managed-scraper configs: interval >= 30 s"), and at most 5 min
  (a limit of ours: beyond Prometheus' 5-minute look-back every series is stale between scrapes);
- at most ``max_blob_bytes`` bytes (default 64 KiB): a cap of our own. No size limit for the
  blob is in botocore's model (``Blob`` has no ``max``) or on the pages above; a group's blob
  is ~1 KiB, so anything near the cap is a rendering bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from promshift.core.deploy import DeployState
from promshift.core.durations import parse_duration
from promshift.core.inputs import InputBudget, InputRefused, parse_yaml_bounded

MIN_SCRAPE_INTERVAL_S = 30.0
# Above Prometheus' 5-minute look-back a series goes stale between two scrapes: queries see gaps, not data.
MAX_SCRAPE_INTERVAL_S = 300.0
MAX_BLOB_BYTES = 64 * 1024
ALLOWED_TOP_LEVEL = ("global", "scrape_configs")
ALLOWED_SD = ("kubernetes_sd_configs", "static_configs")
# Scraper statuses (botocore's ``amp`` model, ScraperStatusCode).
PENDING = ("CREATING", "UPDATING", "DELETING")
FAILED = ("CREATION_FAILED", "UPDATE_FAILED", "DELETION_FAILED")
ACTIVE = "ACTIVE"
DELETED = "DELETED"  # not an AWS status: DescribeScraper answers ResourceNotFoundException


class ScraperConfigError(ValueError):
    """The blob breaks a managed-collector limit; nothing was sent to AWS."""


@dataclass(frozen=True)
class ScraperJob:
    """Which pods the collector scrapes for a group: dcgm-exporter's, by pod label and port name."""

    job_name: str = "dcgm"
    pod_label: str = "app.kubernetes.io/name"
    pod_label_value: str = "dcgm-exporter"
    port_name: str = "metrics"
    namespace: str | None = None


@dataclass(frozen=True)
class ScraperLimits:
    """The limits a blob is checked against (see the module docstring for where each comes from)."""

    min_scrape_interval_s: float = MIN_SCRAPE_INTERVAL_S
    max_scrape_interval_s: float = MAX_SCRAPE_INTERVAL_S
    max_blob_bytes: int = MAX_BLOB_BYTES


def _meta_label(name: str) -> str:
    """``app.kubernetes.io/name`` as Prometheus' kubernetes_sd exposes it on pods."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in name)


def render_scraper_config(*, name_regex: str, scrape_interval_s: float, job: ScraperJob = ScraperJob(),
                          external_labels: Mapping[str, str] | None = None, drop_labels: tuple[str, ...] = ()) -> str:
    """The group's scrape configuration blob (YAML text): dcgm-exporter pods, the group's metrics only.

    ``drop_labels`` (the group's declared drops) add a ``labeldrop`` after the keep filter, as on remote_write.
    """
    interval = _duration_text(scrape_interval_s)
    sd: dict[str, Any] = {"role": "pod"}
    if job.namespace:
        sd["namespaces"] = {"names": [job.namespace]}
    scrape_job: dict[str, Any] = {
        "job_name": job.job_name,
        "scrape_interval": interval,
        "kubernetes_sd_configs": [sd],
        "relabel_configs": [
            {"source_labels": [_meta_label(job.pod_label)], "regex": job.pod_label_value, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": job.port_name,
             "action": "keep"},
            # dcgm-exporter labels its series with Hostname itself; the instance is the pod's node.
            {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "instance"},
        ],
        "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": name_regex, "action": "keep"}],
    }
    if drop_labels:
        scrape_job["metric_relabel_configs"].append({"regex": "|".join(drop_labels), "action": "labeldrop"})
    document: dict[str, Any] = {"global": {"scrape_interval": interval}, "scrape_configs": [scrape_job]}
    if external_labels:
        document["global"]["external_labels"] = dict(external_labels)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def _duration_text(seconds: float) -> str:
    if seconds <= 0 or seconds != int(seconds):
        raise ScraperConfigError(f"scrape interval must be a whole number of seconds > 0, got {seconds!r}")
    return f"{int(seconds)}s"


def validate_scraper_config(blob: str, limits: ScraperLimits = ScraperLimits()) -> dict[str, Any]:
    """The parsed blob, or ScraperConfigError naming the first limit it breaks (one line)."""
    size = len(blob.encode())
    if size > limits.max_blob_bytes:
        raise ScraperConfigError(f"scraper configuration is {size} bytes; the limit is {limits.max_blob_bytes}")
    try:
        document = parse_yaml_bounded(blob, InputBudget("scraper configuration", max_bytes=limits.max_blob_bytes,
                                                        max_depth=32, max_alias_nodes=1_000))
    except InputRefused as exc:
        raise ScraperConfigError(str(exc)) from None
    if not isinstance(document, dict):
        raise ScraperConfigError("scraper configuration must be a YAML mapping at the top level")
    unsupported = sorted(str(key) for key in document if key not in ALLOWED_TOP_LEVEL)
    if unsupported:
        raise ScraperConfigError(
            f"scraper configuration has unsupported top-level section(s) {', '.join(unsupported)}: a managed "
            f"collector takes only {' and '.join(ALLOWED_TOP_LEVEL)} (its destination is the workspace, "
            "not remote_write)")
    global_section = document.get("global") or {}
    if not isinstance(global_section, dict):
        raise ScraperConfigError("scraper configuration: global must be a mapping")
    default_interval = _interval(global_section.get("scrape_interval", "1m"), "global", limits)
    jobs = document.get("scrape_configs")
    if not isinstance(jobs, list) or not jobs:
        raise ScraperConfigError("scraper configuration needs at least one scrape_configs job")
    names: set[str] = set()
    for index, job in enumerate(jobs):
        if not isinstance(job, dict) or not job.get("job_name"):
            raise ScraperConfigError(f"scrape_configs[{index}] needs a job_name")
        name = str(job["job_name"])
        if name in names:
            raise ScraperConfigError(f"scrape_configs has job_name {name!r} twice")
        names.add(name)
        if "scrape_interval" in job:
            _interval(job["scrape_interval"], f"job {name!r}", limits)
        elif default_interval is None:
            raise ScraperConfigError(f"job {name!r} has no scrape interval")
        sd_keys = sorted(str(key) for key in job if str(key).endswith("_sd_configs") or key == "static_configs")
        refused = [key for key in sd_keys if key not in ALLOWED_SD]
        if refused:
            raise ScraperConfigError(
                f"job {name!r} uses {', '.join(refused)}: a managed collector discovers targets with "
                f"{' or '.join(ALLOWED_SD)} only (no file-based or other service discovery)")
        if not sd_keys:
            raise ScraperConfigError(f"job {name!r} has no kubernetes_sd_configs or static_configs: it scrapes nothing")
    return document


def _interval(value: Any, where: str, limits: ScraperLimits) -> float:
    try:
        seconds = parse_duration(str(value))
    except ValueError:
        raise ScraperConfigError(f"{where} scrape_interval {value!r} is not a duration") from None
    if seconds < limits.min_scrape_interval_s:
        raise ScraperConfigError(f"{where} scrape_interval {value} is below the managed collector's minimum of "
                                 f"{limits.min_scrape_interval_s:g}s")
    if seconds > limits.max_scrape_interval_s:
        raise ScraperConfigError(f"{where} scrape_interval {str(value)[:40]} is above "
                                 f"{limits.max_scrape_interval_s:g}s: beyond Prometheus' 5-minute look-back every "
                                 "series would be stale between scrapes")
    return seconds


def keep_regexes(document: Mapping[str, Any]) -> list[str]:
    """The ``__name__`` keep-filters of every job's metric_relabel_configs (what the blob writes)."""
    found = []
    for job in document.get("scrape_configs") or []:
        for rule in job.get("metric_relabel_configs") or []:
            if rule.get("action") == "keep" and list(rule.get("source_labels") or []) == ["__name__"]:
                found.append(str(rule.get("regex")))
    return found


@dataclass(frozen=True)
class ScraperAssessment:
    """What one status observation means for a deploy: its DeployState and a one-line reason."""

    state: DeployState
    reason: str


def assess_scraper(status: str, status_reason: str | None, *, expect: str, elapsed_s: float,
                   timeout_s: float) -> ScraperAssessment:
    """Decide from one DescribeScraper status whether to keep waiting.

    ``expect`` is ``ACTIVE`` (after create or update) or ``DELETED`` (after delete; the caller
    passes ``DELETED`` when DescribeScraper says the scraper is gone). Any ``*_FAILED`` status
    fails with AWS's ``statusReason``: botocore's ``ScraperActive`` waiter fails only on
    ``CREATION_FAILED`` and would keep waiting through ``UPDATE_FAILED``.
    """
    reason = f": {status_reason}" if status_reason else ""
    if status in FAILED:
        return ScraperAssessment(DeployState.FAILED, f"scraper is {status}{reason}")
    if status == expect:
        return ScraperAssessment(DeployState.DONE, f"scraper is {status}")
    if status in PENDING or (expect == DELETED and status == ACTIVE):
        if elapsed_s > timeout_s:
            return ScraperAssessment(DeployState.TIMEOUT, f"scraper still {status} after {elapsed_s:.0f}s "
                                                          f"(deadline {timeout_s:.0f}s)")
        return ScraperAssessment(DeployState.WAITING, f"scraper is {status} ({elapsed_s:.0f}s)")
    return ScraperAssessment(DeployState.FAILED, f"scraper is {status}, expected {expect}{reason}")


def scraper_alias(group_name: str) -> str:
    """The alias promshift gives a group's scraper (ScraperAlias: ``[0-9A-Za-z][-.0-9A-Z_a-z]*``, <= 100)."""
    cleaned = "".join(c if c.isalnum() or c in "-._" else "-" for c in group_name)
    return f"promshift-{cleaned}"[:100]

