"""The operators of ``promshift__retire`` (prepare -> consolidate -> approval -> retire) and ``promshift__unretire``:
a whole source, chosen in the trigger form (``source``), over ``steps.retire.RetireSource``
(``wiring.retire_source``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException

from promshift.core.text import shown
from promshift.orchestration.operators import Output, _now, given
from promshift.orchestration.wiring import SOURCE_PARAM


def _chosen_source(context: Any) -> str:
    source = (context.get("params") or {}).get(SOURCE_PARAM)
    if not isinstance(source, str) or not source:
        raise AirflowFailException(f"choose the source connection in the form ({SOURCE_PARAM!r})")
    return source


class _RetireTask:
    catalog_path: str
    profile: str | None

    def retire_source(self, context: Any) -> Any:
        from promshift.orchestration.wiring import retire_source

        return retire_source(_chosen_source(context), catalog_path=self.catalog_path, profile=self.profile,
                             run_id=context["run_id"])


class RetirePrepareOperator(_RetireTask, BaseOperator):
    """Refused unless every group of the source has baked (one line naming those that have not); else what
    retiring ends (by name) and the source's usage now: the evidence the approver is shown."""

    ui_color = "#fce8e6"

    def __init__(self, *, catalog_path: str, profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path, self.profile = catalog_path, profile

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.retire import RetireRefused

        try:
            return self.retire_source(context).prepare(_now())
        except RetireRefused as exc:
            raise AirflowFailException(str(exc)) from None


class RetireConsolidateOperator(_RetireTask, BaseOperator):
    """Before the approval and the switch: each target's per-group entries merged into one by the lossless queue swap
    (``RetireSource.consolidate``), so the agent forwards through one queue per target; where the merge may not run
    the entries stay and one line says why. Never fails for that: only an edit it could not undo fails it (the retry
    resumes the swap)."""

    template_fields: Sequence[str] = ("prepared",)
    ui_color = "#fef7e0"

    def __init__(self, *, catalog_path: str, profile: str | None = None, prepared: Output = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path, self.profile, self.prepared = catalog_path, profile, prepared

    def execute(self, context: Any) -> dict[str, Any]:
        prepared = given(self, "prepared") or {}
        if prepared.get("already"):
            return {"already_agent": True, "targets": {}, "lines": []}
        result = self.retire_source(context).consolidate(_now())
        for line in result.get("lines") or []:
            self.log.info("write queues: %s", line)
        return result


class RetireApprovalOperator(_RetireTask, ApprovalOperator):
    """The approval: what retiring ends, by name, and the usage before; the approver lists the names accepted
    (``accept``), checked again when the answer resumes the task and by the retire task. The run's trigger user
    may not approve it (four eyes)."""

    template_fields: Sequence[str] = (*ApprovalOperator.template_fields, "prepared", "consolidated")

    def __init__(self, *, catalog_path: str, profile: str | None = None, prepared: Output = None,
                 consolidated: Output = None, **kwargs: Any) -> None:
        from airflow.sdk.definitions.param import ParamsDict

        kwargs.setdefault("subject", "Retire the source Prometheus (it becomes an agent that only forwards)?")
        kwargs.setdefault("body", "Evidence is filled in when the task runs.")
        params = ParamsDict(kwargs.pop("params", None) or {})
        params["comment"] = Param("", type="string", description="Why (kept in the audit)", source="task")
        params["accept"] = Param("", type="string", maxLength=20000, source="task",
                                 description="Names of what retiring ends that you accept, comma-separated "
                                             "(rule:…, read:…, metric:…, history:…); anything not named blocks it")
        super().__init__(params=params, **kwargs)
        self.catalog_path, self.profile, self.prepared = catalog_path, profile, prepared
        self.consolidated = consolidated

    def execute(self, context: Any) -> Any:
        from promshift.core.evidence import evidence_sha256

        prepared = given(self, "prepared") or {}
        if prepared.get("already"):
            return {"decision": "already an agent", "by": None, "comment": "", "accept": ""}
        names = prepared.get("names") or []
        before = prepared.get("usage_before") or {}
        self.body = (f"**{prepared.get('source')}** carries {len(prepared.get('groups') or [])} group(s), every one "
                     f"baked: {', '.join(prepared.get('groups') or [])}.\n\nRetiring makes it an agent: it stops "
                     f"storing, answering queries and evaluating rules. Its usage now: {before.get('rss_mb')} MB "
                     f"resident, {before.get('cpu_share')} of a core.\n\nWhat retiring ends "
                     f"({len(names)}; each blocks unless named in **accept**):\n\n"
                     + ("\n".join(f"- `{n}`" for n in names[:200]) or "- nothing")
                     + queues_section(given(self, "consolidated") or {})
                     + f"\n\nevidence sha256 `{evidence_sha256(prepared)}`")
        self.assign(context)
        return super().execute(context)

    def assign(self, context: Any) -> None:
        """Every approver of the source's groups (a team's members as they are now), less the run's trigger user;
        one line when nobody is left (Airflow would let anyone answer a request assigned to nobody)."""
        from promshift.orchestration.approval_operators import assign_approvers

        step = self.retire_source(context)
        assign_approvers(self, context, sorted({a for g in step.groups for a in g.approvers}), group=step.group)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from promshift.core.events import EventKind
        from promshift.core.retire import RetireEnds, parse_acceptances, retire_decision
        from promshift.core.text import shown

        step = self.retire_source(context)
        prepared = given(self, "prepared") or {}
        responder = event.get("responded_by_user") or {}
        by = str((responder.get("id") if isinstance(responder, dict) else None) or "unknown")
        triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
        params = event.get("params_input") or {}
        choice = (event.get("chosen_options") or ["?"])[0]
        accepted = parse_acceptances(params.get("accept"))
        answer = {"decision": choice, "by": by, "comment": shown(str(params.get("comment", ""))),
                  "accept": ",".join(accepted)}
        if "error" in event or choice != "Approve":
            why = f"not approved ({event.get('error') or choice} by {by})"
            step.record(EventKind.SOURCE_RETIRE_REFUSED, _now(), {"reason": why, **answer})
            raise AirflowFailException(why)
        if triggered_by and by == triggered_by:
            why = f"{by} triggered this run and may not approve it (four eyes)"
            step.record(EventKind.SOURCE_RETIRE_REFUSED, _now(), {"reason": why, **answer})
            raise AirflowFailException(why)
        ends = prepared.get("ends") or {}
        decision = retire_decision(RetireEnds(tuple(ends.get("rules") or ()), tuple(ends.get("reads") or ()),
                                              tuple(ends.get("unowned_metrics") or ()),
                                              tuple(ends.get("history") or ())), accepted)
        if not decision.ok:
            step.record(EventKind.SOURCE_RETIRE_REFUSED, _now(), {"reason": decision.line(), **answer})
            raise AirflowFailException(decision.line())
        return answer


def queues_section(consolidated: dict[str, Any]) -> str:
    """The approval's lines on the write queues the agent will forward through (one per target), '' when none."""
    lines = consolidated.get("lines") or []
    if not lines:
        return ""
    return "\n\nWrite queues the agent forwards through (merged before asking):\n\n" + "\n".join(
        f"- {shown(str(line))}" for line in lines[:20])


class RetireOperator(_RetireTask, BaseOperator):
    """The switch and its proof (``RetireSource.retire``: checks the bake and the acceptances again; a retry
    after the switch finds an agent and only proves it)."""

    template_fields: Sequence[str] = ("approval",)
    ui_color = "#fce8e6"

    def __init__(self, *, catalog_path: str, profile: str | None = None, approval: Output = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path, self.profile, self.approval = catalog_path, profile, approval

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.retire import RetireFailed, RetireRefused

        approval = given(self, "approval") or {}
        try:
            return self.retire_source(context).retire(_now(), accepted=approval.get("accept"), approval=approval)
        except (RetireRefused, RetireFailed) as exc:
            raise AirflowFailException(str(exc)) from None


class UnretireOperator(_RetireTask, BaseOperator):
    """The undo: the server restored byte for byte (config and command line), the target without a gap."""

    ui_color = "#e6f4ea"

    def __init__(self, *, catalog_path: str, profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog_path, self.profile = catalog_path, profile

    def execute(self, context: Any) -> dict[str, Any]:
        from promshift.steps.retire import RetireFailed

        reason = str((context.get("params") or {}).get("reason") or "manual unretire")
        try:
            return self.retire_source(context).unretire(_now(), reason=reason)
        except RetireFailed as exc:
            raise AirflowFailException(str(exc)) from None
