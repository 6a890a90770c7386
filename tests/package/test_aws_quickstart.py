"""docs/aws-quickstart.md, command by command (issue 37 item 8).

Every command of the page's ``bash`` blocks is either run here, in order, in one shell (the CLI, the exports,
every ``envsubst``), checked here the way promshift or AWS would read it (each JSON handed to ``aws
secretsmanager``, the DAG trigger's conf), run by another test (the wheel's install line), or listed in
``NOT_HERE`` with why it cannot run on this machine. A command added to the page without a place here fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from promshift.adapters.amp import amp_target_from_extra
from promshift.adapters.fab_teams import FabApiTeams
from promshift.adapters.settings import load_catalog, require_production_settings
from promshift.core.deploy_kinds import kubernetes_source_of
from promshift.core.run_params import parse_run_params
from promshift.orchestration.approver_teams import api_server_url

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "aws-quickstart.md"
# Commands that need what this machine has not, by how they start: why.
NOT_HERE = {
    "aws ": "an AWS account (the CLI is there; no account or network to AWS is)",
    "export WorkspaceId=$(aws ": "an AWS account: the test sets WorkspaceId as that command's answer would",
    "docker ": "a container engine (tests/package/test_image_layer.py runs the Dockerfile's Python layer instead)",
    "helm ": "a Kubernetes cluster (tests/package/test_deploy_targets.py validates the values against the chart)",
    "kubectl ": "a Kubernetes cluster (the contract server stands in for the API in the deployer tests)",
}
WORKSPACE_ID = "ws-0123abcd-4567-89ef-0123-456789abcdef"
# The features the walk-through uses (deploy/iam/features.yaml): their statements must be filled completely.
FEATURES = ("always", "workspace-by-alias", "deploy:k8s-cr", "reports-s3", "anchor-object-lock",
            "secrets-manager-backend")


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 8
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def secret_strings() -> dict[str, object]:
    found = {}
    for line in commands():
        if line.startswith("aws secretsmanager create-secret"):
            words = shlex.split(line)
            found[words[words.index("--name") + 1]] = json.loads(words[words.index("--secret-string") + 1])
    return found


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's local commands run in order in one bash, in a folder holding what they name."""
    work = tmp_path_factory.mktemp("quickstart")
    for folder in ("catalog", "deploy"):
        shutil.copytree(REPO / folder, work / folder)
    (work / "prometheus.yml").write_text("global: {scrape_interval: 30s}\nscrape_configs: []\n")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "promshift"  # the command as the wheel installs it, from this checkout's code
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from promshift.cli import main; "
                    "sys.exit(main())' \"$@\"\n")
    shim.chmod(0o755)
    script = ["set -euo pipefail", f"export WorkspaceId={WORKSPACE_ID}"]
    for line in commands():
        if line.startswith("pip install") or any(line.startswith(p) for p in NOT_HERE):
            continue
        script.append(line)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMSHIFT_", "AIRFLOW_CONN"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(REPO / "include"))
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (work / "stdout.txt").write_text(done.stdout)
    return work


def test_every_command_has_its_place() -> None:
    placed, unplaced = 0, []
    runnable = ("promshift ", "export ", "mkdir -p iam && for f in deploy/iam/*.json; do envsubst", "envsubst <")
    for line in commands():
        if line.startswith(runnable) or line.startswith("pip install") \
                or any(line.startswith(p) for p in NOT_HERE):
            placed += 1
        else:
            unplaced.append(line)
    assert not unplaced, f"commands neither run nor listed in NOT_HERE: {unplaced}"
    assert placed >= 30


def test_the_install_line_is_the_one_the_install_test_runs() -> None:
    from tests.package.test_install_lines import install_lines

    ours = [shlex.split(line) for line in commands() if line.startswith("pip install")]
    assert ours and all(line in install_lines() for line in ours)


def test_the_read_only_commands_run_and_render_shows_the_amp_blocks(walked: Path) -> None:
    out = (walked / "stdout.txt").read_text()
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version and out.startswith(f"promshift {version.group(1)}\n")
    assert "catalog/metric_groups.yaml: OK (" in out
    assert '+    sigv4:' in out and '+      region: "us-east-1"' in out and "+    queue_config:" in out


def test_the_filled_iam_documents_are_whole_for_the_features_used(walked: Path) -> None:
    features = yaml.safe_load((REPO / "deploy" / "iam" / "features.yaml").read_text())
    for role, spec in features["roles"].items():
        for name in [spec["policy"], *spec["trust"]]:
            text = (walked / "iam" / name).read_text()
            doc = json.loads(text)  # envsubst left valid JSON
            if name != spec["policy"]:
                continue
            used = {sid for f in FEATURES for sid in features["features"].get(f, {}).get(role, [])}
            for st in doc["Statement"]:
                if st["Sid"] in used:
                    body = json.dumps(st)
                    assert "${" not in body and "::workspace/\"" not in body and ":role/\"" not in body, st["Sid"]
                    assert not re.search(r"arn:aws:[a-z0-9-]+:(us-east-1)?:(111122223333)?:[a-z-]+/\"", body), body
    trust = json.loads((walked / "iam" / "trust-source-writer-irsa.json").read_text())
    subs = trust["Statement"][0]["Condition"]["StringEquals"]
    assert any(v == ["system:serviceaccount:monitoring:prometheus-k8s"] for v in subs.values())


