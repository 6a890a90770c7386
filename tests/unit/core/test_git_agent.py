"""``core.git_agent``: kube-prometheus-stack's ``prometheus.agentMode`` set and unset byte for byte, and every
spelling it cannot read as the chart does refused with nothing returned."""

from __future__ import annotations

import re

import pytest

from promshift.core.git_agent import agent_mode, set_agent_mode
from promshift.core.git_render import GitRenderError

# The key laid out as the chart's values.yaml lays it out: comments around it, a sibling after it.
CHART = """\
## the Prometheus of the release
##
prometheus:
  enabled: true

  ## true: a PrometheusAgent (no rules, queries, alerting)
  ##
  agentMode: false

  ## its annotations
  ##
  annotations: {}
  prometheusSpec:
    retention: 10d   # keep ten days
    remoteWrite: [{"name": "promshift-gpu", "url": "https://aps.example/api/v1/remote_write"}]
"""
TEAM = """\
# the GPU fleet's values
grafana:
  enabled: false
prometheus:
  prometheusSpec:
    scrapeInterval: 5s
    remoteWrite: []
alertmanager:
  enabled: true
"""


def test_false_becomes_true_in_place_and_nothing_else_moves() -> None:
    assert agent_mode(CHART) is False
    on = set_agent_mode(CHART, True)
    assert on == CHART.replace("  agentMode: false\n", "  agentMode: true\n")
    assert agent_mode(on) is True
    assert set_agent_mode(on, True) == on  # a retry: the same text
    assert set_agent_mode(on, False) == CHART  # and back, byte for byte


def test_an_absent_key_is_added_as_prometheus_last_key_marked_and_removed_again() -> None:
    assert agent_mode(TEAM) is None  # the chart's default: a server
    on = set_agent_mode(TEAM, True)
    assert on == TEAM.replace("    remoteWrite: []\n", "    remoteWrite: []\n  agentMode: true  # added by promshift\n")
    assert set_agent_mode(on, True) == on
    assert set_agent_mode(on, False) == TEAM
    assert set_agent_mode(TEAM, False) == TEAM  # absent is already a server


def test_bytes_in_bytes_out_crlf_and_no_final_newline_kept() -> None:
    crlf = TEAM.replace("\n", "\r\n").encode()
    on = set_agent_mode(crlf, True)
    assert isinstance(on, bytes) and b"  agentMode: true  # added by promshift\r\n" in on and b"\n" not in \
        on.replace(b"\r\n", b"")
    assert set_agent_mode(on, False) == crlf
    bare = "prometheus:\n  agentMode: false"
    assert set_agent_mode(bare, True) == "prometheus:\n  agentMode: true"
    assert set_agent_mode("prometheus:\n  prometheusSpec: {}", True) == \
        "prometheus:\n  prometheusSpec: {}\n  agentMode: true  # added by promshift"


def test_a_missing_prometheus_key_and_an_empty_file_get_both_keys_marked() -> None:
    for text in ("grafana:\n  enabled: false\n", ""):
        on = set_agent_mode(text, True)
        assert on == text + "prometheus:  # added by promshift\n  agentMode: true  # added by promshift\n"
        assert agent_mode(on) is True and set_agent_mode(on, False) == text


def test_the_owners_own_true_is_flipped_back_not_removed() -> None:
    owner = CHART.replace("agentMode: false", "agentMode: True")
    assert agent_mode(owner) is True
    assert set_agent_mode(owner, False) == CHART.replace("agentMode: false", "agentMode: False")


@pytest.mark.parametrize(("values", "refusal"), [
    # the chart tests Go template truth: a string "false" is an agent; yes/on/1/null are read differently by
    # YAML 1.1 and 1.2 or not at all; never guessed
    ('prometheus:\n  agentMode: "false"\n', "not a plain true or false"),
    ("prometheus:\n  agentMode: 'true'\n", "not a plain true or false"),
    ("prometheus:\n  agentMode: yes\n", "not a plain true or false"),
    ("prometheus:\n  agentMode: 1\n", "not a plain true or false"),
    ("prometheus:\n  agentMode:\n  x: 1\n", "not a plain true or false"),
    ("prometheus:\n  agentMode: ~\n", "not a plain true or false"),
    ("prometheus:\n  agentMode: !!bool false\n", "not a plain true or false"),
    ("prometheus:\n  agentMode: [false]\n", "not a plain true or false"),
    # anchors and aliases: the bytes are shared with, or live under, another key
    ("prometheus:\n  agentMode: &off false\nthanos:\n  enabled: *off\n", "anchor"),
    ("defaults: &off false\nprometheus:\n  agentMode: *off\n", "anchor"),
    ("prometheus: &p\n  enabled: true\ncopy: *p\n", "anchored or an alias"),
    ("base: &b {enabled: true}\nprometheus:\n  <<: *b\n  x: 1\n", "merge key"),
    # shapes the edit does not touch
    ("prometheus: {enabled: true}\n", "block mapping"),
    ("prometheus:\n", "empty (null)"),
    ("prometheus:\n  enabled: false\n  agentMode: false\n", "renders no Prometheus"),
    ("prometheus:\n  agentMode: false\n---\nprometheus: {}\n", "one YAML document"),
    ("- prometheus\n", "block mapping at the top level"),
    ("prometheus:\n  agentMode: false\n  agentMode: true\n", "set twice"),
])
def test_values_it_cannot_edit_safely_are_refused(values: str, refusal: str) -> None:
    with pytest.raises(GitRenderError, match=re.escape(refusal)):
        set_agent_mode(values, True)
    with pytest.raises(GitRenderError, match=re.escape(refusal)):
        set_agent_mode(values, False)


def test_an_alias_bomb_is_refused_within_the_files_budget() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)) \
        + "prometheus:\n  agentMode: false\n"
    with pytest.raises(GitRenderError):
        set_agent_mode(bomb, True)
