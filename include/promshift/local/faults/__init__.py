"""The fault matrix (issue 12 part 4), in the lab: each fault on the real local stack, each ending in a safe,
audited state.

``env`` holds the environment (``FaultEnv`` over a running ``LocalStack``), one fault's bookkeeping
(``Fault``, ``FaultResult``) and the steps the faults share; the faults live by what they break:
``backends`` (1-4, 14), ``kills`` (5, 6), ``operators`` (7, 8, 10, 11), ``concurrency`` (9, 12, 13).
``FAULTS`` lists them by number. ``bench/faults/run.py`` runs them all and writes
``bench/results/faults.json``; ``tests/integration/test_faults.py`` calls the same functions and asserts on
their results.
"""

from __future__ import annotations

from collections.abc import Callable

from promshift.local.faults.backends import (
    fault_429_storm_latency,
    fault_reload_rejected,
    fault_source_restart,
    fault_target_down_parity,
    fault_target_down_warmup,
)
from promshift.local.faults.concurrency import (
    fault_audit_unreachable,
    fault_two_groups_cut_over,
    fault_two_runs_one_group,
)
from promshift.local.faults.env import FLUSH_DEADLINE, GROUP, OTHER_GROUP, FaultEnv, FaultResult, prometheus_wrapper
from promshift.local.faults.kills import fault_kill_deploy, fault_kill_rollback
from promshift.local.faults.operators import (
    fault_approval,
    fault_approval_timeout,
    fault_restart_during_warmup,
    fault_restart_scheduler,
    fault_restart_triggerer,
    fault_self_approval,
)
from promshift.local.stack.local import PROMETHEUS_BIN

__all__ = [
    "FAULTS", "FLUSH_DEADLINE", "GROUP", "OTHER_GROUP", "PROMETHEUS_BIN", "FaultEnv", "FaultResult",
    "prometheus_wrapper", "fault_429_storm_latency", "fault_reload_rejected", "fault_source_restart",
    "fault_target_down_parity", "fault_target_down_warmup", "fault_audit_unreachable", "fault_two_groups_cut_over",
    "fault_two_runs_one_group", "fault_kill_deploy", "fault_kill_rollback", "fault_approval",
    "fault_approval_timeout", "fault_restart_during_warmup", "fault_restart_scheduler", "fault_restart_triggerer",
    "fault_self_approval",
]

FAULTS: list[tuple[int, Callable[[FaultEnv], FaultResult]]] = [
    (1, fault_target_down_warmup),
    (2, fault_target_down_parity),
    (3, fault_429_storm_latency),
    (4, fault_reload_rejected),
    (5, fault_kill_deploy),
    (6, fault_kill_rollback),
    (7, fault_restart_scheduler),
    (8, fault_restart_triggerer),
    (9, fault_audit_unreachable),
    (10, fault_approval_timeout),
    (11, fault_self_approval),
    (12, fault_two_runs_one_group),
    (13, fault_two_groups_cut_over),
    (14, fault_source_restart),
]
