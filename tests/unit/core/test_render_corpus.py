"""Property tests of the remote_write edit: add then remove gives back the original bytes.

Two sources of configs: a corpus of real-world shapes (tests/data/configs/: comments, anchors,
aliases and merge keys, YAML 1.1 scalars, CRLF, tabs in strings, flow style, multi-line
strings, Unicode, no final newline, a BOM, document markers) and a seeded generator that mixes
the same features at random. For every config:

- ``add`` inserts one contiguous chunk and leaves every other byte where it was;
- read by YAML 1.2 (ruamel.yaml) and YAML 1.1 (PyYAML), the result is the original plus our
  entry at the end of ``remote_write``, nothing else;
- ``remove`` after ``add`` gives back the original bytes, and ``add`` twice is a no-op.

tests/integration/test_deploy.py runs the real ``promtool check config`` on the corpus results.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from ruamel.yaml import YAML

from promshift.core.render import RenderError, add_remote_write, remote_write_entry, remove_remote_write

CORPUS = Path(__file__).resolve().parents[2] / "data" / "configs"
CORPUS_FILES = sorted(CORPUS.glob("*.yml"))
NAME = "promshift-gpu-memory"

ENTRIES = {
    "plain": remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED)",
                                url="http://127.0.0.1:9/api/v1/write"),
    "amp": remote_write_entry(group_name="gpu-memory", name_regex="DCGM_FI_DEV_FB_(FREE|USED|RESERVED)",
                              url="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write",
                              sigv4={"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/promshift"}),
    # Values YAML 1.1 would reinterpret if written plain, a tab, a quote, a backslash, non-ASCII.
    "tricky": remote_write_entry(group_name="gpu-memory", name_regex='on|010|1.10|0x1F|a\tb|"q"|back\\slash|Zürich',
                                 url="http://127.0.0.1:9/w?x=1#frag", queue_config={"capacity": 10, "yes": 1}),
}


def load12(data: bytes) -> Any:
    return YAML(typ="safe", pure=True).load(data.decode("utf-8"))


def load11(data: bytes) -> Any:
    return yaml.load(data.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506


def split_entries(doc: Any) -> tuple[dict[str, Any], list[Any]]:
    doc = dict(doc or {})
    return doc, list(doc.pop("remote_write", None) or [])


def insertion(original: bytes, edited: bytes) -> tuple[int, bytes]:
    """Where ``edited`` is ``original`` with one chunk inserted: (offset, chunk); fails otherwise."""
    grown = len(edited) - len(original)
    assert grown > 0, "nothing was inserted"
    prefix = 0
    while prefix < len(original) and original[prefix] == edited[prefix]:
        prefix += 1
    suffix = 0
    while suffix < len(original) and original[-1 - suffix] == edited[-1 - suffix]:
        suffix += 1
    assert prefix + suffix >= len(original), "bytes outside the inserted entry changed"
    assert edited[:prefix] + edited[prefix + grown:] == original
    return prefix, edited[prefix:prefix + grown]


def check_round_trip(original: bytes, entry: dict[str, Any]) -> bytes:
    edited = add_remote_write(original, entry)
    at, chunk = insertion(original, edited)
    # Read both ways, the result is the original plus our entry, nothing else.
    for load in (load12, load11):
        before_rest, before_entries = split_entries(load(original))
        after_rest, after_entries = split_entries(load(edited))
        assert after_rest == before_rest, load.__name__
        assert after_entries == before_entries + [entry], load.__name__
    # The chunk holds our entry in the file's own newline style.
    assert entry["name"].encode() in chunk
    if b"\r\n" in original and b"\n" not in original.replace(b"\r\n", b""):
        assert b"\n" not in edited.replace(b"\r\n", b""), "a bare LF went into a CRLF file"
    if b"\r\n" not in original:
        assert b"\r" not in chunk
    assert add_remote_write(edited, entry) == edited, "adding the same entry again is a no-op"
    assert remove_remote_write(edited, entry["name"]) == original, "remove did not give back the original bytes"
    assert remove_remote_write(original, entry["name"]) == original
    return edited


@pytest.mark.parametrize("kind", sorted(ENTRIES))
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_add_then_remove_gives_back_the_original_bytes(path: Path, kind: str) -> None:
    check_round_trip(path.read_bytes(), ENTRIES[kind])


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_the_pure_path_gives_the_same_edits(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without LibYAML (ruamel.yaml's parser, full-document checks) the corpus round-trips to the same bytes."""
    from promshift.core import render

    data = path.read_bytes()
    fast = add_remote_write(data, ENTRIES["tricky"])
    monkeypatch.setattr(render, "_FAST", False)
    assert check_round_trip(data, ENTRIES["tricky"]) == fast


