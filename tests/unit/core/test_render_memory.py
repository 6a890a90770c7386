"""Render's memory: an edit keeps only the nodes it needs and streams its proof (issue 38 item 5).

``_parse(text, keep=KEY)`` must find the same positions and style as the whole tree, an alias in
``remote_write`` must still read the anchor it names elsewhere, and an edit's peak allocation must stay a
few times the file's size (the bench, ``bench/render_scale``, records RSS up to 32 MiB).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from promshift.core.render import (
    KEY,
    WHOLE_DOCUMENT_MAX,
    RenderError,
    add_remote_write,
    remote_write_entries,
    remote_write_entry,
    remote_write_names,
    remove_remote_write,
)
from promshift.core.render_yaml import _column, _Doc, _Node, _parse
from promshift.core.render_yaml import _walk as walk

CORPUS = Path(__file__).resolve().parents[2] / "data" / "configs"
CORPUS_FILES = sorted(p for p in CORPUS.glob("*.yml"))
ENTRY = remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                           url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write",
                           sigv4={"region": "us-east-1"})


def walked_style(doc: _Doc) -> tuple[int | None, int | None, bool]:
    """The file's list and mapping indents and whether the last node is a block scalar, by walking the whole
    tree (what render did before it summarised while parsing)."""
    seq_offset = map_step = None
    for parent in walk(doc.root):
        if parent.kind != "map" or parent.flow:
            continue
        for key, value in zip(parent.children[::2], parent.children[1::2], strict=True):
            if value.flow or value.kind not in ("map", "seq") or not value.children:
                continue
            col = _column(doc, value.start if value.kind == "seq" else value.children[0].start)
            offset = col - _column(doc, key.start)
            if value.kind == "seq" and seq_offset is None and offset >= 0:
                seq_offset = offset
            elif value.kind == "map" and map_step is None and offset > 0:
                map_step = offset
    nodes = list(walk(doc.root))
    last = max(nodes, key=lambda n: (n.end, n.kind == "scalar")) if nodes else None
    return seq_offset, map_step, bool(last and last.block)


def shape(node: _Node | None) -> Any:
    if node is None:
        return None
    return (node.kind, node.start, node.end, node.value, node.flow, node.empty, node.block, node.close,
            node.first, node.last, [shape(c) for c in node.children])


def top_pairs(doc: _Doc) -> list[tuple[_Node, _Node]]:
    assert doc.root is not None
    return list(zip(doc.root.children[::2], doc.root.children[1::2], strict=True))


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "ruamel"])
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_keeping_only_remote_write_finds_what_the_whole_tree_finds(path: Path, fast: bool) -> None:
    text = path.read_bytes().decode("utf-8")
    whole, kept = _parse(text, fast=fast), _parse(text, keep=KEY, fast=fast)
    assert (kept.end, kept.floor, kept.fast, kept.exotic) == (whole.end, whole.floor, whole.fast, whole.exotic)
    assert (kept.seq_offset, kept.map_step, kept.last_block) == walked_style(whole)
    assert (whole.seq_offset, whole.map_step, whole.last_block) == walked_style(whole)
    if whole.root is None or whole.root.kind != "map":
        assert (kept.root is None) == (whole.root is None)
        assert kept.root is None or (kept.root.kind, kept.root.start, kept.root.end) == \
            (whole.root.kind, whole.root.start, whole.root.end)
        return
    assert kept.root is not None
    assert (kept.root.start, kept.root.end, kept.root.first, kept.root.last) == \
        (whole.root.start, whole.root.end, whole.root.first, whole.root.last)
    pairs = top_pairs(whole)
    assert kept.pairs == whole.pairs == len(pairs)
    wanted = [(k, v) for i, (k, v) in enumerate(pairs) if i == 0 or (k.kind == "scalar" and k.value in (KEY, "<<"))]
    got = top_pairs(kept)
    assert [shape(k) for k, _ in got] == [shape(k) for k, _ in wanted]
    for (key, value), (_, whole_value) in zip(got, wanted, strict=True):
        if key.value == KEY:
            assert shape(value) == shape(whole_value)  # remote_write's value: whole
        else:
            assert (value.kind, value.start, value.end, value.first, value.last) == \
                (whole_value.kind, whole_value.start, whole_value.end, whole_value.first, whole_value.last)
            assert value.kind in ("scalar", "alias") or not value.children or not value.kept


ALIASED = """global: {scrape_interval: 30s}
auth: &auth
  username: promshift
  password_file: /etc/prometheus/pw
headers: &h {X-Scope-OrgID: fleet}
scrape_configs:
  - job_name: node
    static_configs: [{targets: ["127.0.0.1:9100"]}]
