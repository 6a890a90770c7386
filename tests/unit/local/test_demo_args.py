"""``make demo``'s DEPLOY option: refused in one line before anything starts when it cannot apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from promshift.local.demo import main, run_demo


def test_deploy_scraper_needs_the_amp_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", "scraper", "--target", "prometheus"])
    assert exit_info.value.code == 2
    assert "--deploy scraper needs --target amp" in capsys.readouterr().err


def test_deploy_k8s_cr_needs_the_amp_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", "k8s-cr"])
    assert exit_info.value.code == 2
    assert "--deploy k8s-cr needs --target amp" in capsys.readouterr().err


def test_unknown_deploy_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo's stack has a Prometheus resource, not a ConfigMap: k8s-configmap is not a demo deploy.
    with pytest.raises(SystemExit) as exit_info:
        main(["--deploy", "k8s-configmap", "--target", "amp"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'k8s-configmap'" in capsys.readouterr().err


def test_unknown_profile_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--profile", "demo-fastest"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--profile:" in err and "unknown profile 'demo-fastest'" in err and "demo-quick" in err


def test_run_demo_refuses_an_unknown_profile_before_touching_the_stack(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    with pytest.raises(ValueError, match="unknown profile 'demo-fastest'"):
        run_demo(group_name="gpu-utilization", scenario="happy", nodes=2, airflow_port=1, report_root=tmp_path,
                 profile="demo-fastest")
    assert not (tmp_path / "state").exists()  # nothing was reset or started


@pytest.mark.parametrize(("deploy", "target", "message"), [
    ("scraper", "prometheus", "deploy 'scraper' needs the AMP target"),
    ("k8s-cr", "prometheus", "deploy 'k8s-cr' needs the AMP target"),
    ("ftp", "amp", "deploy must be one of remote_write, scraper, k8s-cr, git, got 'ftp'"),
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


class _Stack:
    """What the demo's connection builders read from a running AMP stack with the k8s component."""

    class config:  # noqa: N801 - LocalStack.config's attributes
        target_kind = "amp"

    source_url = "http://127.0.0.1:19090"
    source_config_path = Path("/state/source/prometheus.yml")

    def aws_env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example"}

    def amp_connection_extra(self) -> dict[str, str]:
        return {"region_name": "us-east-1", "workspace_id": "ws-1", "endpoint_url": "http://127.0.0.1:14566"}

    def scraper_extra(self) -> dict[str, str]:
        raise AssertionError("k8s-cr must not ask for a managed collector")

    def kubernetes_source_extra(self, timeout_s: float, *, rules: bool = False) -> dict[str, object]:
        return {"namespace": "monitoring", "name": "k8s", "config_file": "/state/k8s/kubeconfig.json",
                "timeout_s": timeout_s, **({"prometheus_rules": ["monitoring/gpu-rules"]} if rules else {})}


def test_k8s_cr_puts_the_resource_on_the_source_connection_and_keeps_the_targets_remote_write() -> None:
    from promshift.core.deploy_kinds import deploy_kind_of, kubernetes_source_of
    from promshift.local.demo import K8S_TIMEOUT_S, source_connection, target_connection

    stack = _Stack()
    source = source_connection(stack, "k8s-cr")  # type: ignore[arg-type]
    target = target_connection(stack, "k8s-cr")  # type: ignore[arg-type]
    assert "config_path" not in source["extra"]  # a worker pod could not see the file: only the resource
    assert "deploy" not in target["extra"] and "scraper" not in target["extra"]
    assert deploy_kind_of(target["extra"], conn_id="promshift_target", is_amp=True,
                          source_extra=source["extra"]) == "k8s-cr"
    k8s = kubernetes_source_of(source["extra"])
    assert k8s is not None and (k8s.namespace, k8s.name, k8s.timeout_s) == ("monitoring", "k8s", K8S_TIMEOUT_S)
    assert k8s.config_file == "/state/k8s/kubeconfig.json"
    plain = source_connection(stack)  # type: ignore[arg-type]
    assert plain["extra"] == {"config_path": "/state/source/prometheus.yml"}
    assert kubernetes_source_of(plain["extra"]) is None
    assert "rules" not in source["extra"] and k8s.prometheus_rules == ()


def test_a_run_moving_rules_names_the_prometheusrule_on_k8s_cr_and_the_rule_files_else() -> None:
    from promshift.core.deploy_kinds import kubernetes_source_of
    from promshift.local.demo import scenario_trigger_conf, source_connection

    stack = _Stack()
    source = source_connection(stack, "k8s-cr", rules=True)  # type: ignore[arg-type]
    k8s = kubernetes_source_of(source["extra"])
    assert source["extra"]["rules"] is True and "config_path" not in source["extra"]
    assert k8s is not None and k8s.prometheus_rules == (("monitoring", "gpu-rules"),)
    plain = source_connection(stack, rules=True)  # type: ignore[arg-type]
    assert plain["extra"] == {"config_path": "/state/source/prometheus.yml", "rules": True}
    # a run moving rules accepts short history as the lifecycle scenarios do (its alert's for: 1m); others do not
    assert scenario_trigger_conf("happy", rules=True) == {"accept_short_history": True}
    assert scenario_trigger_conf("happy") == {}


