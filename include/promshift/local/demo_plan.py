"""``make demo SCENARIO=plan``: the local stack under a replayed read load, then ``promshift plan`` on it.

The source writes its query log (``query_log_file``); dashboards refresh and a few ad-hoc queries run
(``stack.read_load``) while the source's rules evaluate; then the plan is written under
``reports/<time>-plan/`` and its summary printed. Then the first recommended group that has safe label drops
(else the first group) is migrated with them: its catalog entry, with ``drop_labels``, is written into the
demo's catalog (``catalog.yaml`` beside the plan, with the repo catalog's defaults, profiles and dashboards),
and it runs through the normal demo (a fresh stack and Airflow, scenario ``happy``: dual-write with the
``labeldrop``, warm-up, parity, latency, approval, cut-over), whose parity compares the target with the
source stripped of the dropped labels.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.read_load import replay

REPO_ROOT = Path(__file__).resolve().parents[3]


def pick_group(plan: Mapping[str, Any], host_label: str) -> Mapping[str, Any]:
    """The first recommended group (wave order) with a label drop it can declare, else the first group."""
    groups = list(plan.get("groups") or [])
    if not groups:
        raise ValueError("the plan recommends no group to migrate")
    return next((g for g in groups if any(d != host_label for d in g["labeldrop"])), groups[0])


def demo_catalog(plan: Mapping[str, Any], *, base: Path, out_dir: Path) -> tuple[Path, str]:
    """Write the demo's catalog: ``base``'s defaults and profiles, and the picked plan group with its drops.

    The group's people come from ``base``'s first group (the demo's on-call approvers); its golden
    dashboards are copied beside the catalog (catalog paths resolve inside its folder). Returns the
    catalog path and the group's name.
    """
    doc = yaml.safe_load(base.read_text())
    host_label = str(doc.get("defaults", {}).get("host_label", "Hostname"))
    g = pick_group(plan, host_label)
    people = doc["groups"][0]
    drops = [d for d in g["labeldrop"] if d != host_label and not d.startswith("__")]
    queries = list(g.get("golden_queries") or []) or [f"sum by ({host_label}) ({g['metrics'][0]})"]
    entry: dict[str, Any] = {"name": g["name"], "description": f"first group of `promshift plan` ({g['series']:,} "
                             f"series), with its safe label drops", "owners": people["owners"],
                             "approvers": people["approvers"], "wave": 1, "metrics": list(g["metrics"]),
                             "latency": {"queries": queries}}
    if "notify" in people:
        entry["notify"] = people["notify"]
    if drops:
        entry["drop_labels"] = drops
    doc["groups"] = [entry]
    out_dir.mkdir(parents=True, exist_ok=True)
    if (base.parent / "dashboards").is_dir():
        shutil.copytree(base.parent / "dashboards", out_dir / "dashboards", dirs_exist_ok=True)
    path = out_dir / "catalog.yaml"
    path.write_text("# The demo's catalog: the first group `promshift plan` recommends, with its label drops.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path, g["name"]


def run_plan_demo(*, nodes: int, report_root: Path, rounds: int = 3, airflow_port: int | None = None) -> str:
    """Start (or reuse) the stack, replay the read load, write the plan; with ``airflow_port``, then migrate
    the first recommended group with its drops through the normal demo. Return the printed text."""
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
    text = f"=== promshift plan on the local stack ({answered} queries replayed; exit {code}) ===\n{out}"
    if airflow_port is None or code != 0:
        return text
    from promshift.adapters.settings import check_catalog_file
    from promshift.local.demo import run_scenario, start_session

    plan = json.loads((out / "plan.json").read_text())
    catalog, name = demo_catalog(plan, base=REPO_ROOT / "catalog" / "metric_groups.yaml", out_dir=out / "catalog")
    checked = check_catalog_file(catalog)
    if checked.problems:
        raise ValueError(f"the demo catalog {catalog} does not pass the check: {checked.problems[0]}")
    group = checked.catalog.get(name)
    print(f"{text}\n=== migrating {name} ({len(group.metrics)} metrics) with drop_labels "
          f"{list(group.drop_labels) or 'none'} (catalog {catalog}) ===", flush=True)
    session = start_session(nodes=nodes, airflow_port=airflow_port, catalog_path=catalog)
    report = run_scenario(session, group_name=name, scenario="happy", report_root=report_root)
    return f"{report}"
