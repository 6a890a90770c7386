"""The history backfill's OpenMetrics writer: layout promtool accepts, the live scrape's labels, the fleet's values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from promshift.local.stack.backfill import fleet_metrics, history_range, write_backfill
from promshift.local.stack.fleet import FleetSpec, load_counters, node_values, render_node
from promshift.local.stack.local import EXTERNAL_LABELS

START = 1_790_000_000.0  # whole minutes, after every simulated node's boot
GAUGE, COUNTER = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+) (?P<ts>\d+)$")
LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def read(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, dict[str, str], str, int]]]:
    """([(metric, type)] in file order, [(metric, labels, value, ts)]); asserts the OpenMetrics layout."""
    lines = path.read_text().splitlines()
    assert lines[-1] == "# EOF"
    types: list[tuple[str, str]] = []
    samples: list[tuple[str, dict[str, str], str, int]] = []
    for line in lines[:-1]:
        if line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            types.append((name, kind))
            continue
        match = LINE.match(line)
        assert match, line
        # Each family is contiguous: a sample belongs to the last TYPE line.
        assert types and match["name"] == types[-1][0], line
        samples.append((match["name"], {m["key"]: m["value"] for m in LABEL.finditer(match["labels"])},
                        match["value"], int(match["ts"])))
    return types, samples


def scraped_labels(fleet: FleetSpec, node: int, metric: str) -> list[dict[str, str]]:
    """Each GPU's labels as the source stores a scrape: the exposition's plus instance and job."""
    out = []
    for line in render_node(fleet, node, START).splitlines():
        if line.startswith(metric + "{"):
            labels = {m["key"]: m["value"] for m in LABEL.finditer(line[len(metric) + 1: line.rindex("}")])}
            out.append({**labels, "instance": fleet.hostname(node), "job": "dcgm"})
    return out


@pytest.fixture(scope="module")
def fleet() -> FleetSpec:
    return FleetSpec(nodes=2, gpus_per_node=3)


def test_writes_every_series_with_the_scrapes_labels_and_the_fleets_values(fleet: FleetSpec, tmp_path: Path) -> None:
    text = write_backfill(fleet, tmp_path, START, START + 600, 120, [COUNTER, GAUGE])
    steps = [START + 120 * i for i in range(6)]
    assert set(text.files) == {"source", "target"}
    assert text.metrics == (COUNTER, GAUGE)
    assert (text.series_per_side, text.samples_per_side) == (2 * 3 * 2, 2 * 3 * 2 * 6)
    assert text.bytes == {side: path.stat().st_size for side, path in text.files.items()}
    assert text.bytes["target"] > text.bytes["source"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source.om", "target.om"]  # no .part files left

    for side, extra in (("source", {}), ("target", EXTERNAL_LABELS)):
        types, samples = read(text.files[side])
        # dcgm-exporter's types, in the order asked for.
        assert types == [(COUNTER, "counter"), (GAUGE, "gauge")]
        assert len(samples) == text.samples_per_side
        for metric in (COUNTER, GAUGE):
            for node in range(fleet.nodes):
                for gpu, labels in enumerate(scraped_labels(fleet, node, metric)):
                    got = [(value, ts) for name, lab, value, ts in samples
                           if name == metric and lab == {**labels, **extra}]
                    assert got == [(node_values(fleet, node, t)[metric][gpu], int(t)) for t in steps], (side, metric)


def test_every_rendered_metric_can_be_backfilled_with_its_type(fleet: FleetSpec, tmp_path: Path) -> None:
    kinds = fleet_metrics()
    assert kinds == {c.name: c.kind for c in load_counters() if c.kind != "label"}
    assert kinds[COUNTER] == "counter" and kinds[GAUGE] == "gauge"
    text = write_backfill(fleet, tmp_path, START, START, 60, list(kinds))
    types, samples = read(text.files["source"])
    assert types == list(kinds.items())
    assert len(samples) == fleet.nodes * fleet.gpus_per_node * len(kinds)


def test_refuses_what_it_cannot_write(fleet: FleetSpec, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not render DCGM_FI_NOPE"):
        write_backfill(fleet, tmp_path, START, START + 60, 60, [GAUGE, "DCGM_FI_NOPE"])
    with pytest.raises(ValueError, match="no metrics"):
        write_backfill(fleet, tmp_path, START, START + 60, 60, [])
    with pytest.raises(ValueError, match="whole seconds"):
        write_backfill(fleet, tmp_path, START + 0.5, START + 60, 60, [GAUGE])
    with pytest.raises(ValueError, match="before start"):
        write_backfill(fleet, tmp_path, START, START - 60, 60, [GAUGE])


def test_history_range_is_on_the_grid_and_ends_before_now() -> None:
    now = START + 1234.5
    start, end = history_range(now, 3600, 300)
    assert (start % 300, end % 300) == (0, 0)
    assert start <= now - 3600 < start + 300
    assert now - 30 - 300 < end <= now - 30
    with pytest.raises(ValueError, match="nothing to backfill"):
        history_range(now, 10, 300)


def test_sides_carry_their_labels_and_changes_and_share_unchanged_text(fleet: FleetSpec, tmp_path: Path) -> None:
    from promshift.local.stack.backfill import SeriesChange, Side, estimate_openmetrics_bytes, write_openmetrics

    host0, host1 = fleet.hostname(0), fleet.hostname(1)

    def changes(metric: str, host: str, gpu: int) -> SeriesChange | None:
        if (metric, host, gpu) == (GAUGE, host0, 1):
            return SeriesChange(missing=True)
        if host == host1 and gpu == 0:
            return SeriesChange(rename=("Hostname", "hostname"), factor=0.5)
        return None

    steps = [START, START + 60]
    sides = [Side("plain"), Side("faulty", {"cluster": "c"}, changes), Side("labelled", {"cluster": "c"})]
    text = write_openmetrics(fleet, tmp_path, steps, [GAUGE], sides)
    _, plain = read(text.files["plain"])
    _, faulty = read(text.files["faulty"])
    _, labelled = read(text.files["labelled"])
    assert text.samples == {"plain": 12, "faulty": 10, "labelled": 12}
    assert [(m, {**lab, "cluster": "c"}, v, t) for m, lab, v, t in plain] == labelled
    by_key = {(lab.get("Hostname") or lab.get("hostname"), lab["gpu"], t): (lab, v) for _, lab, v, t in faulty}
    assert (host0, "1", int(START)) not in by_key
    lab, value = by_key[host1, "0", int(START)]
    assert "hostname" in lab and "Hostname" not in lab
    assert float(value) == float(node_values(fleet, 1, START)[GAUGE][0]) * 0.5
    estimate = estimate_openmetrics_bytes(fleet, [GAUGE], steps, sides)
    assert estimate["faulty"] == estimate["labelled"] > estimate["plain"]
    assert text.bytes["plain"] <= estimate["plain"] <= text.bytes["plain"] * 1.10


def test_sides_must_be_named_once_and_a_rename_needs_the_label(fleet: FleetSpec, tmp_path: Path) -> None:
    from promshift.local.stack.backfill import SeriesChange, Side, write_openmetrics

    with pytest.raises(ValueError, match="each once"):
        write_openmetrics(fleet, tmp_path, [START], [GAUGE], [Side("a"), Side("a")])
    with pytest.raises(ValueError, match="no label 'nope' to rename"):
        write_openmetrics(fleet, tmp_path / "r", [START], [GAUGE],
                          [Side("a", changes=lambda *_: SeriesChange(rename=("nope", "x")))])
