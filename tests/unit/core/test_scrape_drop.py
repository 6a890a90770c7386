"""The decommission edit: a metric_relabel_configs drop in one scrape job, byte-preserving and undone exactly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from promshift.core.render import RenderError
from promshift.core.scrape_drop import add_scrape_drop, drop_rule, has_scrape_drop, remove_scrape_drop, scrape_jobs

CORPUS = Path(__file__).resolve().parents[2] / "data" / "configs"
RULE = drop_rule("DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED")
WITH_JOBS = sorted(p for p in CORPUS.glob("*.yml") if scrape_jobs(p.read_bytes()))


def test_the_corpus_has_scrape_jobs_to_edit() -> None:
    assert len(WITH_JOBS) >= 10


# Jobs whose edit would change more than the rule (merge keys) or sit on one flow line: refused, never guessed.
REFUSED = {"anchors-merge.yml": "merges keys", "flow-empty.yml": "is not a block mapping"}


@pytest.mark.parametrize("path", WITH_JOBS, ids=[p.name for p in WITH_JOBS])
def test_add_then_remove_restores_every_byte(path: Path) -> None:
    original = path.read_bytes()
    job = scrape_jobs(original)[-1]
    if path.name in REFUSED:
        with pytest.raises(RenderError, match=REFUSED[path.name]):
            add_scrape_drop(original, job, RULE)
        return
    added = add_scrape_drop(original, job, RULE)
    assert added != original and has_scrape_drop(added, job, RULE)
    assert add_scrape_drop(added, job, RULE) == added  # a retried edit is a no-op
    # Only lines were inserted: every original line is still there, in order.
    assert all(line in added.splitlines() for line in original.splitlines())
    loaded = yaml.safe_load(added)
    target = next(j for j in loaded["scrape_configs"] if j.get("job_name") == job)
    assert target["metric_relabel_configs"][-1] == RULE
    assert remove_scrape_drop(added, job, RULE) == original
    assert remove_scrape_drop(original, job, RULE) == original  # nothing to remove: a no-op


def test_a_rule_goes_after_the_jobs_own_rules_and_keeps_comments_and_crlf() -> None:
    text = (b"global:\r\n  scrape_interval: 5s\r\nscrape_configs:\r\n  - job_name: fleet  # the GPU nodes\r\n"
            b"    metric_relabel_configs:\r\n      - source_labels: [__name__]\r\n        regex: go_.*\r\n"
            b"        action: drop  # noise\r\n    file_sd_configs:\r\n      - files: [fleet.json]\r\n"
            b"  - job_name: other\r\n    static_configs: [{targets: ['a:1']}]\r\n")
    added = add_scrape_drop(text, "fleet", RULE)
    assert b"\n" not in added.replace(b"\r\n", b"")  # CRLF kept
    rules = yaml.safe_load(added)["scrape_configs"][0]["metric_relabel_configs"]
    assert rules == [{"source_labels": ["__name__"], "regex": "go_.*", "action": "drop"}, RULE]
    assert b"action: drop  # noise\r\n      - source_labels:" in added
    assert remove_scrape_drop(added, "fleet", RULE) == text


@pytest.mark.parametrize("mrc", ["    metric_relabel_configs: []\n", "    metric_relabel_configs:\n",
                                 "    metric_relabel_configs: [{source_labels: [__name__], regex: x, action: drop}]\n"])
def test_flow_and_empty_rule_lists(mrc: str) -> None:
    text = "scrape_configs:\n  - job_name: fleet\n" + mrc + "    static_configs: [{targets: ['a:1']}]\n"
    added = add_scrape_drop(text, "fleet", RULE)
    assert yaml.safe_load(added)["scrape_configs"][0]["metric_relabel_configs"][-1] == RULE
    assert remove_scrape_drop(added, "fleet", RULE) == text


@pytest.mark.parametrize(("text", "message"), [
    ("scrape_configs:\n  - job_name: a\n", "0 scrape jobs named 'fleet'"),
    ("scrape_configs:\n  - job_name: fleet\n  - job_name: fleet\n", "2 scrape jobs named 'fleet'"),
    ("scrape_configs: [{job_name: fleet}]\n", "is not a block mapping"),
    ("scrape_configs:\n  - job_name: fleet\n    metric_relabel_configs: {a: 1}\n", "must be a list"),
])
def test_what_cannot_be_edited_safely_is_refused(text: str, message: str) -> None:
    with pytest.raises(RenderError, match=message):
        add_scrape_drop(text, "fleet", RULE)


@pytest.mark.integration  # starts a process
def test_promtool_accepts_the_edited_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed (Debian's prometheus package)"
    text = ("global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: fleet\n"
            "    static_configs:\n      - targets: ['127.0.0.1:9400']\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(add_scrape_drop(text, "fleet", RULE))
    out = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
