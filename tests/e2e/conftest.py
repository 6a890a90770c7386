"""Shared by the end-to-end tests: a private PROMSHIFT_HOME and free ports for every component of the stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports

# Every port the stack may listen on (the last four only with --target amp).
PORT_VARS = ("FLEET", "SOURCE", "TARGET", "AWS", "MOTO", "FRONTDOOR", "RELAY")


def free_port() -> int:
    return find_free_ports(1)[0]


def stop_stack() -> None:
    """Stop the stack the demo left running (PROMSHIFT_HOME and the ports come from the environment)."""
    LocalStack(StackConfig.from_env()).down()


@pytest.fixture
def small_stack_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    for name, port in zip(PORT_VARS, find_free_ports(len(PORT_VARS)), strict=True):
        monkeypatch.setenv(f"PROMSHIFT_{name}_PORT", str(port))
    return tmp_path
