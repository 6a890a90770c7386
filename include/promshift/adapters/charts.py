"""Latency chart: per window, both backends, p50 and p95, on a log scale (matplotlib, headless)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no screen here or in CI
import matplotlib.pyplot as plt  # noqa: E402

from promshift.core.report import source_failed_label  # noqa: E402


def latency_chart(windows: Sequence[Mapping[str, Any]], path: str | Path, *, title: str) -> Path:
    """Write ``latency_figure`` to ``path`` (PNG)."""
    path = Path(path)
    fig = latency_figure(windows, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def latency_chart_png(windows: Sequence[Mapping[str, Any]], *, title: str) -> bytes:
    """``latency_figure`` as PNG bytes (for an object store)."""
    fig = latency_figure(windows, title=title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def latency_figure(windows: Sequence[Mapping[str, Any]], *, title: str) -> Any:
    """Grouped bars (source/target × p50/p95) per window; failed or unmeasured bars say so, not hidden."""
    names = [w["window"] for w in windows]
    series = [
        ("source p50", "source_p50_s", "#9e9e9e", None),
        ("source p95", "source_p95_s", "#616161", "//"),
        ("target p50", "target_p50_s", "#42a5f5", None),
        ("target p95", "target_p95_s", "#1565c0", "//"),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(names) + 2), 4.5), dpi=110)
    width = 0.2
    for i, (label, key, color, hatch) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(names))]
        values = [w.get(key) or 0 for w in windows]
        bars = ax.bar(xs, values, width, label=label, color=color, hatch=hatch, edgecolor="white")
        for bar, w in zip(bars, windows, strict=True):
            if w.get(key) is None:
                side = key.split("_")[0]
                if not w.get(f"{side}_failures"):
                    why = "not measured"
                elif side == "source":
                    why = w.get("source_failure") or "failed"
                else:
                    why = "failed"
                # No bar to read: say why, standing at the foot of the axis (x in data, y in axes units).
                ax.annotate(why, (bar.get_x() + width / 2, 0.03), xycoords=ax.get_xaxis_transform(),
                            ha="center", va="bottom", fontsize=7, color="#d32f2f", rotation=90)
    for j, w in enumerate(windows):
        ax.hlines(w.get("slo_p95_s"), j - 0.45, j + 0.45, colors="#d32f2f", linestyles="dashed",
                  label="target p95 SLO" if j == 0 else None)
        label = None
        if w.get("speedup"):  # speedup = source p50 / target p50
            speed = w["speedup"]
            label = f"{speed:.1f}x faster" if speed >= 1 else f"{1 / speed:.1f}x slower"
        elif failed := source_failed_label(w):
            label = f"{failed}; target answered"
        if label:
            top = max(w.get("source_p95_s") or 0, w.get("target_p95_s") or 0, w.get("slo_p95_s") or 0)
            ax.annotate(label, (j, top), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_yscale("log")
    tallest = max([w.get(k) or 0 for w in windows for k in ("source_p95_s", "target_p95_s", "slo_p95_s")] + [1e-3])
    ax.set_ylim(top=tallest * 4)  # room for the speedup labels above the bars
    ax.set_xticks(range(len(names)), names)
    ax.set_xlabel("query window")
    ax.set_ylabel("query time (s, log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plan_cost_chart_png(groups: Sequence[Mapping[str, Any]], *, title: str) -> bytes:
    """Monthly AMP cost per recommended group, before and after trimming (bars, USD), as PNG bytes."""
    names = [g["name"] for g in groups] or ["(no group)"]
    before = [g["cost_before"]["total_usd"] for g in groups] or [0.0]
    after = [g["cost_after"]["total_usd"] for g in groups] or [0.0]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names) + 2), 4.5), dpi=110)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], before, 0.4, label="before (every metric of the family)", color="#9e9e9e")
    ax.bar([x + 0.2 for x in xs], after, 0.4, label="after (read metrics only)", color="#1565c0")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("USD per month (AMP list prices)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
