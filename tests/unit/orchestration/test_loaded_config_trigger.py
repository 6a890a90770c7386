"""LoadedConfigTrigger: serialises its arguments and polls the source's loaded config until a Kubernetes
deploy (or restore) shows there, or its deadline passes; the event carries the whole status history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from promshift.core.deploy import DeployResult, DeployState
from promshift.orchestration.triggers import LoadedConfigTrigger


class Loaded:
    """A source Prometheus whose loaded config lists the given remote_write names, one answer per poll."""

    base_url = "http://127.0.0.1:1"

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)

    def config_text(self) -> str:
        names = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(names, Exception):
            raise names
        return "remote_write:\n" + "".join(f"  - name: {n}\n    url: http://x\n" for n in names) if names else "{}\n"


def started(action: str = "deploy", *, deadline_in_s: float = 60) -> dict[str, Any]:
    now = datetime.now(UTC)
    result = DeployResult("k8s-cr", action, DeployState.WAITING, details={
        "remote_write": "promshift-gpu-memory", "deadline": (now + timedelta(seconds=deadline_in_s)).isoformat()})
    return result.observed("CR_UPDATED", now, state=DeployState.WAITING).to_dict()


class FakeSourceTrigger(LoadedConfigTrigger):
    source: Loaded

    def prometheus_client(self) -> Any:
        return self.source


def run(trigger: LoadedConfigTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(first())


def test_serialize_mirrors_init() -> None:
    trigger = LoadedConfigTrigger(source_conn_id="promshift_source", result=started(), poll_interval_s=0.5)
    path, kwargs = trigger.serialize()
    assert path == "promshift.orchestration.triggers.LoadedConfigTrigger"
    assert LoadedConfigTrigger(**kwargs).serialize() == (path, kwargs)


def test_done_once_the_entry_is_loaded_with_the_whole_history() -> None:
    trigger = FakeSourceTrigger(source_conn_id="s", result=started(), poll_interval_s=0.01)
    trigger.source = Loaded([], ["team"], ["team", "promshift-gpu-memory"])
    event = run(trigger)
    assert event["status"] == "done"
    assert [c["status"] for c in event["result"]["status_history"]] == ["CR_UPDATED", "WAITING_FOR_RELOAD", "LIVE"]


def test_a_restore_is_done_once_the_entry_is_gone() -> None:
    trigger = FakeSourceTrigger(source_conn_id="s", result=started("restore"), poll_interval_s=0.01)
    trigger.source = Loaded(["promshift-gpu-memory"], [])
    assert run(trigger)["result"]["status_history"][-1]["status"] == "RESTORED"


def test_timeout_at_the_deadline() -> None:
    trigger = FakeSourceTrigger(source_conn_id="s", result=started(deadline_in_s=0), poll_interval_s=0.01)
    trigger.source = Loaded([])
    event = run(trigger)
    assert event["status"] == "timeout" and "remote_write promshift-gpu-memory missing" in event["reason"]


def test_three_failed_polls_in_a_row_end_with_an_error() -> None:
    trigger = FakeSourceTrigger(source_conn_id="s", result=started(), poll_interval_s=0.01)
    trigger.source = Loaded(RuntimeError("down"))  # type: ignore[arg-type]
    event = run(trigger)
    assert event["status"] == "error" and "down" in event["reason"]
