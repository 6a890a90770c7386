"""Every kind of audit event, once: what the ``kind`` column of the audit log may hold.

A ``StrEnum``: a member equals its string, so events read back from the database (plain ``str``)
compare equal to members, and the stored values are exactly what they were before the enum.
Never rename a value: the audit log is append-only and old events keep their kinds.

The owners' notices (``core.notify``: ``approval_needed``, ``bake_failed``, ...) are another
vocabulary; a notice sent is recorded here as ``notified``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    """The kind of one audit event (see ``core.audit.AuditEvent``)."""

    # -- a migration run (``steps.migration``, ``steps.deploy``) ---------------------------------
    VALIDATED = "validated"  # both backends answer and the group may start: the run now holds the group
    VALIDATION_FAILED = "validation_failed"  # validate refused (one-line reason); releases the group
    START_REFUSED = "start_refused"  # the group's stage, a paused wave or a dependency forbids a run
    SNAPSHOT_TAKEN = "snapshot_taken"  # the source config (or scraper/object) kept for rollback
    QUOTA_REFUSED = "quota_refused"  # the AMP quota pre-flight refused the deploy (nothing deployed)
    DEPLOY_FAILED = "deploy_failed"  # the deploy failed and was undone (nothing deployed)
    DUAL_WRITE_DEPLOYED = "dual_write_deployed"  # the group's dual-write is live (-> dual_writing)
    WARMUP_STARTED = "warmup_started"  # waiting for the target to catch up (-> warming)
    WARMUP_READY = "warmup_ready"  # the target caught up
    WARMUP_TIMEOUT = "warmup_timeout"  # the target did not catch up in time
    WARMUP_ERROR = "warmup_error"  # the warm-up could not be observed
    GATE_PASSED = "gate_passed"  # every check passed (-> verified); a human is asked
    GATE_INCONCLUSIVE = "gate_inconclusive"  # some check could not decide; a human is asked
    GATE_FAILED = "gate_failed"  # a check failed or errored: the run rolls back
    EVIDENCE_SHOWN = "evidence_shown"  # the approver was asked, shown evidence hashing to evidence_sha256
    APPROVED = "approved"  # the cut-over was approved (-> approved)
    APPROVAL_REJECT = "approval_reject"  # the approver chose Reject
    APPROVAL_TIMEOUT = "approval_timeout"  # nobody answered in time
    APPROVAL_REFUSED_FOUR_EYES = "approval_refused_four_eyes"  # the run's trigger tried to approve it
    # An Approve on evidence that changed after it was shown (the XCom the approver saw is gone or different).
    APPROVAL_REFUSED_EVIDENCE_CHANGED = "approval_refused_evidence_changed"
    CUT_OVER = "cut_over"  # reads routed to the target (-> cut_over)
    RUN_COMPLETE = "run_complete"  # the run closed after the cut-over; releases the group
    ROLLED_BACK = "rolled_back"  # the snapshot restored (-> rolled_back); releases the group
    ROLLBACK_NOT_NEEDED = "rollback_not_needed"  # nothing was deployed, so nothing restored; releases the group
    ROLLBACK_FAILED = "rollback_failed"  # the restore failed: the group stays held (nobody verified the source)
    REPORT_PUBLISHED = "report_published"  # the run's report written (a side event: where, with hashes)
    NOTIFIED = "notified"  # the owners were told something (a side event: which notice, which channel)

    # -- a dry run: what it would have done, recorded instead of doing it (never a stage move) ----
    DRY_RUN_STEP = "dry_run_step"  # a step skipped, with what it would have done
    DRY_RUN_GATE = "dry_run_gate"  # the gate's verdict, decided and recorded without moving the stage
    DRY_RUN_COMPLETE = "dry_run_complete"  # how far the dry run got; nobody is asked, nothing cut over

    # -- what moves with a group (``steps.moves``) -----------------------------------------------
    RULES_SNAPSHOT = "rules_snapshot"  # both sides' rules kept, with the promtool-checked plan
    RULES_RECORDS_ADDED = "rules_records_added"  # the recording rules loaded on the target
    RULES_MOVED = "rules_moved"  # the rules handed to the target at the cut-over
    RULES_RESTORED = "rules_restored"  # the rules put back from their snapshot
    RULES_MOVE_FAILED = "rules_move_failed"  # a step of the rules move failed (the rollback names it)
    RULES_RESTORE_FAILED = "rules_restore_failed"  # the rollback could not put the rules back
    READ_PATH_SNAPSHOT = "read_path_snapshot"  # the dashboards kept
    READ_PATH_SWITCHED = "read_path_switched"  # the dashboards switched to the target at the cut-over
    READ_PATH_RESTORED = "read_path_restored"  # the dashboards put back from their snapshot
    READ_PATH_SWITCH_FAILED = "read_path_switch_failed"  # a step of the dashboards switch failed
    READ_PATH_RESTORE_FAILED = "read_path_restore_failed"  # the rollback could not put the dashboards back

    # -- after the cut-over (``steps.lifecycle``) ------------------------------------------------
    BAKE_STARTED = "bake_started"  # the bake watch's first check (-> baking)
    BAKE_CHECK = "bake_check"  # one bake check, with its verdict
    BAKED = "baked"  # clean for the whole bake period (-> baked)
    READS_ROLLED_BACK = "reads_rolled_back"  # a bake check failed: reads back on the source (-> rolled_back_reads)
    RESTORE_READS_FAILED = "restore_reads_failed"  # reads could not be returned to the source
    DECOMMISSION_APPROVED = "decommission_approved"  # the second approval (no stage move)
    DECOMMISSION_APPROVAL_REJECT = "decommission_approval_reject"  # ... Reject
    DECOMMISSION_APPROVAL_TIMEOUT = "decommission_approval_timeout"  # ... nobody answered
    DECOMMISSION_APPROVAL_REFUSED_FOUR_EYES = "decommission_approval_refused_four_eyes"  # ... by the trigger
    # ... on evidence that changed after it was shown.
    DECOMMISSION_APPROVAL_REFUSED_EVIDENCE_CHANGED = "decommission_approval_refused_evidence_changed"
    DECOMMISSION_REFUSED = "decommission_refused"  # the group may not be decommissioned (why)
    DECOMMISSION_FAILED = "decommission_failed"  # the drop failed, or would leave the target short; undone
    DECOMMISSIONED = "decommissioned"  # the source stopped storing the group (-> decommissioned)
    RECOMMISSIONED = "recommissioned"  # the drop undone (-> recommissioned)

    # -- added later (kept at the end: the order of the values above is pinned by a test) ----------
    # An Approve whose shown hash is not the hash of the gate evidence the audit log holds for this run.
    APPROVAL_REFUSED_EVIDENCE_UNVERIFIED = "approval_refused_evidence_unverified"
    QUOTA_RESERVED = "quota_reserved"  # the pre-flight passed: the group's series count on its workspace from now
    # The run passed its DAG's deadline alert (warm-up and approval timeouts plus a margin) and has not ended: a
    # side event recorded by the deadline's callback on the triggerer (``orchestration.deadlines``); no stage move.
    RUN_OVERDUE = "run_overdue"
    # The warm-up saw the target refuse samples while the group warmed up (the writer's failed samples, the
    # workspace's DiscardedSamples by reason): FAILED, naming the reason (``core.warmup``).
    WARMUP_FAILED = "warmup_failed"
    # Bounded write queues (``steps.queues``): how the group's series are written changed, not where it stands.
    QUEUE_SWAP_ADDED = "queue_swap_added"  # a merged entry added beside the entries it replaces (overlap begins)
    QUEUE_SWAP_DONE = "queue_swap_done"  # the merged entry proven, the entries it replaces removed
    QUEUE_SWAP_UNDONE = "queue_swap_undone"  # the proof failed: the add taken back (byte for byte when possible)
    QUEUE_CAP_REFUSED = "queue_cap_refused"  # a new dual-write refused: the source is at its queue cap
    # The history horizon (``core.horizon``): what waits until the target's history covers its reads.
    HORIZON_WAITING = "horizon_waiting"  # panels or rules held back at the cut-over, each with its ready time
    HORIZON_SWITCHED = "horizon_switched"  # held-back panels or rules switched once the target covered them
    # Retiring a whole source (``steps.retire``; group ``source:<conn>``, never a stage move).
    SOURCE_RETIRE_REFUSED = "source_retire_refused"  # a group not baked, or what retiring ends not accepted
    SOURCE_RETIRE_PREPARED = "source_retire_prepared"  # what retiring ends, the usage before (shown to approve)
    SOURCE_RETIRE_APPROVED = "source_retire_approved"  # approved, with the names accepted
    SOURCE_RETIRED = "source_retired"  # the source is an agent: the proof (target, 422, usage before/after)
    SOURCE_RETIRE_FAILED = "source_retire_failed"  # the switch failed (the server was put back) or the proof did
    SOURCE_UNRETIRED = "source_unretired"  # the server restored byte for byte, the target without a gap
    SOURCE_UNRETIRE_FAILED = "source_unretire_failed"  # the restore failed or was not byte-identical
    # Before the switch: each target's per-group entries merged into one by the lossless swap (``queue_swap_*`` under
    # the same source group), or kept with the one-line reason (``steps.retire.RetireSource.consolidate``).
    SOURCE_QUEUES_CONSOLIDATED = "source_queues_consolidated"


# The warm-up's end, by the trigger's status (``ready``, ``timeout``, ``error``, ``failed``).
WARMUP_ENDED = {"ready": EventKind.WARMUP_READY, "timeout": EventKind.WARMUP_TIMEOUT,
                "error": EventKind.WARMUP_ERROR, "failed": EventKind.WARMUP_FAILED}
# The gate decided (a dry run's verdict is ``dry_run_gate``, not one of these).
GATE_DECIDED = frozenset({EventKind.GATE_PASSED, EventKind.GATE_INCONCLUSIVE, EventKind.GATE_FAILED})
# An answer to the cut-over's approval (or the end of waiting for one): the decision, who, why.
APPROVAL_ANSWERS = frozenset({EventKind.APPROVED, EventKind.APPROVAL_REJECT, EventKind.APPROVAL_TIMEOUT,
                              EventKind.APPROVAL_REFUSED_FOUR_EYES, EventKind.APPROVAL_REFUSED_EVIDENCE_CHANGED,
                              EventKind.APPROVAL_REFUSED_EVIDENCE_UNVERIFIED})
# The answers that are not an approval (the run rolls back), as ``failure_reason`` names them.
APPROVAL_REFUSALS = APPROVAL_ANSWERS - {EventKind.APPROVED}
# A step of a move that failed, by what moves (recorded with its error before the task fails).
MOVE_FAILED = {"rules": EventKind.RULES_MOVE_FAILED, "read_path": EventKind.READ_PATH_SWITCH_FAILED}
# The rollback could not restore what moved, by what moves.
RESTORE_FAILED = {"rules": EventKind.RULES_RESTORE_FAILED, "read_path": EventKind.READ_PATH_RESTORE_FAILED}
# Steps that resume from "this run's last event" look past these (a notice, the report a step publishes, the
# deadline's overdue mark, recorded by the triggerer while a step may still be running).
SIDE_EVENTS = frozenset({EventKind.NOTIFIED, EventKind.REPORT_PUBLISHED, EventKind.RUN_OVERDUE,
                         EventKind.QUEUE_SWAP_ADDED, EventKind.QUEUE_SWAP_DONE, EventKind.QUEUE_SWAP_UNDONE,
                         EventKind.HORIZON_WAITING, EventKind.HORIZON_SWITCHED})
# A run holds its group from its ``validated`` event until one of these (its end: refused at validate, rolled
# back, nothing to roll back, or complete). ``rollback_failed`` keeps holding it: nobody verified the source.
RELEASES_GROUP = frozenset({EventKind.VALIDATION_FAILED, EventKind.ROLLED_BACK, EventKind.ROLLBACK_NOT_NEEDED,
                            EventKind.RUN_COMPLETE})


def approval_kind(decision: str, *, prefix: str = "") -> EventKind:
    """The event of an approval's answer: ``Approve`` is ``<prefix>approved``, any other decision
    ``<prefix>approval_<decision>``; ``prefix`` names another approval than the cut-over's
    (``decommission_``). ValueError for a decision no member records."""
    return EventKind(prefix + ("approved" if decision == "Approve" else "approval_" + decision.lower()))


def claims_group(event: Any) -> bool:
    """Whether ``event`` claims its group for its run: a ``validated`` event of a real run (a dry run changes
    nothing, so it never holds the group)."""
    return bool(event.kind == EventKind.VALIDATED and not event.evidence_data.get("dry_run"))
