"""``make demo SCENARIO=plan-aggregate``: the plan's aggregation recommendation, migrated through Airflow.

1. The local stack under a read load: the repo's dashboards, the lab's fleet view (``FLEET_DASHBOARD``: the GPU
   memory copy engine per node and fleet-wide, as the read load's on-call queries read it) and the ad-hoc queries,
   all in the source's query log; then ``promshift plan`` writes ``plan.md``/``plan.json`` under
   ``reports/<time>-plan-aggregate/``.
2. The first plan group with a recommended aggregation becomes the lab's catalog group (``catalog/catalog.yaml``
   beside the plan, never the repo's catalog): its recommended metrics with ``aggregations:`` as the plan wrote
   them, its golden dashboards the repo's and the fleet view, its latency queries the plan's rewritten reads.
3. A fresh stack and Airflow on that catalog (``start_session``), the fleet view provisioned in the stack's
   dashboard folder, and the normal ``happy`` run with the read-path switch on (``run_scenario``): dual-write
   deploys the recording rules and ships only the recorded series, parity's golden layer compares each original
   read on the source with its rewrite on the target, approval, and at cut-over the fleet view's queries are
   rewritten to the recorded series.
4. After the run the demo counts series on both sides (``aggregation`` in ``report.json``): the target holds the
   recorded series only, one per node and operation, where the source holds one raw series per GPU; ``plan.md``
   is copied into the report directory. The last line printed is the report directory.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from promshift.core.catalog import Aggregate
from promshift.core.durations import format_duration
from promshift.local.demo_lifecycle import SOURCE_DATASOURCE

log = logging.getLogger("promshift.local.demo")

REPO_ROOT = Path(__file__).resolve().parents[3]
SCENARIO = "plan-aggregate"
FLEET_DASHBOARD = "fleet-copy-engine.json"
# The fleet view's panels: what the read load's on-call queries read (promshift.local.stack.read_load.ADHOC).
FLEET_PANELS = (("Copy engine per node", "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)"),
                ("Fleet copy engine", "avg(DCGM_FI_DEV_MEM_COPY_UTIL)"))
# The run's time budget from the session's start (Airflow's start-up counts: up to 7 min on a loaded machine).
TIMEOUT_S = 1200.0


def fleet_dashboard() -> str:
    """The lab's fleet view (a Grafana dashboard model): each panel reads the copy engine aggregated per node or
    fleet-wide through the source datasource, never per GPU."""
    panels = [{"id": i + 1, "type": "timeseries", "title": title, "datasource": dict(SOURCE_DATASOURCE),
               "gridPos": {"h": 8, "w": 12, "x": 12 * i, "y": 0},
               "targets": [{"refId": "A", "expr": expr, "datasource": dict(SOURCE_DATASOURCE)}]}
              for i, (title, expr) in enumerate(FLEET_PANELS)]
    model = {"title": "GPU fleet: memory copy engine", "uid": "fleet-copy-engine", "schemaVersion": 39,
             "time": {"from": "now-15m", "to": "now"}, "templating": {"list": []}, "panels": panels}
    return json.dumps(model, indent=2) + "\n"


def recommended(plan: Mapping[str, Any]) -> tuple[str, list[Mapping[str, Any]]]:
    """The first plan group (wave order) with a recommended aggregation, and its recommended aggregations."""
    for g in plan.get("groups") or []:
        found = [a for a in plan.get("aggregations") or [] if a["recommended"] and a["group"] == g["name"]]
        if found:
            return str(g["name"]), found
    blocked = [f"{a['metric']} ({a['blocked_by'][0]['why']})" for a in plan.get("aggregations") or []
               if a.get("blocked_by")][:3]
    raise ValueError("the plan recommends no aggregation" + (f"; blocked: {', '.join(blocked)}" if blocked else ""))


def aggregates_of(found: Sequence[Mapping[str, Any]]) -> list[Aggregate]:
    """The catalog's ``Aggregate`` of each plan recommendation (as the plan's catalog draft writes them)."""
    return [Aggregate(a["metric"], tuple(a["level"]), tuple(a["operations"]), float(a["window_s"])) for a in found]


def aggregation_catalog(plan: Mapping[str, Any], *, base: Path, out_dir: Path,
                        dashboards: Sequence[Path]) -> tuple[Path, str]:
    """Write the lab's catalog: ``base``'s defaults and profiles, and one group: the plan's first recommended
    aggregation(s), with ``aggregations:`` as the plan recommends them.

    The group's people come from ``base``'s first group (the demo's on-call approvers); its golden dashboards are
    ``base``'s defaults plus ``dashboards`` (copied beside the catalog: catalog paths resolve inside its folder);
    its latency queries are the plan's rewrites of the reads (they read the recorded series, as the target will).
    Returns the catalog path and the group's name."""
    doc = yaml.safe_load(base.read_text())
    name, found = recommended(plan)
    people = doc["groups"][0]
    aggregations = []
    for agg in aggregates_of(found):
        entry: dict[str, Any] = {"metric": agg.metric, "by": list(agg.by), "operations": list(agg.operations)}
        if agg.rate_s:
            entry["rate"] = format_duration(agg.rate_s)
        aggregations.append(entry)
    rewritten = list(dict.fromkeys(r["rewritten"] for a in found for r in a["reads"] if r.get("rewritten")))[:4]
    out_dir.mkdir(parents=True, exist_ok=True)
    if (base.parent / "dashboards").is_dir():
        shutil.copytree(base.parent / "dashboards", out_dir / "dashboards", dirs_exist_ok=True)
    if (base.parent / "amp_prices.yaml").is_file():  # the latency step's cost projection reads it beside the catalog
        shutil.copyfile(base.parent / "amp_prices.yaml", out_dir / "amp_prices.yaml")
    golden = list(doc.get("defaults", {}).get("parity", {}).get("golden_dashboards") or [])
    for path in dashboards:
        shutil.copyfile(path, out_dir / "dashboards" / path.name)
        golden.append(f"dashboards/{path.name}")
    series = sum(int(a["series_before"]) for a in found)
    after = sum(int(a["series_after"]) for a in found)
    group: dict[str, Any] = {
        "name": name, "description": f"`promshift plan`'s aggregation of {', '.join(a['metric'] for a in found)}: "
        f"{series:,} raw series on the source, {after:,} recorded series shipped",
        "owners": people["owners"], "approvers": people["approvers"], "wave": 1,
        "metrics": [a["metric"] for a in found], "aggregations": aggregations,
        "parity": {"golden_dashboards": list(dict.fromkeys(golden))},
        "latency": {"queries": rewritten or [f"count({aggregates_of(found)[0].recorded[0]})"]}}
    if "notify" in people:
        group["notify"] = people["notify"]
    doc["groups"] = [group]
    path = out_dir / "catalog.yaml"
    path.write_text("# The demo's catalog: the aggregation `promshift plan` recommends, as one group.\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path, name


def count(url: str, expr: str) -> int:
    """The value of a ``count(...)`` on ``url`` now (0 when it answers no series)."""
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30)
    r.raise_for_status()
    result = r.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def series_counts(source_url: str, target_url: str, aggregates: Sequence[Aggregate], *,
                  dashboards_dir: Path) -> dict[str, Any]:
    """Series of each aggregated metric on both sides over the last 10 minutes, and the fleet view's queries now.

    ``ratio``: the source's raw series per series of one recording on the target (one per node for a per-node
    recording: the GPUs per node). ``target_holds_recorded_only``: the target has each recording and none of the
    raw metric."""
    out: dict[str, Any] = {"metrics": []}
    ok = True
    for agg in aggregates:
        raw_source = count(source_url, f"count(count_over_time({agg.metric}[10m]))")
        raw_target = count(target_url, f"count(count_over_time({agg.metric}[10m]))")
        recorded = {record: count(target_url, f"count(count_over_time({record}[10m]))") for record in agg.recorded}
        each = min(recorded.values()) if recorded else 0
        out["metrics"].append({"metric": agg.metric, "level": list(agg.level), "source_raw_series": raw_source,
                               "target_raw_series": raw_target, "target_recorded_series": recorded,
                               "ratio": round(raw_source / each, 2) if each else None,
                               "ratio_all_recordings": round(raw_source / sum(recorded.values()), 2) if each else None})
        ok = ok and raw_target == 0 and each > 0 and raw_source > 0
    out["target_holds_recorded_only"] = ok
    view = dashboards_dir / FLEET_DASHBOARD
    if view.is_file():
        model = json.loads(view.read_text())
        out["fleet_view_after"] = [{"title": p.get("title"), "datasource": p.get("datasource"),
                                    "exprs": [t.get("expr") for t in p.get("targets") or []]}
                                   for p in model.get("panels") or []]
    return out


def saving_lines(plan: Mapping[str, Any], name: str) -> list[str]:
    """What plan.md says the group's aggregation saves (series and samples before and after, per month)."""
    lines = []
    for a in plan.get("aggregations") or []:
        if a["recommended"] and a["group"] == name:
            lines.append(f"  {a['metric']} by ({', '.join(a['level']) or 'fleet'}): {a['series_before']:,} -> "
                         f"{a['series_after']:,} series, {a['samples_per_s_before']:,.1f} -> "
                         f"{a['samples_per_s_after']:,.1f} samples/s, saves ${a['saved_usd']:,.2f}/month "
                         f"({', '.join(r['record'] for r in a['rules'])})")
    return lines


def run_aggregate_demo(*, nodes: int, report_root: Path, airflow_port: int, rounds: int = 3,
                       timeout_s: float = TIMEOUT_S, profile: str | None = None) -> Path:
    """The plan on a stack under the read load, the lab catalog of its aggregation, the run; the report dir.
    ``profile``: the lab catalog's profile the run uses (its profiles are the repository catalog's; else ``demo``)."""
    from promshift.adapters.settings import check_catalog_file
    from promshift.cli import main as promshift
    from promshift.local.demo import run_scenario, start_session
    from promshift.local.stack.local import LocalStack, StackConfig
    from promshift.local.stack.read_load import replay

    t0 = time.time()
    out = (report_root / f"{time.strftime('%Y%m%dT%H%M%S')}-{SCENARIO}").resolve()
    views = out / "read-load"
    views.mkdir(parents=True, exist_ok=True)
    (views / FLEET_DASHBOARD).write_text(fleet_dashboard())
    stack = LocalStack(StackConfig.from_env(nodes=nodes))
    stack.up()
    dashboards = REPO_ROOT / "catalog" / "dashboards"
    started = time.monotonic()
    answered = replay(stack.source_url, [dashboards, views], rounds=rounds)
    time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))  # a few rule evaluations in the log too
    plan_dir = out / "plan"
    code = promshift(["plan", "--source", stack.source_url, "--query-log", str(stack.source_query_log_path),
                      "--dashboards", str(dashboards), "--dashboards", str(views), "--period", "1h",
                      "--out", str(plan_dir)])
    if code != 0:
        raise RuntimeError(f"promshift plan exited {code} ({plan_dir})")
    plan = json.loads((plan_dir / "plan.json").read_text())
    catalog, name = aggregation_catalog(plan, base=REPO_ROOT / "catalog" / "metric_groups.yaml",
                                        out_dir=out / "catalog", dashboards=[views / FLEET_DASHBOARD])
    checked = check_catalog_file(catalog)
    if checked.problems:
        raise ValueError(f"the demo catalog {catalog} does not pass the check: {checked.problems[0]}")
    group = checked.catalog.get(name)
    print(f"=== promshift plan on the local stack ({answered} queries replayed): {plan_dir / 'plan.md'} ===\n"
          + "\n".join(saving_lines(plan, name))
          + f"\n=== migrating {name} with aggregations "
            f"{', '.join(r for a in group.aggregations for r in a.recorded)} (catalog {catalog}) ===", flush=True)
    session = start_session(nodes=nodes, airflow_port=airflow_port, catalog_path=catalog, profile=profile)
    # The fleet view is provisioned beside the stack's DCGM dashboard: the read-path switch edits both folders' files.
    shutil.copyfile(views / FLEET_DASHBOARD, session.stack.dashboards_dir / FLEET_DASHBOARD)
    session.started = t0  # the demo's wall time counts from the plan's stack

    def extra(s: Any) -> dict[str, Any]:
        counts = series_counts(s.stack.source_url, s.stack.target_url, group.aggregations,
                               dashboards_dir=s.stack.dashboards_dir)
        return {"aggregation": {"plan": str(plan_dir), "catalog": str(catalog), "group": name,
                                "aggregations": [{"metric": a.metric, "by": list(a.by),
                                                  "operations": list(a.operations), "recorded": list(a.recorded)}
                                                 for a in group.aggregations],
                                "saved_usd_per_month": round(sum(float(a["saved_usd"]) for a in plan["aggregations"]
                                                                 if a["recommended"] and a["group"] == name), 4),
                                **counts}}

    report_dir = run_scenario(session, group_name=name, scenario="happy", report_root=out / "runs",
                              timeout_s=timeout_s, read_path=True, report_extra=extra)
    shutil.copyfile(plan_dir / "plan.md", report_dir / "plan.md")
    report = json.loads((report_dir / "report.json").read_text())
    agg = report.get("aggregation") or {}
    for m in agg.get("metrics") or []:
        print(f"Target: {m['metric']}: {m['target_raw_series']} raw series; recorded "
              + ", ".join(f"{k} {v}" for k, v in m["target_recorded_series"].items())
              + f"; source {m['source_raw_series']} raw series ({m['ratio']}x fewer per recording)")
    for p in agg.get("fleet_view_after") or []:
        print(f"Fleet view after cut-over: {p['title']}: {p['datasource']} {p['exprs']}")
    print(f"plan.md (the saving): {report_dir / 'plan.md'}")
    print(f"demo wall time {time.time() - t0:.0f}s")
    return report_dir
