"""``python -m promshift.local stack up|down|status|dual-write|drift``: the local fleet, source/target and
(``--target amp``) AWS; with the production commands beside them (``audit``, ``check``, ``catalog``, ``render``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from promshift.adapters.prometheus import PrometheusError
from promshift.core.render import RenderError
from promshift.local.stack.local import LocalStack, StackConfig, StackError

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
    up.add_argument("--k8s", action="store_true",
                    help="also the Kubernetes API contract server with a prometheus-operator stand-in that renders "
                         "the Prometheus resource monitoring/k8s onto the source (a contract test, not a cluster)")
    up.add_argument("--git", action="store_true",
                    help="also a bare config repository (kube-prometheus-stack values), a reconciler stand-in that "
                         "syncs it onto the source like Argo CD / Flux, and a GitHub API contract server")
    up.add_argument("--clusters", type=int, choices=(1, 2), default=1,
                    help="2: also a second cluster (its own fleet of half the nodes and source Prometheus) and a "
                         "second target, as a second workspace (ports PROMSHIFT_{FLEET,SOURCE,TARGET}_B_PORT or free); "
                         "with --target amp the second target backs a second AMP workspace behind the same front "
                         "door, with its own signing relay (PROMSHIFT_RELAY_B_PORT or free)")
    up.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                    help="2: the source runs as an HA pair: a second Prometheus (source-1, port "
                         "PROMSHIFT_SOURCE_1_PORT or free) scrapes the same fleet with prometheus_replica=source-1")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.set_defaults(handler=stack_up)

    down = commands.add_parser("down", help="stop every process of the stack")
    down.set_defaults(handler=stack_down)

    status = commands.add_parser("status", help="show the stack's processes; exit 1 if any is down")
    status.set_defaults(handler=stack_status)
    add_remote_write_commands(commands)


def add_remote_write_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stack dual-write`` and ``stack drift`` (local experiments on the target-bound path)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("group", metavar="GROUP", help="catalog group name, e.g. gpu-memory")
    common.add_argument("--catalog", help="catalog file (default: $PROMSHIFT_CATALOG or catalog/metric_groups.yaml)")
    common.add_argument("--profile", help="catalog profile (default: $PROMSHIFT_PROFILE)")
    common.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the target to receive the change (default 60)")
    epilog = ("Changes nothing but the local stack named by PROMSHIFT_HOME and PROMSHIFT_*_PORT, and only while "
              "its source and target are up. Exit 0 done, 1 failed (nothing left half-done: a rejected deploy "
              "restores the config), 2 bad input.")
    dual = commands.add_parser(
        "dual-write", parents=[common], epilog=epilog,
        help="add a group's remote_write entry to the local source (no Airflow); verify the target receives it",
        description="Adds the group's own remote_write entry (keep-filter on its metrics) to the local source's "
                    "config with the deployer a migration uses (promtool check, reload, verified live), then waits "
                    "until the target holds the group's series. A present entry is left as it is.")
    dual.set_defaults(handler=stack_dual_write)
    drift = commands.add_parser(
        "drift", parents=[common], epilog=epilog,
        help="FAULT INJECTION: plant a label rename on a group's target-bound path for some hosts",
        description="Fault injection for local experiments: adds write_relabel_configs rules to promshift's own "
                    "remote_write entry for GROUP on the local stack, so that for hosts matching --hosts the "
                    "target receives label FROM as TO (the source keeps FROM), e.g. dcgm-exporter's "
                    "Hostname -> hostname rename on half the fleet. This edits a live entry in place (its queue "
                    "restarts), which a migration never does. If the group is not dual-written yet, its entry is "
                    "added with the rename from the start; otherwise the target keeps showing the hosts' series "
                    "under FROM for up to 5 minutes (remote write sends no staleness markers for them).")
    drift.add_argument("--rename-label", required=True, metavar="FROM=TO", help="e.g. Hostname=hostname")
    drift.add_argument("--hosts", required=True, metavar="REGEX",
                       help="RE2 regex, fully anchored, on the group's host label, e.g. 'gpu-node-000[0-4]' or '.*'")
    drift.set_defaults(handler=stack_drift)


def _remote_write_command(args: argparse.Namespace, run: Callable[[Any], Any]) -> int:
    """Load the group, check the stack is up, run; one-line errors on stderr (2: bad input, 1: failed)."""
    from promshift.adapters.settings import default_profile, load_catalog
    from promshift.local.stack.remote_write import BadInput, LocalRemoteWrite, RemoteWriteError, require_up

    command = f"python -m promshift.local stack {args.stack_command}"
    try:
        group = load_catalog(args.catalog, profile=args.profile or default_profile()).get(args.group)
    except KeyError as exc:
        print(f"{command}: {exc.args[0]}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"{command}: catalog: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    stack = LocalStack(StackConfig.from_env())
    try:
        require_up(stack)
        change = run(LocalRemoteWrite(stack, group, timeout_s=args.timeout))
    except BadInput as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    except (RemoteWriteError, PrometheusError, RenderError) as exc:
        print(f"{command}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(change.summary)
    return 0


def stack_dual_write(args: argparse.Namespace) -> int:
    """Handle ``stack dual-write GROUP``."""
    return _remote_write_command(args, lambda path: path.dual_write())


def stack_drift(args: argparse.Namespace) -> int:
    """Handle ``stack drift GROUP --rename-label FROM=TO --hosts REGEX``."""
    from promshift.local.stack.remote_write import BadInput, LabelRename

    try:
        rename = LabelRename.parse(args.rename_label, args.hosts)
    except BadInput as exc:
        print(f"python -m promshift.local stack drift: {exc}", file=sys.stderr)
        return 2
    return _remote_write_command(args, lambda path: path.plant(rename))


def stack_up(args: argparse.Namespace) -> int:
    """Handle ``stack up``."""
    target_kind = getattr(args, "target", None) or "prometheus"
    stack = LocalStack(StackConfig.from_env(nodes=getattr(args, "nodes", None), target_kind=target_kind,
                                            kubernetes=bool(getattr(args, "k8s", False)),
                                            git=bool(getattr(args, "git", False)),
                                            clusters=getattr(args, "clusters", None),
                                            replicas=getattr(args, "replicas", None)))
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
    print(f"mail sink:         smtp://127.0.0.1:{stack.smtp_port}  (messages kept under {stack.mail_dir})")
    if stack.config.kubernetes:
        print(f"kubernetes API:    {stack.kubernetes_url}  (contract server; kubeconfig {stack.kubeconfig_path})")
    if stack.config.git:
        address = stack.git_address() or {}
        print(f"config repository: {address.get('repo')} ({address.get('path')}, branch {address.get('branch')}; "
              f"synced every {address.get('interval_s')}s)")
        print(f"GitHub API:        {stack.github_url}  (contract server; token in {stack.git_dir / 'token'})")
    if target_kind == "amp":
        # Names and URLs only: the credential pair is never printed.
        print(f"AMP control plane: {stack.aws_url}  (boto3 amp client endpoint_url, region {stack.config.region})")
        print(f"AMP workspace:     {stack.workspace_id}")
        print(f"AMP endpoint:      {stack.prometheus_endpoint()}")
        print(f"signed relay:      {stack.relay_remote_write_url}")
        if stack.workspace_b_id:
            print(f"AMP workspace B:   {stack.workspace_b_id}  (over {stack.target_b_url})")
            print(f"AMP endpoint B:    {stack.prometheus_endpoint(stack.workspace_b_id)}")
            print(f"signed relay B:    {stack.relay_b_remote_write_url}")
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


def main(argv: list[str] | None = None) -> int:
    """The lab's command: the production ``promshift`` command plus ``stack``."""
    from promshift.cli import build_parser
    from promshift.cli import main as promshift_main

    return promshift_main(argv, parser=build_parser(add_stack_commands, prog="python -m promshift.local"))
