"""The pure parts of the managed-collector path: the deploy seam's values and fake, the blob, the status
assessor, the quota maths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from promshift.core.deploy import (
    ConfigDeployer,
    DeployError,
    DeployResult,
    DeploySnapshot,
    DeployState,
    InMemoryConfigDeployer,
    InMemorySnapshotStore,
    SnapshotStore,
)
from promshift.core.quota import assess_quota
from promshift.core.scraper_config import (
    ScraperConfigError,
    ScraperLimits,
    assess_scraper,
    keep_regexes,
    render_scraper_config,
    scraper_alias,
    validate_scraper_config,
)

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
REGEX = "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL"


# -- the deploy seam -------------------------------------------------------------------------

def test_the_fake_and_the_store_fit_the_protocols_and_round_trip() -> None:
    deployer = InMemoryConfigDeployer("old", "new")
    store = InMemorySnapshotStore()
    assert isinstance(deployer, ConfigDeployer) and isinstance(store, SnapshotStore)
    snap = deployer.snapshot()
    ref = store.put("g", "run 1", snap)
    assert store.get(ref) == snap
    result = deployer.deploy(store.get(ref), T0)
    assert result.state is DeployState.DONE and deployer.live == "new"
    assert DeployResult.from_dict(result.to_dict()) == result
    restored = deployer.restore(snap, T0)
    assert restored.action == "restore" and deployer.live == "old"


def test_a_snapshot_whose_content_was_edited_is_refused() -> None:
    data = DeploySnapshot("scraper", "s-1", "global: {}\n").to_dict()
    data["content"] = "global: {scrape_interval: 5s}\n"
    with pytest.raises(DeployError, match="does not match its recorded sha256"):
        DeploySnapshot.from_dict(data)


def test_the_fake_refuses_a_deploy_over_a_concurrent_change() -> None:
    deployer = InMemoryConfigDeployer("old", "new")
    snap = deployer.snapshot()
    deployer.live = "someone else's"
    with pytest.raises(DeployError, match="changed since the snapshot"):
        deployer.deploy(snap, T0)
    assert deployer.live == "someone else's"


def test_status_history_records_each_change_once_with_its_time() -> None:
    deployer = InMemoryConfigDeployer(None, "blob", kind="scraper", statuses=(
        ("CREATING", DeployState.WAITING), ("CREATING", DeployState.WAITING), ("ACTIVE", DeployState.DONE)))
    result = deployer.deploy(deployer.snapshot(), T0)
    for step in (1, 2):
        result = deployer.verify(result, T0 + timedelta(seconds=step))
    assert result.state is DeployState.DONE
    assert [c.to_dict() for c in result.status_history] == [
        {"status": "CREATING", "at": T0.isoformat()},
        {"status": "ACTIVE", "at": (T0 + timedelta(seconds=2)).isoformat()}]
    # restore of a snapshot taken when nothing existed removes what the deploy made
    deployer.restore(DeploySnapshot("scraper", None, "", {"existed": False}), T0)
    assert deployer.live is None


# -- the blob ----------------------------------------------------------------------------------

def test_the_rendered_blob_passes_its_own_limits_and_keeps_only_the_group() -> None:
    blob = render_scraper_config(name_regex=REGEX, scrape_interval_s=30)
    document = validate_scraper_config(blob)
    assert keep_regexes(document) == [REGEX]
    job = document["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": "dcgm-exporter",
            "action": "keep"} in job["relabel_configs"]
    assert "remote_write" not in document


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(remote_write=[{"url": "http://x"}]), "unsupported top-level section(s) remote_write"),
    (lambda d: d["scrape_configs"][0].update(file_sd_configs=[{"files": ["/x.json"]}]), "uses file_sd_configs"),
    (lambda d: d["scrape_configs"][0].update(consul_sd_configs=[{}]), "uses consul_sd_configs"),
    (lambda d: d["global"].update(scrape_interval="15s"), "global scrape_interval 15s is below"),
    (lambda d: d["scrape_configs"][0].update(scrape_interval="10s"), "job 'dcgm' scrape_interval 10s is below"),
    (lambda d: d["scrape_configs"][0].pop("kubernetes_sd_configs"), "scrapes nothing"),
    (lambda d: d["scrape_configs"].append(dict(d["scrape_configs"][0])), "job_name 'dcgm' twice"),
])
def test_a_blob_breaking_a_limit_is_refused_with_one_line(mutate: object, message: str) -> None:
    document = yaml.safe_load(render_scraper_config(name_regex=REGEX, scrape_interval_s=30))
    mutate(document)  # type: ignore[operator]
    with pytest.raises(ScraperConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        validate_scraper_config(yaml.safe_dump(document))
    assert "\n" not in str(caught.value)


def test_size_and_interval_limits_are_parameters() -> None:
    blob = render_scraper_config(name_regex=REGEX, scrape_interval_s=30)
    with pytest.raises(ScraperConfigError, match="bytes; the limit is 100"):
        validate_scraper_config(blob, ScraperLimits(max_blob_bytes=100))
    with pytest.raises(ScraperConfigError, match="not valid YAML"):
        validate_scraper_config("global: [\n")
    with pytest.raises(ScraperConfigError, match="whole number of seconds"):
        render_scraper_config(name_regex=REGEX, scrape_interval_s=2.5)
    assert scraper_alias("gpu utilization/x") == "promshift-gpu-utilization-x"


# -- the status assessor ----------------------------------------------------------------------

@pytest.mark.parametrize(("status", "reason", "expect", "elapsed", "state", "words"), [
    ("CREATING", None, "ACTIVE", 5, DeployState.WAITING, "CREATING"),
    ("UPDATING", None, "ACTIVE", 5, DeployState.WAITING, "UPDATING"),
    ("ACTIVE", None, "ACTIVE", 5, DeployState.DONE, "ACTIVE"),
    ("CREATION_FAILED", "subnet not found", "ACTIVE", 5, DeployState.FAILED, "CREATION_FAILED: subnet not found"),
    ("UPDATE_FAILED", "bad relabel", "ACTIVE", 5, DeployState.FAILED, "UPDATE_FAILED: bad relabel"),
    ("DELETION_FAILED", "eni in use", "DELETED", 5, DeployState.FAILED, "DELETION_FAILED: eni in use"),
    ("CREATING", None, "ACTIVE", 601, DeployState.TIMEOUT, "still CREATING after 601s"),
    ("DELETING", None, "DELETED", 5, DeployState.WAITING, "DELETING"),
    ("DELETED", None, "DELETED", 5, DeployState.DONE, "DELETED"),
    ("DELETING", None, "ACTIVE", 5, DeployState.WAITING, "DELETING"),
])
def test_each_scraper_status_maps_to_a_deploy_state(status: str, reason: str | None, expect: str, elapsed: float,
                                                    state: DeployState, words: str) -> None:
    assessment = assess_scraper(status, reason, expect=expect, elapsed_s=elapsed, timeout_s=600)
    assert assessment.state is state
    assert words in assessment.reason


# -- quota maths --------------------------------------------------------------------------------

def test_quota_under_the_share_passes_and_reports_the_audit_shape() -> None:
    a = assess_quota(group_series=100_000, workspace_series=600_000, series_limit=1_000_000, scrape_interval_s=30,
                     workspace_ingestion_rate=20_000, ingestion_limit=70_000)
    assert a.ok
    assert a.to_dict()["group_series"] == 100_000 and a.to_dict()["workspace_series"] == 600_000
    assert a.to_dict()["limit"] == 1_000_000 and a.to_dict()["share"] == pytest.approx(0.7)
    assert a.ingestion is not None and a.ingestion.added == pytest.approx(100_000 / 30)


def test_crossing_80_percent_of_active_series_is_refused() -> None:
    a = assess_quota(group_series=200_001, workspace_series=600_000, series_limit=1_000_000, scrape_interval_s=30)
    assert not a.ok
    assert "active series would reach 80.0% " in a.reason and "> 80% of 1,000,000" in a.reason
    exactly = assess_quota(group_series=200_000, workspace_series=600_000, series_limit=1_000_000,
                           scrape_interval_s=30)
    assert exactly.ok  # at the share is allowed; beyond it is not


def test_crossing_the_ingestion_share_is_refused_even_with_series_headroom() -> None:
    a = assess_quota(group_series=120_000, workspace_series=0, series_limit=10_000_000, scrape_interval_s=15,
                     workspace_ingestion_rate=50_000, ingestion_limit=70_000)
    assert not a.ok and "ingestion rate (samples/s) would reach 82.9%" in a.reason
    assert "50,000 now + 8,000 for the group" in a.reason


def test_quota_configurable_share_no_data_and_bad_input() -> None:
    assert not assess_quota(group_series=10, workspace_series=85, series_limit=100, scrape_interval_s=30,
                            max_share=0.9).ok
    assert assess_quota(group_series=5, workspace_series=85, series_limit=100, scrape_interval_s=30,
                        max_share=0.9).ok
    empty = assess_quota(group_series=0, workspace_series=0, series_limit=100, scrape_interval_s=30)
    assert not empty.ok and "no active series" in empty.reason
    for bad in ({"max_share": 0}, {"series_limit": 0}, {"scrape_interval_s": 0}):
        args = {"group_series": 1, "workspace_series": 0, "series_limit": 100, "scrape_interval_s": 30, **bad}
        with pytest.raises(ValueError):
            assess_quota(**args)  # type: ignore[arg-type]
