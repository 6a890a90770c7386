"""The local AMP's rule-groups namespaces as the target's rule files (``stack.rule_namespaces``), with a real
``promtool`` and a recorded reload."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from promshift.local.stack.frontdoor import api_kind
from promshift.local.stack.rule_namespaces import RuleNamespaces

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")

GOOD = b"groups:\n  - name: g\n    interval: 5s\n    rules:\n      - record: up:sum\n        expr: sum(up)\n"
OTHER = b"groups:\n  - name: g\n    rules:\n      - alert: Down\n        expr: up == 0\n"
BAD = b"groups:\n  - name: g\n    rules:\n      - record: up:sum\n        expr: sum(up\n"


@dataclass
class Answer:
    status: int
    data: bytes = b""


class Reloads:
    """Stands in for the target: records every reload, answers what ``answers`` holds (then 200)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.answers: list[Answer] = []

    def request(self, method: str, url: str) -> Answer:
        self.calls.append(f"{method} {url}")
        return self.answers.pop(0) if self.answers else Answer(200)


@pytest.fixture
def rig(tmp_path: Path) -> tuple[RuleNamespaces, Reloads]:
    reloads = Reloads()
    return RuleNamespaces(tmp_path / "amp-rules", "http://127.0.0.1:1/workspaces/ws-local/", state_dir=tmp_path,
                          http=reloads), reloads  # type: ignore[arg-type]


def test_a_good_namespace_becomes_a_rule_file_and_the_target_reloads(rig) -> None:
    rules, reloads = rig
    assert rules.apply("ws-1", "promshift-gpu", GOOD, creating=True) == {"statusCode": "ACTIVE"}
    path = rules.path("ws-1", "promshift-gpu")
    assert path.name == "amp-ws-1-promshift-gpu.yml" and path.read_bytes() == GOOD
    assert reloads.calls == ["POST http://127.0.0.1:1/workspaces/ws-local/-/reload"]
    assert rules.status("ws-1", "promshift-gpu") == {"statusCode": "ACTIVE"}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no check file left behind


def test_invalid_rules_fail_the_update_and_keep_the_last_good_file(rig, tmp_path: Path) -> None:
    rules, reloads = rig
    rules.apply("ws-1", "ns", GOOD, creating=True)
    status = rules.apply("ws-1", "ns", BAD, creating=False)
    assert status["statusCode"] == "UPDATE_FAILED"
    assert status["statusReason"].startswith("invalid rules: ") and "\n" not in status["statusReason"]
    assert str(tmp_path) not in status["statusReason"]
    assert rules.path("ws-1", "ns").read_bytes() == GOOD
    assert len(reloads.calls) == 1  # promtool refused it: the target was not touched
    # kept in the state dir: another instance (a restarted control plane) answers the same
    again = RuleNamespaces(tmp_path / "amp-rules", "http://127.0.0.1:1", state_dir=tmp_path)
    assert again.status("ws-1", "ns") == status
    assert json.loads((tmp_path / "rule-namespaces.json").read_text())["ws-1/ns"] == status


def test_invalid_rules_on_create_fail_the_creation_and_write_nothing(rig) -> None:
    rules, reloads = rig
    assert rules.apply("ws-1", "ns", BAD, creating=True)["statusCode"] == "CREATION_FAILED"
    assert not rules.path("ws-1", "ns").exists() and reloads.calls == []


def test_a_refused_reload_restores_the_previous_file_and_reloads_again(rig) -> None:
    rules, reloads = rig
    rules.apply("ws-1", "ns", GOOD, creating=True)
    reloads.answers = [Answer(500, b"failed to reload config: one or more errors occurred\n")]
    status = rules.apply("ws-1", "ns", OTHER, creating=False)
    assert status == {"statusCode": "UPDATE_FAILED", "statusReason": "the workspace could not load the rules "
                      "(HTTP 500): failed to reload config: one or more errors occurred"}
    assert rules.path("ws-1", "ns").read_bytes() == GOOD
    assert len(reloads.calls) == 3  # the good one, the refused one, the one onto the restored file
    # a later good put clears the failure
    assert rules.apply("ws-1", "ns", OTHER, creating=False) == {"statusCode": "ACTIVE"}


def test_a_refused_reload_of_a_new_namespace_removes_its_file(rig) -> None:
    rules, reloads = rig
    reloads.answers = [Answer(500, b"bad")]
    assert rules.apply("ws-1", "ns", GOOD, creating=True)["statusCode"] == "CREATION_FAILED"
    assert not rules.path("ws-1", "ns").exists()


def test_delete_removes_the_file_and_the_record(rig) -> None:
    rules, reloads = rig
    rules.apply("ws-1", "ns", GOOD, creating=True)
    rules.delete("ws-1", "ns")
    assert not rules.path("ws-1", "ns").exists() and rules.status("ws-1", "ns") is None
    assert len(reloads.calls) == 2
    rules.delete("ws-1", "ns")  # nothing left: no reload
    assert len(reloads.calls) == 2


def test_names_cannot_leave_the_rules_dir(rig) -> None:
    rules, _ = rig
    assert rules.path("ws-1", "../../etc/x").parent == rules.rules_dir


def test_the_front_door_serves_the_rules_api() -> None:
    assert api_kind("/workspaces/ws-1/api/v1/rules") == "rules"
    assert api_kind("/workspaces/ws-1/api/v1/alerts") == "alerts"


def test_the_answered_status_is_checked_against_botocores_model() -> None:
    from botocore.exceptions import ParamValidationError

    from promshift.local.stack.controlplane import validate_status

    validate_status({"statusCode": "UPDATE_FAILED", "statusReason": "invalid rules: x"})
    with pytest.raises(ParamValidationError):
        validate_status({"statusCode": "BROKEN"})
    with pytest.raises(ParamValidationError):
        validate_status({"statusReason": "no code"})
