"""WarmupTrigger: polls both backends until the target has caught up, on the triggerer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from promshift.adapters.prometheus import PrometheusClient
from promshift.core.warmup import assess_warmup, observe_warmup


class WarmupTrigger(BaseTrigger):
    """Waits for a dual-written group to warm up; holds no worker slot.

    It observes and never writes (a trigger may run more than once). The event's
    ``status`` is ``ready``, ``timeout`` or ``error``, with the last observation.
    """

    def __init__(self, *, group_name: str, selector: str, source_conn_id: str, target_conn_id: str,
                 started_at: float, min_duration_s: float, timeout_s: float, max_lag_s: float | None,
                 poll_interval_s: float) -> None:
        super().__init__()
        self.group_name = group_name
        self.selector = selector
        self.source_conn_id = source_conn_id
        self.target_conn_id = target_conn_id
        self._clients: tuple[PrometheusClient, PrometheusClient] | None = None
        self._read_discards: Callable[[datetime, datetime], Any] | None = None
        self.started_at = started_at
        self.min_duration_s = min_duration_s
        self.timeout_s = timeout_s
        self.max_lag_s = max_lag_s
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "promshift.orchestration.triggers.WarmupTrigger",
            {
                "group_name": self.group_name,
                "selector": self.selector,
                "source_conn_id": self.source_conn_id,
                "target_conn_id": self.target_conn_id,
                "started_at": self.started_at,
                "min_duration_s": self.min_duration_s,
                "timeout_s": self.timeout_s,
                "max_lag_s": self.max_lag_s,
                "poll_interval_s": self.poll_interval_s,
            },
        )

    def clients(self) -> tuple[PrometheusClient, PrometheusClient]:
        """Source and target clients from their Airflow connections (an AMP target signs every request).

        Built once per run of the trigger; signed clients read their credentials per request, so
        credentials that expire during a long warm-up are refreshed.
        """
        if self._clients is None:
            from promshift.orchestration.hooks import backend_hook

            target = backend_hook(self.target_conn_id)
            self._clients = (backend_hook(self.source_conn_id).prometheus_client(), target.prometheus_client())
            # An AMP workspace publishes its discarded samples (CloudWatch DiscardedSamples): warm-up judges them.
            self._read_discards = getattr(target, "discards_reader", None)
        return self._clients

    def _observe(self) -> dict[str, Any]:
        source, target = self.clients()
        from promshift.adapters.ingest_health import with_ingestion_health

        now = datetime.now(UTC)
        obs = observe_warmup(group_name=self.group_name, selector=self.selector, source=source, target=target,
                             elapsed_s=time.time() - self.started_at)
        # The target's refusals: the writer's failed samples, and an AMP workspace's DiscardedSamples.
        obs = with_ingestion_health(obs, read_discards=self._read_discards, source=source, target=target,
                                    selector=self.selector, since=now - timedelta(seconds=obs.elapsed_s), now=now)
        status = assess_warmup(obs, min_duration_s=self.min_duration_s, timeout_s=self.timeout_s,
                               max_lag_s=self.max_lag_s)
        return {"state": status.state, "reason": status.reason, "observation": obs.to_dict()}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        errors = 0
        while True:
            try:
                # The HTTP client is synchronous; keep it off the triggerer's event loop.
                result = await asyncio.to_thread(self._observe)
                errors = 0
            except Exception as exc:  # a backend blip is retried; three in a row end the wait
                errors += 1
                self.log.warning("warm-up poll failed (%s in a row): %s", errors, exc)
                if errors >= 3 or time.time() - self.started_at > self.timeout_s:
                    yield TriggerEvent({"status": "error", "reason": str(exc)})
                    return
                await asyncio.sleep(self.poll_interval_s)
                continue
            self.log.info("warm-up %s: %s", self.group_name, result["reason"])
            if result["state"] != "waiting":
                yield TriggerEvent({"status": result["state"], "reason": result["reason"],
                                    "observation": result["observation"]})
                return
            await asyncio.sleep(self.poll_interval_s)


async def follow_deploy(trigger: BaseTrigger, result_dict: dict[str, Any], make_client: Callable[[], Any],
                        observe: Callable[[Any, Any, datetime], Any], what: str) -> AsyncIterator[TriggerEvent]:
    """Poll a deploy or restore with ``observe(client, result, now)`` until it is final; one event at the end.

    A poll that raises is retried; three in a row end the wait with ``status: error``. Observing never writes.
    The event: ``{"status", "reason", "result": <DeployResult dict with the whole status_history>}``.
    """
    from promshift.core.deploy import DeployResult

    result = DeployResult.from_dict(result_dict)
    client = None
    errors = 0
    while not result.state.final:
        await asyncio.sleep(trigger.poll_interval_s)  # type: ignore[attr-defined]
        try:
            client = client or await asyncio.to_thread(make_client)
            result = await asyncio.to_thread(observe, client, result, datetime.now(UTC))
            errors = 0
        except Exception as exc:  # a blip (AWS, the API server) is retried; three in a row end the wait
            errors += 1
            trigger.log.warning("%s poll failed (%s in a row): %s", what, errors, exc)
            if errors >= 3:
                yield TriggerEvent({"status": "error", "reason": str(exc), "result": result.to_dict()})
                return
            continue
        trigger.log.info("%s %s: %s", what, result.details.get("scraper_id") or result.details.get("remote_write"),
                         result.reason)
    yield TriggerEvent({"status": result.state.value, "reason": result.reason, "result": result.to_dict()})


class ScraperStatusTrigger(BaseTrigger):
    """Polls a managed-collector scraper until its deploy or restore is final; holds no worker slot.

    Gets the target connection's id (an ``amp`` connection) and the ``DeployResult`` that
    ``ScraperDeployer.deploy``/``restore`` returned (as a dict); each poll is one DescribeScraper judged
    by ``core.scraper_config.assess_scraper`` (``UPDATE_FAILED`` fails, which botocore's waiter misses).
    It observes and never writes. The event: ``{"status": "done"|"failed"|"timeout"|"error", "reason",
    "result": <DeployResult dict with the whole status_history>}``.
    """

    def __init__(self, *, target_conn_id: str, result: dict[str, Any], poll_interval_s: float = 5.0) -> None:
        super().__init__()
        self.target_conn_id = target_conn_id
        self.result = result
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "promshift.orchestration.triggers.ScraperStatusTrigger",
            {"target_conn_id": self.target_conn_id, "result": self.result, "poll_interval_s": self.poll_interval_s},
        )

    def amp_client(self) -> Any:
        """The boto3 ``amp`` client of the target connection (credentials, region, role as AmpHook reads them)."""
        from promshift.orchestration.amp_hook import AmpHook

        return AmpHook(aws_conn_id=self.target_conn_id).conn

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from promshift.adapters.amp_scraper import observe_scraper

        async for event in follow_deploy(self, self.result, self.amp_client, observe_scraper, "scraper"):
            yield event


class LoadedConfigTrigger(BaseTrigger):
    """Polls the source Prometheus's ``/api/v1/status/config`` until a Kubernetes deploy or restore is loaded.

    For the ConfigMap and ``Prometheus`` CR deployers (``adapters.k8s_deploy``): the write is done, and the
    config-reloader sidecar or the operator must still carry it into the server. Gets the source
    connection's id and the ``DeployResult`` (as a dict) that ``deploy``/``restore`` returned; each poll is
    ``observe_loaded_config`` (TIMEOUT at the result's deadline). It observes and never writes. The event:
    ``{"status": "done"|"timeout"|"error", "reason", "result": <DeployResult dict with the status_history>}``.
    """

    def __init__(self, *, source_conn_id: str, result: dict[str, Any], poll_interval_s: float = 2.0) -> None:
        super().__init__()
        self.source_conn_id = source_conn_id
        self.result = result
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "promshift.orchestration.triggers.LoadedConfigTrigger",
            {"source_conn_id": self.source_conn_id, "result": self.result, "poll_interval_s": self.poll_interval_s},
        )

    def prometheus_client(self) -> PrometheusClient:
        from promshift.orchestration.hooks import backend_hook

        return backend_hook(self.source_conn_id).prometheus_client()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from promshift.adapters.k8s_deploy import observe_loaded_config

        async for event in follow_deploy(self, self.result, self.prometheus_client, observe_loaded_config,
                                         "loaded-config"):
            yield event


class GitChangeTrigger(LoadedConfigTrigger):
    """Follows a git deploy or restore (``adapters.git_deploy``): its pull request's merge state (closed unmerged:
    failed), then the source's loaded config, as ``LoadedConfigTrigger``. The token comes from the connection the
    source's ``extra.git.conn_id`` names, read in the triggerer; it is never in the trigger's arguments."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "promshift.orchestration.triggers.GitChangeTrigger",
            {"source_conn_id": self.source_conn_id, "result": self.result, "poll_interval_s": self.poll_interval_s},
        )

    def observer(self) -> Any:
        from promshift.adapters.git_deploy import GitHubPullRequests, GitObserver
        from promshift.core.git_source import git_source_of
        from promshift.orchestration.hooks import backend_hook, connection_secret

        hook = backend_hook(self.source_conn_id)
        source = git_source_of(hook.extra, conn_id=self.source_conn_id)  # type: ignore[union-attr]
        pulls = None
        if source.backend == "github":
            token = connection_secret(source.conn_id) if source.conn_id else None
            pulls = GitHubPullRequests(source.api_url, str(source.repository), token,
                                       http_loopback=source.http_loopback)
        return GitObserver(hook.prometheus_client(), pulls)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from promshift.adapters.git_deploy import observe_git_change

        async for event in follow_deploy(self, self.result, self.observer, observe_git_change, "git change"):
            yield event
