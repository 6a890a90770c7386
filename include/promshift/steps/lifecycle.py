"""After cut-over: the bake watch, and returning a group's reads to the source (the ``restore_reads`` hook).

``GroupLifecycle`` works on one ``GroupMigration`` (its audit, routing and backends); every transition
goes through ``GroupMigration.record``. The judgement is pure (``core.bake``); this module observes the
backends and applies the outcome.

Read-path restorers (the hook other adapters plug into): a ``ReadRestorer`` is a name and a callable
``(migration, *, reason, now) -> evidence``; it must be idempotent (a retried task calls it again). The
default list holds the routing entry alone (``restore_routing``); the rules and Grafana adapters add
theirs with ``GroupLifecycle(..., read_restorers=[*DEFAULT_READ_RESTORERS, ("rules", restore_rules)])``.
Dual-write is never touched here: it stays on, so a re-cut-over loses nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from promshift.core.bake import (
    BakeObservation,
    DeliveryObservation,
    MovedRule,
    baked,
    clean_streak_start,
    judge,
    observe_delivery,
    observe_rules,
)
from promshift.core.deploy import snapshot_key
from promshift.core.deploy_kinds import DEPLOYS, REMOTE_WRITE, Deploy
from promshift.core.errors import AlertmanagerError, PrometheusError
from promshift.core.events import EventKind
from promshift.core.horizon import Horizon, decommission_short_by, dual_write_since, held_back, waiting_list
from promshift.core.promql import newest_sample_expr
from promshift.core.queues import carrying_entry
from promshift.core.redact import redact
from promshift.core.render import RenderError, remote_write_name, remote_write_names
from promshift.core.stages import BAKE_WATCHED, Stage
from promshift.core.verdicts import Verdict
from promshift.core.warmup import parse_remote_write_lag
from promshift.steps.migration import GroupMigration, one_line

log = logging.getLogger(__name__)

# Stages a decommission may start from: a clean bake, or a decommission that was undone.
DECOMMISSIONABLE = frozenset({Stage.BAKED, Stage.RECOMMISSIONED})

ReadRestorer = tuple[str, Callable[..., Mapping[str, Any]]]
HorizonMove = Callable[[GroupMigration, Horizon, datetime], Any]
# A moved rule's label in a rules_moved event recorded before it listed ``moved_rules`` (``core.rules.Rule.label``).
_RULE_LABEL = re.compile(r"^(record|alert) (\S+) \(.*: group (['\"])(.*)\3, rule \d+\)$")


def moved_rules(migration: GroupMigration) -> tuple[list[MovedRule], datetime] | None:
    """The rules the group's latest handoff moved to the target and when (its ``rules_moved`` event), or None
    when no rules of the group are on the target (none moved, or a ``rules_restored`` took them back since).

    Raises ValueError when a handoff moved rules but its event names none (the bake cannot check them)."""
    events = migration.audit.events(group=migration.group.name)
    moved = [i for i, e in enumerate(events) if e.kind == EventKind.RULES_MOVED]
    if not moved:
        return None
    event = events[moved[-1]]
    data = event.evidence_data
    if not data.get("moved") or any(e.kind == EventKind.RULES_RESTORED for e in events[moved[-1] + 1:]):
        return None
    if "moved_rules" in data:
        rules = [MovedRule(str(r["kind"]), str(r["name"]), str(r.get("group") or "")) for r in data["moved_rules"]]
    else:
        labels = ((data.get("target") or {}).get("details") or {}).get("rules") or []
        found = [_RULE_LABEL.match(str(label)) for label in labels]
        rules = [MovedRule(m[1], m[2], m[4]) for m in found if m]
    if not rules and data.get("rules"):
        raise ValueError(f"the rules_moved event of run {event.run_id} names none of its {data['rules']} rules")
    return rules, event.at


def restore_routing(migration: GroupMigration, *, reason: str, now: datetime) -> dict[str, Any]:
    """The group's routing entry back to the source (one upsert on its own row); a no-op if it is there."""
    group = migration.group.name
    if migration.routing.read_from(group) == "source":
        return {"routing": migration.routing.get(group), "changed": False}
    route = migration.routing.route(group, read_from="source", url=migration.backends.source.base_url, at=now,
                                    run_id=migration.run_id, pair=migration.group.pair)
    return {"routing": route, "changed": True}


