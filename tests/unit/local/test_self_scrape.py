"""The local source's job ``promshift``: its token file (0600, replaced before it expires) and its target."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
import yaml

from promshift.local.airflow_lab import METRICS_USER
from promshift.local.self_scrape import jwt_expires_at, keep_scraped, self_metrics_line
from promshift.local.stack.local import PROMSHIFT_JOB, PROMSHIFT_METRICS_PATH, LocalStack, StackConfig, StackError


def _jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'HS512', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


class _Airflow:
    """The part of LocalAirflow keep_scraped uses: a port and tokens that expire ``lifetime_s`` after ``now``."""

    port = 19654
    base_url = "http://127.0.0.1:19654"

    def __init__(self, now: float, lifetime_s: float) -> None:
        self.now, self.lifetime_s, self.asked = now, lifetime_s, []

    def token(self, user: str, *, fresh: bool = False) -> str:
        self.asked.append((user, fresh))
        return _jwt({"sub": user, "exp": int(self.now + self.lifetime_s), "n": len(self.asked)})


def test_jwt_expiry_is_read_from_the_claims_and_anything_else_has_none() -> None:
    assert jwt_expires_at(_jwt({"exp": 1_800_000_000})) == 1_800_000_000.0
    assert jwt_expires_at(_jwt({"sub": "x"})) is None
    assert jwt_expires_at(_jwt({"exp": True})) is None
    assert jwt_expires_at("not-a-jwt") is None
    assert jwt_expires_at("a.!!!.c") is None
    assert jwt_expires_at("a." + "A" * 20_000 + ".c") is None


def test_the_source_config_names_the_job_with_its_token_file_and_an_empty_target_list(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    stack._write_configs()
    jobs = {j["job_name"]: j for j in yaml.safe_load(stack.source_config_path.read_text())["scrape_configs"]}
    job = jobs[PROMSHIFT_JOB]
    assert job["metrics_path"] == PROMSHIFT_METRICS_PATH
    assert job["authorization"] == {"credentials_file": str(stack.promshift_token_path)}
    assert job["file_sd_configs"] == [{"files": [str(stack.promshift_sd_path)]}]
    assert json.loads(stack.promshift_sd_path.read_text()) == []  # no Airflow yet: nothing scraped, nothing down


def test_keep_scraped_writes_a_0600_token_and_replaces_it_only_when_it_is_about_to_expire(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    now = 1_800_000_000.0
    airflow = _Airflow(now, lifetime_s=3600)
    assert keep_scraped(stack, airflow, now=now, min_left_s=600) is True  # type: ignore[arg-type]
    first = stack.promshift_token_path.read_text()
    assert stat.S_IMODE(stack.promshift_token_path.stat().st_mode) == 0o600
    assert jwt_expires_at(first) == now + 3600
    assert json.loads(stack.promshift_sd_path.read_text()) == [{"targets": ["127.0.0.1:19654"], "labels": {}}]
    # Fifty minutes later it still has ten minutes and one second: kept.
    assert keep_scraped(stack, airflow, now=now + 2999, min_left_s=600) is False  # type: ignore[arg-type]
    assert stack.promshift_token_path.read_text() == first
    # Two seconds later it has 599 s: a new one, from the metrics user, asked for fresh (not the cached one).
    airflow.now = now + 3001
    assert keep_scraped(stack, airflow, now=now + 3001, min_left_s=600) is True  # type: ignore[arg-type]
    assert stack.promshift_token_path.read_text() != first
    assert jwt_expires_at(stack.promshift_token_path.read_text()) == now + 3001 + 3600
    assert airflow.asked == [(METRICS_USER, True), (METRICS_USER, True)]
    assert stat.S_IMODE(stack.promshift_token_path.stat().st_mode) == 0o600
    # A token file someone widened is narrowed again when it is replaced.
    stack.promshift_token_path.chmod(0o644)
    stack.promshift_token_path.write_text("garbage")
    assert keep_scraped(stack, airflow, now=now + 3001, min_left_s=600) is True  # type: ignore[arg-type]
    assert stat.S_IMODE(stack.promshift_token_path.stat().st_mode) == 0o600


def test_a_token_that_is_not_one_word_is_refused(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    for bad in ("", "two words", "line\nbreak"):
        with pytest.raises(StackError, match="not one word"):
            stack.scrape_promshift("127.0.0.1:1", bad)
    assert not stack.promshift_token_path.exists()


def test_the_summary_line_says_up_with_stages_or_down_with_the_error() -> None:
    up = {"job": "promshift", "up": 1, "target": "127.0.0.1:1", "groups_series": 12,
          "groups_by_stage": {"cut_over": 1, "planned": 3, "warming": 0}, "last_error": ""}
    assert self_metrics_line(up) == ("the source scrapes 127.0.0.1:1 (job promshift up); 12 promshift_groups "
                                     "series; groups per stage: cut_over 1, planned 3")
    down = {"job": "promshift", "up": 0, "last_error": "server returned HTTP status 401 Unauthorized"}
    assert self_metrics_line(down) == "job promshift DOWN (server returned HTTP status 401 Unauthorized)"
    assert self_metrics_line({"job": "promshift", "up": None}) == "job promshift no target"
