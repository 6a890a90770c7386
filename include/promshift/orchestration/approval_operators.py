"""The approvals: the cut-over's (on the gate's evidence) and the decommission's (on the bake's); four eyes and
the evidence hash are checked by ``core.approval.decide_approval``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from promshift.core.approvers import team_of
from promshift.core.text import shown as escaped_text
from promshift.orchestration.operators import (
    SOURCE_CONN,
    TARGET_CONN,
    Output,
    _GroupStep,
    _iso,
    _now,
    given,
    publish_report,
)


def assign_approvers(op: ApprovalOperator, context: Any, entries: Sequence[str], *, group: str) -> list[str]:
    """Resolve ``entries`` now (a team's members as they are now), without the run's trigger user, and assign
    ``op``'s request to them; their ids. Fails with one line when nobody is left to ask: Airflow would let any
    user answer a request assigned to nobody."""
    from promshift.core.approvers import ApproversError, resolve
    from promshift.orchestration.approver_teams import team_directory

    triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
    try:
        directory = team_directory() if any(team_of(a) for a in entries) else None
        asked = resolve(entries, directory, group=group, exclude=[triggered_by])
    except ApproversError as exc:
        raise AirflowFailException(str(exc)) from None
    op.assigned_users = [{"id": a.id, "name": a.name} for a in asked]
    return [a.id for a in asked]


class MigrationApprovalOperator(_GroupStep, ApprovalOperator):
    """On-call approval showing the evidence; enforces four eyes; Reject fails (and so rolls back).

    ``gate_evidence``: the gate task's output. Rendered again when the answer resumes the task, so the
    answer is checked against the gate's XCom as it is then.
    """

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "gate_evidence")

    # Which approval this is in the audit ("" the cut-over's; "decommission_" the second approval).
    approval_prefix = ""
    # Whether the evidence shown is the gate's, recorded in the audit log, so the answer is checked against it.
    shows_audited_gate = True

    def _answer(self, migration: Any, **answer: Any) -> None:
        migration.record_approval(prefix=self.approval_prefix, **answer)

    def __init__(self, *, group_name: str | None, catalog_path: str, approvers: Sequence[str] | None,
                 profile: str | None = None, source_conn_id: str = SOURCE_CONN,
                 target_conn_id: str = TARGET_CONN, dag_target: str | None = None, gate_evidence: Output = None,
                 **kwargs: Any) -> None:
        """``group_name`` and ``approvers`` None: a DAG of every group; the chosen group's approvers (and its
        ``approval_timeout``) are read from the catalog when the task runs."""
        kwargs.setdefault("subject", f"Cut over metric group {group_name or '(chosen in the form)'} to AMP?")
        kwargs.setdefault("body", "Evidence is filled in when the task runs.")
        # The approver's form: its own comment field only. Airflow hands a task the DAG's params (the trigger
        # form) merged with its own; HITL keeps only params whose source is "task", so the comment is marked so
        # (without it, a DAG with params would leave the approver no comment field).
        from airflow.sdk.definitions.param import ParamsDict

        params = ParamsDict(kwargs.pop("params", None) or {})
        if "comment" not in params:
            params["comment"] = Param("", type="string", description="Why (kept in the audit)", source="task")
        kwargs["params"] = params
        # The catalog's users and teams; a team is resolved when the question is asked (``ask_approvers``).
        self.approver_entries = list(approvers) if approvers is not None else None
        super().__init__(assigned_users=[{"id": a, "name": a} for a in approvers or () if team_of(a) is None],
                         **kwargs)
        self._init_group(group_name=group_name, catalog_path=catalog_path, profile=profile,
                         source_conn_id=source_conn_id, target_conn_id=target_conn_id, dag_target=dag_target)
        self.gate_evidence = gate_evidence

    def ask_within_group_timeout(self) -> None:
        """In a DAG of every group, wait for the chosen group's own ``approval_timeout`` (the DAG was built with
        the longest of its groups')."""
        if self.approver_entries is None:
            self.response_timeout = timedelta(seconds=self.group.approval_timeout_s)

    def ask_approvers(self, context: Any) -> list[str]:
        """Resolve the approvers now (a team's members as they are now), without the run's trigger user, and
        assign the request to them; their ids. Fails with one line when nobody is left to ask: Airflow would let
        any user answer a request assigned to nobody."""
        entries = self.approver_entries if self.approver_entries is not None else list(self.group.approvers)
        return assign_approvers(self, context, entries, group=self.group_name)

    def evidence(self) -> dict[str, Any]:
        """What the approver decides on: the gate's whole evidence (verdict, parity, latency with cost), its XCom."""
        return given(self, "gate_evidence") or {}

    def board_url(self) -> str | None:
        """The migration board's page for this group, under the Airflow UI's base URL (None when it is not set)."""
        from airflow.configuration import conf

        from promshift.core.urls import URL_PREFIX

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        return f"{base}{URL_PREFIX}/groups/{self.group_name}" if base else None

    def execute(self, context: Any) -> Any:
        from promshift.core.evidence import evidence_sha256
        from promshift.core.gate import GateEvidence
        from promshift.core.report import approval_body

        evidence = self.evidence()
        if self.run_params(context).dry_run:
            self._end_dry_run(context, evidence)
        self.ask_within_group_timeout()
        digest = evidence_sha256(evidence)
        shown = GateEvidence.from_dict(evidence)
        gate = shown.gate
        board = self.board_url()
        # Recorded before the question is asked: the answer is checked against this hash.
        asked = self.ask_approvers(context)
        self.migration(context).record_evidence_shown(
            evidence_sha256=digest, approvers=asked, now=_now(), board_url=board)
        self.subject = f"[{gate.verdict.value}] Cut over metric group {self.group_name} to AMP?"
        self.body = approval_body(self.group_name, gate, shown.parity, shown.latency, evidence_sha256=digest,
                                  board_url=board)
        # HITL runs its notifiers once the request exists, just before the task waits for an answer.
        self.notifiers = [*self.notifiers, self.owners_notifier("approval_needed", gate=gate.to_dict(),
                                                                board_url=board, approvers=asked)]
        return super().execute(context)

    def _end_dry_run(self, context: Any, evidence: dict[str, Any]) -> None:
        """A dry run asks nobody: record how far it got (``dry_run_complete``), publish the report, and skip
        the approval, and so the cut-over and its asset."""
        from promshift.core.events import EventKind

        migration = self.migration(context)
        gate = evidence.get("gate") or {}
        migration.record(EventKind.DRY_RUN_COMPLETE, _now(), {
            "dry_run": True, "gate": gate.get("verdict"), "gate_reason": gate.get("reason"),
            "parity": (evidence.get("parity") or {}).get("verdict"),
            "latency": (evidence.get("latency") or {}).get("verdict"), "stage": migration.stage().value,
            "run_params": migration.run_params.to_dict(),
            "would": "ask the approvers, then cut over"})
        publish_report(self, context, migration)
        raise AirflowSkipException(f"dry run: gate {gate.get('verdict')}; no approval asked, nothing cut over")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self.choose_group(context)
        migration = self.migration(context)
        responder = event.get("responded_by_user") or {}

        def field(name: str) -> str | None:
            value = responder.get(name) if isinstance(responder, dict) else getattr(responder, name, None)
            return str(value) if value else None

        # Airflow's own record of this answer: the HITL detail of this task instance.
        hitl = {"dag_id": self.dag_id, "run_id": context["run_id"], "task_id": self.task_id,
                "map_index": getattr(context["ti"], "map_index", -1), "responder_id": field("id"),
                "responded_at": _iso(event.get("responded_at"))}
        from promshift.core.approval import Answer, Evidence, decide_approval
        from promshift.core.evidence import evidence_sha256

        if "error" in event:
            answer = Answer(None, "nobody", str(event.get("error")), error=str(event.get("error")),
                            error_type=str(event.get("error_type")))
        else:
            # Airflow's form took it as typed: kept and shown with control and bidi-override characters escaped.
            answer = Answer((event.get("chosen_options") or ["?"])[0], field("id") or field("name") or "unknown",
                            escaped_text(str((event.get("params_input") or {}).get("comment", ""))),
                            responder=(field("id"), field("name")),
                            triggered_by=getattr(context.get("dag_run"), "triggering_user_name", None))
        # The evidence the approver was shown (its hash, recorded when the question was asked), now, and the gate
        # evidence as the audit log holds it for this run (read back now): the hash shown must be its.
        asked = migration.approval_request()
        gate_event = migration.gate_event() if self.shows_audited_gate and answer.error is None else None
        evidence = Evidence(
            shown=str(asked.evidence_data.get("evidence_sha256")) if asked is not None else None,
            current=evidence_sha256(self.evidence()) if answer.error is None else None,
            recorded=evidence_sha256(gate_event.evidence_data) if gate_event is not None else None,
            audited=self.shows_audited_gate,
            where=f"audit seq {gate_event.seq}" if gate_event is not None else "no gate event recorded")
        decided = decide_approval(answer, evidence)
        bound = ({} if answer.error is not None else
                 {"evidence_sha256": evidence.shown, "current_sha256": evidence.current, **decided.extra})
        self._answer(migration, decision=decided.decision, by=answer.by, comment=answer.comment, now=_now(),
                     hitl=hitl, **bound)
        if not decided.approved:
            raise AirflowFailException(decided.message)
        by, choice, comment = answer.by, answer.choice, answer.comment
        self.log.info("approved by %s", by)
        return {"decision": choice, "by": by, "comment": comment}

