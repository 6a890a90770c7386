"""The lab's bake-watch clock advance (``PROMSHIFT_LAB_BAKE_WATCH_CLOCK_AHEAD``): applied in the lab, refused in one
line under ``PROMSHIFT_ENV=production`` (it counts history the target does not hold), and never read by the
cut-over."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.adapters import settings
from promshift.adapters.settings import LAB_CLOCK_AHEAD_VAR, LabOnlySetting, lab_bake_watch_clock_ahead_s

NAMED = {"PROMSHIFT_AUDIT_URL": "postgresql+psycopg://promshift@db.internal:5432/promshift",
         "PROMSHIFT_AUDIT_KEY": "k" * 32, "PROMSHIFT_AUDIT_ANCHOR_URL": "s3://anchors/audit",
         "PROMSHIFT_SNAPSHOTS_URL": "s3://state/snapshots", "PROMSHIFT_REPORTS_URL": "s3://state/reports",
         "PROMSHIFT_CATALOG": "/opt/airflow/catalog/metric_groups.yaml"}


def test_the_lab_applies_it_and_unset_means_the_wall_clock() -> None:
    assert lab_bake_watch_clock_ahead_s({}) == 0.0
    assert lab_bake_watch_clock_ahead_s({LAB_CLOCK_AHEAD_VAR: "  "}) == 0.0
    assert lab_bake_watch_clock_ahead_s({LAB_CLOCK_AHEAD_VAR: "24h"}) == 86400.0
    assert lab_bake_watch_clock_ahead_s({"PROMSHIFT_ENV": "lab", LAB_CLOCK_AHEAD_VAR: "1d2h"}) == 26 * 3600.0


@pytest.mark.parametrize(("value", "why"), [("soon", "invalid duration 'soon'"), ("-5m", "invalid duration"),
                                            ("400d", "more than a year ahead")])
def test_a_bad_value_is_one_line(value: str, why: str) -> None:
    with pytest.raises(LabOnlySetting, match=why) as exc:
        lab_bake_watch_clock_ahead_s({LAB_CLOCK_AHEAD_VAR: value})
    assert "\n" not in str(exc.value) and str(exc.value).startswith(LAB_CLOCK_AHEAD_VAR)


def test_production_refuses_it_in_one_line_even_with_every_store_named() -> None:
    env = {"PROMSHIFT_ENV": "production", **NAMED}
    assert settings.production_problems(env) == []  # the stores alone are fine ...
    env[LAB_CLOCK_AHEAD_VAR] = "24h"
    with pytest.raises(LabOnlySetting) as exc:
        lab_bake_watch_clock_ahead_s(env)
    line = str(exc.value)
    assert "\n" not in line and line == (f"{LAB_CLOCK_AHEAD_VAR} is lab-only (it counts history the target does "
                                         "not hold): PROMSHIFT_ENV=production refuses it; unset it")
    # ... and the start-up check (a run's validate, the board) refuses it with the rest
    assert settings.production_problems(env) == [f"{LAB_CLOCK_AHEAD_VAR} is set: it is lab-only (unset it)"]
    with pytest.raises(settings.ProductionSettingsMissing, match=f"refuses to start: {LAB_CLOCK_AHEAD_VAR} is set"):
        settings.require_production_settings("validate", env)


def test_the_bake_watch_reads_it_through_the_composition_root_and_fails_its_task_in_production(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.orchestration import lifecycle_operators, wiring

    monkeypatch.setenv(LAB_CLOCK_AHEAD_VAR, "24h")
    monkeypatch.delenv("PROMSHIFT_ENV", raising=False)
    assert wiring.lab_bake_watch_clock_ahead_s() == 86400.0
    monkeypatch.setenv("PROMSHIFT_ENV", "production")
    with pytest.raises(AirflowFailException, match="is lab-only"):
        wiring.lab_bake_watch_clock_ahead_s()
    # the bake check hands it to its lifecycle (the e2e lifecycle demo shows its effect)
    assert "horizon_clock_ahead_s=lab_bake_watch_clock_ahead_s()" in inspect.getsource(
        lifecycle_operators.BakeCheckOperator.execute)


def test_the_cut_over_counts_by_the_wall_clock_whatever_the_lab_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    from promshift.core.audit import AuditEvent
    from promshift.core.events import EventKind
    from promshift.orchestration.wiring import GroupWiring

    monkeypatch.setenv(LAB_CLOCK_AHEAD_VAR, "24h")
    now = datetime(2026, 12, 6, 15, 0, tzinfo=UTC)
    since = now - timedelta(minutes=4)
    deployed = AuditEvent(seq=1, at=since, group="gpu-memory", run_id="manual__m", kind=EventKind.DUAL_WRITE_DEPLOYED,
                          actor="t", evidence="{}", stage_from=None, stage_to="dual_writing", prev_hash="",
                          hash="")
    wiring = SimpleNamespace(group_name="gpu-memory", group=SimpleNamespace(scrape_interval_s=30.0),
                             run_params=lambda context: SimpleNamespace(accept_short_history=False))
    migration = SimpleNamespace(audit=SimpleNamespace(events=lambda group: [deployed]))
    horizon = GroupWiring.horizon(wiring, migration, {}, now)  # type: ignore[arg-type]
    assert horizon.lab_clock_ahead_s == 0.0 and horizon.counted_now == now and horizon.dual_write_since == since
