"""core.alert_routes: an AMP alert manager definition's route tree, walked as Alertmanager walks it."""

from __future__ import annotations

import pytest

from promshift.core.alert_routes import (
    AlertRoutesError,
    alert_labels,
    alert_route_problem,
    parse_definition,
    parse_matcher,
)

# AMP's documented shape: alertmanager_config is a YAML string inside the definition.
DOCUMENTED = b"""alertmanager_config: |
  route:
    receiver: 'default'
  receivers:
    - name: 'default'
      sns_configs:
      - topic_arn: arn:aws:sns:us-east-2:123456789012:My-Topic
        sigv4:
          region: us-east-2
"""

TREE = b"""template_files:
  default_template: |
    {{ define "sns.default.message" }}{{ .Status }}{{ end }}
alertmanager_config: |
  route:
    receiver: nobody
    routes:
      - matchers: ['severity="critical"']
        receiver: pager
      - match_re:
          alertname: Gpu.*
        receiver: gpu-team
        continue: true
      - match:
          team: storage
        receiver: storage
      - matchers: ['severity=~"warn.*"', 'team!="silent"']
        receiver: warnings
  receivers:
    - name: nobody
    - name: pager
      sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:pager', sigv4: {region: us-east-1}}]
    - name: gpu-team
      sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:gpu', sigv4: {region: us-east-1}}]
    - name: storage
      sns_configs: []
    - name: warnings
      sns_configs: [{topic_arn: 'arn:aws:sns:us-east-1:123456789012:warn', sigv4: {region: us-east-1}}]
"""


def reached(data: bytes, name: str, labels: dict | None = None) -> tuple[str, ...]:
    return parse_definition(data).receivers_for(alert_labels(name, labels))


def test_the_documented_default_route_takes_every_alert() -> None:
    routing = parse_definition(DOCUMENTED)
    assert reached(DOCUMENTED, "Anything", {"severity": "info"}) == ("default",)
    assert alert_route_problem(routing, [("Anything", {"severity": "info"})]) is None


def test_first_matching_child_wins_unless_it_continues() -> None:
    # critical: the first child matches and does not continue
    assert reached(TREE, "GpuMemoryNearlyFull", {"severity": "critical"}) == ("pager",)
    # a Gpu alert: gpu-team continues, then warnings matches too; the root no longer handles it
    assert reached(TREE, "GpuMemoryNearlyFull", {"severity": "warning", "team": "ml"}) == ("gpu-team", "warnings")
    # no child matches: the root's receiver
    assert reached(TREE, "DiskFull", {"severity": "info", "team": "ml"}) == ("nobody",)


def test_an_alert_that_reaches_only_receivers_without_integrations_is_refused_in_one_line() -> None:
    routing = parse_definition(TREE)
    problem = alert_route_problem(routing, [("GpuHot", {"severity": "critical"}),
                                            ("DiskFull", {"severity": "info", "team": "ml"})])
    assert problem is not None and "\n" not in problem
    assert problem.startswith("alert DiskFull (alertname='DiskFull', severity='info', team='ml') pages nobody")
    assert "receiver 'nobody', which has no integration" in problem
    # an empty sns_configs list is no integration either
    assert alert_route_problem(routing, [("BucketFull", {"team": "storage", "severity": "info"})]) is not None


def test_labels_unknown_before_firing_keep_every_possible_route() -> None:
    # team is not set by the rule: the storage and warnings routes may or may not match, nor the root
    assert reached(TREE, "DiskFull", {"severity": "warning"}) == ("storage", "warnings", "nobody")
    assert alert_route_problem(parse_definition(TREE), [("DiskFull", {"severity": "warning"})]) is None
    # a templated value is unknown too
    assert alert_labels("A", {"severity": "{{ $labels.sev }}"}) == {"severity": None, "alertname": "A"}
    assert reached(TREE, "DiskFull", {"severity": "{{ $labels.sev }}", "team": "ml"}) == ("pager", "warnings",
                                                                                         "nobody")


def test_a_child_without_a_receiver_inherits_its_parents() -> None:
    data = b"""alertmanager_config:
  route:
    receiver: ops
    routes:
      - match: {severity: critical}
        routes:
          - match: {team: nobody}
            receiver: void
  receivers:
    - {name: ops, webhook_configs: [{url: 'http://127.0.0.1:1/'}]}
    - {name: void}
"""
    assert reached(data, "X", {"severity": "critical", "team": "ml"}) == ("ops",)
    assert reached(data, "X", {"severity": "critical", "team": "nobody"}) == ("void",)


@pytest.mark.parametrize(("data", "why"), [
    (b"route: {}", "has no alertmanager_config"),
    (b"alertmanager_config: |\n  receivers: []\n", "has no route"),
    (b"alertmanager_config: |\n  route: {routes: []}\n", "root route names no receiver"),
    (b"alertmanager_config: |\n  route: {receiver: a}\n  receivers: [{name: b}]\n", "undefined receivers: a"),
    (b"alertmanager_config: |\n  route: {receiver: a, routes: [{matchers: ['sev ~ x']}]}\n  receivers: [{name: a}]\n",
     "is not 'name=value'"),
    (b"alertmanager_config: |\n  route: {receiver: a, routes: [{match_re: {x: '(('}}]}\n  receivers: [{name: a}]\n",
     "invalid regular expression"),
    (b"alertmanager_config: [unclosed", "not valid YAML"),
    (b"x" * 1_048_577, "over 1048576"),
])
def test_a_bad_definition_is_one_line_naming_what(data: bytes, why: str) -> None:
    with pytest.raises(AlertRoutesError) as err:
        parse_definition(data)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_the_route_tree_has_a_depth_budget() -> None:
    route = "{receiver: a}"
    for _ in range(40):
        route = "{receiver: a, routes: [" + route + "]}"
    with pytest.raises(AlertRoutesError, match="deeper than 32"):
        parse_definition(f"alertmanager_config:\n  route: {route}\n  receivers: [{{name: a}}]\n".encode())


def test_matcher_strings_parse_as_alertmanager_writes_them() -> None:
    assert str(parse_matcher('severity="critical"')) == "severity='critical'"
    assert parse_matcher("severity=~warn.*").value == "warn.*"
    assert parse_matcher('job != "a\\"b"').value == 'a"b'
    m = parse_matcher('alertname=~"Gpu.*"')
    assert m.test({"alertname": "GpuHot"}).value == "yes"
    assert m.test({"alertname": "xGpuHot"}).value == "no"  # anchored, as Alertmanager anchors it