DEFAULT_READ_RESTORERS: tuple[ReadRestorer, ...] = (("routing", restore_routing),)


class RestoreReadsFailed(RuntimeError):
    """A read-path restorer failed; recorded as ``restore_reads_failed`` (no stage move)."""


class DecommissionRefused(RuntimeError):
    """The group may not be decommissioned now; recorded as ``decommission_refused``, nothing changed."""


class DecommissionFailed(RuntimeError):
    """The drop was applied but not proven safe, so it was undone (``decommission_failed``)."""


class GroupLifecycle:
    """The bake watch's work on one group (one check per call)."""

    def __init__(self, migration: GroupMigration, *, deploy: Deploy = DEPLOYS[REMOTE_WRITE],
                 read_restorers: Sequence[ReadRestorer] = DEFAULT_READ_RESTORERS,
                 parity_check: Callable[[float, float], tuple[Verdict, str]] | None = None,
                 horizon_moves: Sequence[HorizonMove] = (), horizon_clock_ahead_s: float = 0.0) -> None:
        self.migration = migration
        self.deploy = deploy
        self.read_restorers = tuple(read_restorers)
        # What the history horizon held back at the cut-over, moved by a clean check once its time has come
        # (``moves.ReadPathStep.switch_when_ready``, ``moves.RulesStep.handoff_when_ready``).
        self.horizon_moves = tuple(horizon_moves)
        # LAB ONLY (0 elsewhere; ``settings.lab_bake_watch_clock_ahead_s``): the movers count the target's history
        # this far ahead of the wall clock; recorded in every horizon record they write (``Horizon.to_dict``).
        self.horizon_clock_ahead_s = horizon_clock_ahead_s
        # (window start, now) -> (verdict, reason); default: ParityCheck over the short window.
        self._parity = parity_check or self._short_parity

    @property
    def group(self) -> Any:
        return self.migration.group

    # -- observing ---------------------------------------------------------------------------
    def observe(self, now: datetime) -> BakeObservation:
        """One look at both sides: freshness and series on the target, lag on the source, a short parity window;
        and, when the group's rules moved to the target, their health there (its ``/api/v1/rules``)."""
        b, selector, errors = self.migration.backends, self.group.selector(), []
        values: dict[str, Any] = {}

        def attempt(name: str, read: Callable[[], Any]) -> None:
            try:
                values[name] = read()
            except (PrometheusError, RenderError, ValueError, KeyError, TypeError) as exc:
                errors.append((name, one_line(exc)))

        at = now.timestamp()
        attempt("age", lambda: b.target.scalar(f"time() - {newest_sample_expr(selector)}", at=at))
        attempt("source_series", lambda: b.source.scalar(f"count({selector})", at=at))
        attempt("target_series", lambda: b.target.scalar(f"count({selector})", at=at))
        queue = self.deploy.source_queue
        name = remote_write_name(self.group.name)
        if queue:
            # Once merged (bounded write queues) the group is written by the merged entry, not its own.
            carrier: dict[str, str | None] = {}

            def carrying() -> str | None:
                if "name" not in carrier:
                    carrier["name"] = carrying_entry(b.source.config_text(), self.group.name)
                return carrier["name"]

            attempt("lag", lambda: parse_remote_write_lag(b.source.metrics_text(), carrying() or name))
            # Still deployed? A sync from git (or a helm upgrade) that dropped our entry says so here.
            attempt("entry", lambda: carrying() is not None)
        since = self.migration.existing_dual_write_since()
        window_start = at - self.group.parity.skip_recent_s - self.group.bake.parity_window_s
        if since is not None:
            window_start = max(window_start, since)
        attempt("parity", lambda: self._parity(window_start, at))
        if b.target_discards is not None:  # the workspace's discards in the bake window (adapters.ingest_health)
            attempt("discards", lambda: b.target_discards(datetime.fromtimestamp(window_start, UTC), now))
        attempt("moved_rules", lambda: moved_rules(self.migration))
        moved = values.get("moved_rules")
        if moved is not None:  # only a group whose rules are on the target has a rules measurement
            probes = self.migration.probes
            attempt("rules", lambda: observe_rules(moved[0], probes.loaded_rules(b.target), now=at,
                                                   loaded_at=moved[1].timestamp()))
            alerts = [r.name for r in moved[0] if r.kind == "alert"]
            if alerts:
                attempt("delivery", lambda: self._delivery(alerts, at))
        errors = [("rules", why) if what == "moved_rules" else (what, why) for what, why in errors]
        lag, failed = values.get("lag") or (None, None)
        parity = values.get("parity")
        discarded = values.get("discards")
        example = ""
        if failed or (discarded and any(n > 0 for n in discarded.values())):
            from promshift.core.warmup import missing_series_example

            example = missing_series_example(b.source, b.target, selector, at=at)
        return BakeObservation(
            target_newest_age_s=values.get("age"), lag_s=lag, failed_samples=failed,
            source_series=None if values.get("source_series") is None else int(values["source_series"]),
            target_series=None if values.get("target_series") is None else int(values["target_series"]),
            parity=parity[0] if parity else None, parity_reason=parity[1] if parity else "",
            queue_expected=queue, rules=values.get("rules"), delivery=values.get("delivery"),
            entry_loaded=values.get("entry"), entry_name=name if queue else "", errors=tuple(errors),
            discarded=discarded, discards_expected=b.target_discards is not None, example_series=example)

    def _delivery(self, alerts: Sequence[str], at: float) -> DeliveryObservation:
        """The moved alerts firing on the target, and what its Alertmanager holds for each."""
        b = self.migration.backends
        firing = [(name, since) for name, since in self.migration.probes.firing_alerts(b.target) if name in alerts]
        held = None
        if b.target_alerts is not None:
            try:
                names = dict.fromkeys(n for n, _ in firing)
                held = {name: [a.receivers for a in b.target_alerts(name)] for name in names}
            except AlertmanagerError as exc:
                raise ValueError(str(exc)) from None
        return observe_delivery(alerts, firing, held, now=at)

    def _short_parity(self, window_start: float, now: float) -> tuple[Verdict, str]:
        from promshift.core.bake import bake_window_problem
        from promshift.core.deploy_kinds import group_for_deploy
        from promshift.core.golden import MIN_POINTS

        # A golden query that looks back further than the bake window never fits: say so (ERROR), rather than
        # INCONCLUSIVE at every check, for ever.
        never = bake_window_problem(self.group.bake, step_s=self.group.parity.step_s,
                                    lookbacks=self.migration.probes.golden_lookbacks(self.group,
                                                                                     self.migration.catalog_dir),
                                    min_points=MIN_POINTS)
        if never:
            return Verdict.ERROR, never
        b = self.migration.backends
        result = self.migration.probes.parity(group_for_deploy(self.group, self.deploy), b.source, b.target,
                                              catalog_dir=self.migration.catalog_dir).run(
            dual_write_since=window_start, now=now)
        bad = [f"{m.name}: {m.reason}" for m in result.not_passed()]
        return result.verdict, "; ".join(bad[:3]) or f"{result.points_compared} points compared"

    # -- the check ---------------------------------------------------------------------------
    def bake_check(self, now: datetime, observation: BakeObservation | None = None) -> dict[str, Any]:
        """Check the group once and apply the outcome: ``baking``, ``baked`` or ``rolled_back_reads``.

        A cut-over group starts baking here (``bake_started``). A failed check returns its reads to the
        source at once (``restore_reads``). A retry after a restore that failed restores again without
        checking again (a clean check must not leave reads on the source while the stage says baking).
        """
        m = self.migration
        stage = m.stage()
        if stage not in BAKE_WATCHED:
            return {"outcome": "not_watched", "stage": stage.value}
        mine = m.audit.events(group=self.group.name, run_id=m.run_id)
        if mine and mine[-1].kind == EventKind.RESTORE_READS_FAILED:
            restored = self.restore_reads(reason=str(mine[-1].evidence_data.get("reason")), now=now)
            return {"outcome": "rolled_back_reads", "reason": restored["reason"], "restored": restored}
        policy = self.group.bake
        if stage == Stage.CUT_OVER:
            m.record(EventKind.BAKE_STARTED, now, {"policy": dataclasses.asdict(policy)}, to=Stage.BAKING)
        obs = observation if observation is not None else self.observe(now)
        result = judge(obs, policy)
        evidence = {**result.to_dict(), "observation": _observation_dict(obs)}
        m.record(EventKind.BAKE_CHECK, now, evidence)
        if result.failed:
            restored = self.restore_reads(reason=f"bake check {result.verdict.value}: {result.reason()}", now=now)
            return {"outcome": "rolled_back_reads", "check": evidence, "reason": restored["reason"],
                    "restored": restored}
        moved = self.move_when_ready(now)
        checks = self.checks_since_bake_started()
        if baked(checks, policy, now=now.timestamp()):
            streak = clean_streak_start(checks, interval_s=policy.interval_s)
            m.record(EventKind.BAKED, now, {"checks": len(checks), "clean_since": streak, "period_s": policy.period_s,
                                  "last_check": evidence}, to=Stage.BAKED)
            return {"outcome": "baked", "check": evidence, "clean_since": streak}
        return {"outcome": "baking", "check": evidence, "checks": len(checks),
                "clean_since": clean_streak_start(checks, interval_s=policy.interval_s), "horizon_moves": moved}

    def move_when_ready(self, now: datetime) -> list[Any]:
        """Switch what the history horizon held back whose ready time has passed (each mover records it)."""
        m = self.migration
        events = m.audit.events(group=self.group.name)
        since = dual_write_since(events)
        if since is None or not held_back(events) or not self.horizon_moves:
            return []
        horizon = Horizon(since, now, scrape_interval_s=self.group.scrape_interval_s,
                          lab_clock_ahead_s=self.horizon_clock_ahead_s)
        return [move(m, horizon, now) for move in self.horizon_moves]

    def checks_since_bake_started(self) -> list[tuple[float, Verdict]]:
        """(time, verdict) of every bake check since the group last entered ``baking``, oldest first."""
        events = self.migration.audit.events(group=self.group.name)
        starts = [i for i, e in enumerate(events) if e.stage_to == Stage.BAKING.value]
        since = starts[-1] if starts else len(events)
        return [(e.at.timestamp(), Verdict(e.evidence_data["verdict"])) for e in events[since:]
                if e.kind == EventKind.BAKE_CHECK]

    def restore_reads(self, *, reason: str, now: datetime) -> dict[str, Any]:
        """Every read-path restorer (routing first; rules and dashboards when their adapters plug in), then
        ``rolled_back_reads``. Dual-write stays on. Any restorer failing: ``restore_reads_failed``, raised."""
        m = self.migration
        evidence: dict[str, Any] = {"reason": reason, "restored": {}, "dual_write": "kept on"}
        errors: dict[str, str] = {}
        for name, restorer in self.read_restorers:
            try:
                evidence["restored"][name] = dict(restorer(m, reason=reason, now=now))
            except Exception as exc:  # noqa: BLE001 - every restorer runs; the failure is recorded and raised
                errors[name] = f"{type(exc).__name__}: {one_line(exc)}"
        if errors:
            m.record(EventKind.RESTORE_READS_FAILED, now, {**evidence, "errors": errors})
            raise RestoreReadsFailed(f"restoring reads of {self.group.name!r} failed: "
                                     + "; ".join(f"{k}: {v}" for k, v in errors.items()))
        m.record(EventKind.READS_ROLLED_BACK, now, evidence, to=Stage.ROLLED_BACK_READS)
        return evidence


