"""Deploy a group through AMP's managed collector: the group's scrape configuration as a scraper's blob.

``ScraperDeployer`` is a ``core.deploy.ConfigDeployer``:

- ``snapshot()``: the group's scraper (found by its alias, ``promshift-<group>``) and its blob,
  or "none" when the group has none yet;
- ``deploy()``: checks the blob against the managed collector's limits *before any API call*
  (``core.scraper_config.validate_scraper_config``), checks the scraper is still as snapshotted,
  then ``CreateScraper`` (destination: the workspace ARN; ``source.eksConfiguration`` from the
  target connection's ``extra.scraper``) or ``UpdateScraper``; it returns WAITING with the first status;
- ``verify()``: one ``DescribeScraper``, judged by ``core.scraper_config.assess_scraper`` (our own
  polling: botocore's ``ScraperActive`` waiter misses ``UPDATE_FAILED``); never writes, so
  ``ScraperStatusTrigger`` calls it on the triggerer as often as it likes;
- ``restore()``: the previous blob back (``UpdateScraper``), or ``DeleteScraper`` on the scraper
  the deploy created.

The boto3 ``amp`` client is passed in (``AmpHook.conn`` builds it). AWS errors become one-line
``DeployError`` s that name the scraper and the code, never a credential.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from promshift.adapters.amp import AWS_REGION_RE, CREDENTIAL_ERRORS
from promshift.core.deploy import DeployError, DeployKind, DeployResult, DeploySnapshot, DeployState
from promshift.core.render import sha256_text
from promshift.core.scraper_config import (
    ACTIVE,
    DELETED,
    ScraperConfigError,
    ScraperLimits,
    assess_scraper,
    scraper_alias,
    validate_scraper_config,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 900.0  # AWS documents no upper bound for CREATING; 15 min is what we wait before rollback


@dataclass(frozen=True)
class ScraperSource:
    """The EKS cluster a scraper collects from (per-environment infrastructure, from the connection)."""

    cluster_arn: str
    subnet_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...] = ()

    def to_api(self) -> dict[str, Any]:
        eks: dict[str, Any] = {"clusterArn": self.cluster_arn, "subnetIds": list(self.subnet_ids)}
        if self.security_group_ids:
            eks["securityGroupIds"] = list(self.security_group_ids)
        return {"eksConfiguration": eks}


def _cluster_arn_problem(cluster: str) -> str | None:
    """Why ``cluster`` is no EKS cluster ARN (``arn:PARTITION:eks:REGION:ACCOUNT:cluster/NAME``), or None.

    Field by field, not by substring: an S3 ARN whose key holds ``:eks:...:cluster/`` is not a cluster.
    """
    parts = cluster.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn" or not re.fullmatch(r"aws(-[a-z]+)*", parts[1]):
        return "is not an ARN (arn:aws:eks:REGION:ACCOUNT:cluster/NAME)"
    _, _, service, region, account, resource = parts
    if service != "eks":
        return f"is an ARN of service {service!r}, not eks"
    if not AWS_REGION_RE.fullmatch(region):
        return f"names no region ({region!r})"
    if not re.fullmatch(r"[0-9]{12}", account):
        return f"names no 12-digit account ({account[:20]!r})"
    if not re.fullmatch(r"cluster/[0-9A-Za-z][0-9A-Za-z_-]{0,99}", resource):
        return f"names resource {resource[:60]!r}, not cluster/NAME"
    return None


def scraper_source_from_extra(extra: Mapping[str, Any], *, conn_id: str = "promshift_target",
                              region: str | None = None) -> ScraperSource:
    """``extra.scraper: {cluster_arn, subnet_ids, security_group_ids}`` of the target connection; one-line errors.

    With ``region`` (the workspace's), a cluster in another region is refused: the managed collector is
    created in the workspace's region and scrapes an EKS cluster of that region.
    """
    raw = extra.get("scraper")
    if not isinstance(raw, Mapping):
        raise DeployError(f"connection {conn_id!r} needs extra.scraper: {{cluster_arn, subnet_ids, "
                          "security_group_ids}} to deploy through the managed collector")
    cluster = str(raw.get("cluster_arn") or "").strip()
    problem = _cluster_arn_problem(cluster)
    if problem:
        raise DeployError(f"connection {conn_id!r}: extra.scraper.cluster_arn must be an EKS cluster ARN; "
                          f"{cluster[:120]!r} {problem}")
    cluster_region = cluster.split(":")[3]
    if region is not None and cluster_region != region:
        raise DeployError(f"connection {conn_id!r}: extra.scraper.cluster_arn is in region {cluster_region}, but the "
                          f"workspace is in {region}: a managed collector scrapes a cluster in its workspace's "
                          "region")

    def ids(key: str, required: bool) -> tuple[str, ...]:
        value = raw.get(key)
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise DeployError(f"connection {conn_id!r}: extra.scraper.{key} must be a list of ids "
                              f"(like [\"subnet-0abc\"]), got {shown}")
        if required and not value or len(value) > 5:
            raise DeployError(f"connection {conn_id!r}: extra.scraper.{key} needs 1 to 5 ids, got {len(value)}")
        return tuple(value)

    return ScraperSource(cluster, ids("subnet_ids", True), ids("security_group_ids", False))


def scraper_error(exc: Exception, *, action: str, what: str) -> DeployError:
    """One line for an AWS failure on a scraper: the code and what was asked; never a secret."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error") or {}
        code = str(err.get("Code") or "unknown")
        if code in CREDENTIAL_ERRORS:
            return DeployError(f"{action} on {what}: AWS refused the credentials' signature ({code})")
        message = str(err.get("Message") or "").splitlines()[0][:200] if err.get("Message") else ""
        return DeployError(f"{action} on {what}: {code}" + (f": {message}" if message else ""))
    if isinstance(exc, BotoCoreError):
        return DeployError(f"{action} on {what}: {exc.__class__.__name__}")
    return DeployError(f"{action} on {what}: {exc.__class__.__name__}")


