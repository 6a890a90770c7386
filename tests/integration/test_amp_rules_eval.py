"""The local AMP evaluates its rule-groups namespaces: boto3 against the control plane, the rules read back
through the SigV4 front door's ``/api/v1/rules`` (as the bake watch reads them), a bad update refused with
the last good rules still evaluating, a delete that removes them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from botocore.credentials import Credentials

from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import loaded_rules
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.core.bake import MovedRule, judge_rules, observe_rules
from promshift.core.verdicts import Verdict
from promshift.local.stack.local import LocalStack, StackConfig
from tests.integration.conftest import eventually, running_amp_stack

integration = pytest.mark.integration
NAMESPACE = "promshift-rules-eval"
GOOD = b"""groups:
  - name: rules-eval
    interval: 1s
    rules:
      - record: promshift:eval:one
        expr: vector(1)
      - alert: PromshiftEvalAlways
        expr: vector(1) > 0
"""
# promtool refuses it: an unclosed parenthesis.
BAD = b"""groups:
  - name: rules-eval
    interval: 1s
    rules:
      - record: promshift:eval:broken
        expr: sum(vector(1)
"""


@pytest.fixture(scope="module")
def amp_stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    with running_amp_stack(stack_config_factory) as stack:
        yield stack


def workspace_client(stack: LocalStack) -> PrometheusClient:
    """The workspace's API through the front door, signed as the bake's target client signs."""
    pair = stack.aws_credentials()
    creds = Credentials(pair.access_key, pair.secret_key, pair.session_token)
    return PrometheusClient(stack.prometheus_endpoint(), timeout_s=15, auth=AwsSigV4Auth(creds, stack.config.region))


def status(amp, ws: str) -> dict:
    return amp.describe_rule_groups_namespace(workspaceId=ws, name=NAMESPACE)["ruleGroupsNamespace"]["status"]


@integration
def test_a_namespace_is_evaluated_a_bad_update_keeps_the_last_good_rules_and_delete_removes_them(
        amp_stack: LocalStack) -> None:
    amp, ws = amp_stack.amp_client(), amp_stack.workspace_id
    client = workspace_client(amp_stack)
    rule_file = amp_stack.amp_rules_dir / f"amp-{ws}-{NAMESPACE}.yml"
    moved = [MovedRule("record", "promshift:eval:one", "rules-eval"), MovedRule("alert", "PromshiftEvalAlways",
                                                                               "rules-eval")]

    created = amp.create_rule_groups_namespace(workspaceId=ws, name=NAMESPACE, data=GOOD)
    assert created["status"]["statusCode"] == "ACTIVE"
    assert status(amp, ws) == {"statusCode": "ACTIVE"}
    assert rule_file.read_bytes() == GOOD
    loaded_at = time.time()

    def evaluated() -> bool:
        obs = observe_rules(moved, loaded_rules(client), now=time.time(), loaded_at=loaded_at)
        return judge_rules(obs).verdict == Verdict.SUCCESSFUL

    eventually(evaluated, timeout=30.0, message="the namespace's rules were not evaluated healthy on the target")
    ours = [r for r in loaded_rules(client) if r.group == "rules-eval"]
    assert {(r.kind.value, r.name, r.health) for r in ours} == {("record", "promshift:eval:one", "ok"),
                                                               ("alert", "PromshiftEvalAlways", "ok")}
    assert all(r.interval_s == 1.0 for r in ours)
    # the alert fires on the workspace, read through the front door's /api/v1/alerts
    eventually(lambda: any(a["labels"]["alertname"] == "PromshiftEvalAlways"
                           for a in client._success_body(client._request("GET", "/api/v1/alerts"),  # noqa: SLF001
                                                         "alerts")["data"]["alerts"]), timeout=30.0)

    put = amp.put_rule_groups_namespace(workspaceId=ws, name=NAMESPACE, data=BAD)
    assert put["status"]["statusCode"] == "UPDATING"
    failed = status(amp, ws)
    assert failed["statusCode"] == "UPDATE_FAILED"
    assert failed["statusReason"].startswith("invalid rules: ") and "\n" not in failed["statusReason"]
    listed = amp.list_rule_groups_namespaces(workspaceId=ws)["ruleGroupsNamespaces"]
    assert [(n["name"], n["status"]["statusCode"]) for n in listed] == [(NAMESPACE, "UPDATE_FAILED")]
    assert rule_file.read_bytes() == GOOD
    # the last good rules still evaluate: a fresh evaluation after the refused update
    refused_at = datetime.now(UTC).timestamp()

    def evaluated_again() -> bool:
        obs = observe_rules(moved, loaded_rules(client), now=refused_at, loaded_at=loaded_at)
        ages = [r.last_evaluation_age_s for r in obs.rules]
        return all(age is not None and age <= 0 for age in ages) and judge_rules(obs).verdict == Verdict.SUCCESSFUL

    eventually(evaluated_again, timeout=30.0, message="the previous rules stopped evaluating after the refused update")
    assert not any(r.name == "promshift:eval:broken" for r in loaded_rules(client))

    amp.delete_rule_groups_namespace(workspaceId=ws, name=NAMESPACE)
    assert not rule_file.exists()
    assert not any(r.group == "rules-eval" for r in loaded_rules(client))
    gone = observe_rules(moved, loaded_rules(client), now=time.time(), loaded_at=loaded_at)
    assert judge_rules(gone).verdict == Verdict.FAILED
    assert judge_rules(gone).reason.startswith("record promshift:eval:one missing on the target")


@integration
def test_the_front_door_refuses_an_unsigned_rules_read(amp_stack: LocalStack) -> None:
    import requests

    session = requests.Session()
    session.trust_env = False
    response = session.get(f"{amp_stack.prometheus_endpoint()}api/v1/rules", timeout=15)
    assert response.status_code == 403