def _observation_dict(obs: BakeObservation) -> dict[str, Any]:
    data = dataclasses.asdict(obs)
    data["parity"] = obs.parity.value if obs.parity is not None else None
    data["errors"] = dict(obs.errors)
    return data


# -- decommission (after the second approval) -------------------------------------------------------


class Decommission:
    """Drop the group's series on the source at scrape time (``core.scrape_drop``), or undo that.

    Only safe when the target has a writer of its own (the managed collector: ``Deploy.own_writer``):
    on the remote_write path the source is the target's only writer, and a scrape-time drop would stop the
    target's copy too. That path is refused before anything changes. After the drop is live, two proofs
    are awaited (``verify_s`` at most): the source stops returning the group's series, and the target keeps
    receiving new samples of it; the second failing undoes the drop (snapshot restored byte for byte).
    """

    def __init__(self, migration: GroupMigration, *, deploy: Deploy, verify_s: float | None = None,
                 poll_s: float = 5.0, sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] | None = None, accept_history_loss: bool = False) -> None:
        import time

        self.migration = migration
        # The decommission form's own acceptance: drop the group although something still reads further back
        # than the target holds (the loss is measured and shown to the approver, ``measure``).
        self.accept_history_loss = accept_history_loss
        self.deploy = deploy
        group = migration.group
        # Two scrapes for the staleness markers, plus the collector's lag.
        self.verify_s = verify_s if verify_s is not None else 2 * group.scrape_interval_s + group.bake.max_lag_s
        self.poll_s = poll_s
        self.sleep = sleep or time.sleep
        self.clock = clock or time.time

    def refusal(self, *, history: bool = True) -> str | None:
        """Why the drop may not go ahead (one line), or None. ``history=False``: only what no approver can accept
        (the stage, the only writer); the history loss is then shown to the approver (``history_loss``), whose
        form's ``accept_history_loss`` decides it, and the decommission task checks it again."""
        m = self.migration
        stage = m.stage()
        if stage not in DECOMMISSIONABLE:
            return (f"group {m.group.name!r} is {stage.value}; a decommission starts only from "
                    f"{', '.join(sorted(s.value for s in DECOMMISSIONABLE))} (after a clean bake)")
        if not self.deploy.own_writer:
            return (f"group {m.group.name!r} reaches the target through the source's remote_write: the source is "
                    "the target's only writer, so dropping the group at scrape would stop the target's copy too; "
                    "decommission needs an independent writer (the managed collector, deploy 'scraper')")
        waiting = waiting_list(m.audit.events(group=m.group.name))
        if history and waiting and not self.accept_history_loss:
            first = waiting[0]
            return (f"group {m.group.name!r} still has {len(waiting)} panel(s) or rule(s) reading further back than "
                    f"the target holds (first: {first['kind']} {first['name']!r}, ready at "
                    f"{first['ready_at'] or 'unknown'}); decommission waits until then, or accept the history loss")
        return None

    def measure(self, now: datetime) -> dict[str, Any]:
        """What the drop will free on the source: the group's series per job and the samples/s they add."""
        from promshift.steps.migration import scrape_interval_s

        src, selector = self.migration.backends.source, self.migration.group.selector()
        by_job = {series.labels.get("job", ""): int(series.points[0][1])
                  for series in src.query(f"count by (job) ({selector})", at=now.timestamp()).series if series.points}
        interval = scrape_interval_s(src.config_text())
        total = sum(by_job.values())
        appended = src.scalar("sum(rate(prometheus_tsdb_head_samples_appended_total[5m]))", at=now.timestamp())
        return {"series": total, "series_by_job": by_job, "scrape_interval_s": interval,
                "samples_per_s": total / interval if interval else None,
                "source_samples_appended_per_s": appended}

    def history_loss(self, now: datetime) -> dict[str, Any]:
        """What dropping the group now would lose, for the approver: every panel and rule still reading further
        back than the target holds, and by how much the target falls short of the longest (None: unknown)."""
        events = self.migration.audit.events(group=self.migration.group.name)
        waiting = waiting_list(events)
        since = dual_write_since(events)
        reaches = [w["reach_s"] for w in waiting]
        short = None if since is None or None in reaches else decommission_short_by(
            max(reaches, default=0.0), dual_write_since=since, now=now)
        return {"waiting": waiting, "short_by_s": short, "accepted": self.accept_history_loss}

    def decommission(self, now: datetime, *, approval: Mapping[str, Any]) -> dict[str, Any]:
        from promshift.core.render import sha256_bytes
        from promshift.core.scrape_drop import add_scrape_drop, drop_is_loaded, drop_rule

        m = self.migration
        why = self.refusal()
        if why is not None:
            m.record(EventKind.DECOMMISSION_REFUSED, now, {"reason": why, "stage": m.stage().value,
                                                          "approval": dict(approval)})
            raise DecommissionRefused(why)
        freed = self.measure(now)
        loss = self.history_loss(now)  # recorded with the outcome: what the approver accepted, if anything
        jobs = sorted(job for job in freed["series_by_job"] if job)
        if not jobs:
            why = f"the source has no series of {m.group.name!r} in any scrape job: nothing to decommission"
            m.record(EventKind.DECOMMISSION_REFUSED, now, {"reason": why, "measured": freed})
            raise DecommissionRefused(why)
        rule = drop_rule(m.group.name_regex())
        deployer = m.source_file
        snap = deployer.snapshot()
        ref = m.snapshot_blobs.put(snapshot_key(m.group.name, m.run_id, "decommission.yml"), snap.data,
                                   mode=(snap.mode if snap.mode is not None else 0o600) & 0o644)
        new_data = snap.data
        for job in jobs:
            new_data = add_scrape_drop(new_data, job, rule)
        live = set(remote_write_names(m.backends.source.config_text()))
        deployer.deploy(new_data, snapshot=snap, expect_remote_writes=live)
        loaded = m.backends.source.config_text()
        evidence: dict[str, Any] = {
            "jobs": jobs, "rule": rule, "freed": freed, "snapshot_path": ref, "config_before_sha256": snap.sha256,
            "config_after_sha256": sha256_bytes(new_data), "approval": dict(approval),
            "loaded": all(drop_is_loaded(loaded, job, rule) for job in jobs), "dual_write": "managed collector",
            "history_loss": loss}
        stopped, flowing = self._verify(after=now.timestamp())
        evidence.update(source_stopped=stopped, target_still_receiving=flowing,
                        source_series_after=self._source_series())
        if not (evidence["loaded"] and stopped and flowing):
            restored = deployer.restore(snap)
            evidence["undone"] = {"restored_identical": restored}
            m.record(EventKind.DECOMMISSION_FAILED, now, evidence)
            raise DecommissionFailed(
                f"decommission of {m.group.name!r} not proven safe (drop loaded: {evidence['loaded']}, source "
                f"stopped: {stopped}, target still receiving: {flowing}); the source config was restored")
        m.record(EventKind.DECOMMISSIONED, now, evidence, to=Stage.DECOMMISSIONED)
        return evidence

    def _source_series(self) -> int | None:
        """The group's series the source still returns (None when it cannot be asked)."""
        try:
            return int(self.migration.backends.source.scalar(f"count({self.migration.group.selector()})") or 0)
        except PrometheusError as exc:
            log.warning("decommission: source series after: %s", exc)
            return None

    def _verify(self, *, after: float) -> tuple[bool, bool]:
        """(the source returns no fresh series of the group, the target has a sample newer than ``after``)."""
        m, selector = self.migration, self.migration.group.selector()
        deadline = self.clock() + self.verify_s
        stopped = flowing = False
        while True:
            try:
                stopped = stopped or not (m.backends.source.scalar(f"count({selector})") or 0)
                newest = m.backends.target.scalar(newest_sample_expr(selector))
                flowing = flowing or (newest is not None and newest > after)
            except PrometheusError as exc:
                log.warning("decommission verify: %s", exc)
            if (stopped and flowing) or self.clock() >= deadline:
                return stopped, flowing
            self.sleep(self.poll_s)

    def recommission(self, now: datetime, *, reason: str) -> dict[str, Any]:
        """Undo the decommission: remove the drop (the source scrapes and stores the group again); reads stay
        on the target. The source never stored the group's samples between the decommission and now."""
        from promshift.core.render import sha256_bytes
        from promshift.core.scrape_drop import remove_scrape_drop

        m = self.migration
        if m.stage() != Stage.DECOMMISSIONED:
            raise DecommissionRefused(f"group {m.group.name!r} is {m.stage().value}, not decommissioned")
        done = [e for e in m.audit.events(group=m.group.name) if e.kind == EventKind.DECOMMISSIONED][-1]
        rule, jobs = done.evidence_data["rule"], done.evidence_data["jobs"]
        deployer = m.source_file
        snap = deployer.snapshot()
        new_data = snap.data
        for job in jobs:
            new_data = remove_scrape_drop(new_data, job, rule)
        if new_data != snap.data:
            live = set(remote_write_names(m.backends.source.config_text()))
            deployer.deploy(new_data, snapshot=snap, expect_remote_writes=live)
        evidence = {"reason": reason, "jobs": jobs, "rule": rule, "config_sha256": sha256_bytes(new_data),
                    "identical_to_before_decommission": sha256_bytes(new_data) ==
                    done.evidence_data["config_before_sha256"],
                    "read_from": m.routing.read_from(m.group.name),
                    "source_history_gap": {"from": done.at.isoformat(), "to": now.isoformat(),
                                           "note": "the source never stored the group's samples in this span; "
                                                   "the target holds them"}}
        m.record(EventKind.RECOMMISSIONED, now, evidence, to=Stage.RECOMMISSIONED)
        return evidence