def _not_found(exc: Exception) -> bool:
    return isinstance(exc, ClientError) and (exc.response.get("Error") or {}).get("Code") == "ResourceNotFoundException"


def observe_scraper(client: Any, result: DeployResult, now: datetime) -> DeployResult:
    """One DescribeScraper, judged against what ``result`` waits for (ACTIVE, or DELETED after a delete)."""
    if result.state.final:
        return result
    details = result.details
    scraper_id = str(details["scraper_id"])
    expect = str(details.get("expect") or ACTIVE)
    try:
        scraper = client.describe_scraper(scraperId=scraper_id)["scraper"]
        status, reason = str(scraper["status"]["statusCode"]), scraper.get("statusReason")
    except Exception as exc:
        if expect == DELETED and _not_found(exc):
            status, reason = DELETED, None
        else:
            raise scraper_error(exc, action="DescribeScraper", what=f"scraper {scraper_id}") from None
    elapsed = now.timestamp() - float(details["started_at"])
    assessment = assess_scraper(status, reason, expect=expect, elapsed_s=elapsed,
                                timeout_s=float(details.get("timeout_s") or DEFAULT_TIMEOUT_S))
    if assessment.state is not DeployState.WAITING:
        log.info("scraper %s: %s", scraper_id, assessment.reason)
    return result.observed(status, now, state=assessment.state, reason=assessment.reason)


