"""`python -m promshift.local stack drift`'s pure parts: parsing FROM=TO and --hosts, the rules, replacing an entry."""

from __future__ import annotations

import pytest
import yaml

from promshift.core.render import RenderError, remote_write_entry, remote_write_names, replace_remote_write
from promshift.local.stack.remote_write import BadInput, LabelRename


@pytest.mark.parametrize("spec,hosts,needle", [
    ("Hostname", ".*", "must be FROM=TO"),
    ("=hostname", ".*", "must be FROM=TO"),
    ("Hostname=", ".*", "must be FROM=TO"),
    ("Hostname=host name", ".*", "'host name' is not a label name"),
    ("__name__=x", ".*", "'__name__' is not a label name promshift may rename"),
    ("Hostname=Hostname", ".*", "renames a label to itself"),
    ("Hostname=hostname", "gpu-(", "--hosts 'gpu-(' is not a valid RE2 regex: missing ): gpu-("),
    ("Hostname=hostname", "(?=x)", "is not a valid RE2 regex"),  # lookahead: Prometheus' RE2 refuses it too
])
def test_bad_rename_or_regex_is_one_clear_line(spec: str, hosts: str, needle: str) -> None:
    with pytest.raises(BadInput) as exc:
        LabelRename.parse(spec, hosts)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_rules_copy_then_drop_only_for_matching_hosts() -> None:
    rename = LabelRename.parse("Hostname=hostname", "gpu-node-000[01]|gpu-node-0009")
    copy, drop = rename.rules("Hostname")
    # The alternation is grouped, so `;(.+)` applies to every alternative.
    assert copy == {"source_labels": ["Hostname", "Hostname"], "separator": ";",
                    "regex": "(?:gpu-node-000[01]|gpu-node-0009);(.+)", "target_label": "hostname",
                    "replacement": "$1", "action": "replace"}
    # An empty replacement deletes the label: Hostname goes, but only where the host matched.
    assert drop["target_label"] == "Hostname" and drop["replacement"] == ""
    assert drop["regex"] == "(?:gpu-node-000[01]|gpu-node-0009);.+"
    other = LabelRename.parse("UUID=uuid", "gpu-node-0003").rules("Hostname")
    assert other[0]["source_labels"] == ["Hostname", "UUID"] and other[1]["target_label"] == "UUID"


def test_replace_remote_write_swaps_one_entry_and_keeps_the_others() -> None:
    base = remote_write_entry(group_name="gpu-memory", name_regex="A|B", url="http://127.0.0.1:1/w")
    text = yaml.safe_dump({"remote_write": [{"name": "other", "url": "http://x/w"}, base,
                                            {"name": "last", "url": "http://y/w"}]})
    edited = dict(base, write_relabel_configs=[*base["write_relabel_configs"], *LabelRename.parse(
        "Hostname=hostname", ".*").rules("Hostname")])
    out = yaml.safe_load(replace_remote_write(text, edited))
    # Remove + add on the byte-preserving editor: the replaced entry moves to the end of the list.
    assert remote_write_names(replace_remote_write(text, edited)) == ["other", "last", "promshift-gpu-memory"]
    assert out["remote_write"][2] == edited
    assert out["remote_write"][:2] == [{"name": "other", "url": "http://x/w"}, {"name": "last", "url": "http://y/w"}]
    with pytest.raises(RenderError, match="no remote_write entry 'promshift-gpu-clocks' to replace"):
        replace_remote_write(text, dict(base, name="promshift-gpu-clocks"))