# -- leaving the lifecycle: the full rollback of a group that was cut over ------------------------------

# Where a full rollback by hand may start: a cut-over group in any stage that still dual-writes to it.
FULL_ROLLBACK_FROM = frozenset({Stage.CUT_OVER, Stage.BAKING, Stage.BAKED, Stage.ROLLED_BACK_READS,
                                Stage.RECOMMISSIONED})


def deploying_run(migration: GroupMigration) -> str | None:
    """The run that deployed the group's live dual-write: the one that recorded its latest ``dual_write_deployed``
    (None when none is recorded). A by-hand full rollback undoes that run's change (the git deploy reverts that
    run's own commit, found by its trailer), never one of its own."""
    deployed = [e for e in migration.audit.events(group=migration.group.name)
                if e.kind == EventKind.DUAL_WRITE_DEPLOYED]
    return deployed[-1].run_id if deployed else None


def deployed_snapshot(migration: GroupMigration) -> dict[str, Any] | None:
    """The snapshot the group's live dual-write was deployed from: the ``snapshot_taken`` of the run that recorded
    the group's latest ``dual_write_deployed`` (``deploying_run``; None when none is recorded)."""
    run_id = deploying_run(migration)
    if run_id is None:
        return None
    taken = [e for e in migration.audit.events(group=migration.group.name, run_id=run_id)
             if e.kind == EventKind.SNAPSHOT_TAKEN]
    return dict(taken[-1].evidence_data) if taken else None


