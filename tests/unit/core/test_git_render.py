"""The git deploy's file edits: the three shapes, byte for byte, add then remove gives the same bytes."""

from __future__ import annotations

import pytest
import yaml

from promshift.core.git_render import (
    ADDED,
    HELM_VALUES,
    MANIFEST,
    PROMETHEUS_YML,
    GitRenderError,
    add_entry,
    config_entry,
    entries_of,
    entry_names,
    operator_entry,
    remove_entry,
)
from promshift.core.render import remote_write_entry

ENTRY = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_.*",
                           url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write",
                           sigv4={"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/w"})
NAME = "promshift-gpu-memory"

HELM = [
    # the chart's default: an empty flow list
    "prometheus:\n  prometheusSpec:\n    retention: 10d  # keep\n    remoteWrite: []\n  enabled: true\n",
    # a block list with comments and blank lines after it
    "# team values\nprometheus:\n  prometheusSpec:\n    remoteWrite:\n    - url: http://other/rw\n      name: other\n"
    "\n    # trailing comment\n    replicas: 2\n",
    # indented dashes, YAML 1.1 booleans elsewhere
    "alertmanager:\n  enabled: on\nprometheus:\n  prometheusSpec:\n    remoteWrite:\n      - name: other\n"
    "        url: http://x\n",
    # the path missing in part, then entirely; no newline at the end; CRLF; an empty file
    "prometheus:\n  enabled: true",
    "grafana:\n  adminPassword: '010'\n",
    "prometheus:\r\n  prometheusSpec:\r\n    replicas: 1\r\n",
    "",
]
MANIFESTS = [
    "apiVersion: monitoring.coreos.com/v1\nkind: Prometheus\nmetadata:\n  name: k8s\nspec:\n  replicas: 2\n",
    "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: p}\n---\napiVersion: monitoring.coreos.com/v1alpha1\n"
    "kind: PrometheusAgent\nmetadata:\n  name: a\nspec:\n  remoteWrite:\n  - url: http://o\n    name: o\n"
    "---\nkind: Foo\n",
]
PLAIN = ["global:\n  scrape_interval: 15s\nremote_write:\n  - url: http://o\n    name: o\n", "global: {}\n"]


@pytest.mark.parametrize(("shape", "text"), [(HELM_VALUES, t) for t in HELM] + [(MANIFEST, t) for t in MANIFESTS]
                         + [(PROMETHEUS_YML, t) for t in PLAIN])
def test_add_then_remove_gives_the_same_bytes(shape: str, text: str) -> None:
    added = add_entry(shape, text, ENTRY)
    assert added.startswith(text.rstrip("\r\n")[: max(0, len(text) - 40)])  # the head of the file is untouched
    assert entry_names(shape, added)[-1] == NAME
    assert entries_of(shape, added)[-1] == ENTRY  # what a sync renders is our entry, in config spelling
    assert add_entry(shape, added, ENTRY) == added  # a retried deploy changes nothing
    assert remove_entry(shape, added, NAME) == text
    assert remove_entry(shape, add_entry(shape, text.encode(), ENTRY), NAME) == text.encode()
    assert remove_entry(shape, text, NAME) == text  # nothing of ours: a no-op


def test_operator_shapes_use_the_operators_spelling_and_keep_other_bytes() -> None:
    text = HELM[1]
    added = add_entry(HELM_VALUES, text, ENTRY)
    ours = yaml.safe_load(added)["prometheus"]["prometheusSpec"]["remoteWrite"][-1]
    assert ours == operator_entry(ENTRY)
    assert set(ours) == {"name", "url", "writeRelabelConfigs", "sigv4", "queueConfig"}
    assert ours["sigv4"] == {"region": "us-east-1", "roleArn": "arn:aws:iam::123456789012:role/w"}
    assert ours["queueConfig"] == {"maxSamplesPerSend": 1000, "maxShards": 200, "capacity": 2500}
    assert config_entry(ours) == ENTRY
    # Our lines go after the list's last item, before the comment and the next key.
    assert added.startswith(text.split("\n\n    # trailing")[0] + "\n    - name: promshift-gpu-memory\n")
    assert added.endswith("\n\n    # trailing comment\n    replicas: 2\n")


def test_missing_keys_are_marked_and_removed_with_our_entry() -> None:
    added = add_entry(HELM_VALUES, "grafana:\n  enabled: false\n", ENTRY)
    assert added.startswith(f"grafana:\n  enabled: false\nprometheus:  {ADDED}\n  prometheusSpec:  {ADDED}\n"
                            f"    remoteWrite:  {ADDED}\n      - name: {NAME}\n")
    crlf = add_entry(HELM_VALUES, HELM[5], ENTRY)
    assert "\n" not in crlf.replace("\r\n", "")  # the file's own newline style


def test_a_yaml_11_value_elsewhere_is_left_as_it_is() -> None:
    added = add_entry(HELM_VALUES, HELM[2], ENTRY)
    assert "  enabled: on\n" in added  # never rewritten to true
    assert yaml.safe_load(added)["alertmanager"]["enabled"] is True


@pytest.mark.parametrize(("shape", "text", "message"), [
    (HELM_VALUES, "prometheus:\n  prometheusSpec:\n", "prometheus.prometheusSpec is empty"),
    (HELM_VALUES, "prometheus:\n  prometheusSpec: {remoteWrite: []}\n", "must be a block mapping"),
    (HELM_VALUES, "prometheus:\n  prometheusSpec:\n    remoteWrite: nope\n", "must be a list"),
    (HELM_VALUES, "a: 1\n---\nb: 2\n", "one YAML document, found 2"),
    (MANIFEST, "apiVersion: v1\nkind: ConfigMap\n", "exactly one monitoring.coreos.com"),
    (HELM_VALUES, "a: [\n", "not valid YAML"),
    ("kustomize", "", "file shape must be one of helm-values, prometheus-yml, manifest"),
])
def test_bad_files_are_refused_in_one_line(shape: str, text: str, message: str) -> None:
    with pytest.raises(GitRenderError, match=message) as caught:
        add_entry(shape, text, ENTRY)
    assert "\n" not in str(caught.value)


def test_another_entry_of_our_name_is_never_edited() -> None:
    other = dict(ENTRY, url="http://elsewhere/api/v1/write")
    added = add_entry(MANIFEST, MANIFESTS[0], other)
    with pytest.raises(GitRenderError, match="already has a different remote-write entry promshift-gpu-memory"):
        add_entry(MANIFEST, added, ENTRY)
