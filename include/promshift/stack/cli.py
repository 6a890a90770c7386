"""``promshift stack up|down|status``: the local fleet, source/target Prometheus and (``--target amp``) local AWS."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from promshift.stack.local import LocalStack, StackConfig, StackError

logger = logging.getLogger(__name__)


def add_stack_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stack up``, ``stack down`` and ``stack status`` to a top-level subparsers object."""
    stack = subparsers.add_parser(
        "stack",
        help="run the local fleet simulator, source Prometheus and AMP stand-in",
        description="Settings come from PROMSHIFT_HOME, PROMSHIFT_NODES and PROMSHIFT_*_PORT; with --target amp also "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN/AWS_DEFAULT_REGION.",
    )
    commands = stack.add_subparsers(dest="stack_command", required=True)

    up = commands.add_parser("up", help="start (or reuse) the stack and wait until every node is scraped")
    up.add_argument(
        "--nodes", type=int, help="fleet size in nodes of 8 GPUs (default: $PROMSHIFT_NODES or 200)"
    )
    up.add_argument("--fresh", action="store_true", help="stop the stack and delete its state first")
    up.add_argument(
        "--target",
        choices=("prometheus", "amp"),
        default="prometheus",
        help="amp: also a local AWS (moto control plane, SigV4-checking front door, vmagent signing relay)",
    )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.set_defaults(handler=stack_up)

    down = commands.add_parser("down", help="stop every process of the stack")
    down.set_defaults(handler=stack_down)

    status = commands.add_parser("status", help="show the stack's processes; exit 1 if any is down")
    status.set_defaults(handler=stack_status)


def stack_up(args: argparse.Namespace) -> int:
    """Handle ``stack up``."""
    target_kind = getattr(args, "target", None) or "prometheus"
    stack = LocalStack(StackConfig.from_env(nodes=getattr(args, "nodes", None), target_kind=target_kind))
    try:
        if getattr(args, "fresh", False):
            stack.reset()
        report = stack.up(timeout=getattr(args, "timeout", 180.0))
    except StackError as exc:
        logger.error("stack up failed: %s", exc)
        return 1
    print(format_status(report))
    print(f"\nsource:            {stack.source_url}")
    print(f"target:            {stack.target_url}")
    print(f"remote write:      {stack.target_remote_write_url}")
    print(f"source config:     {stack.source_config_path}")
    if target_kind == "amp":
        # Names and URLs only: the credential pair is never printed.
        print(f"AMP control plane: {stack.aws_url}  (boto3 amp client endpoint_url, region {stack.config.region})")
        print(f"AMP workspace:     {stack.workspace_id}")
        print(f"AMP endpoint:      {stack.prometheus_endpoint()}")
        print(f"signed relay:      {stack.relay_remote_write_url}")
        print(f"SigV4 counters:    {stack.frontdoor_url}/-/sigv4-stats")
    return 0


def stack_down(args: argparse.Namespace) -> int:
    """Handle ``stack down``."""
    LocalStack(StackConfig.from_env()).down()
    return 0


def stack_status(args: argparse.Namespace) -> int:
    """Handle ``stack status``: print a table, exit 1 when any component is down or unhealthy."""
    report = LocalStack(StackConfig.from_env()).status()
    print(format_status(report))
    return 0 if all(row["alive"] and row["healthy"] for row in report.values()) else 1


def format_status(report: dict[str, dict[str, Any]]) -> str:
    """Render ``LocalStack.status()`` as a small fixed-width table."""
    rows = [("COMPONENT", "PID", "ALIVE", "HEALTHY", "URL")]
    for name, row in report.items():
        rows.append(
            (
                name,
                str(row["pid"]) if row["pid"] is not None else "-",
                "yes" if row["alive"] else "no",
                "yes" if row["healthy"] else "no",
                str(row["url"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )
