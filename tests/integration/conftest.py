"""Shared fixtures for integration tests: free ports and a small local stack on 127.0.0.1."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from promshift.local.stack.local import PROMETHEUS_BIN, LocalStack, StackConfig, find_free_ports


def eventually(check: Callable[[], Any], timeout: float = 60.0, message: str = "") -> Any:
    """Poll ``check`` every 0.5 s until it answers something true (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, message or "condition not met in time"
        time.sleep(0.5)
    return result


@pytest.fixture(scope="session")
def free_ports() -> Callable[[int], list[int]]:
    """``free_ports(n)``: n distinct free ports on 127.0.0.1."""
    return find_free_ports


@pytest.fixture(scope="session")
def stack_config_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., StackConfig]:
    """Build a StackConfig with its own temp home and free ports; keyword arguments override fields."""
    if not Path(PROMETHEUS_BIN).exists():
        pytest.skip("Prometheus is not installed (apt-get install -y prometheus)")

    def make(**overrides: object) -> StackConfig:
        fleet_port, source_port, target_port = find_free_ports(3)
        values: dict[str, object] = {
            "home": tmp_path_factory.mktemp("stack"),
            "nodes": 10,
            "fleet_port": fleet_port,
            "source_port": source_port,
            "target_port": target_port,
            "scrape_interval": "2s",
        }
        values.update(overrides)
        return StackConfig(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def local_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    """A running 10-node stack (2 s scrapes) shared by the session; stopped at the end."""
    stack = LocalStack(stack_config_factory())
    try:
        stack.up(timeout=90)
        yield stack
    finally:
        stack.down()


AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


@contextlib.contextmanager
def running_amp_stack(stack_config_factory: Callable[..., StackConfig],
                      aws_env: Mapping[str, str] | None = None, **overrides: Any) -> Iterator[LocalStack]:
    """A 2-node AMP stack (1 s scrapes) on free ports, with exactly ``aws_env`` of the AWS_* variables set.

    Without ``aws_env`` no pair is in the environment, so the stack makes its own up. ``overrides``: more
    StackConfig fields (``clusters=2``: the second cluster and a second workspace over target-b).
    """
    aws_port, moto_port, frontdoor_port, relay_port = find_free_ports(4)
    config = stack_config_factory(**{"nodes": 2, "scrape_interval": "1s", "target_kind": "amp", "aws_port": aws_port,
                                     "moto_port": moto_port, "frontdoor_port": frontdoor_port,
                                     "relay_port": relay_port, **overrides})
    with pytest.MonkeyPatch.context() as patch:
        for name in AWS_ENV:
            patch.delenv(name, raising=False)
        for name, value in (aws_env or {}).items():
            patch.setenv(name, value)
        stack = LocalStack(config)
        try:
            stack.up(timeout=120)
            yield stack
        finally:
            stack.down()
