"""The read path switch through Grafana's dashboard API, against the local contract server (not Grafana).

The server (``promshift.local.stack.grafana_api``) checks the token, the bodies, versions (412) and unknown
uids (404), keeps every version and restores them; these tests drive ``adapters.grafana`` and the
``grafana_default`` connection's hook against it over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from promshift.adapters.grafana import GrafanaClient, GrafanaError, GrafanaReadPathSwitch
from promshift.core.catalog import MetricGroup
from promshift.core.read_path import DatasourceRef, ReadPathError
from promshift.local.stack.grafana_api import GrafanaApiServer
from promshift.orchestration.grafana_hook import GrafanaHook, grafana_base_url

TOKEN = "glsa_promshiftTestToken0123456789abcdef_00112233"  # noqa: S105 - a test value, checked for leaks
DCGM = json.loads((Path(__file__).resolve().parents[2] / "catalog/dashboards/dcgm-exporter-dashboard.json").read_text())
UID = DCGM["uid"]
SOURCE = DatasourceRef("prom-src", name="Prometheus")
AMP = DatasourceRef("amp-ws1", name="AMP gpu-fleet")
AMP_REF = {"type": "prometheus", "uid": "amp-ws1"}
UTIL = MetricGroup(name="gpu-utilization", metrics=("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"))
MEMORY = MetricGroup(name="gpu-memory", metrics=("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"))


@pytest.fixture()
def grafana(monkeypatch: pytest.MonkeyPatch) -> Iterator[GrafanaApiServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with GrafanaApiServer({TOKEN: "sa-promshift"}) as server:
        dash = {k: v for k, v in DCGM.items() if k not in ("id", "version")}
        server.seed(dash, folder_uid="gpu")
        server.seed({"uid": "other", "title": "Node overview", "panels": [
            {"id": 1, "title": "load", "datasource": "Prometheus", "targets": [{"expr": "node_load1"}]}]})
        yield server


def client(server: GrafanaApiServer, token: str = TOKEN) -> GrafanaClient:
    return GrafanaClient(server.base_url, token, timeout_s=10)


def switcher(server: GrafanaApiServer, group: MetricGroup = UTIL, **kw: Any) -> GrafanaReadPathSwitch:
    kw.setdefault("query", "DCGM")
    return GrafanaReadPathSwitch(client(server), group, source=SOURCE, target=AMP, **kw)


def panel(model: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in model["panels"] if p.get("title") == title)


def test_switch_via_the_api_and_restore_the_previous_version(grafana: GrafanaApiServer) -> None:
    sw = switcher(grafana)
    dry = sw.plan()
    assert [d["uid"] for d in dry["dashboards"]] == [UID]  # the search found the DCGM dashboard only
    assert [p["title"] for p in dry["dashboards"][0]["switched"]] == ["GPU Utilization"]
    assert grafana.dashboard(UID)["version"] == 1  # a plan saves nothing
    snap = sw.snapshot("manual__1")
    assert [(d["uid"], d["version"]) for d in snap["dashboards"]] == [(UID, 1)]
    ev = sw.switch(snap)
    [d] = ev["dashboards"]
    assert (d["action"], d["version_before"], d["version_after"]) == ("switched", 1, 2)
    assert d["panels"][0]["title"] == "GPU Utilization" and d["sha256_before"] != d["sha256_after"]
    now = grafana.dashboard(UID)
    assert panel(now, "GPU Utilization")["datasource"] == AMP_REF
    before = {k: v for k, v in DCGM.items() if k not in ("id", "version")}
    untouched = [p for p in now["panels"] if p["title"] != "GPU Utilization"]
    assert untouched == [p for p in before["panels"] if p["title"] != "GPU Utilization"]
    assert grafana.version_list(UID)[0]["message"].endswith("[promshift:gpu-utilization:manual__1]")
    assert grafana.version_list(UID)[0]["createdBy"] == "sa-promshift"
    # A retry of the switch saves nothing more.
    assert [x["action"] for x in sw.switch(snap)["dashboards"]] == ["already"]
    assert grafana.dashboard(UID)["version"] == 2
    back = sw.restore(snap)
    [r] = back["dashboards"]
    assert (r["action"], r["restore_to"], r["version_after"]) == ("restored", 1, 3)
    restored = grafana.dashboard(UID)
    assert {k: v for k, v in restored.items() if k not in ("id", "version")} == {**before, "uid": UID}
    assert grafana.version_list(UID)[0]["restoredFrom"] == 1
    assert [x["action"] for x in sw.restore(snap)["dashboards"]] == ["already restored"]
    assert TOKEN not in json.dumps([dry, snap, ev, back])  # no token in any record
    assert ("POST", "/api/dashboards/uid/" + UID + "/restore", 200) in grafana.requests


def test_a_stale_version_is_refused_and_read_again(grafana: GrafanaApiServer) -> None:
    sw = switcher(grafana, MEMORY, uids=[UID], query=None)
    snap = sw.snapshot("run2")
    saves: list[str] = []

    def someone_saves_first(uid: str) -> None:
        if not saves:  # once, just before our first save is served
            saves.append(uid)
            grafana.edit(uid, lambda d: d.update(description="edited by a human"))

    grafana.before_save = someone_saves_first
    ev = sw.switch(snap)
    [d] = ev["dashboards"]
    assert d["stale_versions"] == [1] and (d["version_before"], d["version_after"]) == (2, 3)
    assert ("POST", "/api/dashboards/db", 412) in grafana.requests
    now = grafana.dashboard(UID)
    assert now["description"] == "edited by a human"  # the other user's change was kept, not overwritten
    assert panel(now, "GPU Framebuffer Mem Used")["datasource"] == AMP_REF
    # The rollback restores the version our save replaced (2, with the human's edit), not the snapshot's.
    [r] = sw.restore(snap)["dashboards"]
    assert (r["action"], r["restore_to"]) == ("restored", 2)
    assert grafana.dashboard(UID)["description"] == "edited by a human"
    assert panel(grafana.dashboard(UID), "GPU Framebuffer Mem Used")["datasource"] == "$datasource"


def test_restore_refuses_to_overwrite_a_save_after_the_switch(grafana: GrafanaApiServer) -> None:
    sw = switcher(grafana)
    snap = sw.snapshot("run3")
    sw.switch(snap)
    grafana.edit(UID, lambda d: d.update(title="NVIDIA DCGM (tuned)"))
    with pytest.raises(ReadPathError, match="not restored") as exc:
        sw.restore(snap)
    assert exc.value.evidence["dashboards"][0]["action"] == "refused"  # type: ignore[attr-defined]
    assert grafana.dashboard(UID)["title"] == "NVIDIA DCGM (tuned)"
    grafana.delete(UID)
    with pytest.raises(ReadPathError) as exc:
        sw.restore(snap)
    assert exc.value.evidence["dashboards"][0]["reason"] == "deleted after the switch; not recreated"  # type: ignore[attr-defined]


def test_search_reads_every_page(grafana: GrafanaApiServer) -> None:
    for i in range(5):
        grafana.seed({"uid": f"extra{i}", "title": f"Extra {i}", "panels": []})
    hits = client(grafana).search("", limit=2)
    assert len(hits) == 7 and len({h["uid"] for h in hits}) == 7
    assert sum(1 for m, p, _ in grafana.requests if (m, p) == ("GET", "/api/search")) == 4  # 2+2+2+1


def test_a_pruned_version_is_reported_not_guessed(grafana: GrafanaApiServer) -> None:
    sw = switcher(grafana)
    snap = sw.snapshot("run6")
    sw.switch(snap)
    grafana.prune(UID, keep=1)  # only our own version is left
    with pytest.raises(ReadPathError, match="the version before it is gone") as exc:
        sw.restore(snap)
    assert "versions_to_keep" in exc.value.evidence["dashboards"][0]["reason"]  # type: ignore[attr-defined]
    assert panel(grafana.dashboard(UID), "GPU Utilization")["datasource"] == AMP_REF  # nothing guessed


def test_bad_token_is_one_line_without_the_token(grafana: GrafanaApiServer) -> None:
    wrong = "glsa_wrongToken_" + "x" * 24
    sw = GrafanaReadPathSwitch(client(grafana, wrong), UTIL, source=SOURCE, target=AMP, query="DCGM")
    with pytest.raises(GrafanaError) as exc:
        sw.plan()
    text = str(exc.value)
    assert exc.value.status == 401 and "\n" not in text and wrong not in text
    assert text == f"Grafana at {grafana.base_url} refused the service account token (HTTP 401: invalid API key)"


def test_contract_server_refuses_what_grafana_refuses(grafana: GrafanaApiServer) -> None:
    c = client(grafana)
    with pytest.raises(GrafanaError, match="HTTP 404 not-found: Dashboard not found"):
        c.get_dashboard("nope")
    with pytest.raises(GrafanaError, match="HTTP 404 not-found: Dashboard version not found"):
        c.restore_version(UID, 99)
    current = c.get_dashboard(UID)["dashboard"]
    with pytest.raises(GrafanaError, match="HTTP 412 version-mismatch") as exc:
        c.save_dashboard({**current, "version": 0}, folder_uid="gpu", message="stale")
    assert exc.value.reason == "version-mismatch"
    with pytest.raises(GrafanaError, match="HTTP 412 name-exists"):
        c.save_dashboard({"uid": "dup", "title": "NVIDIA DCGM Exporter Dashboard"}, folder_uid="gpu", message="")
    with pytest.raises(GrafanaError, match="datasource must be null, a string or an object"):
        c.save_dashboard({**current, "panels": [{"datasource": 5, "targets": []}]}, folder_uid="gpu", message="")
    with pytest.raises(GrafanaError, match="Dashboard title cannot be empty"):
        c.save_dashboard({**current, "title": " "}, folder_uid="gpu", message="")
    r = requests.post(grafana.base_url + "/api/dashboards/db", timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                      data=json.dumps({"dashboard": current, "folderID": 3}))
    assert r.status_code == 400 and "unknown field(s) folderID" in r.json()["message"]
    assert grafana.dashboard(UID)["version"] == 1  # none of those was stored


def test_a_provisioned_dashboard_is_left_to_file_mode(grafana: GrafanaApiServer) -> None:
    grafana.seed({"uid": "prov", "title": "Provisioned DCGM", "panels": [
        {"id": 1, "title": "util", "datasource": "Prometheus", "targets": [{"expr": "DCGM_FI_DEV_GPU_UTIL"}]}]},
        provisioned=True)
    with pytest.raises(ReadPathError, match="provisioned from a file"):
        switcher(grafana, uids=["prov"], query=None).snapshot("run4")
    with pytest.raises(GrafanaError, match="HTTP 400: Cannot save provisioned dashboard"):
        client(grafana).save_dashboard(client(grafana).get_dashboard("prov")["dashboard"], folder_uid="",
                                       message="")


def test_hook_reads_grafana_default(grafana: GrafanaApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    host, port = grafana.base_url.removeprefix("http://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps(
        {"conn_type": "http", "host": host, "port": int(port), "password": TOKEN}))
    hook = GrafanaHook()
    assert hook.base_url == grafana.base_url
    assert hook.identity() == {"kind": "grafana", "conn_id": "grafana_default", "url": grafana.base_url}
    ok, message = hook.test_connection()
    assert ok and TOKEN not in message
    assert [h["uid"] for h in hook.get_conn().search("node")] == ["other"]
    assert grafana_base_url("grafana.example", 443, "https", {}) == "https://grafana.example:443"
    assert grafana_base_url("h", None, None, {"base_url": "https://g.example/grafana/"}) == "https://g.example/grafana"
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps(
        {"conn_type": "http", "host": host, "port": int(port), "password": "wrong"}))
    ok, message = GrafanaHook().test_connection()
    assert not ok and "HTTP 401" in message


def test_hook_builds_the_switch_from_extra_read_path(grafana: GrafanaApiServer, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from promshift.adapters.blobs import LocalBlobs
    from promshift.adapters.dashboard_files import DashboardFilesSwitch

    host, port = grafana.base_url.removeprefix("http://").split(":")
    read_path = {"source_datasource": {"uid": "prom-src", "name": "Prometheus"},
                 "target_datasource": {"uid": "amp-ws1"}, "query": ""}
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps(
        {"conn_type": "http", "host": host, "port": int(port), "password": TOKEN, "extra": {"read_path": read_path}}))
    sw = GrafanaHook().read_path_switch(UTIL)
    assert isinstance(sw, GrafanaReadPathSwitch)
    snap = sw.snapshot("run5")  # every dashboard searched ("" matches all); only the DCGM one changes
    assert [d["uid"] for d in snap["dashboards"]] == [UID]
    assert sw.switch(snap)["dashboards"][0]["action"] == "switched"
    (tmp_path / "d.json").write_text(json.dumps(DCGM, indent=2))
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps(
        {"conn_type": "http", "extra": {"read_path": {**read_path, "files": [str(tmp_path / "*.json")]}}}))
    with pytest.raises(ReadPathError, match="blobs"):
        GrafanaHook().read_path_switch(UTIL)
    files = GrafanaHook().read_path_switch(UTIL, blobs=LocalBlobs(tmp_path / "snaps"))
    assert isinstance(files, DashboardFilesSwitch)
    assert [f["path"] for f in files.snapshot("run5")["files"]] == [str(tmp_path / "d.json")]
    monkeypatch.setenv("AIRFLOW_CONN_GRAFANA_DEFAULT", json.dumps(
        {"conn_type": "http", "extra": {"read_path": {"source_datasource": {"name": "Prometheus"}}}}))
    with pytest.raises(ReadPathError, match="source_datasource needs a uid"):
        GrafanaHook().read_path_switch(UTIL)
