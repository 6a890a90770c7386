"""The strict local AMP against real servers: each refusal class answered as AMP answers it, counted in
DiscardedSamples, and promshift's one-line verdict naming the reason (warm-up FAILED, parity not SUCCESSFUL).

One AMP stack for the module (2 nodes, 1 s scrapes). Limits are set small per test through the control plane's
answers (``faults.json``: ``aps_quotas``, ``aps_limits``) and cleared after; every test writes its own metric
names, so one test's refusals are not another's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
import requests
import yaml
from botocore.credentials import Credentials

from promshift.adapters.ingest_health import with_ingestion_health, workspace_discards
from promshift.adapters.parity_check import ParityCheck
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.adapters.settings import load_catalog
from promshift.adapters.sigv4 import AwsSigV4Auth
from promshift.core.ingest_limits import (
    DUPLICATE,
    OUT_OF_ORDER,
    RATE_LIMITED,
    SERIES_LIMIT,
    TOO_MANY_LABELS,
    TOO_OLD,
)
from promshift.core.render import remote_write_entry
from promshift.core.verdicts import Verdict
from promshift.core.warmup import assess_warmup, observe_warmup
from promshift.local.stack.amp_ingest import Series, encode_write_request, snappy_compress
from promshift.local.stack.local import LocalStack, StackConfig
from promshift.local.stack.sigv4 import sign_request
from tests.integration.conftest import eventually, running_amp_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(stack_config_factory: Callable[..., StackConfig]) -> Iterator[LocalStack]:
    with running_amp_stack(stack_config_factory) as amp:
        yield amp


@pytest.fixture(autouse=True)
def clear_limits(stack: LocalStack) -> Iterator[None]:
    yield
    stack.set_aws_faults()
    time.sleep(1.2)  # the front door re-reads its limits at most once a second


def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def write(stack: LocalStack, series: list[Series]) -> requests.Response:
    """A remote write signed as the relay signs it."""
    body = snappy_compress(encode_write_request(series))
    url = stack.prometheus_endpoint() + "api/v1/remote_write"
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
               "X-Prometheus-Remote-Write-Version": "0.1.0"}
    signed = sign_request("POST", url, credentials=stack.aws_credentials(), region=stack.config.region, body=body,
                          headers=headers)
    return http().post(url, data=body, headers={**headers, **signed}, timeout=30)


def one(name: str, t_ms: int, value: float = 1.0, **labels: str) -> Series:
    return Series((("__name__", name),) + tuple(sorted(labels.items())), [(t_ms, value)])


def now_ms() -> int:
    return int(time.time() * 1000)


def workspace_client(stack: LocalStack) -> PrometheusClient:
    pair = stack.aws_credentials()
    creds = Credentials(pair.access_key, pair.secret_key, pair.session_token)
    return PrometheusClient(stack.prometheus_endpoint(), timeout_s=30, auth=AwsSigV4Auth(creds, stack.config.region))


def discards_reader(stack: LocalStack) -> Callable[[datetime, datetime], dict[str, float]]:
    """The workspace's DiscardedSamples through the local AWS's CloudWatch, as the AMP hook reads them."""
    pair = stack.aws_credentials()
    cloudwatch = boto3.client("cloudwatch", region_name=stack.config.region, endpoint_url=stack.aws_url,
                              aws_access_key_id=pair.access_key, aws_secret_access_key=pair.secret_key,
                              aws_session_token=pair.session_token)
    workspace = stack.workspace_id
    assert workspace
    return lambda since, now: workspace_discards(cloudwatch, workspace, since=since, now=now)


def warmup_verdict(stack: LocalStack, *, group_name: str, selector: str, since: datetime, reason: str) -> str:
    """promshift's warm-up on the group once the workspace's discards are published: its one line."""
    read = discards_reader(stack)
    source, target = PrometheusClient(stack.source_url, timeout_s=30), workspace_client(stack)

    def failed() -> Any:
        now = datetime.now(UTC)
        obs = observe_warmup(group_name=group_name, selector=selector, source=source, target=target,
                             elapsed_s=(now - since).total_seconds())
        obs = with_ingestion_health(obs, read_discards=read, source=source, target=target, selector=selector,
                                    since=since, now=now)
        status = assess_warmup(obs, min_duration_s=3600, timeout_s=7200, max_lag_s=None)
        return status if status.state == "failed" and reason in status.reason else None

    status = eventually(failed, timeout=60, message=f"warm-up never failed on {reason}")
    line = f"warm-up {status.state}: {status.reason}"
    print(line)
    return line


def front_door_discards(stack: LocalStack) -> dict[str, Any]:
    answer = http().get(f"{stack.frontdoor_url}/-/discarded-samples", timeout=10).json()
    return dict(answer[stack.workspace_id])


def test_default_limits_take_a_clean_write_and_count_nothing(stack: LocalStack) -> None:
    t = now_ms()
    ok = write(stack, [one("strict_clean", t, gpu=str(i)) for i in range(8)])
    assert ok.status_code == 200, ok.text
    got = eventually(lambda: workspace_client(stack).scalar("count(strict_clean)"), timeout=20)
    assert got == 8
    assert not {k: v for k, v in front_door_discards(stack)["discarded"].items() if k.startswith("strict")}


def test_too_old_out_of_order_and_duplicate_samples(stack: LocalStack) -> None:
    since = datetime.now(UTC) - timedelta(seconds=1)
    t = now_ms()
    assert write(stack, [one("strict_order", t, host="a")]).status_code == 200
    old = write(stack, [one("strict_old", t - 2 * 3600 * 1000, host="a")])
    assert (old.status_code, old.text.strip()) == (400, "out of bounds; series: 'strict_old{host=\"a\"}'")
    late = write(stack, [one("strict_order", t - 120_000, host="a")])
    assert (late.status_code, late.text.split(";")[0]) == (400, "out of order sample")
    assert write(stack, [one("strict_order", t - 30_000, host="a")]).status_code == 200  # inside the 60 s window
    dup = write(stack, [one("strict_order", t, 2.0, host="a")])
    assert (dup.status_code, dup.text.split(";")[0]) == (400, "duplicate sample for timestamp")
    assert write(stack, [one("strict_order", t, 1.0, host="a")]).status_code == 200  # the same value: ignored
    counts = front_door_discards(stack)["discarded"]
    assert counts[TOO_OLD] >= 1 and counts[OUT_OF_ORDER] >= 1 and counts[DUPLICATE] >= 1
    line = warmup_verdict(stack, group_name="strict-old", selector='{__name__=~"strict_old|strict_order"}',
                          since=since, reason=TOO_OLD)
    assert line.startswith("warm-up failed: ingestion refused: the workspace discarded ")
    assert f"({OUT_OF_ORDER})" in line and f"({DUPLICATE})" in line


def test_too_many_labels_on_the_relayed_group_fails_warmup_naming_a_series(stack: LocalStack) -> None:
    """The real write path: the source's remote_write entry for gpu-power-thermal, through the signing relay, into
    a workspace allowing 3 labels per series (DCGM series carry more): every series refused, the writer none."""
    group = load_catalog(profile="demo").get("gpu-power-thermal")
    stack.set_aws_faults(aps_quotas={"labels_per_series": 3})
    since = datetime.now(UTC)
    undo = dual_write(stack, group)
    try:
        line = warmup_verdict(stack, group_name=group.name, selector=group.selector(), since=since,
                              reason=TOO_MANY_LABELS)
        assert "too many labels per series (max_label_names_per_series)" in line
        assert "(DiscardedSamples); e.g. series DCGM_FI_" in line
        assert 'instance="' in line.rsplit("e.g. series ", 1)[1]
        assert not workspace_client(stack).query(group.selector()).series  # nothing of the group landed
    finally:
        undo()


def test_rate_limit_refuses_the_whole_request_with_429(stack: LocalStack) -> None:
    stack.set_aws_faults(aps_quotas={"ingestion_rate": 10, "ingestion_burst": 20})
    since = datetime.now(UTC) - timedelta(seconds=1)
    time.sleep(1.5)  # the front door re-reads its limits at most once a second
    t = now_ms()
    refused = write(stack, [one("strict_rate", t, gpu=str(i)) for i in range(30)])
    assert (refused.status_code, refused.text.strip()) == (
        429, "ingestion rate limit (10) exceeded while adding 30 samples and 0 metadata")
    assert workspace_client(stack).scalar("count(strict_rate)") is None
    line = warmup_verdict(stack, group_name="strict-rate", selector='{__name__="strict_rate"}', since=since,
                          reason=RATE_LIMITED)
    assert "30 ingestion rate limit (rate_limited)" in line


def test_series_limit_follows_the_adaptive_capacity(stack: LocalStack) -> None:
    active = front_door_discards(stack)["active_series"]
    stack.set_aws_faults(aps_quotas={"active_series": active + 1}, aps_limits={"series_floor": 1})
    since = datetime.now(UTC) - timedelta(seconds=1)
    time.sleep(1.5)
    t = now_ms()
    refused = write(stack, [one("strict_series", t, gpu=str(i)) for i in range(4)])
    assert refused.status_code == 429
    capacity = front_door_discards(stack)["capacity"]
    assert capacity <= active + 1
    assert refused.text.strip() == f"per-user series limit of {capacity:.0f} exceeded, please contact administrator " \
                                   "to raise it"
    line = warmup_verdict(stack, group_name="strict-series", selector='{__name__="strict_series"}', since=since,
                          reason=SERIES_LIMIT)
    assert "active series limit (per_user_series_limit)" in line


def dual_write(stack: LocalStack, group: Any) -> Callable[[], None]:
    """The group's remote_write entry on the source, through the signing relay; returns the undo."""
    before = stack.source_config_path.read_text()
    config = yaml.safe_load(before)
    config.setdefault("remote_write", []).append(remote_write_entry(
        group_name=group.name, name_regex=group.name_regex(), drop_labels=group.drop_labels,
        url=stack.relay_remote_write_url, sigv4=None))
    stack.source_config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert http().post(f"{stack.source_url}/-/reload", timeout=60).status_code == 200

    def undo() -> None:
        stack.source_config_path.write_text(before)
        http().post(f"{stack.source_url}/-/reload", timeout=60)
    return undo


