"""The catalog bad-input corpus (tests/data/bad_catalogs.yaml): every case a clear one-line error, fast.

Each case goes through ``settings.check_catalog_file`` (what the DAG file and ``promshift catalog
check`` use) from a real file, and must: raise nothing, finish within 2 s of CPU, report only
one-line problems that never quote a huge value, contain the expected text, and never be
accepted silently. A bad group must not take the other groups down with it.
"""

from __future__ import annotations

import re
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import re2
import yaml

from promshift.adapters.settings import check_catalog_file
from promshift.core.catalog import CatalogCheck, CatalogError, parse_catalog
from promshift.core.catalog.fields import _Invalid, _metric_regex

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "data" / "bad_catalogs.yaml"
SHIPPED = REPO / "catalog" / "metric_groups.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text())
CPU_BUDGET_S = 2.0
MAX_PROBLEM_CHARS = 600
REPEAT = re.compile(r"<<(.+?)\*(\d+)>>", re.DOTALL)


def expand(value: Any) -> Any:
    """Replace ``<<S*N>>`` with S repeated N times, in strings and mapping keys."""
    if isinstance(value, str):
        return REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), value)
    if isinstance(value, list):
        return [expand(item) for item in value]
    if isinstance(value, dict):
        return {expand(key): expand(item) for key, item in value.items()}
    return value


def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """Mappings merge key by key (as the catalog's layers do), anything else replaces."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def catalog_text(case: dict[str, Any]) -> str:
    if "text" in case:
        return str(expand(case["text"]))
    doc = yaml.safe_load(SHIPPED.read_text())
    if "group" in case:
        victim = next(g for g in doc["groups"] if g["name"] == case.get("victim", "gpu-memory"))
        merge(victim, expand(case["group"]))
    if "defaults" in case:
        merge(doc["defaults"], expand(case["defaults"]))
    if "profile" in case:
        merge(doc["profiles"]["demo"], expand(case["profile"]))
    if "top" in case:  # top-level keys (``waves:``)
        merge(doc, expand(case["top"]))
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10_000)


def catalog_path(case: dict[str, Any], tmp_path: Path) -> Path:
    """Write the case's catalog (or set up its file-level situation); return the path to check."""
    path = tmp_path / "metric_groups.yaml"
    situation = case.get("file")
    if situation is None:
        path.write_text(catalog_text(case), encoding="utf-8")
    elif situation == "missing":
        path = tmp_path / "no-such-catalog.yaml"
    elif situation == "directory":
        path.mkdir()
    elif situation == "not-utf8":
        path.write_bytes(SHIPPED.read_bytes().replace(b"gpu-memory", b"gpu-m\xe9mory", 1))
    elif situation == "empty":
        path.write_bytes(b"")
    elif situation == "nul-in-path":
        path = tmp_path / "metric\0groups.yaml"
    elif situation == "big-50mb":
        path.write_text(SHIPPED.read_text() + "# " + "0123456789" * 5_242_880 + "\n", encoding="utf-8")
    elif situation == "symlink-dashboard":
        # The shipped defaults read dashboards/dcgm-exporter-dashboard.json: make it a link out.
        path.write_text(SHIPPED.read_text(), encoding="utf-8")
        (tmp_path / "dashboards").mkdir()
        (tmp_path / "dashboards" / "dcgm-exporter-dashboard.json").symlink_to("/etc/passwd")
    else:
        raise AssertionError(f"unknown file situation {situation!r}")
    return path


def test_the_corpus_is_big_and_covers_every_class() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    errors = [case for case in CASES if case.get("expect", "error") == "error"]
    assert len(errors) >= 60
    classes = {case["covers"] for case in CASES}
    table = (REPO / "docs" / "catalog.md").read_text()
    for name in classes:
        assert f"`{name}`" in table, f"class {name} is missing from docs/catalog.md's corpus table"
    for case in CASES:
        assert case.get("expect", "error") in ("error", "accepted"), case["id"]
        assert case.get("expect", "error") == "accepted" or case.get("contains"), case["id"]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_bad_input(case: dict[str, Any], tmp_path: Path) -> None:
    path = catalog_path(case, tmp_path)
    started = time.process_time()
    try:
        result: CatalogCheck = check_catalog_file(path)
    except BaseException:  # noqa: BLE001 - the point: nothing may escape as a traceback
        pytest.fail(f"{case['id']}: raised instead of reporting:\n{traceback.format_exc()}")
    cpu_s = time.process_time() - started
    assert cpu_s < CPU_BUDGET_S, f"{case['id']}: {cpu_s:.2f}s of CPU"

    for problem in result.problems:
        assert "\n" not in problem, problem
        assert len(problem) <= MAX_PROBLEM_CHARS, f"{len(problem)} characters: {problem[:200]}..."
        assert "Traceback" not in problem

    if case.get("expect", "error") == "accepted":
        assert result.problems == (), result.problems
        assert result.catalog.groups
        return

    assert result.problems, f"{case['id']}: accepted silently"
    assert not result.ok
    assert any(case["contains"] in problem for problem in result.problems), result.problems
    if "file" not in case and "text" not in case:
        # The same text through parse_catalog: a CatalogError, never anything else.
        with pytest.raises(CatalogError):
            parse_catalog(path.read_text(encoding="utf-8"))
    if "group" in case and case.get("scope", "group") == "group":
        victim = case.get("victim", "gpu-memory")
        others = {"gpu-utilization", "gpu-memory", "gpu-power-thermal", "gpu-clocks"} - {victim}
        assert set(result.catalog.names()) == others, "one bad group must leave the others their DAGs"
        assert result.catalog_problems == ()