remote_write:
  - url: http://thanos-receive:19291/api/v1/receive
    name: thanos
    basic_auth: *auth
    headers: *h
"""


def test_an_alias_in_remote_write_still_reads_its_anchor_elsewhere() -> None:
    doc = _parse(ALIASED, keep=KEY)
    (_, first), (_, rw) = top_pairs(doc)
    assert not first.kept  # global's children were not kept...
    aliases = [n for n in walk(rw) if n.kind == "alias"]
    assert [a.value for a in aliases] == ["auth", "h"]
    assert all(a.target is not None and a.target.kept and a.target.children for a in aliases)  # ...these were
    assert remote_write_entries(ALIASED)[0]["basic_auth"] == {"username": "promshift",
                                                               "password_file": "/etc/prometheus/pw"}
    added = add_remote_write(ALIASED.encode(), ENTRY)
    assert added.startswith(ALIASED.encode()) and remote_write_entries(added)[1] == ENTRY
    assert remove_remote_write(added, ENTRY["name"]) == ALIASED.encode()


def job(index: int) -> str:
    return (f"  - job_name: job-{index:06d}\n    scrape_interval: 30s\n    kubernetes_sd_configs:\n"
            f"      - role: endpoints\n        namespaces: {{names: [team-{index:06d}]}}\n"
            f"    relabel_configs:\n      - source_labels: [__meta_kubernetes_service_name]\n"
            f"        regex: app-{index:06d}\n        action: keep\n"
            f"      - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}\n")


def large_config(size: int) -> bytes:
    head = "global:\n  scrape_interval: 30s\nremote_write:\n  - url: http://thanos:19291/api/v1/receive\n" \
           "    name: thanos\nscrape_configs:\n"
    parts, total, index = [head], len(head), 0
    while total < size:
        parts.append(job(index))
        total += len(parts[-1])
        index += 1
    return "".join(parts).encode()


def test_an_edit_of_a_large_config_allocates_a_few_times_its_size() -> None:
    """Before, adding an entry to 2 MB allocated about 94x the file (a node per event and two lists of every
    event); now a few copies of the text. Python's own allocations, traced: 10x is the budget."""
    data = large_config(400_000)
    add_remote_write(b"global: {}\n", ENTRY)  # the schemas and regexes every edit shares, built once
    tracemalloc.start()
    try:
        added = add_remote_write(data, ENTRY)
        _, add_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        removed = remove_remote_write(added, ENTRY["name"])
        _, remove_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert removed == data
    assert add_peak < 10 * len(data), f"add peaked at {add_peak / len(data):.1f}x the file"
    assert remove_peak < 10 * len(data), f"remove peaked at {remove_peak / len(data):.1f}x the file"


def test_reading_the_entries_of_a_large_config_allocates_a_few_times_its_size() -> None:
    data = large_config(400_000)
    remote_write_names(b"global: {}\n")
    tracemalloc.start()
    try:
        names = remote_write_names(data)
        entries = remote_write_entries(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert names == ["thanos"] and entries == [{"url": "http://thanos:19291/api/v1/receive", "name": "thanos"}]
    assert peak < 10 * len(data), f"reading the entries peaked at {peak / len(data):.1f}x the file"


def test_a_large_config_that_must_be_read_whole_is_refused_with_one_line() -> None:
    """Tags other than YAML's own, or a top-level merge key, need the whole-document path (a tree of the file,
    about a hundred times its size): above WHOLE_DOCUMENT_MAX that is one line, nothing built."""
    data = large_config(WHOLE_DOCUMENT_MAX + 100_000)
    tagged = data.replace(b"global:\n", b"built: !!timestamp 2001-12-14\nglobal:\n", 1)
    line = (r"^source config is 2\.\d MiB and it has tags other than YAML's standard ones: promshift reads such a "
            r"file whole only up to 2 MiB; edit it by hand$")
    with pytest.raises(RenderError, match=line):
        add_remote_write(tagged, ENTRY)
    merged = b"base: &b {x: 1}\n<<: *b\n" + data
    for edit in (lambda: add_remote_write(merged, ENTRY), lambda: remove_remote_write(merged, "thanos"),
                 lambda: remote_write_names(merged)):
        with pytest.raises(RenderError, match=r"and merges keys into its top level \(<<\)"):
            edit()
    # under the line: checked whole
    small = large_config(20_000).replace(b"global:\n", b"built: !!timestamp 2001-12-14\nglobal:\n", 1)
    assert remove_remote_write(add_remote_write(small, ENTRY), ENTRY["name"]) == small
