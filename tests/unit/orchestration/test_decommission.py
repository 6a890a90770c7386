"""Decommission refusals: decided before any backend is asked, recorded, nothing changed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promshift.adapters.audit_store import AuditStore
from promshift.adapters.prometheus import PrometheusClient
from promshift.adapters.routing import RoutingStore
from promshift.adapters.settings import REPO_ROOT, load_catalog
from promshift.core.deploy_kinds import deploy_of
from promshift.core.stages import Stage
from promshift.orchestration.compose import compose_migration
from promshift.steps.lifecycle import Decommission, DecommissionRefused
from promshift.steps.migration import Backends

GROUP = "gpu-memory"
UP_TO_BAKING = [Stage.DUAL_WRITING, Stage.WARMING, Stage.VERIFIED, Stage.APPROVED, Stage.CUT_OVER, Stage.BAKING]


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    yield store
    store.engine.dispose()


def decommission(tmp_path: Path, audit: AuditStore, history: list[Stage], deploy_kind: str) -> Decommission:
    current = Stage.PLANNED
    for stage in history:
        audit.append(group=GROUP, run_id="manual__m", kind=f"seed_{stage.value}", actor="test",
                     at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
        current = stage
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs:\n  - job_name: fleet\n")
    unused = PrometheusClient("http://127.0.0.1:9")  # nothing listens: a refusal must not need it
    m = compose_migration(load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP),
                       Backends(unused, unused, str(config), ""), audit=audit, routing=RoutingStore(audit.url),
                       snapshots_dir=tmp_path / "snapshots", run_id="manual__decommission")
    return Decommission(m, deploy=deploy_of(deploy_kind))


@pytest.mark.parametrize(("history", "kind", "message"), [
    (UP_TO_BAKING, "scraper", "is baking; a decommission starts only from baked, recommissioned"),
    ([*UP_TO_BAKING, Stage.BAKED], "remote_write", "the source is the target's only writer"),
    ([*UP_TO_BAKING, Stage.ROLLED_BACK_READS], "scraper", "is rolled_back_reads"),
])
def test_a_refused_decommission_changes_nothing_and_is_recorded(
        tmp_path: Path, audit: AuditStore, history: list[Stage], kind: str, message: str) -> None:
    d = decommission(tmp_path, audit, history, kind)
    before = (tmp_path / "prometheus.yml").read_bytes()
    with pytest.raises(DecommissionRefused, match=message):
        d.decommission(datetime.now(UTC), approval={"by": "oncall-bob", "decision": "Approve"})
    ev = audit.events(group=GROUP)[-1]
    assert (ev.kind, ev.stage_to) == ("decommission_refused", None)
    assert message in ev.evidence_data["reason"] and ev.evidence_data["approval"]["by"] == "oncall-bob"
    assert (tmp_path / "prometheus.yml").read_bytes() == before
    assert audit.stage_of(GROUP) == history[-1]
    assert not (tmp_path / "snapshots").exists()


def test_recommission_needs_a_decommissioned_group(tmp_path: Path, audit: AuditStore) -> None:
    d = decommission(tmp_path, audit, [*UP_TO_BAKING, Stage.BAKED], "scraper")
    with pytest.raises(DecommissionRefused, match="is baked, not decommissioned"):
        d.recommission(datetime.now(UTC), reason="test")


# -- the happy path, on a scripted source that loads its config file as Prometheus does ------------------


class ScriptedSource:
    """A source Prometheus: ``/-/reload`` loads the config file; the group's series vanish once the loaded config
    drops them (as a scrape-time drop does). A target whose newest sample is ``target_newest()``."""

    def __init__(self, config: Path, selector_regex: str, target_newest: Any) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, urlsplit

        from promshift.core.scrape_drop import drop_is_loaded, drop_rule

        owner = self
        self.config, self.loaded = config, config.read_text()
        self.reloads = 0

        def dropping() -> bool:
            return drop_is_loaded(owner.loaded, "fleet", drop_rule(selector_regex))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if urlsplit(self.path).path == "/api/v1/status/config":
                    return self.reply({"status": "success", "data": {"yaml": owner.loaded}})
                self.reply({}, 404)

            def do_POST(self) -> None:  # noqa: N802
                path = urlsplit(self.path).path
                if path == "/-/reload":
                    owner.loaded, owner.reloads = owner.config.read_text(), owner.reloads + 1
                    return self.reply({})
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                query = form["query"][0]
                if query.startswith("count by (job)"):
                    result = [] if dropping() else [{"metric": {"job": "fleet"}, "value": [0, "24"]}]
                elif query.startswith("count("):
                    result = [] if dropping() else [{"metric": {}, "value": [0, "24"]}]
                elif query.startswith("max(timestamp("):
                    result = [{"metric": {}, "value": [0, str(target_newest())]}]
                else:  # the source's total appended samples/s
                    result = [{"metric": {}, "value": [0, "9000"]}]
                self.reply({"status": "success", "data": {"resultType": "vector", "result": result}})

            def reply(self, body: dict[str, Any], status: int = 200) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


CONFIG = ("global:\n  scrape_interval: 5s  # the fleet's\nscrape_configs:\n  - job_name: fleet\n"
          "    static_configs:\n      - targets: ['127.0.0.1:9400']\n")


@pytest.mark.integration  # starts a process
def test_decommission_then_recommission_on_a_source_that_drops_what_its_config_says(
        tmp_path: Path, audit: AuditStore) -> None:
    import time

    from promshift.core.scrape_drop import drop_is_loaded, drop_rule

    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG)
    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    fake = ScriptedSource(config, group.name_regex(), target_newest=lambda: time.time())  # the collector writes on
    try:
        current = Stage.PLANNED
        for stage in [*UP_TO_BAKING, Stage.BAKED]:
            audit.append(group=GROUP, run_id="manual__m", kind=f"seed_{stage.value}", actor="test",
                         at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
            current = stage
        client = PrometheusClient(fake.url)
        m = compose_migration(group, Backends(client, client, str(config), ""), audit=audit,
                           routing=RoutingStore(audit.url), snapshots_dir=tmp_path / "snapshots",
                           run_id="manual__decommission")
        d = Decommission(m, deploy=deploy_of("scraper"), verify_s=5, poll_s=0.2)
        evidence = d.decommission(datetime.now(UTC), approval={"by": "oncall-bob", "decision": "Approve"})
        assert audit.stage_of(GROUP) == Stage.DECOMMISSIONED
        assert drop_is_loaded(config.read_text(), "fleet", drop_rule(group.name_regex()))
        assert config.read_text().startswith(CONFIG[:60])  # the user's lines stay as they were
        assert evidence["freed"] == {"series": 24, "series_by_job": {"fleet": 24}, "scrape_interval_s": 5.0,
                                     "samples_per_s": 4.8, "source_samples_appended_per_s": 9000.0}
        assert (evidence["loaded"], evidence["source_stopped"], evidence["target_still_receiving"]) == (
            True, True, True)
        assert Path(evidence["snapshot_path"]).read_text() == CONFIG
        # Undo: the drop goes, byte for byte; reads stay where they were; the gap is recorded.
        undone = Decommission(m, deploy=deploy_of("scraper")).recommission(datetime.now(UTC), reason="rules missing")
        assert config.read_text() == CONFIG and not drop_is_loaded(fake.loaded, "fleet", drop_rule(group.name_regex()))
        assert undone["identical_to_before_decommission"] is True
        assert undone["source_history_gap"]["note"].startswith("the source never stored the group's samples")
        assert audit.stage_of(GROUP) == Stage.RECOMMISSIONED
        assert [e.kind for e in audit.events(group=GROUP)][-2:] == ["decommissioned", "recommissioned"]
        assert fake.reloads == 2
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.mark.integration  # starts a process
def test_a_full_rollback_by_hand_removes_only_the_groups_own_entry_and_routes_reads_back(
        tmp_path: Path, audit: AuditStore) -> None:
    """After a failed bake (rolled_back_reads): the group's remote_write entry goes by name; an entry another group
    added after this group's snapshot stays (a whole-file restore would have removed it)."""
    import time

    from promshift.core.render import add_remote_write, remote_write_entry, remote_write_names
    from promshift.steps.lifecycle import full_rollback

    group = load_catalog(REPO_ROOT / "catalog" / "metric_groups.yaml", profile="demo").get(GROUP)
    mine = remote_write_entry(group_name=GROUP, name_regex=group.name_regex(), url="http://amp.example/write")
    other = remote_write_entry(group_name="gpu-clocks", name_regex="DCGM_FI_DEV_SM_CLOCK",
                               url="http://amp.example/write")
    config = tmp_path / "prometheus.yml"
    config.write_bytes(add_remote_write(add_remote_write(CONFIG.encode(), mine), other))
    fake = ScriptedSource(config, group.name_regex(), target_newest=lambda: time.time())
    try:
        current = Stage.PLANNED
        for stage in [*UP_TO_BAKING, Stage.ROLLED_BACK_READS]:
            audit.append(group=GROUP, run_id="manual__m", kind=f"seed_{stage.value}", actor="test",
                         at=datetime.now(UTC), evidence={}, stage_from=current, stage_to=stage)
            current = stage
        client = PrometheusClient(fake.url)
        routing = RoutingStore(audit.url)
        routing.route(GROUP, read_from="target", url="http://amp.example", at=datetime.now(UTC), run_id="x")
        m = compose_migration(group, Backends(client, client, str(config), ""), audit=audit, routing=routing,
                           snapshots_dir=tmp_path / "snapshots", run_id="manual__rollback")
        result = full_rollback(m, datetime.now(UTC), reason="bake failed twice; back to the source")
        assert remote_write_names(config.read_bytes()) == ["promshift-gpu-clocks"]
        assert config.read_bytes() == add_remote_write(CONFIG.encode(), other)  # exactly the other entry kept
        assert result["remote_write_still_live"] is False and result["from_stage"] == "rolled_back_reads"
        assert routing.read_from(GROUP) == "source"
        assert audit.stage_of(GROUP) == Stage.ROLLED_BACK
        # A retry of this run (Airflow retried the task after its rollback was recorded) finds the record and
        # touches nothing; another run on a group that is rolled back already is refused, nothing touched.
        before, events = config.read_bytes(), len(audit.events(group=GROUP))
        again = full_rollback(m, datetime.now(UTC), reason="retry")
        assert again["already_rolled_back"] is True and again["from_stage"] == "rolled_back_reads"
        other_run = compose_migration(group, Backends(client, client, str(config), ""), audit=audit, routing=routing,
                                      snapshots_dir=tmp_path / "snapshots", run_id="manual__rollback-2")
        with pytest.raises(DecommissionRefused, match="is rolled_back; a full rollback by hand starts only from"):
            full_rollback(other_run, datetime.now(UTC), reason="again")
        assert config.read_bytes() == before and len(audit.events(group=GROUP)) == events
    finally:
        fake.server.shutdown()
        fake.server.server_close()
