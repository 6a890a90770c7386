"""The lab's sync stand-in reads ``prometheus.agentMode`` as kube-prometheus-stack's template does
(``{{- if .Values.prometheus.agentMode }}``: Go template truth of what Helm loaded), not as promshift's editor does."""

from __future__ import annotations

import pytest

from promshift.local.stack.reconciler import wanted_mode


@pytest.mark.parametrize(("values", "mode"), [
    ("prometheus:\n  agentMode: true\n", "agent"),
    ("prometheus:\n  agentMode: false\n", "server"),
    ("prometheus:\n  prometheusSpec: {}\n", "server"),  # the chart's default
    ("grafana: {}\n", "server"),
    ('prometheus:\n  agentMode: "false"\n', "agent"),  # a non-empty string: true for the template
    ("prometheus:\n  agentMode: no\n", "server"),  # YAML 1.1 (Helm's loader): a boolean false
    ("prometheus:\n  agentMode: on\n", "agent"),
    ("prometheus:\n  agentMode: 0\n", "server"),
    ("prometheus:\n  agentMode:\n", "server"),  # null
    ("prometheus:\n  agentMode: {}\n", "server"),  # an empty map is false for the template
])
def test_agent_mode_by_the_charts_own_test(values: str, mode: str) -> None:
    assert wanted_mode("helm-values", values) == mode


def test_only_the_values_shape_has_the_switch() -> None:
    assert wanted_mode("prometheus-yml", "prometheus:\n  agentMode: true\n") == "server"