def test_query_too_large_is_422_and_parity_is_not_successful(stack: LocalStack) -> None:
    t = now_ms()
    for step in range(20):
        assert write(stack, [one("strict_query", t - (20 - step) * 1000, float(step), gpu=str(g))
                             for g in range(4)]).status_code == 200
    target = workspace_client(stack)
    assert target.scalar("count(strict_query)") == 4
    demo = load_catalog(profile="demo").get("gpu-utilization")
    group = dataclasses.replace(demo, parity=dataclasses.replace(demo.parity, skip_recent_s=2, step_s=5))
    undo = dual_write(stack, group)
    try:
        source = PrometheusClient(stack.source_url, timeout_s=30)
        started = time.time()
        eventually(lambda: (target.scalar(f"count({group.selector()})") or 0)
                   >= (source.scalar(f"count({group.selector()})") or 1) or None, timeout=60,
                   message="the relayed group never landed in the workspace")
        time.sleep(15)
        stack.set_aws_faults(aps_limits={"query_samples": 10})
        time.sleep(1.5)
        with pytest.raises(PrometheusError) as too_many:
            target.query("sum_over_time(strict_query[1m])")
        assert too_many.value.http_status == 422
        assert "query processing would load too many samples into memory in query execution" in str(too_many.value)
        end = time.time()
        with pytest.raises(PrometheusError) as too_long:
            target.query_range("strict_query", start=end - 33 * 86400, end=end, step=3600)
        assert too_long.value.http_status == 422 and "the query time range exceeds the limit" in str(too_long.value)
        # promshift's parity on the dual-written group: refused queries never make a SUCCESSFUL verdict
        result = ParityCheck(group, source, target).run(dual_write_since=started, now=time.time())
        reasons = [f"{m.name} {m.verdict.value}: {m.reason}" for m in result.not_passed()]
        print(f"parity {result.verdict.value}: {reasons[:2]}")
        assert result.verdict != Verdict.SUCCESSFUL
        # the refusal is named: split and asked again (issue 35 item 2); where no split fits, INCONCLUSIVE naming it
        assert any("too many samples" in r or "422" in r or "refused for size (samples)" in r for r in reasons), reasons
    finally:
        undo()