class DecommissionApprovalOperator(MigrationApprovalOperator):
    """The second approval: the bake evidence and what the drop frees; four eyes and the evidence hash as for the
    cut-over; recorded as ``decommission_approved`` (no stage move: the drop moves it)."""

    approval_prefix = "decommission_"
    shows_audited_gate = False  # the bake evidence and what the drop frees: XCom only (prepare records no event)
    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "prepared")

    def __init__(self, *, prepared: Output = None, **kwargs: Any) -> None:
        """``prepared``: the prepare task's output (what the drop frees, the bake evidence, the history loss)."""
        from airflow.sdk.definitions.param import ParamsDict

        params = ParamsDict(kwargs.pop("params", None) or {})
        params[ACCEPT_HISTORY_LOSS] = Param(
            False, type="boolean", source="task", title="Accept history loss",
            description="Decommission although panels or rules still read further back than the target holds "
                        "(listed above): the source's history of the group, the only copy of that reach, is lost. "
                        "Recorded in the audit.")
        super().__init__(params=params, **kwargs)
        self.prepared = prepared
        self._form: dict[str, Any] = {}

    def _answer(self, migration: Any, **answer: Any) -> None:
        migration.record_approval(prefix=self.approval_prefix, form=self._form, **answer)

    def evidence(self) -> dict[str, Any]:
        return {"prepare": given(self, "prepared") or {}}

    def execute(self, context: Any) -> Any:
        from promshift.core.evidence import evidence_sha256

        self.choose_group(context)
        self.ask_within_group_timeout()
        evidence = self.evidence()
        digest = evidence_sha256(evidence)
        self.migration(context).record_evidence_shown(
            evidence_sha256=digest, approvers=self.ask_approvers(context), now=_now())
        prepare = evidence["prepare"]
        freed, bake = prepare.get("freed") or {}, prepare.get("bake") or {}
        self.subject = f"Decommission metric group {self.group_name} on the source?"
        self.body = (f"**{self.group_name}** baked at {bake.get('at')} after {bake.get('checks')} clean checks "
                     f"(clean since {bake.get('clean_since')}, period {bake.get('period_s')}s; last: "
                     f"{bake.get('last_check')}).\n\nThe source stops storing the group: "
                     f"{freed.get('series')} series ({freed.get('series_by_job')}), "
                     f"{freed.get('samples_per_s')} samples/s freed. The target (written by the managed collector) "
                     f"becomes the only copy; undoing it leaves a gap in the source's history.\n\n"
                     f"{history_loss_text(prepare.get('history_loss') or {})}\n\n"
                     f"evidence sha256 `{digest}`")
        return ApprovalOperator.execute(self, context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """As the cut-over's, with the form's ``accept_history_loss`` recorded in the approval event; an approval
        of a drop that loses history without accepting it is refused (recorded as ``decommission_refused``)."""
        from promshift.core.events import EventKind

        loss = (given(self, "prepared") or {}).get("history_loss") or {}
        accepted = (event.get("params_input") or {}).get(ACCEPT_HISTORY_LOSS) is True
        waiting = list(loss.get("waiting") or [])
        self._form = {ACCEPT_HISTORY_LOSS: accepted, "history_loss_shown": len(waiting)}
        result = super().execute_complete(context, event)
        if waiting and not accepted:
            why = (f"the drop would lose history {len(waiting)} panel(s) or rule(s) still read (first: "
                   f"{waiting[0].get('kind')} {waiting[0].get('name')!r}) and the approver did not accept it "
                   f"({ACCEPT_HISTORY_LOSS})")
            self.migration(context).record(EventKind.DECOMMISSION_REFUSED, _now(),
                                           {"reason": why, "approval": result, "history_loss": loss})
            raise AirflowFailException(why)
        return {**result, ACCEPT_HISTORY_LOSS: accepted}


ACCEPT_HISTORY_LOSS = "accept_history_loss"


def history_loss_text(loss: dict[str, Any]) -> str:
    """The approval body's history-loss paragraph: every panel and rule still reading further back than the target
    holds (with when it is ready), and by how much the target falls short; or that nothing does."""
    waiting = list(loss.get("waiting") or [])
    if not waiting:
        return "**History:** nothing reads further back than the target holds; no history is lost."
    short = loss.get("short_by_s")
    lines = [f"- {w.get('kind')} `{w.get('name')}` reads {w.get('reach_s')}s back, ready at "
             f"{w.get('ready_at') or 'unknown'}" for w in waiting[:50]]
    return (f"**History loss:** {len(waiting)} panel(s) or rule(s) still read further back than the target holds"
            f"{f' (the target is {short:.0f}s short of the longest)' if isinstance(short, (int, float)) else ''}; "
            f"the source's copy of that reach goes with the drop:\n\n" + "\n".join(lines)
            + f"\n\nTick **{ACCEPT_HISTORY_LOSS}** to decommission anyway; otherwise an approval is refused.")
