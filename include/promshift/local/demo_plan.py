"""``make demo SCENARIO=plan``: the local stack under a replayed read load, then ``promshift plan`` on it.

The source writes its query log (``query_log_file``); dashboards refresh and a few ad-hoc queries run
(``stack.read_load``) while the source's rules evaluate; then the plan is written under
``reports/<time>-plan/`` and its summary printed. Migrating the first group with its label drops is not
part of it yet: the catalog cannot declare drops (docs/plan.md, "Not built yet").
"""

from __future__ import annotations

import time
from pathlib import Path

from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.read_load import replay

REPO_ROOT = Path(__file__).resolve().parents[3]


def run_plan_demo(*, nodes: int, report_root: Path, rounds: int = 3) -> str:
    """Start (or reuse) the stack, replay the read load, write the plan; return the printed text."""
    from promshift.cli import main as promshift

    stack = LocalStack(StackConfig.from_env(nodes=nodes))
    stack.up()
    dashboards = REPO_ROOT / "catalog" / "dashboards"
    started = time.monotonic()
    answered = replay(stack.source_url, [dashboards], rounds=rounds)
    time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))  # a few rule evaluations in the log too
    out = report_root / f"{time.strftime('%Y%m%dT%H%M%S')}-plan"
    code = promshift(["plan", "--source", stack.source_url, "--query-log", str(stack.source_query_log_path),
                      "--dashboards", str(dashboards), "--period", "1h", "--out", str(out)])
    return (f"=== promshift plan on the local stack ({answered} queries replayed; exit {code}) ===\n"
            f"{out}")
