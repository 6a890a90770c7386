"""The deployment targets in deploy/: the official Helm chart's values, the Astro project and the MWAA files.

The Helm values are validated against the chart's own values schema (vendored with its source and sha256), and
the same schema must refuse a misspelt key and a wrong type where we rely on it being strict. The Astro and MWAA
requirement pins must equal requirements.txt's; airflow_settings.yaml must hold every connection, Variable and
pool the code reads; MWAA's startup script must install promtool from a checked tarball and refuse a bad one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
SCHEMA = FIXTURES / "airflow-chart-1.22.0-dev.values.schema.json"
VALUES = REPO / "deploy" / "helm" / "values.yaml"
IAM = REPO / "deploy" / "iam"
ASTRO = REPO / "deploy" / "astronomer"
MWAA = REPO / "deploy" / "mwaa"
IRSA = "eks.amazonaws.com/role-arn"


def pins() -> dict[str, str]:
    found = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            found[canonicalize_name(name.split("[")[0])] = version.split()[0]
    return found


def top_level(path: Path) -> list[Requirement]:
    reqs = []
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text and not text.startswith(("-", "/", ".")):
            reqs.append(Requirement(text))
    return reqs


def values() -> dict[str, Any]:
    loaded = yaml.safe_load(VALUES.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


# --- the Helm chart ----------------------------------------------------------------------------------------------

def test_the_vendored_schema_is_what_its_header_says() -> None:
    header = SCHEMA.with_name(SCHEMA.name + ".SOURCE.md").read_text()
    (digest,) = re.findall(r"sha256 \| `([0-9a-f]{64})`", header)
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == digest
    assert "apache/airflow" in header and "chart/values.schema.json" in header and "Apache-2.0" in header
    assert re.search(r"commit \| `[0-9a-f]{40}`", header)
    assert "1.22.0" in header and "1.22.0" in VALUES.read_text()


def test_the_values_validate_against_the_charts_schema(validator: jsonschema.protocols.Validator) -> None:
    errors = sorted(validator.iter_errors(values()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


@pytest.mark.parametrize(("where", "change"), [
    ("misspelt key under triggerer", lambda v: v["triggerer"].update(enabeld=True)),
    ("misspelt key under apiServer", lambda v: v["apiServer"].update(serviceAcount={})),
    ("misspelt key under images.airflow", lambda v: v["images"]["airflow"].update(tags="x")),
    ("wrong type: triggerer.enabled", lambda v: v["triggerer"].update(enabled="yes")),
    ("wrong type: an annotation value", lambda v: v["triggerer"]["serviceAccount"]["annotations"].update({IRSA: 1})),
    ("wrong type: config option", lambda v: v["config"]["secrets"].update(backend_kwargs={"a": 1})),
    ("executor pattern", lambda v: v.update(executor="celery")),
])
def test_the_schema_is_strict_where_we_rely_on_it(validator: jsonschema.protocols.Validator, where: str,
                                                  change: Any) -> None:
    wrong = copy.deepcopy(values())
    change(wrong)
    assert list(validator.iter_errors(wrong)), f"the chart's schema accepted a {where}"


def test_the_values_run_our_image_with_a_triggerer() -> None:
    v = values()
    airflow = pins()["apache-airflow"]
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version
    tag = f"{version.group(1)}-airflow{airflow}"
    assert v["airflowVersion"] == airflow
    assert v["images"]["airflow"]["tag"] == v["defaultAirflowTag"] == tag
    assert v["images"]["airflow"]["repository"] == v["defaultAirflowRepository"]
    assert v["defaultAirflowRepository"].rsplit("/", 1)[-1] == "promshift"
    assert v["triggerer"]["enabled"] is True and v["triggerer"]["replicas"] >= 1
    env = {e["name"]: e["value"] for e in v["env"]}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"ENV PROMSHIFT_CATALOG={env['PROMSHIFT_CATALOG']}" in dockerfile


def test_every_store_comes_from_one_secret_into_every_component() -> None:
    """Issue 37: the chart's ``secret:`` reaches every Airflow container it makes (API server, scheduler, DAG
    processor, Celery workers, triggerer, KubernetesExecutor pods); each store promshift's own production check
    asks for is there, from the one Secret deploy/helm/promshift-settings.yaml defines, with s3:// stores."""
    from promshift.adapters.settings import production_problems, require_production_settings

    v = values()
    env = {e["name"]: e["value"] for e in v["env"]}
    assert env["PROMSHIFT_ENV"] == "production"
    assert "ENV PROMSHIFT_ENV=production" in (REPO / "Dockerfile").read_text()
    secret = yaml.safe_load((REPO / "deploy" / "helm" / "promshift-settings.yaml").read_text())
    assert (secret["apiVersion"], secret["kind"]) == ("v1", "Secret")
    assert {s["secretName"] for s in v["secret"]} == {secret["metadata"]["name"]}
    from_secret = {s["envName"]: secret["stringData"][s["secretKey"]] for s in v["secret"]}
    assert len(from_secret) == len(v["secret"]) == len(secret["stringData"])
    assert production_problems({"PROMSHIFT_ENV": "production"}) != []  # the check can fail
    require_production_settings("helm values", {**env, **from_secret})  # nothing missing, nothing on a disk
    assert from_secret["PROMSHIFT_SNAPSHOTS_URL"].startswith("s3://")
    assert from_secret["PROMSHIFT_REPORTS_URL"].startswith("s3://")
    assert from_secret["PROMSHIFT_AUDIT_ANCHOR_URL"].startswith("s3://")
    # no component shadows them with an env of its own (the chart appends a component's env after the common one)
    for component in (v["workers"], v["triggerer"], v["apiServer"], v.get("scheduler", {}), v.get("dagProcessor", {})):
        names = {e.get("name") for e in component.get("env", [])}
        names |= {e.get("envName") for e in component.get("secret", [])}
        assert not names & (set(from_secret) | {"PROMSHIFT_ENV"})
    assert not {e["name"] for e in v["env"]} & set(from_secret)  # a store is never a plain value