def test_the_filled_secret_and_values_name_every_store(walked: Path) -> None:
    secret = yaml.safe_load((walked / "promshift-settings.filled.yaml").read_text())
    values = yaml.safe_load((walked / "values.filled.yaml").read_text())
    assert "${" not in (walked / "values.filled.yaml").read_text()
    env = {e["name"]: e["value"] for e in values["env"]}
    stores = {s["envName"]: secret["stringData"][s["secretKey"]] for s in values["secret"]}
    require_production_settings("quickstart", {**env, **stores})
    assert stores["PROMSHIFT_SNAPSHOTS_URL"] == "s3://promshift-state-111122223333/promshift/snapshots"
    assert len(stores["PROMSHIFT_AUDIT_KEY"]) == len(stores["PROMSHIFT_METRICS_TOKEN"]) == 64  # openssl rand -hex 32
    assert stores["PROMSHIFT_AUDIT_KEY"] != stores["PROMSHIFT_METRICS_TOKEN"]


def test_the_connections_handed_to_secrets_manager_pass_promshifts_checks() -> None:
    secrets = secret_strings()
    target = secrets["airflow/connections/promshift_target"]
    assert isinstance(target, dict) and target["conn_type"] == "amp"
    assert amp_target_from_extra(target["extra"]).workspace_alias == "gpu-fleet"
    source = secrets["airflow/connections/promshift_source"]
    assert isinstance(source, dict) and source["conn_type"] == "prometheus"
    k8s = kubernetes_source_of(source["extra"])
    assert k8s is not None and (k8s.kind, k8s.namespace, k8s.name) == ("k8s-cr", "monitoring", "k8s")
    # Under the values' FAB auth manager the teams come from the API server, through this connection: no Variable of
    # user names (FAB's ids are numbers) and no database login.
    assert "airflow/variables/promshift_teams" not in secrets
    fab = secrets["airflow/connections/promshift_fab_api"]
    assert isinstance(fab, dict) and fab["conn_type"] == "http"
    base = api_server_url(fab["conn_type"], fab["host"], fab.get("port"), fab.get("schema"))
    assert base == "http://airflow-api-server.$Namespace.svc:8080" and fab["password"] == "$FabTeamsPassword"
    FabApiTeams(base, username=fab["login"], password=fab["password"], source="quickstart")  # accepted as given


def airflow_commands() -> list[list[str]]:
    """The ``airflow ...`` commands the page runs in the API server's container."""
    found = []
    for line in commands():
        words = shlex.split(line)
        if words[:1] == ["kubectl"] and "--" in words and words[words.index("--") + 1:][:1] == ["airflow"]:
            found.append(words[words.index("--") + 2:])
    return found


def test_the_fab_commands_parse_with_airflows_own_cli_and_create_the_catalogs_teams() -> None:
    """Each ``airflow roles|users ...`` line is parsed by Airflow's CLI with the FAB auth manager (the values' own),
    so a wrong flag fails here; the roles created are every team the shipped catalog names, and the login the
    connection uses gets a role with can_read on Users (what the board's team route asks)."""
    from promshift.core.approvers import team_of

    fab = [argv for argv in airflow_commands() if argv[0] in ("roles", "users")]
    assert len(fab) >= 4
    code = ("import json, sys; from airflow.cli import cli_parser; p = cli_parser.get_parser(); "
            "[p.parse_args(a) for a in json.loads(sys.argv[1])]; print('parsed', len(json.loads(sys.argv[1])))")
    env = {**os.environ, "AIRFLOW__CORE__AUTH_MANAGER":
           "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(fab)], capture_output=True, text=True, env=env,
                          timeout=180)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == f"parsed {len(fab)}", done.stderr[-2000:]
    created = {role for argv in fab if argv[:2] == ["roles", "create"] for role in argv[2:]}
    catalog = load_catalog(REPO / "catalog" / "metric_groups.yaml")
    teams = {team_of(a) for g in catalog.groups for a in g.approvers}
    assert None not in teams and teams <= created  # the shipped catalog names only teams, each one created here
    [perms] = [argv for argv in fab if argv[:2] == ["roles", "add-perms"]]
    assert perms[perms.index("--resource") + 1] == "Users" and perms[perms.index("--action") + 1] == "can_read"
    [login] = [argv for argv in fab if argv[:2] == ["users", "create"]]
    fab_conn = secret_strings()["airflow/connections/promshift_fab_api"]
    assert isinstance(fab_conn, dict) and login[login.index("--username") + 1] == fab_conn["login"]
    assert login[login.index("--role") + 1] == perms[2]


def test_the_first_dry_run_is_a_run_of_the_targets_migration_dag() -> None:
    (line,) = [c for c in commands() if "airflow dags trigger" in c]
    words = shlex.split(line)
    dag_id, conf = words[words.index("trigger") + 1], json.loads(words[words.index("--conf") + 1])
    group = load_catalog(REPO / "catalog" / "metric_groups.yaml").get(conf["group"])
    assert dag_id == group.dag_id
    params = parse_run_params({k: v for k, v in conf.items() if k != "group"}, scrape_interval_s=30.0)
    assert params.dry_run is True
