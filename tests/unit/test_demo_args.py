"""``make demo``'s DEPLOY option: refused in one line before anything starts when it cannot apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.demo import main, run_demo


def test_deploy_scraper_needs_the_amp_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", "scraper", "--target", "prometheus"])
    assert exit_info.value.code == 2
    assert "--deploy scraper needs --target amp" in capsys.readouterr().err


def test_unknown_deploy_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", "k8s-cr", "--target", "amp"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'k8s-cr'" in capsys.readouterr().err


@pytest.mark.parametrize(("deploy", "target", "message"), [
    ("scraper", "prometheus", "deploy 'scraper' needs the AMP target"),
    ("ftp", "amp", "deploy must be one of remote_write, scraper, got 'ftp'"),
])
def test_run_demo_refuses_before_touching_the_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deploy: str,
                                                    target: str, message: str) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    for name in ("AWS_SESSION_TOKEN",):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=message):
        run_demo(group_name="gpu-utilization", scenario="happy", nodes=2, airflow_port=1, report_root=tmp_path,
                 target_kind=target, deploy=deploy)
    assert not (tmp_path / "state").exists()  # nothing was reset or started
