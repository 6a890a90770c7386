"""The fault matrix (issue 12 part 4) on the real local stack: each fault ends in a safe, audited state.

The faults are the lab's fault harness, ``promshift.local.faults`` (``bench/faults/run.py`` runs the same ones and
writes ``bench/results/faults.json``); here each one runs once against a 4-node stack scraped every 2 s, and the
test asserts what its result says: the source config identical, the audit chain intact with the fault's own
events, reads on the source, and no sample lost on the source (measured with ``core.sample_loss``) except
where the fault is the source's own restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from promshift.local import faults as matrix
from promshift.local.stack.local import LocalStack, StackConfig

# The whole matrix takes ~3 min: make e2e runs it (bench/faults/run.py writes bench/results/faults.json).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

@pytest.fixture(scope="module")
def fault_env(stack_config_factory: Callable[..., StackConfig], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Any]:
    wrapper = matrix.prometheus_wrapper(tmp_path_factory.mktemp("bin"))
    stack = LocalStack(stack_config_factory(nodes=4, scrape_interval="2s", prometheus_bin=wrapper))
    env = None
    try:
        stack.up(timeout=90)
        env = matrix.FaultEnv(stack, tmp_path_factory.mktemp("faults"))
        yield env
    finally:
        if env is not None:
            env.close()
        stack.down()


def check(result: Any, *, lost: int | None = 0) -> None:
    """What every fault must end in; ``result.details`` says why when it does not."""
    samples = result.details["samples"]
    gaps = [part["up_gaps"] for part in (samples if isinstance(samples, list) else [samples])]
    detail = f"{result.outcome}\nup gaps {gaps}; events {result.details.get('event_times_s')}\n{result.details}"
    assert result.source_config_identical, detail
    assert result.details["audit_chain_verified"], detail
    assert result.details["missing_events"] == [], detail
    assert not result.details["guard_restored_config"], detail
    assert result.safe, detail
    if lost is not None:
        assert result.source_samples_lost == lost, detail
    samples = result.details["samples"]
    for part in samples if isinstance(samples, list) else [samples]:
        assert part["series"] > 0 and part["expected_per_series"] >= 5, part  # a window, and series, were counted


def test_1_target_down_during_warmup(fault_env: Any) -> None:
    result = matrix.fault_target_down_warmup(fault_env)
    check(result)
    assert result.details["warmup_event"]["status"] in ("error", "timeout")
    assert "warmup_error" in result.audit_events or "warmup_timeout" in result.audit_events


def test_2_target_down_during_parity(fault_env: Any) -> None:
    result = matrix.fault_target_down_parity(fault_env)
    check(result)
    assert result.details["warmup"] == "ready"
    assert "SUCCESSFUL" not in result.details["step"].split(",")[0]


def test_3_a_429_storm_during_latency(fault_env: Any) -> None:
    result = matrix.fault_429_storm_latency(fault_env)
    check(result)
    d = result.details
    assert d["parity"] == "SUCCESSFUL"  # the target itself was fine: only its front door throttled
    assert d["throttled_runs"] == d["target_runs"] > 0
    assert d["latency_retries"] >= 3 * d["target_runs"]  # every throttled run was retried, and counted
    assert d["http_429_answered"] >= 4 * d["target_runs"]
    assert d["latency"] != "SUCCESSFUL"
    assert d["gate"]["verdict"] != "SUCCESSFUL"


def test_4_a_reload_the_source_refuses(fault_env: Any) -> None:
    result = matrix.fault_reload_rejected(fault_env)
    check(result)
    assert result.details["error"].startswith(("DeployError", "DeployStepFailed"))
    assert "dual_write_deployed" not in result.audit_events
    assert result.details["deploy_failed"]["config_sha256"] == result.details["config_sha256_before"]


def test_5_worker_killed_in_deploy_then_retried(fault_env: Any) -> None:
    result = matrix.fault_kill_deploy(fault_env)
    check(result)
    d = result.details
    assert d["kill"]["killed_by"] == "SIGKILL"
    assert d["after_kill"]["file_has_entry"] and not d["after_kill"]["loaded"]  # killed before the reload
    assert "dual_write_deployed" not in d["after_kill"]["events"]
    assert d["retry"] == {"resumed": True, "live": True}
    assert result.audit_events.count("dual_write_deployed") == 1


def test_6_worker_killed_in_rollback_then_retried(fault_env: Any) -> None:
    result = matrix.fault_kill_rollback(fault_env)
    check(result)
    d = result.details
    assert d["kill"]["killed_by"] == "SIGKILL"
    assert d["after_kill"]["file_is_snapshot"] and d["after_kill"]["loaded"]  # written, not reloaded
    assert "rolled_back" not in d["after_kill"]["events"]
    assert d["second_retry"] is True
    assert result.audit_events.count("rolled_back") == 1


@pytest.mark.parametrize("who", ["scheduler", "triggerer"])
def test_7_8_a_restart_while_warmup_is_deferred(fault_env: Any, who: str) -> None:
    result = matrix.fault_restart_during_warmup(fault_env, who=who)
    check(result)
    d = result.details
    assert d["event"]["status"] == "ready"
    assert d["warmup_started_events"] == 1
    assert "started_at" in d["serialized_kwargs"]
    if who == "triggerer":
        assert d["dropped_mid_run"] == 1


def test_9_audit_database_unreachable_at_a_stage_transition(fault_env: Any) -> None:
    result = matrix.fault_audit_unreachable(fault_env)
    check(result)
    d = result.details
    assert d["error"] != "none"
    assert d["while_audit_down"] == {"file_is_snapshot": True, "loaded": False}
    assert "dual_write_deployed" not in result.audit_events


@pytest.mark.parametrize("kind", ["timeout", "four-eyes"])
def test_10_11_approval_timeout_or_self_approval_rolls_back(fault_env: Any, kind: str) -> None:
    result = matrix.fault_approval(fault_env, kind=kind)
    check(result)
    expect = "approval_timeout" if kind == "timeout" else "approval_refused_four_eyes"
    assert expect in result.audit_events
    assert result.audit_events.index(expect) < result.audit_events.index("rolled_back")
    assert "approval" in result.details["rollback"]["reason"]


def test_12_two_runs_of_one_group_at_once(fault_env: Any) -> None:
    result = matrix.fault_two_runs_one_group(fault_env)
    check(result)
    d = result.details
    assert sorted(v.split(":")[0] for v in d["validate"].values()) == ["refused", "validated"]
    assert d["results"]["late"].startswith("refused")
    # The target's migration DAG runs every group of it at once: the audit claim alone holds one group's runs apart.
    assert d["dag_groups"] >= 2 and d["dag_max_active_runs"] >= d["dag_groups"]


def test_13_two_groups_cut_over_at_once(fault_env: Any) -> None:
    result = matrix.fault_two_groups_cut_over(fault_env)
    check(result)
    d = result.details
    assert d["read_from_after_cutover"] == {"gpu-memory": "target", "gpu-utilization": "target"}
    first, second = d["rollbacks"]
    assert first["method"] == "removed_entry" and first["kept_changes_since_snapshot"] == ["promshift-gpu-utilization"]
    assert first["remote_write_still_live"] is False and second["remote_write_still_live"] is False
    # The out-of-order rollback is safe by design (RollbackOperator does not fail it): our entry alone is gone.
    assert first["own_entry_removed"] is True and second.get("own_entry_removed") in (None, True)


def test_14_source_restarted_mid_dual_write(fault_env: Any) -> None:
    result = matrix.fault_source_restart(fault_env)
    check(result, lost=None)
    d = result.details
    assert d["entry_loaded_after_restart"] and d["target_newest_sample_after_restart"] is not None
    # The restart's own gap is measured: it shows in the source's `up` (longer than the process was down), and
    # every series misses what that gap holds, less the 1-sample edge allowance.
    assert d["samples"]["up_gaps"], "the restart's gap is visible in the source's own up series"
    assert d["scrape_gap_s"] >= d["process_down_s"]
    missing = d["missing_per_series_from_gaps"]
    series = d["samples"]["series"]
    assert missing >= 3
    assert series * (missing - 3) <= d["samples_lost_over_restart"] <= series * (missing + 1), d["samples"]
    # Outside the restart's own gap (before the stop, after scraping resumed with our entry live) nothing is lost.
    assert d["scraping_resumed_s_after_restart"] is not None
    assert result.source_samples_lost == 0, d["samples_outside_restart"]
    assert all(o["series"] > 0 and o["expected_per_series"] >= 5 for o in d["samples_outside_restart"])