def test_the_service_accounts_assume_the_airflow_role_of_deploy_iam() -> None:
    check_service_accounts(values())


# Every service account the values create: (where in the values, the IAM role of deploy/iam/features.yaml it assumes,
# the placeholder its trust policies name it by). The API server is read only: a role of its own.
SERVICE_ACCOUNTS = {"worker": (("workers", "celery"), "airflow", "WorkerServiceAccount"),
                    "worker pod": (("workers", "kubernetes"), "airflow", "WorkerPodServiceAccount"),
                    "triggerer": (("triggerer",), "airflow", "TriggererServiceAccount"),
                    "api server": (("apiServer",), "api-server", "ApiServerServiceAccount")}


def check_service_accounts(v: dict[str, Any]) -> None:
    features = yaml.safe_load((IAM / "features.yaml").read_text())
    accounts = {}
    for who, (where, role, placeholder) in SERVICE_ACCOUNTS.items():
        node = v
        for key in where:
            node = node[key]
        account = accounts[who] = node["serviceAccount"]
        policy = features["roles"][role]["policy"]
        assert (IAM / policy).is_file()
        arn = account["annotations"].get(IRSA, "")
        assert re.fullmatch(r"arn:aws:iam::\$\{Account\}:role/[\w+=,.@-]+", arn), (who, arn)
        assert arn.rsplit("/", 1)[1] == Path(policy).stem, f"{who} assumes {arn}, not the role of {policy}"
        assert account["create"] is True and account["name"], who
        # every trust policy of its role names it (IRSA and Pod Identity), and values.yaml says which fills which
        for trust in features["roles"][role]["trust"]:
            assert f"${{{placeholder}}}" in (IAM / trust).read_text(), (who, trust)
        assert f"${{{placeholder}}}" in VALUES.read_text(), placeholder
    assert len({a["name"] for a in accounts.values()}) == len(accounts)
    # and no role trusts a service account of another's: the API server cannot act as a worker
    for role, spec in features["roles"].items():
        for trust in spec["trust"]:
            named = set(re.findall(r"\$\{(\w+ServiceAccount)\}", (IAM / trust).read_text()))
            own = {p for (_, r, p) in SERVICE_ACCOUNTS.values() if r == role}
            assert named <= (own if role != "source-writer" else {"WriterServiceAccount"}), trust


def test_what_the_schema_lets_through_our_own_checks_catch(validator: jsonschema.protocols.Validator) -> None:
    """The chart's schema is lax at the top level and inside serviceAccount: a typo there would silently drop
    the triggerer or the IRSA annotation. Our checks catch both."""
    typo_sa = copy.deepcopy(values())
    account = typo_sa["triggerer"]["serviceAccount"]
    account["annotatons"] = account.pop("annotations")
    typo_top = copy.deepcopy(values())
    typo_top["trigerer"] = typo_top.pop("triggerer")
    for wrong in (typo_sa, typo_top):
        assert not list(validator.iter_errors(wrong)), "the schema got stricter: this test can go"
    with pytest.raises((AssertionError, KeyError)):
        check_service_accounts(typo_sa)
    assert unknown_top_level_keys(typo_top, validator.schema) == ["trigerer"]
    assert unknown_top_level_keys(values(), validator.schema) == []


def unknown_top_level_keys(v: dict[str, Any], schema: Any) -> list[str]:
    return sorted(set(v) - set(schema["properties"]))


