"""A swap of a source's promshift ``remote_write`` entries, over core ports: add, prove, remove (``core.queues``).

``QueueSwap`` sees a ``ConfigDeployer`` per edit (``deployer_for(change)``: the deploy driver of the source's
kind, which snapshots, writes, reloads and verifies the loaded config), a ``QueueProbe`` (the source and the
target, read only) and an audit sink. Each phase reads the live config first, so a task retried after a
crash resumes where the swap stood (``core.queues.swap_phase``) and reaches the same end; a proof that does
not pass by its deadline undoes the add, and the config is the snapshot again byte for byte.

Audit: ``queue_swap_added`` (the overlap begins: the swap, the snapshot's and the new config's sha256),
``queue_swap_done`` (the proof, per group, and the entries removed), ``queue_swap_undone`` (why, and whether
the restored config is the snapshot byte for byte). No stage moves: a swap changes how a group is written,
not where it stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promshift.core.deploy import ConfigDeployer, DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.events import EventKind
from promshift.core.queues import (
    Admission,
    ConfigChange,
    QueueCapError,
    QueueProbe,
    Swap,
    SwapProof,
    admit_dual_write,
    plan_leave,
    plan_merge,
    promshift_queues,
    swap_changes,
    swap_phase,
    swap_proof,
    undo_added,
)
from promshift.core.render import sha256_bytes
from promshift.core.verdicts import Verdict

log = logging.getLogger(__name__)

Record = Callable[[EventKind, datetime, Mapping[str, Any]], Any]


class SwapFailed(RuntimeError):
    """The merged entry was not proven in time: the add was undone (the config is its snapshot again)."""


@dataclass(frozen=True)
class SwapOutcome:
    """How a swap ended: ``done`` (old entries removed) or ``undone`` (proof failed, add taken back)."""

    swap: Swap
    state: str
    proof: SwapProof | None

    def to_dict(self) -> dict[str, Any]:
        return {"swap": self.swap.to_dict(), "state": self.state,
                "proof": None if self.proof is None else self.proof.to_dict()}


class QueueSwap:
    """Runs swaps on one source; ``record`` appends to the audit under the run that asked for the swap."""

    def __init__(self, *, deployer_for: Callable[[ConfigChange], ConfigDeployer], probe: QueueProbe,
                 record: Record, proof_deadline_s: float = 300.0, poll_s: float = 5.0) -> None:
        self.deployer_for = deployer_for
        self.probe = probe
        self.record = record
        self.proof_deadline_s = proof_deadline_s
        self.poll_s = poll_s

    # -- reading -----------------------------------------------------------------------------
    def _snapshot(self, change: ConfigChange) -> tuple[ConfigDeployer, DeploySnapshot, bytes]:
        deployer = self.deployer_for(change)
        snapshot = deployer.snapshot()
        return deployer, snapshot, snapshot.content.encode("utf-8")

    def live(self) -> bytes:
        """The source config as it is now."""
        return self._snapshot(ConfigChange("read", lambda data: data))[2]

    def plan_merge(self, *, url: str, cut_over: Iterable[str]) -> Swap | None:
        return plan_merge(self.live(), url=url, cut_over=cut_over)

    def plan_leave(self, *, group: str) -> Swap | None:
        return plan_leave(self.live(), group=group)

    # -- phases --------------------------------------------------------------------------------
    def _deploy(self, change: ConfigChange, now: datetime, wait: Callable[[float], None] | None
                ) -> tuple[DeploySnapshot, bytes, DeployResult | None]:
        deployer, snapshot, before = self._snapshot(change)
        after = change.apply(before)
        if after == before:
            return snapshot, before, None  # a retried phase: the change is live already
        result = deployer.deploy(snapshot, now)
        while result.state is DeployState.WAITING and wait is not None:
            wait(self.poll_s)
            result = deployer.verify(result, now)
        if result.state is not DeployState.DONE:
            raise DeployError(f"{change.describe}: {result.state.value}: {result.reason}")
        return snapshot, before, result

    def add(self, swap: Swap, now: datetime, wait: Callable[[float], None] | None = None) -> DeploySnapshot:
        """Add the swap's new entry beside the live ones (the overlap begins); the snapshot before it is returned."""
        add, _ = swap_changes(swap)
        snapshot, before, result = self._deploy(add, now, wait)
        if result is not None:
            self.record(EventKind.QUEUE_SWAP_ADDED, now, {
                "swap": swap.to_dict(), "snapshot_sha256": sha256_bytes(before),
                "config_after_sha256": sha256_bytes(add.apply(before)), "deploy": result.to_dict(),
                "queues_after": [q.name for q in promshift_queues(add.apply(before))]})
        return snapshot

    def prove(self, swap: Swap, *, since: float) -> SwapProof:
        """One measurement of the overlap (``core.queues.swap_proof``)."""
        source = {m.group: self.probe.source_series(m) for m in swap.prove}
        target = {m.group: self.probe.target_fresh(m, since) for m in swap.prove}
        sent = self.probe.queue_sent(swap.added_name) if swap.added_name else None
        return swap_proof([m.group for m in swap.prove], source_series=source, target_fresh=target,
                          merged_sent=sent if swap.added_name else float("inf"), expected_sent=sum(source.values()))

    def remove(self, swap: Swap, proof: SwapProof, now: datetime, wait: Callable[[float], None] | None = None) -> None:
        """Remove the entries the swap replaces (only after a SUCCESSFUL proof)."""
        if proof.verdict is not Verdict.SUCCESSFUL:
            raise ValueError(f"a swap removes nothing on a {proof.verdict.value} proof: {proof.reason}")
        _, remove = swap_changes(swap)
        _, before, result = self._deploy(remove, now, wait)
        if result is not None:
            self.record(EventKind.QUEUE_SWAP_DONE, now, {
                "swap": swap.to_dict(), "proof": proof.to_dict(), "config_before_sha256": sha256_bytes(before),
                "config_after_sha256": sha256_bytes(remove.apply(before)), "deploy": result.to_dict(),
                "queues_after": [q.name for q in promshift_queues(remove.apply(before))]})

    def undo(self, swap: Swap, snapshot: DeploySnapshot, now: datetime, *, reason: str) -> bool:
        """Take the swap's add back (its proof failed); True when the config is the snapshot byte for byte."""
        if swap.add is None:
            return True
        take_back = ConfigChange(f"undo {swap.added_name}", lambda data: undo_added(data, swap),
                                 live=frozenset(swap.remove), gone=frozenset({str(swap.added_name)}))
        deployer, current_snap, current = self._snapshot(take_back)
        if swap_phase(current, swap) == "start":
            identical = current == snapshot.content.encode("utf-8")
        elif take_back.apply(current) == snapshot.content.encode("utf-8"):
            # Nothing else changed since the add: the deployer writes the snapshot's own bytes back.
            identical = deployer.restore(snapshot, now).state is DeployState.DONE
        else:
            # Someone else edited the config during the overlap: take out exactly our entry's lines.
            deployer.deploy(current_snap, now)
            identical = False
        self.record(EventKind.QUEUE_SWAP_UNDONE, now, {"swap": swap.to_dict(), "reason": reason,
                                                       "restored_identical": identical,
                                                       "snapshot_sha256": snapshot.sha256})
        return identical

    # -- the whole swap ------------------------------------------------------------------------
    def run(self, swap: Swap, *, clock: Callable[[], datetime], wait: Callable[[float], None]) -> SwapOutcome:
        """Add, prove until SUCCESSFUL or ``proof_deadline_s``, then remove; undo the add on a failed proof."""
        started = clock()
        snapshot = self.add(swap, started, wait)
        since = started.timestamp()
        proof = self.prove(swap, since=since)
        while proof.verdict is not Verdict.SUCCESSFUL:
            if (clock() - started).total_seconds() >= self.proof_deadline_s:
                self.undo(swap, snapshot, clock(), reason=f"not proven in {self.proof_deadline_s:.0f}s: {proof.reason}")
                raise SwapFailed(f"merged entry {swap.added_name} not proven in {self.proof_deadline_s:.0f}s "
                                 f"({proof.reason}); the add was undone")
            log.info("swap %s: %s", swap.added_name, proof.reason)
            wait(self.poll_s)
            proof = self.prove(swap, since=since)
        self.remove(swap, proof, clock(), wait)
        return SwapOutcome(swap, "done", proof)

    # -- where the migration calls it ----------------------------------------------------------
    def admit(self, *, group: str, url: str, cap: int, cut_over: Iterable[str], clock: Callable[[], datetime],
              wait: Callable[[float], None]) -> Admission:
        """The pre-flight of a new dual-write: room under the cap, made by merging the cut-over groups first when
        that frees some; refused in one line with the count (``queue_cap_refused``) when nothing can be merged."""
        admission = admit_dual_write(self.live(), group=group, url=url, cap=cap, cut_over=cut_over)
        if not admission.allowed:
            self.record(EventKind.QUEUE_CAP_REFUSED, clock(), {"group": group, "count": admission.count,
                                                               "cap": cap, "reason": admission.reason})
            raise QueueCapError(admission.reason)
        if admission.merge_first is not None:
            self.run(admission.merge_first, clock=clock, wait=wait)
        return admission

    def leave(self, *, group: str, clock: Callable[[], datetime], wait: Callable[[float], None]) -> SwapOutcome | None:
        """A rollback's first move for a merged group: out of the merged entry by one more swap (None: not merged)."""
        swap = self.plan_leave(group=group)
        return None if swap is None else self.run(swap, clock=clock, wait=wait)
