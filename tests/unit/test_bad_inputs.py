"""The bad-input corpus (tests/data/bad_inputs.yaml): every reader of user or server input, one harness.

Each row names a surface (a runner below) and an input. A refused row must give exactly one line that
contains the row's fragment, never a traceback, within the row's time budget (and memory, when it names
one); an accepted row must go through. To cover a new reader, add a runner to SURFACES and rows to the
corpus.
"""

from __future__ import annotations

import os
import re
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "bad_inputs.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))
REPEAT = re.compile(r"<<(.+?)\*(\d+)>>", re.DOTALL)
DEFAULT_SECONDS = 2.0
MAX_LINE_CHARS = 600


@dataclass
class Outcome:
    """What the user saw: ``refused`` and the lines of the refusal (or of the output when accepted)."""

    refused: bool
    lines: list[str]


def expand(value: Any) -> Any:
    """Replace ``<<S*N>>`` with S repeated N times, in strings and mapping keys."""
    if isinstance(value, str):
        return REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), value)
    if isinstance(value, list):
        return [expand(item) for item in value]
    if isinstance(value, dict):
        return {expand(key): expand(item) for key, item in value.items()}
    return value


def input_path(case: dict[str, Any], tmp_path: Path, name: str = "input.yml") -> Path:
    """The file a file-reading surface reads: ``text`` written in ``encoding``, or a special path (``file``)."""
    given = case["input"]
    situation = given.get("file")
    if situation is None:
        path = tmp_path / name
        path.write_bytes(str(expand(given["text"])).encode(given.get("encoding", "utf-8")))
        return path
    if situation == "missing":
        return tmp_path / f"no-such-{name}"
    if situation == "directory":
        path = tmp_path / name
        path.mkdir()
        return path
    if situation == "fifo":
        path = tmp_path / name
        os.mkfifo(path)
        return path
    if situation == "dev-zero":
        return Path("/dev/zero")
    raise AssertionError(f"{case['id']}: unknown file situation {situation!r}")


# --------------------------------------------------------------------------- the surfaces

Runner = Callable[[dict[str, Any], Path, pytest.CaptureFixture[str]], Outcome]
SURFACES: dict[str, Runner] = {}


def surface(name: str) -> Callable[[Runner], Runner]:
    def register(runner: Runner) -> Runner:
        SURFACES[name] = runner
        return runner

    return register


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``promshift ARGV`` in this process: refused when the exit code is not 0; the lines are stderr's."""
    from promshift.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return Outcome(code != 0, err.splitlines() if code != 0 else out.splitlines())


@surface("render-cli")
def render_cli(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``promshift render gpu-memory --config FILE``; input keys: the file's, plus ``target_url``."""
    argv = ["render", "gpu-memory", "--config", str(input_path(case, tmp_path))]
    if "target_url" in case["input"]:
        argv += ["--target-url", str(expand(case["input"]["target_url"]))]
    outcome = cli(argv, capsys)
    if not outcome.refused:
        return outcome
    # The placeholder notice is not the refusal.
    outcome.lines = [line for line in outcome.lines if "no --target-url" not in line]
    return outcome


# --------------------------------------------------------------------------- the harness


def test_the_corpus_is_well_formed() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in CASES:
        assert case["surface"] in SURFACES, f"{case['id']}: no runner for surface {case['surface']!r}"
        assert case.get("expect", "refused") in ("refused", "accepted"), case["id"]
        assert case.get("expect", "refused") == "accepted" or case.get("contains"), case["id"]
        assert isinstance(case.get("input"), dict), case["id"]


class _PeakMemory:
    """Peak Python allocations while a case runs (only when the row asks: tracing slows everything)."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.peak_mb = 0.0

    def __enter__(self) -> _PeakMemory:
        if self.wanted:
            tracemalloc.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.wanted:
            self.peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_bad_input(case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    runner = SURFACES[case["surface"]]
    budget_s = float(case.get("seconds", DEFAULT_SECONDS))
    outcome: list[Outcome] = []
    failure: list[str] = []

    def run() -> None:
        try:
            outcome.append(runner(case, tmp_path, capsys))
        except BaseException:  # noqa: BLE001 - the point: nothing may escape as a traceback
            failure.append(traceback.format_exc())

    with _PeakMemory("max_mb" in case) as memory:
        started = time.monotonic()
        # In a thread, so a reader that hangs (a FIFO with no writer) fails the case instead of the run.
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(budget_s * 5 + 5)
        elapsed = time.monotonic() - started
    assert not worker.is_alive(), f"{case['id']}: still running after {elapsed:.0f}s (hangs?)"
    assert not failure, f"{case['id']}: raised instead of refusing:\n{failure[0]}"
    assert elapsed <= budget_s, f"{case['id']}: took {elapsed:.2f}s (budget {budget_s}s)"
    if "max_mb" in case:
        assert memory.peak_mb <= float(case["max_mb"]), f"{case['id']}: {memory.peak_mb:.0f} MB allocated"
    result = outcome[0]
    if case.get("expect", "refused") == "accepted":
        assert not result.refused, f"{case['id']}: refused: {result.lines}"
        return
    assert result.refused, f"{case['id']}: accepted silently: {result.lines[:5]}"
    assert len(result.lines) == 1, f"{case['id']}: {len(result.lines)} lines: {result.lines[:5]}"
    line = result.lines[0]
    assert "Traceback" not in line and len(line) <= MAX_LINE_CHARS, line[:300]
    assert case["contains"] in line, f"{case['id']}: {line!r} lacks {case['contains']!r}"
