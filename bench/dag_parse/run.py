"""How long Airflow's DAG processor spends on ``dags/promshift_groups.py`` at 200 and 1,000 groups.

    .venv/bin/python bench/dag_parse/run.py [--groups 200 1000]

For each size a catalog like bench/catalog/run.py's is generated, and a fresh Python process (cold: nothing
imported, as a DAG processor's child parses a file) measures:

Modules load from cached bytecode, as in an installed image (an unmeasured first run writes the cache).

- ``import_s``: importing Airflow's SDK and promshift's DAG factory;
- ``build_s``: running the DAG file once (catalog parse, every DAG and task built);
- ``cold_s``: the two together, what one parse of the file costs a fresh process;
- ``warm_s``: running the file again in the same process (modules imported, caches warm);
- ``dags``: how many DAGs the file made;
- ``collect_s``: one full ``gc.collect()`` after the two runs: the DAG file pauses Python's cyclic collector
  while it builds, and this is the pass it leaves for later (timed on its own, so the baselines below are
  not charged for it);
- each phase's CPU seconds beside its wall-clock seconds (``build_cpu_s`` ...): on a shared machine the
  wall clock counts other processes' work too;
- the baseline beside it, in the same process: ``per_group_build_s``, the shape the file had before, one
  migration DAG of 13 tasks per group (each built by the same factory with its group alone in the form), which
  no setting of Airflow brings under a second at 1,000 groups; and ``shape_build_s``: the file's DAGs in
  Airflow's own terms (as many DAGs, each with its task ids as ``EmptyOperator``s with their
  ``execution_timeout``, the same edges, default_args and tags; no params, schedule, docs or XComArgs),
  Airflow's floor for that many tasks and edges.

Writes ``bench/results/dag-parse.json`` (``groups``, ``cold_s``, ``warm_s``, ``build_s``: lists in the same order).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "dag-parse.json"
sys.path.insert(0, str(REPO / "bench" / "catalog"))

CHILD = r"""
import gc, json, os, runpy, sys, time
clock = time.perf_counter
cpu = time.process_time
w0, c0 = clock(), cpu()
import airflow.sdk
import promshift.orchestration.dag_factory as factory
from promshift.adapters.settings import load_catalog
from shape import build_same_shape  # bench/dag_parse/shape.py
w1, c1 = clock(), cpu()
first = runpy.run_path(sys.argv[1])
w2, c2 = clock(), cpu()
runpy.run_path(sys.argv[1])
w3, c3 = clock(), cpu()
gc.collect()  # the full collection the file's paused collector left for later, timed on its own
wg, cg = clock(), cpu()
dags = list({v.dag_id: v for v in first.values() if isinstance(v, airflow.sdk.DAG)}.values())
n = len(dags)
# The baseline: the shape this file had before, one migration DAG (13 tasks) per group, built by the same
# factory (each group alone in its DAG's form).
groups = load_catalog(os.environ["PROMSHIFT_CATALOG"]).groups
for group in groups:
    factory.build_migration_dag([group], target=group.target, catalog_path=os.environ["PROMSHIFT_CATALOG"])
w4, c4 = clock(), cpu()
build_same_shape(dags)
w5, c5 = clock(), cpu()
tasks = sum(len(d.tasks) for d in dags)
print(json.dumps({"import_s": w1 - w0, "build_s": w2 - w1, "warm_s": w3 - w2, "dags": n, "tasks": tasks,
                  "collect_s": wg - w3, "per_group_build_s": w4 - wg, "shape_build_s": w5 - w4,
                  "import_cpu_s": c1 - c0, "build_cpu_s": c2 - c1, "warm_cpu_s": c3 - c2,
                  "collect_cpu_s": cg - c3, "per_group_build_cpu_s": c4 - cg, "shape_build_cpu_s": c5 - c4}))
"""


def measure(groups: int, tmp: Path) -> dict[str, Any]:
    from run import catalog_text  # bench/catalog/run.py

    catalog = tmp / f"catalog-{groups}.yaml"
    catalog.write_text(catalog_text(groups))
    env = {**os.environ, "PROMSHIFT_CATALOG": str(catalog), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW_HOME": str(tmp / "airflow-home")}
    env.pop("PROMSHIFT_PROFILE", None)
    # Modules load from their cached bytecode, as in an installed image (pip compiles it at install): without
    # it every cold parse would also compile each module's source, a cost no deployed DAG processor pays.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH"))
                                        if p)
    for _ in range(2):  # the first run writes the bytecode cache (and is not kept); the second is measured
        done = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "dags" / "promshift_groups.py")], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{groups} groups: the parse failed: {done.stderr.strip().splitlines()[-1:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    row["groups"] = groups
    row["cold_s"] = round(row["import_s"] + row["build_s"], 3)
    row["cold_cpu_s"] = round(row["import_cpu_s"] + row["build_cpu_s"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[200, 1000])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="promshift-dag-parse-") as tmp:
        rows = [measure(groups, Path(tmp)) for groups in args.groups]
    print(f"{'groups':>7} {'dags':>6} {'tasks':>7} {'import':>8} {'build':>8} {'cold':>8} {'warm':>8} "
          f"{'baseline: a DAG per group':>26} {'same shape (EmptyOperators)':>28} {'build CPU':>10} {'shape CPU':>10}")
    for r in rows:
        print(f"{r['groups']:>7,} {r['dags']:>6,} {r['tasks']:>7,} {r['import_s']:>7.2f}s {r['build_s']:>7.2f}s "
              f"{r['cold_s']:>7.2f}s {r['warm_s']:>7.2f}s {r['per_group_build_s']:>25.2f}s "
              f"{r['shape_build_s']:>27.2f}s {r['build_cpu_s']:>9.2f}s {r['shape_build_cpu_s']:>9.2f}s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "DAG file parse time (cold: a fresh process; warm: the same process again)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "bench/dag_parse/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "groups": [r["groups"] for r in rows], "cold_s": [r["cold_s"] for r in rows],
        "warm_s": [r["warm_s"] for r in rows], "build_s": [r["build_s"] for r in rows],
        "import_s": [r["import_s"] for r in rows], "dags": [r["dags"] for r in rows],
        "tasks": [r["tasks"] for r in rows], "collect_s": [r["collect_s"] for r in rows],
        "per_group_build_s": [r["per_group_build_s"] for r in rows],
        "shape_build_s": [r["shape_build_s"] for r in rows],
        # CPU seconds of the same phases (time.process_time): what the DAG processor spends, less bent by the
        # machine's other work than the wall-clock figures above.
        **{f"{phase}_cpu_s": [r[f"{phase}_cpu_s"] for r in rows]
           for phase in ("import", "build", "cold", "warm", "collect", "per_group_build", "shape_build")},
        "budget_build_s_at_1000": 1.0,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
