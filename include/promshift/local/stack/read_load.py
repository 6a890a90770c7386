"""A realistic read load on the local source, so ``promshift plan`` has real usage to read.

Dashboards refresh (each panel query of the given dashboard files as a range query over the last
hour, Grafana's way: variables from the dashboard, ``$__rate_interval`` and friends), and a few
ad-hoc queries an on-call engineer would type. Rules evaluate on their own (the source's
``rule_files``). Every query lands in the source's query log (``query_log_file``).

    python -m promshift.local.stack.read_load --source URL --dashboards catalog/dashboards --rounds 3
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from promshift.core.plan import _dashboard_variables, _panel_targets
from promshift.core.promql import grafana_builtins, substitute

# What on-call types when a node pages: by hand, one label or two.
ADHOC = (
    'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-0000"}',
    "topk(5, DCGM_FI_DEV_POWER_USAGE)",
    'max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS)',
    "count by (modelName) (DCGM_FI_DEV_GPU_UTIL)",
    # The fleet view, per node and fleet-wide: every read of this metric aggregates its GPUs away, so the plan
    # recommends recording it per node before shipping (core/aggregation.py).
    "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)",
    "avg(DCGM_FI_DEV_MEM_COPY_UTIL)",
)


def dashboard_queries(paths: Sequence[Path], *, step_s: float = 30.0, range_s: float = 3600.0) -> list[str]:
    """Every panel query of these dashboards, its variables filled in as Grafana would."""
    out: list[str] = []
    builtins = grafana_builtins(step_s, range_s)
    for path in paths:
        model = json.loads(path.read_text())
        values = _dashboard_variables(model)
        for _, target in _panel_targets(model):
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip():
                sub = substitute(expr, values, builtins=builtins)
                out.append(substitute(sub.expr, {v: ".*" for v in sub.unknown}).expr)
    return out


def replay(source_url: str, dashboards: Sequence[Path], *, rounds: int = 2, adhoc: Sequence[str] = ADHOC,
           step_s: float = 30.0, timeout_s: float = 20.0) -> int:
    """Run the load ``rounds`` times; the number of queries the source answered."""
    files: list[Path] = []
    for d in dashboards:
        files.extend(sorted(d.glob("*.json")) if d.is_dir() else [d])
    panels = dashboard_queries(files, step_s=step_s)
    answered = 0
    with requests.Session() as session:
        for _ in range(rounds):
            now = time.time()
            for expr in panels:
                r = session.post(f"{source_url}/api/v1/query_range", timeout=timeout_s,
                                 data={"query": expr, "start": f"{now - 3600:.3f}", "end": f"{now:.3f}",
                                       "step": f"{step_s:g}"})
                answered += r.status_code == 200
            for expr in adhoc:
                r = session.post(f"{source_url}/api/v1/query", data={"query": expr}, timeout=timeout_s)
                answered += r.status_code == 200
    return answered


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m promshift.local.stack.read_load", description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True)
    p.add_argument("--dashboards", action="append", default=[])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    n = replay(args.source, [Path(d) for d in args.dashboards], rounds=args.rounds)
    print(f"{n} queries answered")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
