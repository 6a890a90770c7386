"""make e2e's wall time on two xdist workers: modules by number of tests (xdist's default) or longest first.

Each module's seconds are ``tests/conftest.py``'s ``MODULE_SECONDS`` (loaded 2-core runs); how they split over the
module's tests is ``SPLITS`` (the session's start in the first test), else even. Two measures of each order:

- ``simulated``: xdist 3.8.0's ``LoadScopeScheduling`` rules (modules in order, by number of tests unless
  ``--no-loadscope-reorder``; each worker gets a module, then another while it has at most two tests to go);
- ``stand_in``: real pytest-xdist on a generated suite of the same modules and tests, each sleeping 1/``SCALE`` of
  its seconds, the wall time pytest reports scaled back (its start-up is scaled too: a few seconds x SCALE).

Both with k8s-cr as listed and with ``--k8s-extra`` seconds more. Writes ``bench/results/e2e-order.json``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCALE = 20.0
K8S = "e2e/test_k8s_cr_demo_e2e.py"
SPINE = "e2e/test_demo_e2e.py"  # make test's, not make e2e's
# Share of a module's seconds per test, where not even (the module's stack and Airflow start in its first test).
SPLITS = {
    "board/test_board_airflow.py": [71, 2, 2, 10, 2, 40],
    "e2e/test_amp_demo_e2e.py": [200, 126],
    "e2e/test_fleet_demo_e2e.py": [431, 3, 3, 3],
    "e2e/test_git_demo_e2e.py": [236, 170],
    "integration/test_horizon_local.py": [7.6, 0.3],
    "integration/test_queue_swap.py": [46, 5, 0.5, 30],
    "integration/test_retire_source.py": [25, 9, 9, 9, 35, 7],
}
TESTS_PER_MODULE = {"integration/test_faults.py": 14, "integration/test_ha_pairs.py": 3,
                    "integration/test_parity_query_limits.py": 9}


def module_seconds() -> dict[str, float]:
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULE_SECONDS":
            return {k: float(v) for k, v in ast.literal_eval(node.value).items() if k != SPINE}
    raise ValueError("tests/conftest.py has no MODULE_SECONDS")


def modules(k8s_extra: float) -> list[tuple[str, list[float]]]:
    """make e2e's modules in pytest's collection order (by path), each with its tests' seconds."""
    out = []
    for name, total in sorted(module_seconds().items()):
        total += k8s_extra if name == K8S else 0.0
        shares = SPLITS.get(name) or [1.0] * TESTS_PER_MODULE.get(name, 1)
        out.append((name, [total * s / sum(shares) for s in shares]))
    return out


def ordered(mods: list[tuple[str, list[float]]], longest_first: bool) -> list[tuple[str, list[float]]]:
    if longest_first:  # tests/conftest.py's order, kept by --no-loadscope-reorder
        return sorted(mods, key=lambda m: -sum(m[1]))
    return sorted(mods, key=lambda m: -len(m[1]))  # xdist's default reorder (stable)


def simulate(mods: list[tuple[str, list[float]]], workers: int = 2) -> float:
    queue = OrderedDict((name, list(tests)) for name, tests in mods)
    pending: dict[int, list[float]] = {w: [] for w in range(workers)}

    def assign(w: int) -> None:
        pending[w] += queue.popitem(last=False)[1]

    for w in range(workers):
        if queue:
            assign(w)
    for w in range(workers):
        if queue and len(pending[w]) <= 2:
            assign(w)
    running = {w: pending[w].pop(0) for w in range(workers) if pending[w]}
    end = 0.0
    while running:
        w = min(running, key=running.__getitem__)
        now = running.pop(w)
        end = max(end, now)
        if queue and len(pending[w]) <= 2:  # xdist: on each test's completion
            assign(w)
        if pending[w]:
            running[w] = now + pending[w].pop(0)
    return end


def stand_in(mods: list[tuple[str, list[float]]], longest_first: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="e2e-order-") as tmp:
        root = Path(tmp)
        for name, tests in mods:
            path = root / "tests" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("import time\n\n" + "".join(
                f"\ndef test_{i}():\n    time.sleep({s / SCALE:.3f})\n" for i, s in enumerate(tests)))
        flags = []
        if longest_first:
            order = {name: -sum(tests) for name, tests in mods}
            (root / "conftest.py").write_text(
                "from pathlib import Path\n\nORDER = " + repr(order) + "\n\n\n"
                "def pytest_collection_modifyitems(items):\n"
                "    root = Path(__file__).parent / 'tests'\n"
                "    items.sort(key=lambda i: ORDER[Path(str(i.path)).relative_to(root).as_posix()])\n")
            flags = ["--no-loadscope-reorder"]
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                               "--dist", "loadfile", *flags, "tests"], cwd=root, capture_output=True, text=True,
                              check=True)
        seconds = re.search(r"passed in ([\d.]+)s", done.stdout)
        if seconds is None:
            raise RuntimeError(done.stdout[-2000:])
        return float(seconds.group(1)) * SCALE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-extra", type=float, default=300.0)
    parser.add_argument("--no-stand-in", action="store_true", help="the simulation only")
    args = parser.parse_args()
    runs = []
    for extra in (0.0, args.k8s_extra):
        mods = modules(extra)
        row: dict[str, object] = {"k8s_cr_s": round(dict(mods)[K8S][0]), "work_s": round(sum(sum(t) for _, t in mods)),
                                  "simulated": {}, "stand_in": {}}
        for key, lpt in (("by_number_of_tests", False), ("longest_first", True)):
            row["simulated"][key] = round(simulate(ordered(mods, lpt)))  # type: ignore[index]
            if not args.no_stand_in:
                row["stand_in"][key] = round(stand_in(mods, lpt))  # type: ignore[index]
        runs.append(row)
        print(json.dumps(row), flush=True)
    out = REPO / "bench" / "results" / "e2e-order.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "how": " ".join(__doc__.split("\n", 1)[1].split()),
                               "scale": SCALE, "runs": runs}, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
