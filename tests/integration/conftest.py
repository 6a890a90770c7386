"""Shared fixtures for integration tests: free ports and a small local stack on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from promshift.stack.local import PROMETHEUS_BIN, LocalStack, StackConfig, find_free_ports


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