# --------------------------------------------------------------------------- C++ RE2 vs Go, checked by promtool

# (pattern, whether Go's regexp accepts it inside Prometheus' ^(?:...)$). Every "False" one is
# accepted by google-re2 (C++ RE2) on its own: these are exactly the differences we must catch.
GO_DIFFERENCES = [
    (r"DCGM_\C", False),
    (r"DCGM_(?<domain>SM|MEM)", False),
    (r"DCGM_(?P<domäne>SM|MEM)", False),
    (r"DCGM_\p{Kawi}", False),
    (r"DCGM_\p{Vithkuqi}", False),
    (r"DCGM_|\QX", False),
    ("(" * 1001 + "DCGM" + ")" * 1001, False),
    (r"DCGM_(?P<domain>SM|MEM)", True),
    (r"DCGM_\Q.\E", True),
    (r"DCGM_\pN", True),
    (r"DCGM_\PL", True),
    (r"DCGM_\p{Greek}", True),
    (r"(?U)DCGM_.+", True),
    (r"(?i)dcgm_[[:alpha:]]+", True),
    ("(?:" * 1001 + "DCGM" + ")" * 1001, True),
]


def promtool_accepts(pattern: str, tmp_path: Path) -> bool:
    config = {"scrape_configs": [{"job_name": "j", "static_configs": [{"targets": ["127.0.0.1:9"]}],
                                  "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": pattern,
                                                              "action": "keep"}]}]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(["promtool", "check", "config", str(path)], capture_output=True).returncode == 0


def ours_accepts(pattern: str) -> bool:
    try:
        _metric_regex(pattern)
    except _Invalid:
        return False
    return True


@pytest.mark.parametrize(("pattern", "go_accepts"), GO_DIFFERENCES,
                         ids=[p[:40] if len(p) < 100 else f"nesting-{p[:3]}" for p, _ in GO_DIFFERENCES])
@pytest.mark.integration  # starts a process
def test_go_regexp_differences_match_promtool(pattern: str, go_accepts: bool, tmp_path: Path) -> None:
    """Debian's promtool 2.42 compiles relabel regexes with Go's regexp: our verdict must be its verdict."""
    options = re2.Options()
    options.log_errors = False
    re2.compile(pattern, options)  # C++ RE2 accepts every one of them
    assert promtool_accepts(pattern, tmp_path) is go_accepts
    assert ours_accepts(pattern) is go_accepts


# --------------------------------------------------------------------------- the same, through the CLI


@pytest.mark.parametrize("case_id", ["file-missing", "file-is-a-directory", "file-not-utf8", "file-nul-in-path",
                                     "file-50-mb", "unclosed-flow-sequence", "alias-bomb-9-levels",
                                     "flow-nesting-5000-deep", "top-level-list"])
def test_catalog_check_cli_says_one_line_for_an_unreadable_catalog(
        case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from promshift.cli import main

    case = next(case for case in CASES if case["id"] == case_id)
    path = catalog_path(case, tmp_path)
    code = main(["catalog", "check", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (64, "")
    assert err.count("\n") == 1 and err.startswith(f"promshift: cannot read catalog {path}: ")
    assert case["contains"] in err and len(err) < 400


@pytest.mark.parametrize("case_id", ["approval-timeout-10-million-years", "regex-backslash-C", "match-all-dot-star",
                                     "approver-is-the-only-owner", "dashboard-symlink-escape"])
def test_catalog_check_cli_lists_problems_one_per_line(
        case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from promshift.cli import main

    case = next(case for case in CASES if case["id"] == case_id)
    path = catalog_path(case, tmp_path)
    code = main(["catalog", "check", str(path)])
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert code == 1 and lines[0] == f"{path}: {len(lines) - 1} problem{'s' if len(lines) > 2 else ''}"
    assert all(line.startswith("  - ") for line in lines[1:])
    assert any(case["contains"] in line for line in lines[1:])
