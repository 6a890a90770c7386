"""A swap of a source's promshift ``remote_write`` entries, over core ports: add, prove, remove (``core.queues``).

``QueueSwap`` sees a ``ConfigDeployer`` per edit (``deployer_for(change)``: the deploy driver of the source's
kind, which snapshots, writes, reloads and verifies the loaded config), a ``QueueProbe`` (the source and the
target, read only) and an audit sink. Each phase reads the live config first, so a task retried after a
crash resumes where the swap stood (``core.queues.swap_phase``) and reaches the same end; a proof that does
not pass by its deadline undoes the add, and the config is the snapshot again byte for byte.

A swap that adds an entry starts only when the target's out-of-order window (``out_of_order_window``, read
right before the add) covers the overlap, whose every sample reaches the target twice
(``core.queues.overlap_refusal``); otherwise ``OverlapRefused`` in one line and nothing is edited.

Audit: ``queue_swap_added`` (the overlap begins: the swap, the snapshot's and the new config's sha256, the target's
out-of-order window it relied on),
``queue_swap_done`` (the proof, per group, and the entries removed), ``queue_swap_undone`` (why, and whether
the restored config is the snapshot byte for byte). No stage moves: a swap changes how a group is written,
not where it stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promshift.core.deploy import ConfigDeployer, DeployError, DeployResult, DeploySnapshot, DeployState
from promshift.core.events import EventKind
from promshift.core.queues import (
    Admission,
    ConfigChange,
    OutOfOrderWindow,
    OverlapRefused,
    QueueCapError,
    QueueProbe,
    Swap,
    SwapProof,
    admit_dual_write,
    admit_loaded,
    cap_refusal,
    overlap_refusal,
    overlap_window_needed,
    own_entry_groups,
    plan_leave,
    plan_merge,
    promshift_queues,
    swap_changes,
    swap_phase,
    swap_proof,
    undo_added,
)
from promshift.core.render import (
    RenderError,
    is_promshift_name,
    remote_write_entries,
    remote_write_name,
    remote_write_names,
    sha256_bytes,
)
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
    """Runs swaps on one source; ``record`` appends to the audit under the run that asked for the swap.

    ``out_of_order_window``: the target's out-of-order window (seconds, origin); ``scrape_interval_s``: the groups'
    scrape interval, which sets the window a swap's overlap needs; ``member_interval_s(group)``: a member's own
    scrape interval where it differs (None: unknown), so the slowest member of a swap sets that window."""

    def __init__(self, *, deployer_for: Callable[[ConfigChange], ConfigDeployer], probe: QueueProbe,
                 record: Record, out_of_order_window: OutOfOrderWindow, scrape_interval_s: float,
                 proof_deadline_s: float = 300.0, poll_s: float = 5.0,
                 member_interval_s: Callable[[str], float | None] | None = None) -> None:
        self.deployer_for = deployer_for
        self.probe = probe
        self.record = record
        self.out_of_order_window = out_of_order_window
        self.scrape_interval_s = scrape_interval_s
        self.member_interval_s = member_interval_s or (lambda _group: None)
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
        result = self._settled(deployer, deployer.deploy(snapshot, now), now, wait)
        if result.state is not DeployState.DONE:
            raise DeployError(f"{change.describe}: {result.state.value}: {result.reason}")
        return snapshot, before, result

    def _settled(self, deployer: ConfigDeployer, result: DeployResult, now: datetime,
                 wait: Callable[[float], None] | None) -> DeployResult:
        """``result`` followed until it is final (a deployer that waits for a reload: the Kubernetes resource)."""
        while result.state is DeployState.WAITING and wait is not None:
            wait(self.poll_s)
            result = deployer.verify(result, now)
        return result

    def overlap_guard(self, swap: Swap, *, refuse: bool = True) -> dict[str, Any] | None:
        """The target's out-of-order window this swap relies on (what the audit records), or ``OverlapRefused`` in
        one line when it does not cover the overlap. None: the swap sends nothing twice (the last member leaves:
        nothing is added). ``refuse=False`` (a rollback's leave, which nothing may block): the shortfall is recorded
        as the risk taken (``covered`` false, ``risk`` the refusal's line) instead."""
        if swap.add is None:
            return None
        interval_s = self.slowest_interval_s(swap)
        window_s, origin = self.out_of_order_window()
        refusal = overlap_refusal(window_s, scrape_interval_s=interval_s, origin=origin)
        if refusal is not None and refuse:
            raise OverlapRefused(refusal)
        guard = {"window_s": window_s, "origin": origin, "needed_s": overlap_window_needed(interval_s),
                 "scrape_interval_s": interval_s, "covered": refusal is None}
        if refusal is not None:
            log.warning("swap %s goes ahead for a rollback on a target that may refuse the overlap: %s",
                        swap.added_name, refusal)
            guard["risk"] = refusal
        return guard

    def slowest_interval_s(self, swap: Swap) -> float:
        """The scrape interval that sets the overlap's window: the slowest of the swap's members (every series it
        proves is sent twice during the overlap), never less than the deploying group's."""
        known = [i for m in swap.prove if (i := self.member_interval_s(m.group)) is not None and i > 0]
        return max([self.scrape_interval_s, *known])

    def add(self, swap: Swap, now: datetime, wait: Callable[[float], None] | None = None, *,
            out_of_order: Mapping[str, Any] | None = None) -> DeploySnapshot:
        """Add the swap's new entry beside the live ones (the overlap begins); the snapshot before it is returned.
        ``out_of_order``: the target's window the overlap relies on (``overlap_guard``), recorded with the add."""
        add, _ = swap_changes(swap)
        snapshot, before, result = self._deploy(add, now, wait)
        if result is not None:
            self.record(EventKind.QUEUE_SWAP_ADDED, now, {
                "swap": swap.to_dict(), "target_out_of_order": None if out_of_order is None else dict(out_of_order),
                "snapshot_sha256": sha256_bytes(before),
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

    def undo(self, swap: Swap, snapshot: DeploySnapshot, now: datetime, *, reason: str,
             wait: Callable[[float], None] | None = None) -> bool:
        """Take the swap's add back (its proof failed); True when the config is the snapshot byte for byte (on the
        Kubernetes resource: its ``spec.remoteWrite`` as it was, once the operator's reload shows the add gone)."""
        if swap.add is None:
            return True
        take_back = ConfigChange(f"undo {swap.added_name}", lambda data: undo_added(data, swap),
                                 live=frozenset(swap.remove), gone=frozenset({str(swap.added_name)}))
        deployer, current_snap, current = self._snapshot(take_back)
        if swap_phase(current, swap) == "start":
            identical = current == snapshot.content.encode("utf-8")
        elif take_back.apply(current) == snapshot.content.encode("utf-8"):
            # Nothing else changed since the add: the deployer writes the snapshot's own bytes back.
            restored = self._settled(deployer, deployer.restore(snapshot, now), now, wait)
            identical = restored.state is DeployState.DONE and restored.details.get("restored_identical") is not False
        else:
            # Someone else edited the config during the overlap: take out exactly our entry's lines.
            self._settled(deployer, deployer.deploy(current_snap, now), now, wait)
            identical = False
        self.record(EventKind.QUEUE_SWAP_UNDONE, now, {"swap": swap.to_dict(), "reason": reason,
                                                       "restored_identical": identical,
                                                       "snapshot_sha256": snapshot.sha256})
        return identical

    # -- the whole swap ------------------------------------------------------------------------
    def run(self, swap: Swap, *, clock: Callable[[], datetime], wait: Callable[[float], None],
            refuse_overlap: bool = True) -> SwapOutcome:
        """Add, prove until SUCCESSFUL or ``proof_deadline_s``, then remove; undo the add on a failed proof.

        Not started (``OverlapRefused``, nothing edited) when the target's out-of-order window does not cover the
        overlap, unless ``refuse_overlap`` is false (a rollback's leave: the risk is recorded with the add); a swap
        found mid-overlap (a crash after its add) is finished, which ends the overlap soonest."""
        started = clock()
        starting = swap_phase(self.live(), swap) == "start"
        guard = self.overlap_guard(swap, refuse=refuse_overlap) if starting else None
        snapshot = self.add(swap, started, wait, out_of_order=guard)
        since = started.timestamp()
        proof = self.prove(swap, since=since)
        while proof.verdict is not Verdict.SUCCESSFUL:
            if (clock() - started).total_seconds() >= self.proof_deadline_s:
                self.undo(swap, snapshot, clock(), reason=f"not proven in {self.proof_deadline_s:.0f}s: {proof.reason}",
                          wait=wait)
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
            try:
                self.run(admission.merge_first, clock=clock, wait=wait)
            except OverlapRefused as exc:  # nothing edited: refused like a path without a swap
                reason = cap_refusal(admission.count, cap, group, f"the merge cannot run: {exc}")
                self.record(EventKind.QUEUE_CAP_REFUSED, clock(), {"group": group, "count": admission.count,
                                                                   "cap": cap, "reason": reason})
                raise QueueCapError(reason) from None
        return admission

    def leave(self, *, group: str, clock: Callable[[], datetime], wait: Callable[[float], None]) -> SwapOutcome | None:
        """A rollback's first move for a merged group: out of the merged entry by one more swap (None: not merged).
        Never refused for the target's out-of-order window (a merge needed it, so it can only have shrunk since):
        nothing may block a rollback; the shortfall is recorded with the add as the risk the rollback took."""
        swap = self.plan_leave(group=group)
        if swap is None:
            return None
        return self.run(swap, clock=clock, wait=wait, refuse_overlap=False)


# -- the cap's pre-flight and the rollback's leave, for the deploy step (``steps.deploy.DeployStep``) -------------


@dataclass(frozen=True)
class QueueCap:
    """What a deploy path that adds a source queue knows of the source's queues (wired by the composition root).

    ``cap()``: the source's cap (read when a pre-flight needs it, so a bad setting refuses the deploy and never
    blocks a rollback); ``out_of_order_window()``: the target's out-of-order window, read right before a swap
    starts (``QueueSwap.overlap_guard``), and ``scrape_interval_s`` what sets the window it must cover;
    ``loaded_names()``: the ``remote_write`` names the source has loaded (every path);
    ``has_cut_over(group)``: whether the group has cut over (the audit's stage); ``swap_ports()``: the path's
    swap (a ``ConfigDeployer`` per change and the probe), None where no swap is built (the file path and the
    ``Prometheus`` resource have one); ``clock``/``wait``: a swap's time.
    """

    cap: Callable[[], int]
    url: str
    loaded_names: Callable[[], Sequence[str]]
    has_cut_over: Callable[[str], bool]
    swap_ports: Callable[[], tuple[Callable[[ConfigChange], ConfigDeployer], QueueProbe]] | None
    clock: Callable[[], datetime]
    wait: Callable[[float], None]
    out_of_order_window: OutOfOrderWindow
    scrape_interval_s: float
    proof_deadline_s: float = 300.0
    poll_s: float = 5.0
    member_interval_s: Callable[[str], float | None] | None = None  # a member's own scrape interval (the catalog's)

    def swaps(self, record: Record) -> QueueSwap | None:
        if self.swap_ports is None:
            return None
        deployer_for, probe = self.swap_ports()
        return QueueSwap(deployer_for=deployer_for, probe=probe, record=record,
                         out_of_order_window=self.out_of_order_window, scrape_interval_s=self.scrape_interval_s,
                         proof_deadline_s=self.proof_deadline_s, poll_s=self.poll_s,
                         member_interval_s=self.member_interval_s)

    def _cap(self, group: str, record: Record, now: datetime) -> int:
        try:
            return self.cap()
        except ValueError as exc:  # fails closed: a bad setting refuses the deploy, never falls back
            record(EventKind.QUEUE_CAP_REFUSED, now, {"group": group, "reason": str(exc)})
            raise QueueCapError(str(exc)) from None

    def preflight(self, *, group: str, record: Record, now: datetime, merge: bool) -> dict[str, Any]:
        """Room under the cap for ``group``'s own entry, or ``QueueCapError`` (recorded as ``queue_cap_refused``,
        nothing deployed). ``merge``: where the path has a swap, merge the cut-over groups first when that makes room
        (the snapshot step, before its snapshot); otherwise count the loaded config only (the deploy, right before
        it deploys: another group may have taken the room since)."""
        cap = self._cap(group, record, now)
        swaps = self.swaps(record) if merge else None
        if swaps is not None:
            cut_over = [g for g in own_entry_groups(remote_write_names(swaps.live())) if self.has_cut_over(g)]
            try:
                admission = swaps.admit(group=group, url=self.url, cap=cap, cut_over=cut_over, clock=self.clock,
                                        wait=self.wait)
            except RenderError as exc:  # an entry the merge cannot read back (a hand edit, an HA pair's dedup)
                reason = f"the source is at its cap of {cap} promshift queues and the merge cannot run: {exc}"
                record(EventKind.QUEUE_CAP_REFUSED, now, {"group": group, "cap": cap, "reason": reason})
                raise QueueCapError(reason) from None
        else:
            names = list(self.loaded_names())
            cut_over = [g for g in own_entry_groups(names) if self.has_cut_over(g)]
            admission = admit_loaded(names, group=group, cap=cap, cut_over=cut_over,
                                     can_merge=self.swap_ports is not None)
            if not admission.allowed:
                record(EventKind.QUEUE_CAP_REFUSED, now, {"group": group, "count": admission.count, "cap": cap,
                                                          "reason": admission.reason})
                raise QueueCapError(admission.reason)
        return {"count": admission.count, "cap": cap, "reason": admission.reason,
                "merged_first": None if admission.merge_first is None else admission.merge_first.to_dict()}

    def leave(self, *, group: str, record: Record) -> SwapOutcome | None:
        """A rollback's first move on a path with a swap: ``group`` out of its merged entry (None: not merged, or
        no swap on this path, where nothing is ever merged)."""
        swaps = self.swaps(record)
        return None if swaps is None else swaps.leave(group=group, clock=self.clock, wait=self.wait)

    def consolidate(self, *, groups: Sequence[str], record: Record, path: str) -> dict[str, Any]:
        """Every ``groups`` group's own entry to this target merged into one entry by the lossless swap (add, prove,
        remove; ``QueueSwap.run``): the retire's last edit before the source becomes an agent, which then forwards
        through one queue per target. Audited by the swap (``queue_swap_*``) under ``record``; a retry resumes a swap
        a crash cut short.

        Never blocks the retire: where the merge may not or cannot run (no swap on ``path``, an entry it cannot read
        back such as an HA pair's, the target's out-of-order window too short, a proof that failed and was undone)
        the per-group entries stay and ``reason`` says why in one line (``state`` ``kept``). An edit that failed
        mid-swap is undone (the config as before it); only a failed undo raises, and the retry resumes the swap."""
        wanted = sorted(set(groups))
        if self.swap_ports is None:
            own = {remote_write_name(g) for g in wanted}
            count = sum(1 for n in self.loaded_names() if n in own)
            return _kept(self.url, count, f"the {path} path has no merge swap (the source config file and the "
                                          f"Prometheus resource have one): the agent forwards through {count} "
                                          "per-group entries")
        swaps = self.swaps(record)
        assert swaps is not None  # swap_ports is set
        live = swaps.live()
        try:
            before = _entries_to(live, self.url)
            swap = plan_merge(live, url=self.url, cut_over=wanted)
        except RenderError as exc:  # an entry the merge cannot read back (a hand edit, an HA pair's dedup)
            count = sum(1 for n in self.loaded_names() if is_promshift_name(n))
            return _kept(self.url, count, f"the merge cannot read the entries back: {exc}")
        if swap is None or (swap_phase(live, swap) == "start" and len(swap.remove) < 2):
            merged = [q for q in promshift_queues(live) if q.url == self.url and q.merged]
            return {"state": "already", "url": self.url, "entries_before": before, "entries_after": before,
                    "members": sorted(g for q in merged for g in q.groups()),
                    "reason": f"nothing to merge: {before} entr{'y' if before == 1 else 'ies'} to the target"}
        _, snapshot, _ = swaps._snapshot(ConfigChange("read", lambda data: data))
        try:
            outcome = swaps.run(swap, clock=self.clock, wait=self.wait)
        except OverlapRefused as exc:  # nothing edited
            return _kept(self.url, before, str(exc))
        except SwapFailed as exc:  # the add was undone
            return _kept(self.url, before, str(exc), state="undone")
        except (DeployError, RenderError, OSError) as exc:
            phase = swap_phase(swaps.live(), swap)
            if phase == "done":
                raise  # the old entries are gone: the retry verifies the merged entry and finds nothing to merge
            if phase == "added":  # never into the switch half-swapped: the add taken back (raises if it cannot be)
                swaps.undo(swap, snapshot, self.clock(), reason=f"the swap failed: {exc}", wait=self.wait)
            return _kept(self.url, before, f"the swap failed and was undone: {str(exc).splitlines()[0][:300]}",
                         state="undone")
        after = _entries_to(swaps.live(), self.url)
        return {"state": "merged", "url": self.url, "entries_before": before, "entries_after": after,
                "members": [m.group for m in swap.prove], "merged_entry": swap.added_name,
                "removed": list(swap.remove), "proof": None if outcome.proof is None else outcome.proof.to_dict(),
                "reason": f"{len(swap.remove)} entries merged into {swap.added_name}, every member proven on the "
                          "target before the old entries went"}


def _entries_to(config: bytes, url: str) -> int:
    """How many promshift entries of ``config`` write to ``url`` (read by name and URL only: any shape counts)."""
    return sum(1 for e in remote_write_entries(config)
               if is_promshift_name(str(e.get("name", ""))) and e.get("url") == url)


def _kept(url: str, count: int, reason: str, *, state: str = "kept") -> dict[str, Any]:
    return {"state": state, "url": url, "entries_before": count, "entries_after": count, "members": [],
            "reason": reason}