def test_connections_come_from_a_secrets_backend_the_image_has() -> None:
    from airflow.providers.amazon.aws.secrets.secrets_manager import SecretsManagerBackend

    secrets = values()["config"]["secrets"]
    module, _, cls = secrets["backend"].rpartition(".")
    assert f"{module}.{cls}" == f"{SecretsManagerBackend.__module__}.{SecretsManagerBackend.__name__}"
    kwargs = json.loads(secrets["backend_kwargs"])
    backend = SecretsManagerBackend(**kwargs)  # an unknown keyword would raise; no AWS call is made here
    assert backend.connections_prefix == "airflow/connections" and backend.variables_prefix == "airflow/variables"
    assert backend.build_path(backend.connections_prefix, "promshift_target", backend.sep) == \
        "airflow/connections/promshift_target"


# --- Astronomer and MWAA ------------------------------------------------------------------------------------------

def expected_platform_pins() -> dict[str, str]:
    """requirements.in's names at requirements.txt's pins, less Airflow itself (the platform provides it)."""
    pinned = pins()
    wanted = {}
    for req in top_level(REPO / "requirements.in"):
        name = canonicalize_name(req.name)
        if name != "apache-airflow":
            wanted[name] = f"=={pinned[name]}"
    return wanted


@pytest.mark.parametrize("path", [ASTRO / "requirements.txt", MWAA / "requirements.txt"])
def test_platform_requirements_equal_ours(path: Path) -> None:
    found = {canonicalize_name(r.name): str(r.specifier) for r in top_level(path)}
    assert found == expected_platform_pins()
    extras = {canonicalize_name(r.name): r.extras for r in top_level(path) if r.extras}
    assert extras == {canonicalize_name(r.name): r.extras for r in top_level(REPO / "requirements.in") if r.extras}


def test_platform_requirements_check_can_fail(tmp_path: Path) -> None:
    drifted = tmp_path / "requirements.txt"
    text = (ASTRO / "requirements.txt").read_text()
    drifted.write_text(text.replace(f"boto3=={pins()['boto3']}", "boto3==0.0.1"))
    found = {canonicalize_name(r.name): str(r.specifier) for r in top_level(drifted)}
    assert found != expected_platform_pins()


def test_mwaa_requirements_install_the_wheel_under_our_constraints() -> None:
    lines = [ln.strip() for ln in (MWAA / "requirements.txt").read_text().splitlines() if ln.strip()]
    constraint = [ln for ln in lines if ln.startswith("--constraint")]
    assert constraint == ['--constraint "/usr/local/airflow/dags/promshift-constraints.txt"']
    wheels = [ln for ln in lines if ln.endswith(".whl")]
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version and wheels == [f"/usr/local/airflow/plugins/promshift-{version.group(1)}-py3-none-any.whl"]


def test_the_astro_project_installs_promtool_and_the_wheel() -> None:
    assert (ASTRO / "packages.txt").read_text().split() == []  # no Debian promtool: the fleet's, as the Dockerfile
    dockerfile = (ASTRO / "Dockerfile").read_text()
    ours = re.search(r"^ARG PROMETHEUS_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert ours and f"ARG PROMETHEUS_VERSION={ours.group(1)}" in dockerfile
    assert "FROM prom/prometheus:v${PROMETHEUS_VERSION} AS promtool" in dockerfile
    assert "COPY --from=promtool /bin/promtool /usr/local/bin/promtool" in dockerfile
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, re.M)
    assert re.fullmatch(r"astrocrpublic\.azurecr\.io/runtime:3\.3-\d+-python-3\.11", base), base
    assert "pip install --no-cache-dir --no-deps /usr/local/airflow/dist/promshift-*.whl" in dockerfile


def code_conn_ids() -> set[str]:
    from promshift.adapters.settings import load_catalog
    from promshift.orchestration import operators

    catalog = load_catalog(REPO / "catalog" / "metric_groups.yaml")
    needed = {operators.SOURCE_CONN, operators.TARGET_CONN, operators.AUDIT_CONN}
    for group in catalog.groups:
        needed |= {group.source, group.target}
    return needed


