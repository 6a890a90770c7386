"""promshift__retire's approval: what retiring ends is accepted by name, checked when the answer resumes the task;
the run's trigger user may not approve; every refusal is audited."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from promshift.core.events import EventKind
from promshift.orchestration.retire_operators import RetireApprovalOperator

PREPARED = {"source": "promshift_source", "groups": ["a", "b"], "names": ["rule:g/r", "metric:x"],
            "ends": {"rules": ["g/r"], "reads": [], "unowned_metrics": ["x"]},
            "usage_before": {"rss_mb": 300.0, "cpu_share": 0.02}}


class _Step:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, dict[str, Any]]] = []

    def record(self, kind: str, at: Any, evidence: dict[str, Any]) -> None:
        self.recorded.append((kind, evidence))


@pytest.fixture()
def approval(monkeypatch: pytest.MonkeyPatch) -> tuple[RetireApprovalOperator, _Step]:
    op = RetireApprovalOperator(task_id="approval", catalog_path="catalog/groups.yaml", prepared=None)
    op.prepared = PREPARED
    step = _Step()
    monkeypatch.setattr(RetireApprovalOperator, "retire_source", lambda self, context: step)
    return op, step


def _context() -> dict[str, Any]:
    return {"params": {"source": "promshift_source"}, "run_id": "r1",
            "dag_run": SimpleNamespace(triggering_user_name="admin")}


def _answer(choice: str, by: str, accept: str) -> dict[str, Any]:
    return {"chosen_options": [choice], "responded_by_user": {"id": by, "name": by},
            "params_input": {"comment": "seen", "accept": accept}}


def test_an_approval_that_leaves_something_unaccepted_fails_and_is_audited(approval) -> None:  # noqa: ANN001
    op, step = approval
    with pytest.raises(AirflowFailException, match="not accepted by name: metric:x"):
        op.execute_complete(_context(), _answer("Approve", "oncall-bob", "rule:g/r"))
    [(kind, evidence)] = step.recorded
    assert kind == EventKind.SOURCE_RETIRE_REFUSED and evidence["by"] == "oncall-bob"


def test_the_trigger_user_may_not_approve_and_a_reject_fails(approval) -> None:  # noqa: ANN001
    op, step = approval
    with pytest.raises(AirflowFailException, match="four eyes"):
        op.execute_complete(_context(), _answer("Approve", "admin", "rule:g/r,metric:x"))
    with pytest.raises(AirflowFailException, match="not approved"):
        op.execute_complete(_context(), _answer("Reject", "oncall-bob", "rule:g/r,metric:x"))
    assert [k for k, _ in step.recorded] == [EventKind.SOURCE_RETIRE_REFUSED] * 2


def test_an_approval_naming_everything_passes_the_names_on(approval) -> None:  # noqa: ANN001
    op, step = approval
    out = op.execute_complete(_context(), _answer("Approve", "oncall-bob", "metric:x,\nrule:g/r"))
    assert out["accept"] == "metric:x,rule:g/r" and out["by"] == "oncall-bob" and not step.recorded


def test_the_approval_shows_the_write_queues_the_agent_forwards_through() -> None:
    from promshift.orchestration.retire_operators import queues_section

    assert queues_section({}) == "" and queues_section({"already_agent": True, "lines": []}) == ""
    text = queues_section({"lines": ["promshift_target: 4 promshift queues -> 1: 4 groups in one entry (a, b, c, d), "
                                     "proven on the target", "other: 2 per-group entries kept: a\u202ereason\nforged"]})
    assert "merged before asking" in text and "- promshift_target: 4 promshift queues -> 1" in text
    # a reason carries an error's text: its control and bidi characters are shown escaped, one line each
    assert "\u202e" not in text and "a\\u202ereason\\x0aforged" in text
