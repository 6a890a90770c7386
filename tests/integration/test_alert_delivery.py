"""Moved alerts reach a receiver: the local AMP's alert manager definition (served by the control plane, checked
against botocore's model) configures Debian's prometheus-alertmanager; a rule-groups namespace's firing alert is
held active there for the definition's receiver; a workspace without a definition refuses the move in one line."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import yaml
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from promshift.adapters.alertmanager import AlertmanagerError, active_alerts
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.rules_deploy import AmpRulesNamespace, firing_alerts
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.core.bake import judge_delivery, observe_delivery
from promshift.core.rules import RuleKind, parse_rule_file
from promshift.core.verdicts import Verdict
from promshift.local.stack.alert_definitions import NO_DEFINITION_RECEIVER
from promshift.local.stack.local import LOCAL_ONCALL_RECEIVER, LocalStack, StackConfig
from tests.integration.conftest import eventually, running_amp_stack

pytestmark = pytest.mark.integration
NAMESPACE = "promshift-alert-delivery"
FIRING = b"""groups:
  - name: alert-delivery
    interval: 1s
    rules:
      - alert: PromshiftDeliveryAlways
        expr: vector(1) > 0
        labels:
          severity: page
"""
SILENT_ROUTE = b"""alertmanager_config: |
  route:
    receiver: oncall
    routes:
      - matchers: ['severity="page"']
        receiver: void
  receivers:
    - name: oncall
      sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:oncall', sigv4: {region: us-east-1}}]
    - name: void
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


def moved_alerts() -> tuple:
    return tuple(r for r in parse_rule_file("r.yml", FIRING).rules if r.kind is RuleKind.ALERT)


def test_a_firing_namespace_alert_is_held_active_for_the_definitions_receiver(amp_stack: LocalStack) -> None:
    amp, ws = amp_stack.amp_client(), amp_stack.workspace_id
    described = amp.describe_alert_manager_definition(workspaceId=ws)["alertManagerDefinition"]
    assert described["status"] == {"statusCode": "ACTIVE"}
    assert described["data"] == amp_stack.local_alert_definition()
    # the local Alertmanager runs the definition's route tree (its SNS integration dropped: not reachable here)
    config = yaml.safe_load(amp_stack.alertmanager_config_path.read_text())
    assert config["route"]["receiver"] == LOCAL_ONCALL_RECEIVER
    assert config["receivers"] == [{"name": LOCAL_ONCALL_RECEIVER}]
    assert AmpRulesNamespace(amp, ws, "alert-delivery").alert_delivery_problem(moved_alerts()) is None

    amp.create_rule_groups_namespace(workspaceId=ws, name=NAMESPACE, data=FIRING)
    try:
        delivered = eventually(lambda: active_alerts(amp_stack.alertmanager_url, "PromshiftDeliveryAlways"),
                               timeout=45.0, message="the namespace's alert never reached the Alertmanager")
        assert delivered[0].receivers == (LOCAL_ONCALL_RECEIVER,)
        assert delivered[0].state == "active" and delivered[0].labels["severity"] == "page"
        assert active_alerts(amp_stack.alertmanager_url, "NoSuchAlert") == []
        # what the bake watch reads: the firing alert on the workspace, and the workspace's Alertmanager (ListAlerts)
        # through the front door, signed
        client = workspace_client(amp_stack)
        firing = [name for name, _since in firing_alerts(client)]
        assert firing == ["PromshiftDeliveryAlways"]
        via_workspace = active_alerts(amp_stack.prometheus_endpoint() + "alertmanager", "PromshiftDeliveryAlways",
                                      auth=client.auth)
        assert [a.receivers for a in via_workspace] == [(LOCAL_ONCALL_RECEIVER,)]
        obs = observe_delivery(["PromshiftDeliveryAlways"], firing_alerts(client),
                               {"PromshiftDeliveryAlways": [a.receivers for a in via_workspace]}, now=time.time())
        assert judge_delivery(obs).verdict == Verdict.SUCCESSFUL
    finally:
        amp.delete_rule_groups_namespace(workspaceId=ws, name=NAMESPACE)


def test_a_workspace_without_a_definition_or_with_a_route_to_nobody_is_refused_in_one_line(
        amp_stack: LocalStack) -> None:
    amp, ws = amp_stack.amp_client(), amp_stack.workspace_id
    ns = AmpRulesNamespace(amp, ws, "alert-delivery")
    original = amp.describe_alert_manager_definition(workspaceId=ws)["alertManagerDefinition"]["data"]
    try:
        # a malformed definition is refused by the control plane, as AMP refuses it
        with pytest.raises(ClientError) as err:
            amp.put_alert_manager_definition(workspaceId=ws, data=b"alertmanager_config: |\n  receivers: []\n")
        assert err.value.response["Error"]["Code"] == "ValidationException"
        assert "has no route" in err.value.response["Error"]["Message"]
        with pytest.raises(ClientError) as err:
            amp.create_alert_manager_definition(workspaceId=ws, data=original)
        assert err.value.response["Error"]["Code"] == "ConflictException"

        amp.put_alert_manager_definition(workspaceId=ws, data=SILENT_ROUTE)
        problem = ns.alert_delivery_problem(moved_alerts())
        assert problem == (f"AMP workspace {ws}: alert PromshiftDeliveryAlways (alertname='PromshiftDeliveryAlways', "
                           "severity='page') pages nobody: the alert manager definition routes it to receiver "
                           "'void', which has no integration")

        amp.delete_alert_manager_definition(workspaceId=ws)
        with pytest.raises(ClientError) as err:
            amp.describe_alert_manager_definition(workspaceId=ws)
        assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"
        problem = ns.alert_delivery_problem(moved_alerts())
        assert problem is not None and "\n" not in problem
        assert problem.startswith(f"AMP workspace {ws} has no alert manager definition: moved alert "
                                  "PromshiftDeliveryAlways would page nobody")
        # and the local Alertmanager routes to no receiver of the workspace's
        assert yaml.safe_load(amp_stack.alertmanager_config_path.read_text())["route"]["receiver"] == \
            NO_DEFINITION_RECEIVER
        # and the workspace's Alertmanager API answers as a workspace without one
        with pytest.raises(AlertmanagerError, match="HTTP 404$"):
            active_alerts(amp_stack.prometheus_endpoint() + "alertmanager", "X", auth=workspace_client(amp_stack).auth)
    finally:
        try:
            amp.create_alert_manager_definition(workspaceId=ws, data=original)
        except ClientError:
            amp.put_alert_manager_definition(workspaceId=ws, data=original)
