"""The input budgets (core/inputs.py) and the bounded file reader (adapters/files.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from promshift.adapters.files import read_user_file, read_user_text
from promshift.core.inputs import (
    CATALOG,
    CONFIG,
    InputBudget,
    InputRefused,
    YamlBudgetCounter,
    check_size,
    check_yaml_events,
    decode_utf8,
    json_depth,
    parse_json_bounded,
    parse_yaml_bounded,
)

SMALL = InputBudget("test input", max_bytes=1_000, max_depth=4, max_alias_nodes=20, max_scalar_chars=10)


def bomb(levels: int, width: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


# -- size, encoding ----------------------------------------------------------------------------------


def test_size_is_counted_in_utf8_bytes() -> None:
    check_size("é" * 500, SMALL)  # 1,000 bytes: at the limit
    with pytest.raises(InputRefused, match="test input is 1,002 bytes, more than the 1,000 allowed"):
        check_size("é" * 501, SMALL)
    with pytest.raises(InputRefused, match="1,001 bytes"):
        check_size(b"x" * 1_001, SMALL)


def test_not_utf8_names_the_first_bad_byte() -> None:
    assert decode_utf8("\ufeffZürich".encode()) == "\ufeffZürich"  # a BOM stays
    with pytest.raises(InputRefused, match=r"source config is not valid UTF-8 at byte 1 \(b'\\xfc'\)"):
        decode_utf8("Zürich".encode("latin-1"), "source config")


# -- YAML: depth, aliases, scalar length -------------------------------------------------------------


def test_an_alias_bomb_is_refused_at_the_alias_that_crosses_the_budget_in_no_time_and_memory() -> None:
    text = bomb(9)  # 9^9 = 387 million strings if expanded
    tracemalloc.start()
    started = time.process_time()
    bomb_line = r"aliases expand to more than 100,000 values \(an alias bomb\?\).*\(line 6, column 10\)"
    with pytest.raises(InputRefused, match=bomb_line):
        parse_yaml_bounded(text, CONFIG)
    cpu = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert cpu < 0.5 and peak < 5_000_000


def test_honest_aliases_are_legal_and_cost_what_writing_them_out_costs() -> None:
    counter = YamlBudgetCounter(SMALL)
    # A 3-node anchor used 6 times: 18 nodes, under the budget of 20; the seventh use crosses it.
    text = "a: &a [1, 2]\n" + "".join(f"b{i}: *a\n" for i in range(7))
    events = list(yaml.parse(text))
    with pytest.raises(InputRefused, match="more than 20 values"):
        for event in events:
            counter.feed(event)
    assert counter.alias_nodes == 21
    ok = "a: &a [1, 2]\n" + "".join(f"b{i}: *a\n" for i in range(6))
    assert parse_yaml_bounded(ok, dataclasses.replace(SMALL, max_scalar_chars=100))["b5"] == [1, 2]


def test_merge_keys_count_like_any_alias() -> None:
    text = "base: &base {x: 1, y: 2}\n" + "".join(f"j{i}: {{<<: *base, z: {i}}}\n" for i in range(10))
    assert parse_yaml_bounded(text, CONFIG)["j9"] == {"x": 1, "y": 2, "z": 9}
    with pytest.raises(InputRefused, match="alias bomb"):
        parse_yaml_bounded(text, dataclasses.replace(CONFIG, max_alias_nodes=20))


def test_depth_scalar_length_self_reference_and_undefined_aliases() -> None:
    check_yaml_events(yaml.parse("a: {b: {c: 1}}"), SMALL)
    with pytest.raises(InputRefused, match=r"test input: nesting deeper than 4 levels \(line 1, column 13\)"):
        check_yaml_events(yaml.parse("a: {b: {c: {d: [1]}}}"), SMALL)
    with pytest.raises(InputRefused, match="a value of 11 characters"):
        check_yaml_events(yaml.parse("a: 01234567890"), SMALL)
    with pytest.raises(InputRefused, match=r"alias \*a refers to a value that contains it"):
        check_yaml_events(yaml.parse("a: &a [1, *a]"), SMALL)
    with pytest.raises(InputRefused, match=r"found undefined alias \*nope"):
        check_yaml_events(yaml.parse("a: *nope"), SMALL)


def test_parse_yaml_bounded_is_one_line_and_yaml_1_1() -> None:
    assert parse_yaml_bounded(b"a: on\nb: 010\n", CONFIG) == {"a": True, "b": 8}  # as go-yaml v2 reads them
    with pytest.raises(InputRefused) as bad:
        parse_yaml_bounded("a: [1, 2\nb: 3\n", CONFIG)
    assert "\n" not in str(bad.value) and str(bad.value).startswith("source config is not valid YAML: ")
    with pytest.raises(InputRefused, match="nesting deeper than 64 levels"):
        parse_yaml_bounded("a: " + "[" * 500 + "]" * 500, CONFIG)


def test_the_catalog_loader_uses_the_same_counter() -> None:
    from promshift.core.catalog.loader import MAX_ALIAS_NODES, load_yaml

    assert MAX_ALIAS_NODES == CATALOG.max_alias_nodes
    with pytest.raises(ValueError, match=r"invalid YAML: aliases expand to more than 10,000 .*\(line 5, column 10\)"):
        load_yaml(bomb(6))


# -- JSON ------------------------------------------------------------------------------------------


def test_json_depth_and_size() -> None:
    assert json_depth({"a": [1, {"b": []}]}) == 4 and json_depth(5) == 0
    budget = InputBudget("dashboard", max_bytes=100_000, max_depth=10)
    assert parse_json_bounded(b'\xef\xbb\xbf{"a": [1]}', budget) == {"a": [1]}
    with pytest.raises(InputRefused, match="dashboard: nesting deeper than 10 levels"):
        parse_json_bounded("[" * 11 + "]" * 11, budget)
    with pytest.raises(InputRefused, match="dashboard: nesting deeper than 10 levels"):
        parse_json_bounded("[" * 50_000 + "]" * 50_000, budget)  # past Python's own recursion limit
    with pytest.raises(InputRefused, match="dashboard is not valid JSON"):
        parse_json_bounded("{", budget)


# -- files -----------------------------------------------------------------------------------------


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_bytes(b"global: {}\r\n")
    assert read_user_file(path, SMALL) == b"global: {}\r\n"
    link = tmp_path / "link.yml"
    link.symlink_to(path)
    assert read_user_text(link, SMALL) == "global: {}\r\n"  # a CRLF stays


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),
    (lambda p: p.mkdir(), "a directory"),
])
def test_anything_but_a_regular_file_is_one_line_at_once(tmp_path: Path, make: object, kind: str) -> None:
    path = tmp_path / "config.yml"
    make(path)  # type: ignore[operator]
    started = time.monotonic()
    line = f"cannot read test input {path}: it is {kind}, not a regular file"
    with pytest.raises(InputRefused, match=re.escape(line)):
        read_user_file(path, SMALL)
    assert time.monotonic() - started < 1  # a FIFO with no writer does not block the open


def test_dev_zero_is_refused_before_a_byte_is_read() -> None:
    with pytest.raises(InputRefused, match="/dev/zero: it is a character device, not a regular file"):
        read_user_file("/dev/zero", CONFIG)


def test_too_big_missing_and_not_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_bytes(b"x" * 1_001)
    with pytest.raises(InputRefused, match="1,001 bytes, more than the 1,000 allowed"):
        read_user_file(big, SMALL)
    with pytest.raises(InputRefused, match="No such file or directory"):
        read_user_file(tmp_path / "missing.yml", SMALL)
    latin = tmp_path / "latin.yml"
    latin.write_bytes("a: Zürich\n".encode("latin-1"))
    with pytest.raises(InputRefused, match=f"test input {latin} is not valid UTF-8 at byte 4"):
        read_user_text(latin, SMALL)
