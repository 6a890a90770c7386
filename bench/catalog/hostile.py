"""`promshift catalog check` and the DAG file on a catalog whose golden and latency queries sit at every
PromQL budget's edge, and just past it, beside the shipped catalog in the same run.

    .venv/bin/python bench/catalog/hostile.py

The budget (``core.promql.check_budget``) is checked before the Rust parser, whose memory grows with the
square of the syntax tree's depth. Three catalogs, each a copy of the shipped one with its golden dashboard:

- ``shipped``: as it is (the baseline);
- ``edge``: every group gets latency queries and golden panels exactly at each edge: 64 nested brackets,
  256 operators, 65,536 characters (the catalog's own scalar limit too), and all three at once;
- ``over``: the same one step past each edge, plus the shapes that used to kill the process (5,000 nested
  parentheses, as many ``+`` terms as 60,000 characters hold, 9,979 characters of nesting).

Each command runs in a fresh process (``os.wait4`` gives its own CPU time and peak RSS): ``promshift catalog
check FILE`` and one parse of ``dags/promshift_groups.py`` (Airflow's import timeout is 30 s). Budget: 5 s and
300 MB each. Updates the ``hostile_queries`` key of ``bench/results/catalog.json`` (other keys stay).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "catalog.json"
BUDGET_S, BUDGET_MB = 5.0, 300.0


def nested(depth: int, m: str) -> str:
    """``depth`` brackets deep: ``abs(`` wrappers around a 2-bracket read (``avg_over_time(m[5m])``)."""
    return "abs(" * (depth - 2) + f"avg_over_time({m}[5m])" + ")" * (depth - 2)


def operators(count: int, m: str) -> str:
    return m + " + 1" * count


def long(chars: int, m: str) -> str:
    head, tail = f'max({m}{{Hostname=~"', '"})'
    body = "|".join(f"h{i:06d}" for i in range(chars // 8 + 1))
    return head + body[: chars - len(head) - len(tail)] + tail


def everything(depth: int, ops: int, chars: int, m: str) -> str:
    core = "(" * (depth - 2) + f"avg_over_time({m}[5m])" + " + 1" * ops + ")" * (depth - 2)
    pad = chars - len(core) - len(' or max({Hostname=~""})') - len(m)
    return core + f' or max({m}{{Hostname=~"' + "a" * pad + '"})'


def queries(kind: str, m: str) -> list[str]:
    """At each edge (``edge``), or one past it and the old killers (``over``); a query longer than 65,536
    characters is refused by the catalog's own scalar limit first, so ``over`` has none."""
    if kind == "edge":
        return [nested(64, m), operators(256, m), long(65_536, m), everything(64, 255, 65_536, m)]
    return [nested(65, m), operators(257, m), "(" * 5000 + m + ")" * 5000, (m + "+") * (60_000 // (len(m) + 1)) + m,
            "(" * 4989 + m + ")" * 4989]


def write_catalog(kind: str, folder: Path) -> Path:
    shutil.copytree(REPO / "catalog", folder, dirs_exist_ok=True)
    path = folder / "metric_groups.yaml"
    if kind == "shipped":
        return path
    doc = yaml.safe_load(path.read_text())
    for group in doc["groups"]:
        qs = queries(kind, group["metrics"][0] if group.get("metrics") else "DCGM_FI_DEV_SM_CLOCK")
        group.setdefault("latency", {})["queries"] = qs
        group.setdefault("parity", {})["golden_dashboards"] = [f"dashboards/{kind}-{group['name']}.json"]
        panels = [{"title": f"q{i}", "type": "timeseries", "targets": [{"expr": q, "refId": "A"}]}
                  for i, q in enumerate(qs)]
        (folder / "dashboards" / f"{kind}-{group['name']}.json").write_text(json.dumps({"title": kind,
                                                                                       "panels": panels}))
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    return path


def run(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One fresh process: its wall and CPU seconds, peak RSS, exit code and last lines of output."""
    wall = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = out.strip().splitlines()
    return {"wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "exit": proc.returncode,
            "lines": len(lines), "first_lines": [line[:300] for line in lines[:4]], "all_lines": lines}


# The file's own cost (``build``: the catalog parse and every DAG built) beside the imports every parse of
# any DAG file pays first (Airflow's SDK and promshift's factory).
DAG_CHILD = r"""
import resource, runpy, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import airflow.sdk
import promshift.orchestration.dag_factory
t1, c1 = time.perf_counter(), time.process_time()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
found = runpy.run_path(sys.argv[1])
t2, c2 = time.perf_counter(), time.process_time()
dags = sorted({v.dag_id for v in found.values() if isinstance(v, airflow.sdk.DAG)})
print(len(dags), "DAGs:", ", ".join(dags))
print("BUILD", t2 - t1, c2 - c1, t1 - t0, c1 - c0, rss1)
"""


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="promshift-hostile-") as tmp:
        env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW_HOME": str(Path(tmp) / "af")}
        env.pop("PROMSHIFT_PROFILE", None)
        for kind in ("shipped", "edge", "over"):
            path = write_catalog(kind, Path(tmp) / kind)
            env_kind = {**env, "PROMSHIFT_CATALOG": str(path)}
            check = run([sys.executable, "-c", "import sys; from promshift.cli import main; "
                         "sys.exit(main(['catalog', 'check', sys.argv[1]]))", str(path)], env_kind)
            dag = run([sys.executable, "-c", DAG_CHILD, str(REPO / "dags" / "promshift_groups.py")], env_kind)
            build = next(line.split() for line in dag.pop("all_lines") if line.startswith("BUILD "))
            dag.update(build_wall_s=round(float(build[1]), 3), build_cpu_s=round(float(build[2]), 3),
                       import_wall_s=round(float(build[3]), 3), import_cpu_s=round(float(build[4]), 3),
                       rss_after_imports_mb=round(float(build[5]), 1))
            check.pop("all_lines")
            longest = max((len(q) for q in queries(kind, "m")), default=0) if kind != "shipped" else 0
            rows.append({"catalog": kind, "longest_query_chars": longest, "catalog_check": check, "dag_file": dag})
    print("CPU seconds of the whole process (of the DAG file's own build, after the imports every DAG file pays)")
    print(f"{'catalog':>8} {'command':>14} {'wall s':>7} {'CPU s':>12} {'peak MB':>8} {'exit':>4}  first line")
    ok = True
    for row in rows:
        for name in ("catalog_check", "dag_file"):
            r = row[name]
            cpu = f"{r['cpu_s']:.2f}" + (f" ({r['build_cpu_s']:.2f})" if "build_cpu_s" in r else "")
            print(f"{row['catalog']:>8} {name:>14} {r['wall_s']:>7.2f} {cpu:>12} {r['peak_rss_mb']:>8.0f} "
                  f"{r['exit']:>4}  {(r['first_lines'] or [''])[0][:90]}")
            ok = ok and r.get("build_cpu_s", r["cpu_s"]) <= BUDGET_S and r["peak_rss_mb"] <= BUDGET_MB
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["hostile_queries"] = {
        "benchmark": "catalog check and the DAG file on golden/latency queries at and past the PromQL budget",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "bench/catalog/hostile.py",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "budget": {"cpu_s": BUDGET_S, "peak_rss_mb": BUDGET_MB},
        "within_budget": ok,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}; within budget: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