def shape(node: Any) -> Any:
    if node is None:
        return None
    # ruamel.yaml's round-trip parser marks a folded scalar's folds with \a; the value is otherwise the same.
    value = node.value.replace("\a", "") if node.value else node.value
    return (node.kind, node.start, node.end, value, node.flow, node.empty, node.block, node.close,
            [shape(c) for c in node.children])


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_libyaml_and_ruamel_find_the_same_positions(path: Path) -> None:
    from promshift.core.render import _parse

    text = path.read_bytes().decode("utf-8")
    fast, pure = _parse(text), _parse(text, fast=False)
    assert (shape(fast.root), fast.end, fast.floor) == (shape(pure.root), pure.end, pure.floor)


def test_the_corpus_covers_what_it_claims() -> None:
    data = {p.name: p.read_bytes() for p in CORPUS_FILES}
    assert len(data) >= 25
    joined = b"\0".join(data.values())
    for feature in (b"\r\n", b"\xef\xbb\xbf", b"\t", b"<<: *", b"&", b"*targets", b": on", b"1.10", b"010", b"0x1F",
                    b"remote_write: []", b"remote_write: [", b"|+", b">-", b"\n...\n", "東京".encode(), b"# "):
        assert feature in joined, feature
    assert any(not d.endswith(b"\n") for d in data.values() if d)
    assert any(b"remote_write" not in d for d in data.values())


def test_yaml11_values_keep_their_text_and_comments_stay() -> None:
    original = (CORPUS / "yaml11-scalars.yml").read_bytes()
    edited = add_remote_write(original, ENTRIES["plain"])
    for text in (b"replica: on", b"version: 1.10", b"regex: 010", b"mask: 0x1F", b"enabled: Yes"):
        assert edited.count(text) == original.count(text) == 1
    docs = (CORPUS / "docs-style.yml").read_bytes()
    edited = add_remote_write(docs, ENTRIES["plain"])
    for line in docs.splitlines():
        assert line in edited.splitlines()


def test_our_entry_follows_the_files_indentation() -> None:
    four = add_remote_write((CORPUS / "remote-write-last.yml").read_bytes(), ENTRIES["amp"]).decode()
    assert '\n    - name: "promshift-gpu-memory"\n      url: ' in four
    assert '\n      sigv4:\n        region: "us-east-1"\n' in four
    indentless = add_remote_write((CORPUS / "indentless-4space.yml").read_bytes(), ENTRIES["plain"]).decode()
    assert indentless.endswith('remote_write:  # added by promshift\n- name: "promshift-gpu-memory"\n'
                               '  url: "http://127.0.0.1:9/api/v1/write"\n  write_relabel_configs:\n'
                               '  - source_labels: ["__name__"]\n    regex: "DCGM_FI_DEV_FB_(FREE|USED)"\n'
                               '    action: "keep"\n')
    flow = add_remote_write((CORPUS / "flow-empty.yml").read_bytes(), ENTRIES["plain"]).decode()
    assert 'remote_write: [{name: "promshift-gpu-memory", url: ' in flow


def test_our_entry_goes_before_comments_that_follow_the_list() -> None:
    edited = add_remote_write((CORPUS / "docs-style.yml").read_bytes(), ENTRIES["plain"]).decode()
    assert edited.index(NAME) < edited.index("# ------") < edited.index("scrape_configs:")
    assert edited.index("remote_timeout: 30s") < edited.index(NAME)


