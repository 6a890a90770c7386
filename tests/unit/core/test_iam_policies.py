"""deploy/iam: the policy documents are valid IAM (a maintained linter), and they allow what the code calls.

- parliament lints every document with example values in its placeholders: unknown actions, malformed ARNs,
  resources that do not fit an action. Its action database lags AWS: an action it does not know passes only when
  botocore's own service model has that operation (evidence that the action is real, and newer than the linter).
- Every AWS call in production code (``include/promshift`` without ``local/``) is collected from the source:
  botocore client methods, paginators and waiters of the services promshift builds clients for, the Prometheus
  HTTP paths it sends to the workspace (SigV4-signed: ``aps:QueryMetrics`` ...), and the calls providers make on
  its behalf (SNS notifier, object storage for reports, an assumed role). Each must be allowed by a statement of
  the role ``features.yaml`` names for it; a new call without its action fails here.
- The other way round, least privilege: every action the policies allow is one of those calls or a documented
  call AWS makes on our behalf (the managed collector's ``aws:CalledVia`` reads).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.resources
import json
import re
import sys
import types
import warnings
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml
from botocore import xform_name

from promshift.core.deploy_kinds import DEPLOYS

ROOT = Path(__file__).resolve().parents[3]
IAM = ROOT / "deploy" / "iam"
PACKAGE = ROOT / "include" / "promshift"

EXAMPLE_VALUES = {
    "Region": "us-west-2", "Account": "111122223333", "WorkspaceAccount": "444455556666",
    "WorkspaceId": "ws-12345678-abcd-1234-abcd-123456789012", "ClusterName": "gpu-fleet",
    "ReportsBucket": "promshift-reports", "ReportsPrefix": "reports/", "AnchorBucket": "promshift-anchor",
    "AnchorPrefix": "anchor/", "TopicName": "promshift-oncall", "WorkspaceRoleName": "promshift-amp",
    "OidcProvider": "oidc.eks.us-west-2.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE",
    "Namespace": "airflow", "WorkerServiceAccount": "airflow-worker", "WorkerPodServiceAccount": "airflow-worker-pod",
    "TriggererServiceAccount": "airflow-triggerer", "ApiServerServiceAccount": "airflow-api-server",
    "WriterNamespace": "monitoring", "WriterServiceAccount": "prometheus-server",
    "WriterIdentityRoleName": "prometheus-server-irsa",
    "SesIdentity": "example.com",
    "IdentityStoreAccount": "777788889999", "IdentityStoreId": "d-9067642ac7",
}
PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# botocore service name -> IAM action prefix (the signing name is not always it: CloudWatch signs as "monitoring").
IAM_PREFIX = {"amp": "aps", "service-quotas": "servicequotas", "cloudwatch": "cloudwatch", "s3": "s3",
              "identitystore": "identitystore"}
# Production modules that call AWS through botocore clients, and the services of those clients.
AWS_MODULES: dict[str, tuple[str, ...]] = {
    "adapters/amp.py": ("amp",),
    "adapters/amp_scraper.py": ("amp",),
    "adapters/rules_deploy.py": ("amp",),
    "adapters/amp_quota.py": ("service-quotas", "cloudwatch"),
    "adapters/amp_tenants.py": ("amp",),
    "adapters/ingest_health.py": ("cloudwatch",),
    "adapters/audit_anchor.py": ("s3",),
    "adapters/identity_store_teams.py": ("identitystore",),
}
# Method names elsewhere that happen to be an AWS operation's name, and what they really are.
NOT_AWS: dict[tuple[str, str], str] = {
    ("adapters/grafana.py", "get_dashboard"): "Grafana's HTTP API",
    ("board/pages.py", "get_template"): "Jinja's environment",
    ("adapters/usage.py", "get_dashboard"): "Grafana's HTTP API (the plan's dashboards)",
}
# Operations whose IAM action is not prefix:Operation.
ACTION_OF_OPERATION = {
    ("s3", "ListObjectsV2"): ("s3:ListBucket",),
    ("s3", "ListObjectVersions"): ("s3:ListBucketVersions",),
}
# Keyword arguments that need one more action.
ACTION_OF_KEYWORD = {
    ("s3", "GetObject", "VersionId"): "s3:GetObjectVersion",
    ("s3", "PutObject", "ObjectLockMode"): "s3:PutObjectRetention",
    ("amp", "CreateScraper", "tags"): "aps:TagResource",
}
# Prometheus HTTP API paths in production code: the action a workspace checks, or why none is needed.
HTTP_ACTIONS: dict[str, tuple[str, str]] = {
    "/api/v1/query": ("airflow", "aps:QueryMetrics"),
    "/api/v1/query_range": ("airflow", "aps:QueryMetrics"),
    "/api/v1/labels": ("airflow", "aps:GetLabels"),
    "/api/v1/label/": ("airflow", "aps:GetLabels"),
    "/api/v1/series": ("airflow", "aps:GetSeries"),
    "/api/v1/metadata": ("airflow", "aps:GetMetricMetadata"),
    "/api/v1/rules": ("airflow", "aps:ListRules"),
    "/api/v1/alerts": ("airflow", "aps:ListAlerts"),
    "/api/v1/remote_write": ("source-writer", "aps:RemoteWrite"),
    "/api/v2/alerts": ("airflow", "aps:ListAlerts"),  # the workspace's Alertmanager API (alertmanager/api/v2)
}
SOURCE_ONLY_PATHS = {
    "/api/v1/status/config": "the source Prometheus's loaded config (AMP has no status API)",
    "/api/v1/status/runtimeinfo": "a self-hosted server's retention (AMP's is read from the catalog)",
    "/api/v1/admin/tsdb/delete_series": "a self-hosted server's admin API",
    "/api/v1/status/tsdb": "the plan's inventory of the source (AMP has no status API)",
    "/api/v1/status/buildinfo": "the source Prometheus's version, for validate's promtool check (AMP has none)",
}
# Paths a module sends only to the source, whatever the workspace would need for them.
SOURCE_ONLY_IN = {
    ("adapters/usage.py", "/api/v1/series"): "the plan reads the source's series (promshift plan --source)",
    ("adapters/usage.py", "/api/v1/rules"): "the plan reads the source's rules",
    ("adapters/usage.py", "/api/v1/metadata"): "the plan reads the source's metric types",
}
# Calls a provider or the SDK makes for us: (text that shows the code uses it, role, actions).
PROVIDER_CALLS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("orchestration/notify.py", "SnsNotifier", "airflow", ("sns:Publish",)),
    # SesHook.send_email is send_raw_email (amazon provider 9.39).
    ("orchestration/notify.py", "SesNotifier", "airflow", ("ses:SendRawEmail",)),
    ("orchestration/report_store.py", "ObjectStoragePath", "airflow",
     ("s3:PutObject", "s3:GetObject", "s3:ListBucket")),
    ("orchestration/amp_hook.py", "role_arn", "airflow", ("sts:AssumeRole",)),
)
# What the deployment files make Airflow call, for each component's role (repository path, marker, role, actions).
DEPLOY_CALLS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("deploy/helm/values.yaml", "SecretsManagerBackend", "airflow", ("secretsmanager:GetSecretValue",)),
    ("deploy/helm/values.yaml", "SecretsManagerBackend", "api-server", ("secretsmanager:GetSecretValue",)),
)
# What the board, on the API server, reads: the reports it serves (ObjectStoragePath reads) and the anchor's reads
# (the anchor module's calls that only read; ``ANCHOR_MODULE`` below).
BOARD_CALLS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("board/app.py", "read_published", "api-server", ("s3:GetObject", "s3:ListBucket")),
)
ANCHOR_MODULE = "adapters/audit_anchor.py"
READ_VERBS = ("Get", "List", "Describe")
# Actions AWS performs on our behalf during CreateScraper (aws:CalledVia aps), never called by our code.
ON_OUR_BEHALF = {"eks:DescribeCluster", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                 "iam:CreateServiceLinkedRole"}
# parliament cannot know an account's own OIDC provider, and a trust policy has no Resource by definition.
TRUST_FINDINGS_OK = {"UNKNOWN_FEDERATION_SOURCE"}
TRUST_MALFORMED_OK = "Statement contains neither Resource nor NotResource"


def _parliament() -> Any:
    """parliament imports ``pkg_resources`` (gone from setuptools 81) for two data files; give it that function."""
    if "pkg_resources" not in sys.modules:
        shim = types.ModuleType("pkg_resources")
        shim.resource_filename = lambda package, name: str(importlib.resources.files(package) / name)  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = shim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import parliament
    return parliament


def filled(text: str) -> str:
    missing = sorted({name for name in PLACEHOLDER.findall(text) if name not in EXAMPLE_VALUES})
    assert not missing, f"placeholders without an example value: {missing}"
    return PLACEHOLDER.sub(lambda m: EXAMPLE_VALUES[m.group(1)], text)


@cache
def features() -> dict[str, Any]:
    return yaml.safe_load((IAM / "features.yaml").read_text())


def document(name: str) -> dict[str, Any]:
    return json.loads(filled((IAM / name).read_text()))


def statements(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = doc["Statement"]
    return [found] if isinstance(found, dict) else list(found)


def as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def role_policy(role: str) -> dict[str, Any]:
    return document(features()["roles"][role]["policy"])


def allows(policy: Mapping[str, Any], action: str, sids: Iterable[str] | None = None) -> bool:
    wanted = set(sids) if sids is not None else None
    return any(st["Effect"] == "Allow" and (wanted is None or st.get("Sid") in wanted)
               and any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in as_list(st["Action"]))
               for st in statements(policy))


def listed_sids(role: str) -> set[str]:
    return {sid for feature in features()["features"].values() for sid in feature.get(role, [])}


@cache
def boto_operations() -> dict[str, dict[str, str]]:
    """service -> {python method name: operation name} from botocore's own models (no network)."""
    session = botocore.session.get_session()
    return {service: {xform_name(op): op for op in session.get_service_model(service).operation_names}
            for service in IAM_PREFIX}


