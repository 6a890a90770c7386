"""The latency chart says what a missing bar means and what the speedup is, where people look."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from promshift.adapters.charts import latency_chart, latency_figure

WINDOWS = [
    {"window": "1h", "source_p50_s": 2.0, "source_p95_s": 3.0, "target_p50_s": 0.5, "target_p95_s": 0.8,
     "speedup": 4.0, "slo_p95_s": 2.0, "source_failures": 0, "target_failures": 0},
    {"window": "6h", "source_p50_s": 1.0, "source_p95_s": 1.2, "target_p50_s": 2.0, "target_p95_s": 2.2,
     "speedup": 0.5, "slo_p95_s": 5.0, "source_failures": 0, "target_failures": 0},
    {"window": "24h", "source_p50_s": None, "source_p95_s": None, "target_p50_s": 9.5, "target_p95_s": 10.2,
     "speedup": None, "slo_p95_s": 12.0, "source_failures": 5, "target_failures": 0, "source_failure": "timed out"},
    {"window": "12h", "source_p50_s": 3.0, "source_p95_s": 4.0, "target_p50_s": None, "target_p95_s": None,
     "speedup": None, "slo_p95_s": 8.0, "source_failures": 0, "target_failures": 5},
    {"window": "48h", "source_p50_s": None, "source_p95_s": None, "target_p50_s": None, "target_p95_s": None,
     "speedup": None, "slo_p95_s": 12.0, "source_failures": 0, "target_failures": 0},
]


def texts_by_window() -> dict[str, list[str]]:
    fig = latency_figure(WINDOWS, title="t")
    try:
        ax = fig.axes[0]
        out: dict[str, list[str]] = {w["window"]: [] for w in WINDOWS}
        for text in ax.texts:
            x = text.xy[0]
            out[WINDOWS[round(x)]["window"]].append(text.get_text())
        assert ax.get_yscale() == "log"
        return out
    finally:
        plt.close(fig)


def test_missing_bars_say_why_and_speedups_are_labelled() -> None:
    texts = texts_by_window()
    assert texts["1h"] == ["4.0x faster"]
    assert texts["6h"] == ["2.0x slower"]
    # The seed's case: the source timed out and the target answered. Both source bars say so.
    assert sorted(texts["24h"]) == ["source timed out; target answered", "timed out", "timed out"]
    assert sorted(texts["12h"]) == ["failed", "failed"]  # target failed: no speedup claimed
    assert texts["48h"] == ["not measured"] * 4  # e.g. longer than the retention: nothing was run


def test_chart_is_written_as_png(tmp_path: Path) -> None:
    path = latency_chart(WINDOWS, tmp_path / "out" / "latency.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
