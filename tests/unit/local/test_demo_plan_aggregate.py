"""``make demo SCENARIO=plan-aggregate``'s pieces that need no server: the fleet view the read load reads, the lab
catalog written from a plan's aggregation, and the refusal of a plan that recommends none."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.settings import check_catalog_file
from promshift.core.read_path import SWITCH, DatasourceRef, plan_dashboard
from promshift.local.demo import main
from promshift.local.demo_lifecycle import SOURCE_DATASOURCE, TARGET_DATASOURCE
from promshift.local.demo_plan_aggregate import (
    FLEET_DASHBOARD,
    REPO_ROOT,
    aggregation_catalog,
    fleet_dashboard,
    recommended,
    saving_lines,
)

RECORDED = ("Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:sum", "Hostname:DCGM_FI_DEV_MEM_COPY_UTIL:count")


def _plan() -> dict[str, Any]:
    """A plan's shape (plan.json) with one recommended aggregation in its second group and a blocked one."""
    rewritten = f"(sum by (Hostname) ({RECORDED[0]}) / sum by (Hostname) ({RECORDED[1]}))"
    return {"groups": [{"name": "dcgm-fi-dev-gpu"}, {"name": "dcgm-fi-dev-other"}],
            "aggregations": [
                {"metric": "DCGM_FI_DEV_MEM_COPY_UTIL", "group": "dcgm-fi-dev-other", "recommended": True,
                 "level": ["Hostname"], "operations": ["sum", "count"], "window_s": 0.0,
                 "rules": [{"record": r, "expr": ""} for r in RECORDED], "series_before": 160, "series_after": 40,
                 "samples_per_s_before": 32.0, "samples_per_s_after": 8.0, "saved_usd": 5.69,
                 "reads": [{"reader": "dashboard:fleet", "read": "avg by (Hostname) (DCGM_FI_DEV_MEM_COPY_UTIL)",
                            "rewritten": rewritten}], "blocked_by": []},
                {"metric": "DCGM_FI_DEV_GPU_TEMP", "group": "dcgm-fi-dev-gpu", "recommended": False,
                 "blocked_by": [{"reader": "dashboard:dcgm", "expr": "DCGM_FI_DEV_GPU_TEMP", "why": "per GPU"}]}]}


def test_the_lab_catalog_carries_the_plans_aggregation_and_passes_the_check(tmp_path: Path) -> None:
    view = tmp_path / FLEET_DASHBOARD
    view.write_text(fleet_dashboard())
    path, name = aggregation_catalog(_plan(), base=REPO_ROOT / "catalog" / "metric_groups.yaml",
                                     out_dir=tmp_path / "catalog", dashboards=[view])
    assert name == "dcgm-fi-dev-other" and path.parent == tmp_path / "catalog"
    checked = check_catalog_file(path)
    assert not checked.problems, checked.problems
    group = checked.catalog.get(name)
    assert [g.name for g in checked.catalog.groups] == [name]
    assert group.metrics == ("DCGM_FI_DEV_MEM_COPY_UTIL",)
    assert [a.recorded for a in group.aggregations] == [RECORDED]
    # The keep filter ships the recordings, not the raw metric; the latency queries read the recordings.
    selector = group.selector()
    assert selector.startswith('{__name__=~"') and selector.endswith('"}'), selector
    keeps = re.compile(json.loads(selector[len("{__name__=~"):-1]))  # a PromQL string: JSON's escapes
    assert all(keeps.fullmatch(r) for r in RECORDED) and not keeps.fullmatch("DCGM_FI_DEV_MEM_COPY_UTIL")
    assert all(RECORDED[0] in q for q in group.latency.queries)
    assert (tmp_path / "catalog" / "dashboards" / FLEET_DASHBOARD).read_text() == fleet_dashboard()
    assert (tmp_path / "catalog" / "amp_prices.yaml").read_bytes() == \
        (REPO_ROOT / "catalog" / "amp_prices.yaml").read_bytes()  # the cost projection reads it beside the catalog
    # The repo's catalog is never the one written.
    assert "dcgm-fi-dev-other" not in (REPO_ROOT / "catalog" / "metric_groups.yaml").read_text()
    assert "160 -> 40 series" in saving_lines(_plan(), name)[0]


def test_the_fleet_view_switches_to_the_target_with_its_reads_rewritten(tmp_path: Path) -> None:
    view = tmp_path / FLEET_DASHBOARD
    view.write_text(fleet_dashboard())
    path, name = aggregation_catalog(_plan(), base=REPO_ROOT / "catalog" / "metric_groups.yaml",
                                     out_dir=tmp_path / "catalog", dashboards=[view])
    group = check_catalog_file(path).catalog.get(name)
    text = fleet_dashboard()
    plan = plan_dashboard(text, group, source=DatasourceRef(**SOURCE_DATASOURCE),
                          target=DatasourceRef(**TARGET_DATASOURCE))
    assert [p.state for p in plan.panels] == [SWITCH, SWITCH], plan.to_dict()
    after = json.loads(plan.apply(text))
    exprs = [t["expr"] for p in after["panels"] for t in p["targets"]]
    assert all(RECORDED[0] in e and RECORDED[1] in e for e in exprs), exprs
    assert all("DCGM_FI_DEV_MEM_COPY_UTIL)" not in e for e in exprs), exprs
    assert {p["datasource"]["uid"] for p in after["panels"]} == {TARGET_DATASOURCE["uid"]}


def test_a_plan_without_a_recommended_aggregation_is_refused_naming_a_blocker() -> None:
    plan = _plan()
    plan["aggregations"] = plan["aggregations"][1:]
    with pytest.raises(ValueError, match=r"recommends no aggregation; blocked: DCGM_FI_DEV_GPU_TEMP \(per GPU\)"):
        recommended(plan)


def test_the_scenario_refuses_options_it_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--scenario", "plan-aggregate", "--deploy", "git"])
    assert exit_info.value.code == 2
    assert "plan-aggregate migrates the plan's own group" in capsys.readouterr().err
