from __future__ import annotations

import re

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


def test_bytes_in_bytes_out_and_str_in_str_out() -> None:
    crlf = BASE.replace("\n", "\r\n").encode()
    edited = add_remote_write(crlf, entry())
    assert isinstance(edited, bytes) and edited.startswith(crlf)
    assert b"\n" not in edited.replace(b"\r\n", b"")
    assert remove_remote_write(edited, "promshift-gpu-utilization") == crlf
    assert isinstance(add_remote_write(BASE, entry()), str)


def test_config_without_remote_write_round_trips_byte_for_byte() -> None:
    for base in ("global:\n  scrape_interval: 5s\n", "global:\n  scrape_interval: 5s", "", "# only a comment\n"):
        out = add_remote_write(base, entry())
        assert "remote_write:  # added by promshift" in out
        assert remote_write_names(out) == ["promshift-gpu-utilization"]
        assert remove_remote_write(out, "promshift-gpu-utilization") == base


def test_the_added_key_stays_while_another_entry_lives_under_it() -> None:
    base = "global:\n  scrape_interval: 5s\n"
    ours = add_remote_write(base, entry())
    theirs = ours + "  - url: http://other/w\n    name: other\n"
    kept = remove_remote_write(theirs, "promshift-gpu-utilization")
    assert kept == base + "remote_write:  # added by promshift\n  - url: http://other/w\n    name: other\n"
    assert remote_write_names(kept) == ["other"]


def test_an_identical_entry_written_differently_is_still_a_no_op() -> None:
    e = entry()
    hand_written = BASE + (f"- name: {e['name']}\n  url: {e['url']}\n  write_relabel_configs:\n"
                           f"  - source_labels: [__name__]\n    regex: '{e['write_relabel_configs'][0]['regex']}'\n"
                           "    action: keep\n")
    assert add_remote_write(hand_written, e) == hand_written


def test_remove_is_a_no_op_without_the_entry_and_refuses_duplicates() -> None:
    assert remove_remote_write(BASE, "promshift-gpu-utilization") == BASE
    dup = BASE + "- name: dup\n  url: http://a\n- name: dup\n  url: http://b\n"
    with pytest.raises(RenderError, match="2 remote_write entries named 'dup'"):
        remove_remote_write(dup, "dup")


@pytest.mark.parametrize(("url", "line"), [
    ("http://127.0.0.1:9/w\n    bearer_token: x", "contains '\\n'"),
    ("http://127.0.0.1:9/w\u2028x", "contains '\\u2028'"),
    ("file:///etc/passwd", "must start with http:// or https://"),
    ("not a url", "contains ' '"),
    ("https:///api/v1/write", "has no host"),
    ("http://h:port/", "is not a valid URL"),
    ("ftp://user:hunter2@example.com/w", "must start with http:// or https://"),
])
def test_a_remote_write_url_that_prometheus_should_never_get_is_refused(url: str, line: str) -> None:
    entry = remote_write_entry(group_name="g", name_regex="a", url=url)  # a rollback needs only the name
    with pytest.raises(RenderError, match=re.escape(line)) as refused:
        add_remote_write(b"global: {}\n", entry)
    assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)


def test_https_urls_with_ports_paths_and_queries_are_fine() -> None:
    for url in ("https://aps-workspaces.us-east-1.amazonaws.com:443/workspaces/ws-1/api/v1/remote_write",
                "http://127.0.0.1:9/w?x=1#frag", "http://[::1]:9090/api/v1/write"):
        entry = remote_write_entry(group_name="g", name_regex="a", url=url)
        assert remove_remote_write(add_remote_write("global: {}\n", entry), entry["name"]) == "global: {}\n"
