from __future__ import annotations

import pytest
import yaml

from promshift.core.render import (
    RenderError,
    add_remote_write,
    remote_write_entry,
    remote_write_names,
    remove_remote_write,
)

BASE = """global:
  scrape_interval: 5s
  external_labels:
    cluster: local
scrape_configs:
- job_name: dcgm
  file_sd_configs:
  - files: [/tmp/t.json]
remote_write:
- name: other-team
  url: http://example.invalid/api/v1/write
"""


def entry(regex: str = "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL") -> dict:
    return remote_write_entry(group_name="gpu-utilization", name_regex=regex, url="http://127.0.0.1:9091/w")


def test_adds_a_new_entry_with_a_keep_filter_and_keeps_the_others() -> None:
    out = yaml.safe_load(add_remote_write(BASE, entry()))
    names = [e["name"] for e in out["remote_write"]]
    assert names == ["other-team", "promshift-gpu-utilization"]
    relabel = out["remote_write"][1]["write_relabel_configs"]
    assert relabel == [{"source_labels": ["__name__"], "regex": "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL",
                        "action": "keep"}]
    assert out["scrape_configs"] == yaml.safe_load(BASE)["scrape_configs"]
    assert out["global"]["external_labels"] == {"cluster": "local"}


def test_same_entry_twice_is_a_no_op_but_editing_a_live_entry_is_refused() -> None:
    once = add_remote_write(BASE, entry())
    assert add_remote_write(once, entry()) == once
    with pytest.raises(RenderError, match="never edits a live entry"):
        add_remote_write(once, entry("DCGM_FI_DEV_GPU_UTIL"))


def test_config_without_remote_write_gets_one_and_remove_restores_shape() -> None:
    base = "global:\n  scrape_interval: 5s\n"
    out = add_remote_write(base, entry())
    assert remote_write_names(out) == ["promshift-gpu-utilization"]
    assert yaml.safe_load(remove_remote_write(out, "promshift-gpu-utilization")) == yaml.safe_load(base)


def test_yaml_special_characters_survive_rendering() -> None:
    regex = 'DCGM_FI_DEV_(SM|MEM)_CLOCK|a"b: c'
    out = yaml.safe_load(add_remote_write(BASE, entry(regex)))
    assert out["remote_write"][1]["write_relabel_configs"][0]["regex"] == regex


def test_bad_yaml_is_a_clear_error() -> None:
    with pytest.raises(RenderError, match="not valid YAML"):
        add_remote_write("global: [unclosed", entry())


def test_an_amp_entry_signs_with_sigv4_and_uses_amps_queue_settings() -> None:
    from promshift.core.render import AMP_QUEUE_CONFIG

    amp = remote_write_entry(group_name="g", name_regex="a|b", url="https://aps/ws/api/v1/remote_write",
                             sigv4={"region": "us-east-1"})
    assert amp["sigv4"] == {"region": "us-east-1"}
    assert amp["queue_config"] == {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500}
    assert amp["queue_config"] == dict(AMP_QUEUE_CONFIG)
    with_role = remote_write_entry(group_name="g", name_regex="a", url="u", queue_config={"capacity": 5000},
                                   sigv4={"region": "eu-west-1", "role_arn": "arn:aws:iam::1:role/r"})
    assert with_role["sigv4"] == {"region": "eu-west-1", "role_arn": "arn:aws:iam::1:role/r"}
    assert with_role["queue_config"] == {"capacity": 5000}  # an explicit queue_config wins
    plain = remote_write_entry(group_name="g", name_regex="a", url="u")
    assert "sigv4" not in plain and "queue_config" not in plain  # a self-hosted target is unchanged
    with pytest.raises(RenderError, match="sigv4 remote_write needs a region"):
        remote_write_entry(group_name="g", name_regex="a", url="u", sigv4={"region": ""})