def test_the_file_path_runs_the_quota_preflight_and_refuses_past_the_capacity(
        stack: LocalStack, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy_dual_write on the remote_write (file) path, through the group's DAG: the workspace's current capacity
    (2 series here) is under the group's series, so nothing is deployed and the audit says why, with the numbers."""
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from promshift.adapters.audit_store import AuditStore
    from promshift.adapters.settings import default_catalog_path
    from promshift.local.group_dag import build_group_dag
    from tests.fakes import FakeTI, fed

    pair = stack.aws_credentials()
    monkeypatch.setenv("PROMSHIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PROMSHIFT_AUDIT_URL", f"sqlite:///{tmp_path / 'audit.db'}")
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_SOURCE", json.dumps({
        "conn_type": "prometheus", "host": stack.source_url, "extra": {"config_path": str(stack.source_config_path)}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMSHIFT_TARGET", json.dumps({
        "conn_type": "amp", "login": pair.access_key, "password": pair.secret_key,
        "extra": stack.amp_connection_extra()}))
    stack.publish_usage()
    stack.set_aws_faults(aps_quotas={"active_series": 2})
    config_before = stack.source_config_path.read_bytes()
    g = load_catalog(profile="demo").get("gpu-clocks")
    dag = build_group_dag(g, catalog_path=default_catalog_path(), profile="demo")
    context = {"run_id": "manual__strict-file-path", "ti": FakeTI()}
    snap = dag.get_task("snapshot").execute(context)
    with pytest.raises(AirflowFailException, match=r"^quota pre-flight refused: ") as refused:
        fed(dag, "deploy_dual_write", snapshot=snap).execute(context)
    print(refused.value)
    assert stack.source_config_path.read_bytes() == config_before  # nothing deployed
    events = [e for e in AuditStore().events() if e.group == g.name and e.run_id == context["run_id"]]
    assert [e.kind for e in events] == ["snapshot_taken", "quota_refused"]
    quota = (events[-1].evidence_data or {})["deploy"]["quota"]
    assert quota["limit"] == 2 and quota["group_series"] > 2 and quota["capacity"] == 2
    assert quota["labels_per_series"]["limit"] == 70 and quota["labels_per_series"]["group"] > 5
