"""``LocalStack`` is a composition of component families (``local/stack/parts``): each component is built by one
family, every name callers used stays, and each family's health and start rules reach its own components only."""

from __future__ import annotations

from pathlib import Path

import pytest

from promshift.local.stack import local
from promshift.local.stack.local import ALL_COMPONENTS, LocalStack, StackConfig
from promshift.local.stack.parts.airflow import AirflowPart
from promshift.local.stack.parts.alerting import AlertingPart
from promshift.local.stack.parts.amp import AmpPart
from promshift.local.stack.parts.fleet import FleetPart
from promshift.local.stack.parts.prometheus import PrometheusPart
from promshift.local.stack.parts.stand_ins import StandInsPart

# What LocalStack offered before the carve (its public methods and properties): all still there.
PUBLIC = (
    "alertmanager_config_path alertmanager_dir alertmanager_installed alertmanager_port alertmanager_url amp_client "
    "amp_connection_extra amp_dir amp_rules_dir aws_credentials aws_env aws_url cluster_b_ports credentials_path "
    "dashboards_dir data_dir down file_sd_b_path file_sd_path fleet fleet_b fleet_faults_path fleet_url frontdoor_url "
    "git_address git_dir git_source_extra git_token github_url home k8s_port kubeconfig_path kubernetes_address "
    "kubernetes_dir kubernetes_source_extra kubernetes_url local_alert_definition log_path mail mail_dir moto_url "
    "pid_path prometheus_cr prometheus_cr_url prometheus_endpoint promshift_sd_path promshift_token_path "
    "publish_usage relay_b_remote_write_url relay_remote_write_url reset scrape_promshift scraper_extra "
    "set_aws_faults set_fleet_faults sigv4_stats smtp_connection_env smtp_port source_b_config_path source_b_url "
    "source_config_path source_query_log_path source_rules_path source_url state_path status "
    "target_b_remote_write_url target_b_url target_config_path target_remote_write_url target_url up "
    "workspace_b_id workspace_id"
).split()
# The module-level names tests, demos and the lab import from promshift.local.stack.local.
IMPORTED = ("AIRFLOW ALERTMANAGER AMP_COMPONENTS AMP_WORKSPACE_ALIAS_B AWS CLUSTER_B_COMPONENTS COMPONENTS "
            "EXTERNAL_LABELS EXTERNAL_LABELS_B FLEET_B FRONTDOOR K8S LOCAL_ONCALL_RECEIVER MAIL PROMETHEUS_BIN "
            "PROMSHIFT_JOB PROMSHIFT_METRICS_PATH RELAY RELAY_B SCRAPE_JOB SOURCE SOURCE_B SOURCE_RETENTION "
            "StackConfig StackError TARGET TARGET_B TARGET_KINDS find_free_ports LocalStack").split()


def test_every_name_callers_used_is_still_there() -> None:
    assert [name for name in PUBLIC if not hasattr(LocalStack, name)] == []
    assert [name for name in IMPORTED if not hasattr(local, name)] == []
    assert set(IMPORTED) <= set(local.__all__)


def test_each_component_is_built_by_one_family(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, target_kind="amp", clusters=2))
    built = [stack._alerting_components(), stack._fleet_components(), stack._prometheus_components(),
             stack._amp_components("ws-1", "fp", "ws-2"), stack._stand_in_components(), stack._cluster_b_components(),
                 stack._replica_components()]
    names = [name for family in built for name in family]
    assert sorted(names) == sorted(ALL_COMPONENTS)  # none twice, none missing
    assert sorted(stack._components(workspace_id="ws-1", fingerprint="fp", workspace_b_id="ws-2")) == sorted(names)
    for family in (FleetPart, PrometheusPart, AmpPart, StandInsPart, AlertingPart, AirflowPart):
        assert issubclass(LocalStack, family)


@pytest.mark.parametrize("name,leftover", [("mail", "mail/sink.json"), ("k8s", "k8s/api.json"),
                                           ("git", "git/api.json")])
def test_a_start_clears_only_its_own_components_address(tmp_path: Path, name: str, leftover: str) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, kubernetes=name == "k8s", git=name == "git"))
    files = [tmp_path / f for f in ("mail/sink.json", "k8s/api.json", "git/api.json")]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    stack._before_start(stack._components()[name])
    assert [p.relative_to(tmp_path).as_posix() for p in files if not p.exists()] == [leftover]


def test_health_is_the_familys_own_rule(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, kubernetes=True))
    components = stack._components()
    (tmp_path / "k8s").mkdir()
    # A recorded address whose pid is not the pid file's is a dead server's, whatever answers on the port.
    (tmp_path / "k8s" / "api.json").write_text('{"pid": 1, "port": 1}')
    stack.pid_path("k8s").write_text("2\n")
    assert stack._healthy(components["k8s"]) is False
    (tmp_path / "git").mkdir()
    (tmp_path / "git" / "api.json").write_text('{"pid": 7, "port": 0}')
    stack.pid_path("git").write_text("7\n")
    assert stack._healthy(components["git"]) is True  # the git family's rule: its own record, no HTTP probe
    stack.pid_path("git").write_text("8\n")
    assert stack._healthy(components["git"]) is False


def test_only_the_local_aws_and_the_sources_get_the_credential_pair(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path, target_kind="amp", clusters=2))
    stack._aws_child_env = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"}
    components = stack._components(workspace_id="ws-1", workspace_b_id="ws-2")
    given = sorted(name for name, c in components.items() if stack._child_env(c))
    assert given == sorted(["aws", "frontdoor", "relay", "relay-b", "source", "source-1", "source-b"])