def test_the_lifecycle_scenarios_default_to_the_managed_collector_and_gpu_memory() -> None:
    from promshift.local.demo_lifecycle import lifecycle_choices

    for scenario in ("lifecycle", "bake-fail"):
        assert lifecycle_choices(scenario, None, None, None) == ("gpu-memory", "amp", "scraper")
    assert lifecycle_choices("lifecycle", "gpu-clocks", "amp", "scraper") == ("gpu-clocks", "amp", "scraper")


@pytest.mark.parametrize("argv", [["--target", "prometheus"], ["--target", "amp", "--deploy", "remote_write"],
                                  ["--deploy", "k8s-cr"]])
def test_a_lifecycle_scenario_refuses_another_target_or_deploy_in_one_line(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--scenario", "lifecycle", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--scenario lifecycle needs --target amp --deploy scraper" in err and "only AMP" not in err


def test_run_demo_refuses_a_lifecycle_scenario_on_the_remote_write_path(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "state"))
    with pytest.raises(ValueError, match="--scenario bake-fail needs --target amp --deploy scraper"):
        run_demo(group_name="gpu-memory", scenario="bake-fail", nodes=2, airflow_port=1, report_root=tmp_path,
                 target_kind="amp", deploy="remote_write")
    assert not (tmp_path / "state").exists()


def test_git_puts_the_repository_on_the_source_connection_and_the_token_in_a_connection_of_its_own() -> None:
    from promshift.core.deploy_kinds import deploy_kind_of
    from promshift.core.git_source import git_source_of
    from promshift.local.demo import GIT_TIMEOUT_S, source_connection, target_connection
    from promshift.local.stack.local import LocalStack, StackConfig

    stack = LocalStack(StackConfig(home=Path("/nonexistent-promshift-home"), git=True))
    address = {"repo": "/state/git/config.git", "path": "values.yaml", "shape": "helm-values", "branch": "main",
               "repository": "platform/gpu-monitoring", "url": "http://127.0.0.1:31111"}
    stack.git_address = lambda: address  # type: ignore[method-assign]  # what the running component recorded
    source = source_connection(stack, "git")
    assert "config_path" not in source["extra"]
    assert deploy_kind_of(target_connection(stack, "git")["extra"], conn_id="promshift_target", is_amp=False,
                          source_extra=source["extra"]) == "git"
    git = git_source_of(source["extra"])
    assert (git.url, git.path, git.shape, git.backend, git.repository, git.api_url, git.conn_id, git.timeout_s) == (
        "/state/git/config.git", "values.yaml", "helm-values", "github", "platform/gpu-monitoring",
        "http://127.0.0.1:31111", "promshift_git", GIT_TIMEOUT_S)
    assert "token" not in json.dumps(source)
    with pytest.raises(ValueError, match="the git and k8s components both render onto the source's config"):
        StackConfig(home=Path("/nonexistent-promshift-home"), git=True, kubernetes=True)


def test_the_lab_accepts_short_history_only_where_a_scenario_says_so() -> None:
    from promshift.core.catalog import MetricGroup
    from promshift.local.airflow_lab import LocalAirflow
    from promshift.local.demo import SCENARIOS, scenario_trigger_conf

    sent: list[tuple[str, dict]] = []
    airflow = LocalAirflow(home=Path("/nonexistent-airflow-home"), port=1, extra_env={})
    airflow.trigger = lambda dag_id, *, user, conf: sent.append((dag_id, conf)) or "run"  # type: ignore[method-assign]
    group = MetricGroup(name="gpu-memory", metrics=("DCGM_FI_DEV_FB_USED",))
    airflow.trigger_group(group)
    airflow.trigger_group(group, conf={"accept_short_history": True, "group": "not-this-one"})
    # by default the form's own default (false) applies; the group is always the one asked for
    assert [conf for _dag, conf in sent] == [{"group": "gpu-memory"},
                                            {"accept_short_history": True, "group": "gpu-memory"}]
    # only bake-fail, which switches a dashboard and moves rules minutes into dual-write, passes it; lifecycle shows
    # the history horizon instead (what reads further back waits for the bake watch)
    assert {s for s in SCENARIOS if scenario_trigger_conf(s).get("accept_short_history")} == {"bake-fail"}
    assert all(scenario_trigger_conf(s) == {} for s in SCENARIOS if s != "bake-fail")
    # A run with the dashboard switch on (plan-aggregate's fleet dashboard, minutes into dual-write) accepts it too.
    assert scenario_trigger_conf("happy", read_path=True) == {"accept_short_history": True}


def test_retire_takes_no_group_deploy_history_or_celery(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--group", "gpu-memory"], ["--deploy", "scraper"], ["--history", "1h"], ["--executor", "celery"]):
        with pytest.raises(SystemExit):
            main(["--scenario", "retire", *argv])
        assert "--scenario retire migrates every group of the local source itself" in capsys.readouterr().err


def test_retire_on_k8s_cr_needs_the_amp_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--scenario", "retire", "--deploy", "k8s-cr", "--target", "prometheus"])
    assert "--deploy k8s-cr needs --target amp" in capsys.readouterr().err