def production_modules() -> list[tuple[str, ast.Module, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith("local/"):
            text = path.read_text()
            found.append((rel, ast.parse(text), text))
    return found


def aws_calls(modules: list[tuple[str, ast.Module, str]]) -> tuple[dict[str, set[str]], list[str]]:
    """(role -> actions the code needs, problems): every client call, paginator and waiter, HTTP path, provider."""
    needed: dict[str, set[str]] = {"airflow": set(), "api-server": set(), "source-writer": set()}
    problems: list[str] = []
    every_op = {name for ops in boto_operations().values() for name in ops}
    for rel, tree, _text in modules:
        services = AWS_MODULES.get(rel, ())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name in ("get_paginator", "get_waiter") and node.args and isinstance(node.args[0], ast.Constant):
                    name = str(node.args[0].value)
                    if node.func.attr == "get_waiter":
                        problems.append(f"{rel}: waiter {name!r}: add the waiter's operation to this test")
                        continue
                elif name not in every_op:
                    continue
                owners = [s for s in services if name in boto_operations()[s]]
                if not owners:
                    if (rel, name) not in NOT_AWS and name in every_op:
                        problems.append(f"{rel}: {name}() is an AWS operation's name in a module this test does "
                                        "not know as an AWS caller (AWS_MODULES or NOT_AWS)")
                    continue
                service = owners[0]
                operation = boto_operations()[service][name]
                actions = set(ACTION_OF_OPERATION.get((service, operation), (f"{IAM_PREFIX[service]}:{operation}",)))
                keywords = {kw.arg for kw in node.keywords if kw.arg} | (
                    {"VersionId"} if any(kw.arg is None for kw in node.keywords) else set())
                actions |= {action for (svc, op, kw), action in ACTION_OF_KEYWORD.items()
                            if svc == service and op == operation and kw in keywords}
                needed["airflow"] |= actions
                if rel == ANCHOR_MODULE:  # the board verifies the chain against the anchor: its reads only
                    needed["api-server"] |= {a for a in actions if a.split(":")[1].startswith(READ_VERBS)}
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(("/api/v1/", "/api/v2/")):
                path = node.value
                if path in SOURCE_ONLY_PATHS or (rel, path) in SOURCE_ONLY_IN:
                    continue
                key = next((p for p in HTTP_ACTIONS if path == p or (p.endswith("/") and path.startswith(p))), None)
                if key is None:
                    problems.append(f"{rel}: HTTP path {path!r}: say which aps action it needs (HTTP_ACTIONS) or "
                                    "why none (SOURCE_ONLY_PATHS)")
                    continue
                role, action = HTTP_ACTIONS[key]
                needed[role].add(action)
    texts = {rel: text for rel, _, text in modules}
    for rel, marker, role, actions in DEPLOY_CALLS:
        if marker in (ROOT / rel).read_text():
            needed[role] |= set(actions)
        else:
            problems.append(f"{rel} no longer uses {marker}: update DEPLOY_CALLS")
    for rel, marker, role, actions in PROVIDER_CALLS + BOARD_CALLS:
        if marker in texts.get(rel, ""):
            needed[role] |= set(actions)
        else:
            problems.append(f"{rel} no longer uses {marker}: update PROVIDER_CALLS")
    return needed, problems


def uncovered(needed: Mapping[str, set[str]]) -> list[str]:
    return sorted(f"{role}: {action}" for role, actions in needed.items() for action in actions
                  if not allows(role_policy(role), action, listed_sids(role)))


# -- the documents ------------------------------------------------------------------------------------------


def test_every_document_is_json_with_known_placeholders():
    names = sorted(p.name for p in IAM.glob("*.json"))
    assert names, "deploy/iam holds no policy document"
    for name in names:
        doc = document(name)
        assert doc["Version"] == "2012-10-17", name
        sids = [st.get("Sid") for st in statements(doc)]
        assert all(sids) and len(set(sids)) == len(sids), f"{name}: every statement needs its own Sid: {sids}"


def test_the_linter_finds_nothing_in_the_permission_policies():
    parliament = _parliament()
    for role in features()["roles"].values():
        name = role["policy"]
        findings = parliament.analyze_policy_string(filled((IAM / name).read_text())).findings
        left = []
        for finding in findings:
            if finding.issue == "UNKNOWN_ACTION":
                prefix, _, operation = finding.location["string"].partition(":")
                service = next((s for s, p in IAM_PREFIX.items() if p == prefix), None)
                if service and operation in boto_operations()[service].values():
                    continue  # newer than the linter's database; botocore's model has it
            left.append((finding.issue, finding.detail))
        assert not left, f"{name}: {left}"


def test_the_linter_finds_nothing_in_the_trust_policies():
    parliament = _parliament()
    trusts = sorted({t for role in features()["roles"].values() for t in role["trust"]})
    assert trusts == sorted(p.name for p in IAM.glob("trust-*.json"))  # every trust document belongs to a role
    assert len(trusts) == 7
    for name in trusts:
        findings = parliament.analyze_policy_string(filled((IAM / name).read_text())).findings
        left = [(f.issue, f.detail) for f in findings
                if f.issue not in TRUST_FINDINGS_OK and not (f.issue == "MALFORMED" and f.detail == TRUST_MALFORMED_OK)]
        assert not left, f"{name}: {left}"
    irsa = statements(document("trust-irsa.json"))[0]
    assert irsa["Action"] == "sts:AssumeRoleWithWebIdentity"
    provider = EXAMPLE_VALUES["OidcProvider"]
    condition = irsa["Condition"]["StringEquals"]
    assert condition[f"{provider}:aud"] == "sts.amazonaws.com"
    assert all(sub.startswith("system:serviceaccount:airflow:") for sub in condition[f"{provider}:sub"])
    pods = statements(document("trust-pod-identity.json"))[0]
    assert pods["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(pods["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    assert "aws:RequestTag/kubernetes-service-account" in pods["Condition"]["StringEquals"]


def service_accounts_trusted(name: str) -> set[str]:
    """The service accounts (namespace:name) an IRSA or Pod Identity trust document names."""
    found: set[str] = set()
    for st in statements(document(name)):
        condition = st.get("Condition", {}).get("StringEquals", {})
        for key, value in condition.items():
            if key.endswith(":sub"):
                found |= {v.removeprefix("system:serviceaccount:") for v in as_list(value)}
            elif key == "aws:RequestTag/kubernetes-service-account":
                ns = condition["aws:RequestTag/kubernetes-namespace"]
                found |= {f"{ns}:{v}" for v in as_list(value)}
    return found


def test_each_identity_is_trusted_by_its_own_service_accounts_only():
    """The control plane: the Celery workers, the KubernetesExecutor's pods, the triggerer; the API server alone
    assumes the read-only role; the source Prometheus alone the writer's (by IRSA or Pod Identity)."""
    ex = EXAMPLE_VALUES
    control = {f"airflow:{ex[k]}" for k in ("WorkerServiceAccount", "WorkerPodServiceAccount",
                                            "TriggererServiceAccount")}
    expected = {"airflow": control, "api-server": {f"airflow:{ex['ApiServerServiceAccount']}"},
                "source-writer": {f"{ex['WriterNamespace']}:{ex['WriterServiceAccount']}"}}
    for role, spec in features()["roles"].items():
        for trust in spec["trust"]:
            if trust != "trust-source-writer-assumed.json":
                assert service_accounts_trusted(trust) == expected[role], (role, trust)


def test_the_writer_is_assumed_by_its_own_identity_never_by_itself():
    """With the connection's writer_role_arn, the writer's own (IRSA) role assumes the writer role; a role named as
    its own principal is the self-assume trap (aws-ia/terraform-aws-eks-blueprints-addons#266), and promshift's
    control-plane role never appears."""
    (st,) = statements(document("trust-source-writer-assumed.json"))
    assert st["Action"] == "sts:AssumeRole"
    principal = st["Principal"]["AWS"]
    assert principal == f"arn:aws:iam::{EXAMPLE_VALUES['Account']}:role/{EXAMPLE_VALUES['WriterIdentityRoleName']}"
    writer_role = Path(features()["roles"]["source-writer"]["policy"]).stem
    assert not principal.endswith((f"role/{writer_role}", "role/promshift-airflow"))
    assert "#266" in (IAM / "features.yaml").read_text()


def test_the_api_server_role_only_reads():
    needed, _ = aws_calls(production_modules())
    allowed = {action for st in statements(role_policy("api-server")) for action in as_list(st["Action"])}
    assert allowed == needed["api-server"] == {
        "s3:GetObject", "s3:ListBucket", "s3:GetObjectVersion", "s3:ListBucketVersions",
        "secretsmanager:GetSecretValue"}
    assert all(a.split(":")[1].startswith(READ_VERBS) for a in allowed)
    assert uncovered({"api-server": needed["api-server"]}) == []
    # the control plane's writes are not the API server's
    assert not allows(role_policy("api-server"), "s3:PutObject") and not allows(role_policy("api-server"),
                                                                                  "aps:CreateScraper")


def test_scraper_actions_hold_only_for_scrapers_promshift_tagged():
    """promshift tags a scraper managed-by=promshift when it creates it (adapters/amp_scraper.py); describe, update
    and delete on scrapers are allowed on that tag alone, and the create and its tagging only with it."""
    source = (PACKAGE / "adapters" / "amp_scraper.py").read_text()
    tag = re.search(r'tags=\{"managed-by": "([^"]+)"', source)
    assert tag, "amp_scraper.py no longer tags what it creates"
    policy = role_policy("airflow")
    scraper_arn = f"arn:aws:aps:{EXAMPLE_VALUES['Region']}:{EXAMPLE_VALUES['Account']}:scraper/*"
    for st in statements(policy):
        actions = set(as_list(st["Action"]))
        if scraper_arn in as_list(st["Resource"]) and actions & {"aps:DescribeScraper", "aps:UpdateScraper",
                                                                   "aps:DeleteScraper"}:
            assert st["Condition"]["StringEquals"] == {"aws:ResourceTag/managed-by": tag.group(1)}, st["Sid"]
        if actions & {"aps:CreateScraper", "aps:TagResource"}:
            assert st["Condition"]["StringEquals"]["aws:RequestTag/managed-by"] == tag.group(1), st["Sid"]
    sids = {st["Sid"] for st in statements(policy)}
    assert {"AmpScrapersManagedByPromshift", "AmpScraperTagOnCreate"} <= sids


def test_the_linter_would_catch_a_bad_document():
    parliament = _parliament()
    bad = {"Version": "2012-10-17", "Statement": [
        {"Sid": "Typo", "Effect": "Allow", "Action": ["aps:QueryMetric"], "Resource": "*"},
        {"Sid": "WrongArn", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::bucket"}]}
    issues = {f.issue for f in parliament.analyze_policy_string(json.dumps(bad)).findings}
    assert {"UNKNOWN_ACTION", "RESOURCE_MISMATCH"} <= issues


def test_features_name_existing_statements_and_every_statement_is_needed():
    spec = features()
    for role, files in spec["roles"].items():
        sids = {st["Sid"] for st in statements(document(files["policy"]))}
        named = listed_sids(role)
        assert named <= sids, f"{role}: features.yaml names statements that do not exist: {sorted(named - sids)}"
        assert sids <= named, f"{role}: statements no feature needs: {sorted(sids - named)}"


def test_every_deploy_kind_says_what_it_needs():
    kinds = {name.removeprefix("deploy:") for name in features()["features"] if name.startswith("deploy:")}
    assert kinds == set(DEPLOYS), f"deploy kinds without an IAM entry (or stale ones): {sorted(kinds ^ set(DEPLOYS))}"


# -- the code against the documents ---------------------------------------------------------------------------


def test_every_aws_call_the_code_makes_is_allowed():
    needed, problems = aws_calls(production_modules())
    assert not problems, "\n".join(problems)
    assert {"aps:DescribeWorkspace", "aps:QueryMetrics", "aps:CreateScraper", "servicequotas:GetServiceQuota",
            "cloudwatch:GetMetricData", "s3:PutObjectRetention", "sns:Publish",
            "ses:SendRawEmail", "secretsmanager:GetSecretValue"} <= needed["airflow"]
    assert needed["source-writer"] == {"aps:RemoteWrite"}
    assert uncovered(needed) == []


def test_a_new_call_without_its_action_fails():
    code = ("def more(client):\n    client.delete_workspace(workspaceId='w')\n"
            "    client.get_paginator('list_rule_groups_namespaces')\n")
    modules = [*production_modules(), ("adapters/amp.py", ast.parse(code), code)]
    needed, problems = aws_calls(modules)
    assert not problems
    assert uncovered(needed) == ["airflow: aps:DeleteWorkspace", "airflow: aps:ListRuleGroupsNamespaces"]
    strange = "def f(c):\n    c.get_dashboard(DashboardName='x')\n    return '/api/v1/targets'\n"
    _, problems = aws_calls([("adapters/new.py", ast.parse(strange), strange)])
    assert any("get_dashboard() is an AWS operation's name" in p for p in problems)
    assert any("'/api/v1/targets'" in p for p in problems)


def test_policies_allow_nothing_the_code_does_not_need():
    needed, _ = aws_calls(production_modules())
    for role in features()["roles"]:
        allowed = {action for st in statements(role_policy(role)) for action in as_list(st["Action"])}
        extra = sorted(a for a in allowed - needed[role] - ON_OUR_BEHALF if "*" not in a)
        assert not extra, f"{role}: allowed but never called: {extra}"
        assert not [a for a in allowed if "*" in a], f"{role}: wildcard actions"


@pytest.mark.parametrize("sid", ["ScraperReadsTheCluster", "ScraperReadsTheNetwork"])
def test_on_our_behalf_reads_are_only_through_aps(sid):
    st = next(s for s in statements(role_policy("airflow")) if s["Sid"] == sid)
    assert st["Condition"] == {"ForAnyValue:StringEquals": {"aws:CalledVia": ["aps.amazonaws.com"]}}


def test_the_secrets_backend_reads_only_the_prefixes_the_helm_values_name():
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "values.yaml").read_text())
    kwargs = json.loads(values["config"]["secrets"]["backend_kwargs"])
    prefixes = {kwargs["connections_prefix"], kwargs["variables_prefix"]}
    st = next(s for s in statements(json.loads((IAM / "promshift-airflow.json").read_text()))
              if s["Sid"] == "SecretsBackendRead")
    assert as_list(st["Action"]) == ["secretsmanager:GetSecretValue"]
    assert sorted(as_list(st["Resource"])) == sorted(
        f"arn:aws:secretsmanager:${{Region}}:${{Account}}:secret:{prefix}/*" for prefix in prefixes)