class ScraperDeployer:
    """One group's managed-collector scraper (see the module docstring)."""

    kind = DeployKind.SCRAPER.value

    def __init__(self, client: Any, *, group_name: str, blob: str, workspace_arn: str, source: ScraperSource,
                 timeout_s: float = DEFAULT_TIMEOUT_S, limits: ScraperLimits | None = None) -> None:
        self.client = client
        self.group_name = group_name
        self.blob = blob
        self.workspace_arn = workspace_arn
        self.source = source
        self.timeout_s = timeout_s
        self.limits = limits or ScraperLimits()
        self.alias = scraper_alias(group_name)

    # -- reads -------------------------------------------------------------------------------
    def _find(self) -> str | None:
        """The id of the group's scraper (by alias), or None; two with our alias is an error."""
        try:
            found: list[Mapping[str, Any]] = []
            for page in self.client.get_paginator("list_scrapers").paginate(filters={"alias": [self.alias]}):
                found.extend(s for s in page.get("scrapers") or [] if s.get("alias") == self.alias)
        except Exception as exc:
            raise scraper_error(exc, action="ListScrapers", what=f"alias {self.alias!r}") from None
        if len(found) > 1:
            ids = ", ".join(sorted(str(s["scraperId"]) for s in found))
            raise DeployError(f"{len(found)} scrapers have alias {self.alias!r} ({ids}); delete the extra ones")
        return str(found[0]["scraperId"]) if found else None

    def _describe(self, scraper_id: str) -> Mapping[str, Any]:
        try:
            return dict(self.client.describe_scraper(scraperId=scraper_id)["scraper"])
        except Exception as exc:
            raise scraper_error(exc, action="DescribeScraper", what=f"scraper {scraper_id}") from None

    @staticmethod
    def _blob_text(scraper: Mapping[str, Any]) -> str:
        raw = (scraper.get("scrapeConfiguration") or {}).get("configurationBlob") or b""
        return raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)

    def snapshot(self) -> DeploySnapshot:
        scraper_id = self._find()
        if scraper_id is None:
            return DeploySnapshot(self.kind, None, "", {"existed": False, "alias": self.alias})
        scraper = self._describe(scraper_id)
        return DeploySnapshot(self.kind, scraper_id, self._blob_text(scraper), {
            "existed": True, "alias": self.alias, "scraper_arn": scraper.get("arn"),
            "status": scraper["status"]["statusCode"]})

    # -- writes ------------------------------------------------------------------------------
    def _started(self, answer: Mapping[str, Any], now: datetime, *, action: str, expect: str,
                 **details: Any) -> DeployResult:
        result = DeployResult(self.kind, action, DeployState.WAITING, details={
            "scraper_id": answer["scraperId"], "alias": self.alias, "expect": expect,
            "started_at": now.timestamp(), "timeout_s": self.timeout_s, "workspace_arn": self.workspace_arn,
            **details})
        status = str(answer["status"]["statusCode"])
        return result.observed(status, now, state=DeployState.WAITING, reason=f"scraper is {status}")

    def deploy(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """Validate the blob, then create or update the group's scraper; WAITING until verify says otherwise."""
        try:
            validate_scraper_config(self.blob, self.limits)
        except ScraperConfigError as exc:
            raise DeployError(f"scraper for {self.group_name!r} not deployed: {exc}") from None
        current = self._find()
        if current is not None and current != snapshot.ref and snapshot.ref is None:
            created = self._describe(current)
            if self._is_this_deploy(created):
                # A retried deploy (its first attempt was killed after CreateScraper): follow that scraper.
                log.warning("scraper %s for %s was created by an earlier attempt of this deploy; following it",
                            current, self.group_name)
                return self._started(created, now, action="deploy", expect=ACTIVE, created=True, resumed=True,
                                     scraper_arn=created.get("arn"), blob_sha256=sha256_text(self.blob))
        if current != snapshot.ref:
            raise DeployError(f"scraper {self.alias!r} changed since the snapshot (was {snapshot.ref or 'absent'}, "
                              f"now {current or 'absent'}); refusing to deploy")
        payload = {"scrapeConfiguration": {"configurationBlob": self.blob.encode()},
                   "destination": {"ampConfiguration": {"workspaceArn": self.workspace_arn}}}
        if current is None:
            try:
                answer = self.client.create_scraper(
                    alias=self.alias, source=self.source.to_api(),
                    tags={"managed-by": "promshift", "promshift-group": self.group_name[:256]}, **payload)
            except Exception as exc:
                raise scraper_error(exc, action="CreateScraper", what=f"scraper {self.alias!r}") from None
            log.info("created scraper %s for %s", answer["scraperId"], self.group_name)
            return self._started(answer, now, action="deploy", expect=ACTIVE, created=True,
                                 scraper_arn=answer.get("arn"), blob_sha256=sha256_text(self.blob))
        live = self._describe(current)
        if self._blob_text(live) != snapshot.content and self._is_this_deploy(live):
            # A retried deploy (its first attempt was killed after UpdateScraper went through): follow it.
            log.warning("scraper %s already holds %s's blob from an earlier attempt of this deploy; following it",
                        current, self.group_name)
            return self._started(live, now, action="deploy", expect=ACTIVE, created=False, resumed=True,
                                 scraper_arn=live.get("arn"), blob_sha256=sha256_text(self.blob))
        if self._blob_text(live) != snapshot.content:
            raise DeployError(f"scraper {current} ({self.alias}) has another configuration than the snapshot's "
                              "(someone changed it meanwhile); refusing to overwrite it")
        try:
            answer = self.client.update_scraper(scraperId=current, **payload)
        except Exception as exc:
            raise scraper_error(exc, action="UpdateScraper", what=f"scraper {current}") from None
        log.info("updating scraper %s for %s", current, self.group_name)
        return self._started(answer, now, action="deploy", expect=ACTIVE, created=False,
                             scraper_arn=answer.get("arn"), blob_sha256=sha256_text(self.blob))

    def _is_this_deploy(self, scraper: Mapping[str, Any]) -> bool:
        """The scraper holds exactly this deploy's blob and writes to this deploy's workspace."""
        destination = ((scraper.get("destination") or {}).get("ampConfiguration") or {}).get("workspaceArn")
        return self._blob_text(scraper) == self.blob and destination == self.workspace_arn

    def verify(self, result: DeployResult, now: datetime) -> DeployResult:
        return observe_scraper(self.client, result, now)

    def restore(self, snapshot: DeploySnapshot, now: datetime) -> DeployResult:
        """The previous blob back, or the scraper the deploy created deleted; WAITING until verify says otherwise."""
        current = self._find()
        if snapshot.existed:
            if current != snapshot.ref:
                raise DeployError(f"scraper {snapshot.ref} ({self.alias}) is gone or replaced (now "
                                  f"{current or 'absent'}); cannot restore its configuration")
            try:
                answer = self.client.update_scraper(scraperId=current, scrapeConfiguration={
                    "configurationBlob": snapshot.content.encode()})
            except Exception as exc:
                raise scraper_error(exc, action="UpdateScraper", what=f"scraper {current}") from None
            return self._started(answer, now, action="restore", expect=ACTIVE, restored_sha256=snapshot.sha256)
        if current is None:
            result = DeployResult(self.kind, "restore", DeployState.WAITING, details={"alias": self.alias})
            return result.observed("ABSENT", now, state=DeployState.DONE, reason="no scraper to delete")
        live = self._describe(current)
        if str(live["status"]["statusCode"]) == "DELETING":
            # A retried restore (its first attempt was killed after DeleteScraper): follow that delete.
            log.warning("scraper %s of %s is already DELETING (an earlier attempt of this restore); following it",
                        current, self.group_name)
            return self._started(live, now, action="restore", expect=DELETED, deleted=True, resumed=True)
        try:
            answer = self.client.delete_scraper(scraperId=current)
        except Exception as exc:
            raise scraper_error(exc, action="DeleteScraper", what=f"scraper {current}") from None
        log.info("deleting scraper %s that the deploy of %s created", current, self.group_name)
        return self._started(answer, now, action="restore", expect=DELETED, deleted=True)


def wait_for(deployer: Any, result: DeployResult, *, poll_s: float = 2.0, clock: Callable[[], datetime] | None = None,
             sleep: Callable[[float], None] = time.sleep) -> DeployResult:
    """Verify until the result is final (DONE, FAILED or TIMEOUT): for callers without a triggerer."""
    now = clock or (lambda: datetime.now(UTC))
    while not result.state.final:
        sleep(poll_s)
        result = deployer.verify(result, now())
    return result