def full_rollback(migration: GroupMigration, now: datetime, *, reason: str,
                  read_restorers: Sequence[ReadRestorer] = DEFAULT_READ_RESTORERS) -> dict[str, Any]:
    """Take a cut-over group all the way back (``rolled_back``): reads to the source (every restorer), then its
    own dual-write undone through the deploy driver (``steps.deploy.DeployStep``), for every deploy kind.

    The file path removes its entry by name (``withdraw``), promtool-checked, reloaded and verified gone: other
    groups may have added their own entries since, and a snapshot from before them would remove theirs too.
    Every other kind restores the snapshot its deploy was made from (``deployed_snapshot``): each of those
    deployers removes only the group's own entry when the object changed since (the scraper: deletes it).
    A restore that must be followed returns ``{"waiting": <DeployResult dict>, "snapshot", "extra"}`` for a
    trigger; ``finish_full_rollback`` records it. Idempotent: an entry already gone is not redeployed.
    """
    from promshift.steps.deploy import final_event

    done = migration.recorded(EventKind.ROLLED_BACK, Stage.ROLLED_BACK)
    if done is not None:  # a retry of this run after its rollback was recorded (e.g. the task lost its state)
        return redact({**done.evidence_data, "already_rolled_back": True})
    stage = migration.stage()
    if stage not in FULL_ROLLBACK_FROM:
        raise DecommissionRefused(f"group {migration.group.name!r} is {stage.value}; a full rollback by hand starts "
                                  f"only from {', '.join(sorted(s.value for s in FULL_ROLLBACK_FROM))}")
    restored: dict[str, Any] = {}
    for name, restorer in read_restorers:
        restored[name] = dict(restorer(migration, reason=reason, now=now))
    step = migration.deploy_step
    info = deployed_snapshot(migration)
    extra = {"remote_write": remote_write_name(migration.group.name), "restored": restored,
             "from_stage": stage.value}
    withdraw = getattr(step.deployer, "withdraw", None)
    if withdraw is not None:
        result = withdraw(now, expect_sha256=(info or {}).get("sha256"))
    elif info is None:
        raise DecommissionRefused(f"group {migration.group.name!r}: no snapshot of its deploy is recorded; roll "
                                  f"its {step.deploy.kind} back by hand")
    else:
        result = step.restore(info, reason=reason, now=now)
    if not result.state.final:
        return {"waiting": result.to_dict(), "snapshot": info, "extra": extra}
    return finish_full_rollback(migration, final_event(result), info, reason=reason, now=now, extra=extra)


def finish_full_rollback(migration: GroupMigration, event: Mapping[str, Any], info: Mapping[str, Any] | None, *,
                         reason: str, now: datetime, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Record the full rollback (``rolled_back``, the same shape as a run's rollback, with what was restored and
    the stage it started from) from the restore's final event; reads are already on the source."""
    snapshot = dict(info) if info else {"sha256": None, "existed": True}
    return migration.deploy_step.finish_rollback(event, snapshot, reason=reason, now=now, extra=extra,
)