def test_airflow_settings_hold_what_the_code_reads() -> None:
    from promshift.adapters.amp import amp_target_from_extra
    from promshift.adapters.settings import load_catalog
    from promshift.orchestration.approver_teams import TEAMS_VARIABLE

    settings = yaml.safe_load((ASTRO / "airflow_settings.yaml").read_text())["airflow"]
    conns = {c["conn_id"]: c for c in settings["connections"]}
    assert set(conns) == code_conn_ids()
    targets = {g.target for g in load_catalog(REPO / "catalog" / "metric_groups.yaml").groups}
    assert "pools" not in settings  # the latency bound needs none (max_active_tis_per_dag)
    variables = {v["variable_name"]: v["variable_value"] for v in settings["variables"]}
    assert set(variables) == {TEAMS_VARIABLE}
    teams = json.loads(variables[TEAMS_VARIABLE])
    assert teams and all(isinstance(m, list) and len(m) >= 2 for m in teams.values())  # four eyes need two
    # the target's extra passes the code's own check; the source is a prometheus connection with a config path
    for conn_id in targets:
        if conns[conn_id]["conn_type"] == "amp":
            assert amp_target_from_extra(conns[conn_id]["conn_extra"], conn_id=conn_id).region == "us-east-1"
    assert conns["promshift_source"]["conn_type"] == "prometheus"
    assert conns["promshift_audit"]["conn_extra"]["url"].startswith("postgresql+psycopg://")


def test_every_variable_name_in_the_code_is_known_and_no_pool_is_asked_for() -> None:
    """A new ``Variable.get("...")`` in production code must show up in airflow_settings.yaml; no task may ask for a
    pool someone must create (a missing pool leaves the task waiting in silence)."""
    text = "\n".join(p.read_text() for p in (REPO / "include" / "promshift").rglob("*.py")
                     if "local" not in p.relative_to(REPO / "include" / "promshift").parts)
    settings = (ASTRO / "airflow_settings.yaml").read_text()
    literal_gets = re.findall(r"Variable\.get\(\s*[\"']([\w.-]+)[\"']", text)
    variable_consts = re.findall(r"^\w*VARIABLE\w* = [\"']([\w.-]+)[\"']", text, re.M)
    assert variable_consts, "the scan found nothing: it would prove nothing"
    for name in literal_gets + variable_consts:
        assert f"variable_name: {name}" in settings, name
    assert not re.findall(r"\bpool\s*=", text), "a task asks for a pool: create it in code or bound it otherwise"


# --- MWAA: supported versions and the startup script --------------------------------------------------------------

def mwaa_airflow_versions() -> list[str]:
    import botocore.session

    model = botocore.session.get_session().get_service_model("mwaa")
    doc = model.operation_model("CreateEnvironment").input_shape.members["AirflowVersion"].documentation
    listed = re.search(r"Valid values: (.*?)\.\s*$", re.sub(r"<[^>]+>", "", doc).strip())
    assert listed, doc
    return re.findall(r"\d+\.\d+\.\d+", listed.group(1))


def test_the_mwaa_readme_states_the_versions_mwaa_offers() -> None:
    versions = mwaa_airflow_versions()
    assert versions and not [v for v in versions if v.startswith("3.3.")], \
        "MWAA now offers Airflow 3.3: deploy/mwaa/README.md and docs/deploy.md say it does not"
    readme = (MWAA / "README.md").read_text()
    assert f"Valid values in botocore's model: {', '.join(versions)}." in readme


def run_startup(home: Path, sha: str, tarball_member: str = "prometheus-9.9.9.linux-amd64/promtool"
                ) -> subprocess.CompletedProcess[str]:
    plugins = home / "plugins" / "promtool"
    plugins.mkdir(parents=True, exist_ok=True)
    tool = home / "promtool-src"
    tool.write_text("#!/bin/sh\necho 'promtool, version 9.9.9'\n")
    tool.chmod(0o755)
    tarball = plugins / "prometheus-9.9.9.linux-amd64.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tool, arcname=tarball_member)
    sha = sha or hashlib.sha256(tarball.read_bytes()).hexdigest()
    script = f'source "{MWAA / "startup.sh"}"; command -v promtool; promtool --version; echo "$PROMSHIFT_CATALOG"'
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(home), "PROMTOOL_SHA256": sha,
           "MWAA_AIRFLOW_COMPONENT": "worker"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)


def test_mwaa_startup_script_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(MWAA / "startup.sh")], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        checked = subprocess.run(["shellcheck", str(MWAA / "startup.sh")], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout


def test_mwaa_startup_puts_a_checked_promtool_on_path(tmp_path: Path) -> None:
    done = run_startup(tmp_path, sha="")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(tmp_path / "promtool" / "promtool")
    assert lines[1] == "promtool, version 9.9.9"
    assert lines[2] == str(tmp_path / "dags" / "catalog" / "metric_groups.yaml")


def test_mwaa_startup_refuses_a_tarball_with_the_wrong_sum(tmp_path: Path) -> None:
    done = run_startup(tmp_path, sha="0" * 64)
    assert done.returncode != 0 and "is not PROMTOOL_SHA256" in done.stderr
    assert not (tmp_path / "promtool" / "promtool").exists()