REFUSED = {
    "tab-before-comment.yml": "not valid YAML",
    "remote-write-null.yml": "not a list",
    "flow-top-level.yml": "flow-style mapping",
    "remote-write-alias.yml": "alias or has an anchor",
    "two-documents.yml": "more than one YAML document|found another document",
    "latin1.yml": "not valid UTF-8 at byte",
    "block-scalar-at-eof.yml": "ends in a block scalar",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_configs_we_cannot_edit_safely_are_refused_in_one_line(name: str) -> None:
    data = (CORPUS / "refused" / name).read_bytes()
    with pytest.raises(RenderError, match=REFUSED[name]) as excinfo:
        add_remote_write(data, ENTRIES["plain"])
    assert "\n" not in str(excinfo.value)
    assert sorted(p.name for p in (CORPUS / "refused").glob("*.yml")) == sorted(REFUSED)


# -- a seeded generator ---------------------------------------------------------------------------

SCALARS = ["on", "off", "yes", "No", "1.10", "010", "0x1F", "~", "2024-01-01", "'quoted # not a comment'",
           '"tab\there"', '"esc\\tape"', "Zürich", "🔥 hot", "plain words", "1e3", ".5", "-010"]
COMMENTS = ["# note", "# übersicht 🚀", "#", "# tab\tinside a comment", "#: looks like a key", "# - looks like an item"]


def generated(rng: random.Random) -> bytes:
    """One random config mixing the corpus' features (always valid YAML that Python can parse)."""
    seq = rng.choice([0, 2, 4])
    step = rng.choice([2, 4])
    pad, spad = " " * step, " " * seq

    def comment(indent: int = 0) -> list[str]:
        return [" " * indent + rng.choice(COMMENTS)] if rng.random() < 0.3 else []

    labels = [f"{pad * 2}l{i}: {rng.choice(SCALARS)}" for i in range(rng.randint(0, 4))]
    glob = ["global:", *comment(step)]
    if rng.random() < 0.3:  # block scalars never end the document: see refused/block-scalar-at-eof.yml
        glob += [f"{pad}query_log_file: {rng.choice(['>-', '|', '>'])}", f"{pad * 2}/var/log/q.log", ""]
    glob += [f"{pad}scrape_interval: {rng.choice(['15s', '1m'])}"]
    if labels:
        glob += [f"{pad}external_labels:", *labels]
    scrape = ["scrape_configs:"]
    anchored = rng.random() < 0.4
    for j in range(rng.randint(0, 3)):
        if j and anchored and rng.random() < 0.6:  # a merge key and an alias of the first job
            scrape += [f"{spad}- <<: *job0", f"{spad}  job_name: job{j}", f"{spad}  static_configs: *targets0"]
            continue
        head = [f"{spad}- &job0", f"{spad}  job_name: job{j}"] if j == 0 and anchored else [f"{spad}- job_name: job{j}"]
        targets = "&targets0 " if j == 0 else ""
        scrape += [*head, *comment(seq + 2), f"{spad}  static_configs: {targets}[{{targets: ['h{j}:9100']}}]"]
    blocks = [glob, scrape]
    form = rng.choice(["missing", "empty", "flow-empty", "flow", "block", "block", "block"])
    if form == "empty":
        blocks.append(["remote_write:" + rng.choice(["", "  # none yet", " "])])
    elif form == "flow-empty":
        blocks.append(["remote_write: " + rng.choice(["[]", "[ ]", "[] # later"])])
    elif form == "flow":
        blocks.append(["remote_write: [{url: 'http://a/w', name: a}" + rng.choice(["]", ", ]", "]  # c"])])
    elif form == "block":
        rw = ["remote_write:", *comment(seq)]
        for k in range(rng.randint(1, 3)):
            rw += [f"{spad}- url: http://w{k}.example/api/v1/write"]
            if rng.random() < 0.3:
                rw += [f"{spad}  headers:", f"{spad}  {pad}X-Note: {rng.choice(['|', '|+', '|-', '>'])}",
                       f"{spad}  {pad * 2}text", ""]
            rw += [f"{spad}  name: w{k}", *comment(seq + 2)]
        rw += comment(rng.choice([0, seq, seq + 2]))
        blocks.append(rw)
    rng.shuffle(blocks)
    lines: list[str] = []
    for block in blocks:
        lines += block + ([""] if rng.random() < 0.3 else []) + comment()
    if rng.random() < 0.2:
        lines = ["---", *lines]
    if rng.random() < 0.2:
        lines += ["..."]
    newline = rng.choice(["\n", "\r\n"])
    text = newline.join(lines) + newline
    if rng.random() < 0.25:
        text = text.rstrip("\r\n")
    if rng.random() < 0.15:
        text = "\ufeff" + text
    return text.encode("utf-8")


SEEDS = 150


@pytest.mark.parametrize("seed", range(SEEDS))
def test_generated_configs_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    original = generated(rng)
    check_round_trip(original, ENTRIES[rng.choice(sorted(ENTRIES))])


def test_the_generator_covers_every_shape() -> None:
    configs = [generated(random.Random(seed)) for seed in range(SEEDS)]
    assert sum(b"\r\n" in c for c in configs) > 25
    assert sum(c.startswith(b"\xef\xbb\xbf") for c in configs) > 5
    assert sum(not c.endswith(b"\n") for c in configs) > 15
    assert sum(b"remote_write" not in c for c in configs) > 10
    assert sum(b"remote_write: [" in c for c in configs) > 20
    assert sum(b"|+" in c for c in configs) > 3
    assert sum(b"<<: *job0" in c for c in configs) > 10
