"""Run the fault matrix (issue 12 part 4) on a fresh local stack; print a table, write ``bench/results/faults.json``.

Each fault is a function of the lab's fault harness, ``promshift.local.faults`` (the integration tests in
``tests/integration/test_faults.py`` call the same ones). ``faults.json`` is a list with one object per fault:
``{fault, stage, outcome, safe, source_config_identical, source_samples_lost, audit_events, notes}`` plus
``number``, ``duration_s`` and ``details`` (the measurement behind each field); ``faults-run.json`` says when,
where and how long.

The stack: 4 simulated nodes (8 GPUs each), source and target Prometheus (Debian's 2.42) scraping every 2 s,
under a throwaway directory, on free ports of 127.0.0.1; Prometheus runs with a 5 s
``--storage.remote.flush-deadline`` (see ``promshift.local.faults.FLUSH_DEADLINE``). Faults 9 and 13 need the local
PostgreSQL (127.0.0.1:5432, trust auth, user postgres): each creates and drops its own database.

Run: ``PYTHONPATH=include .venv/bin/python bench/faults/run.py`` (about 4 minutes on 2 cores);
``--only 3,9`` runs some faults and writes nothing unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="promshift-faults-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("PROMSHIFT_AUDIT_KEY", uuid.uuid4().hex * 2)
sys.path.insert(0, str(REPO_ROOT / "include"))

import promshift.local.faults as matrix  # noqa: E402
from promshift.local.stack.local import LocalStack, StackConfig, find_free_ports  # noqa: E402

COLUMNS = ("#", "fault", "stage", "safe", "identical", "lost", "s")


def machine() -> dict[str, object]:
    version = subprocess.run([matrix.PROMETHEUS_BIN, "--version"], capture_output=True, text=True).stdout
    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "prometheus": version.splitlines()[0] if version else None, "loadavg_start": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated fault numbers")
    parser.add_argument("--out", type=Path, help="result file (default bench/results/faults.json for a full run)")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway directory")
    parser.add_argument("--default-flush-deadline", action="store_true",
                        help="run Prometheus with its default --storage.remote.flush-deadline (1m) instead of "
                             f"{matrix.FLUSH_DEADLINE}: a rollback while the target is down then waits on it")
    args = parser.parse_args(argv)
    only = {int(n) for n in args.only.split(",")} if args.only else None
    out = args.out or (None if only else REPO_ROOT / "bench" / "results" / "faults.json")
    faults = [(n, fn) for n, fn in matrix.FAULTS if only is None or n in only]

    work = Path(tempfile.mkdtemp(prefix="promshift-faults-"))
    started = time.monotonic()
    meta = {"benchmark": "fault matrix (issue 12 part 4): each fault on the real local stack",
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": "bench/faults/run.py "
            + " ".join(argv if argv is not None else sys.argv[1:]), "machine": machine()}
    fleet_port, source_port, target_port = find_free_ports(3)
    config = StackConfig(home=work / "stack", nodes=4, fleet_port=fleet_port, source_port=source_port,
                         target_port=target_port, scrape_interval="2s",
                         prometheus_bin=matrix.PROMETHEUS_BIN if args.default_flush_deadline
                         else matrix.prometheus_wrapper(work / "bin"))
    flush = "1m (Prometheus' default)" if args.default_flush_deadline else matrix.FLUSH_DEADLINE
    meta["stack"] = {"nodes": config.nodes, "gpus_per_node": 8, "scrape_interval": config.scrape_interval,
                     "remote_write_flush_deadline": flush, "groups": [matrix.GROUP, matrix.OTHER_GROUP]}
    stack = LocalStack(config)
    results = []
    env = None
    try:
        stack.up(timeout=120)
        env = matrix.FaultEnv(stack, work / "faults")
        for number, fn in faults:
            print(f"--- fault {number}: {fn.__name__}", flush=True)
            t0 = time.monotonic()
            try:
                result = fn(env).to_dict()
            except Exception as exc:  # noqa: BLE001 - a fault that raised is recorded as not safe, and the rest run
                guarded = env.guard(env.baseline)  # the next fault starts from the stack's own config
                result = {"fault": fn.__name__, "stage": "?", "outcome": f"raised {type(exc).__name__}: {exc}",
                          "safe": False, "source_config_identical": None, "source_samples_lost": None,
                          "audit_events": [], "notes": "the fault function raised; see details.traceback",
                          "duration_s": round(time.monotonic() - t0, 1),
                          "details": {"traceback": traceback.format_exc()[-3000:], "guard": guarded}}
            results.append({"number": number, **result})
            print(f"    safe={result['safe']} identical={result['source_config_identical']} "
                  f"lost={result['source_samples_lost']} ({result['duration_s']}s): {result['outcome'][:160]}",
                  flush=True)
    finally:
        if env is not None:
            env.close()
        stack.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["machine"]["loadavg_end"] = list(os.getloadavg())  # type: ignore[index]
    meta["all_safe"] = all(r["safe"] for r in results)
    meta["faults"] = len(results)

    print()
    print(f"{'#':>2}  {'fault':52} {'stage':28} {'safe':5} {'ident':5} {'lost':>5} {'s':>6}")
    for r in results:
        print(f"{r['number']:>2}  {r['fault'][:52]:52} {str(r['stage'])[:28]:28} {str(r['safe']):5} "
              f"{str(r['source_config_identical']):5} {str(r['source_samples_lost']):>5} {r['duration_s']:>6}")
    print(f"\n{len(results)} faults in {meta['duration_s']} s; all safe: {meta['all_safe']}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str) + "\n")
        out.with_name(out.stem + "-run.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {out} and {out.with_name(out.stem + '-run.json')}")
    return 0 if meta["all_safe"] else 1


if __name__ == "__main__":
    sys.exit(main())
