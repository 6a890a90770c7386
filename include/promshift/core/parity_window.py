"""Parity's window maths: the aligned comparison window, the step, the source's scrape interval and how near an
outage's edge a point may go missing. Re-exported by ``core.parity``."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable

from promshift.core.durations import parse_duration
from promshift.core.inputs import CONFIG, parse_yaml_bounded
from promshift.core.parity_labels import Points


def align_window(start: float, end: float, step: float) -> tuple[float, float]:
    """Round ``start`` up and ``end`` down to multiples of ``step``.

    AMP aligns query timestamps to the step for caching; aligning on both sides makes
    the two answers sample the same instants.
    """
    if step <= 0:
        raise ValueError(f"step must be > 0, got {step}")
    return math.ceil(start / step) * step, math.floor(end / step) * step


def comparison_window(*, dual_write_since: float, now: float, skip_recent_s: float, step: float,
                      settle_s: float = 0.0) -> tuple[float, float] | None:
    """The aligned window fully inside dual-write and older than ``skip_recent_s``, or None.

    ``settle_s`` (at least one scrape interval) keeps out the first instants after the
    reload: there the source still answers from samples scraped before dual-write began,
    which the target never received.
    """
    start, end = align_window(dual_write_since + settle_s, now - skip_recent_s, step)
    return (start, end) if end > start else None


def scrape_interval_of(config_text: str, jobs: Iterable[str]) -> tuple[float, str]:
    """The longest scrape interval of ``jobs`` in a Prometheus config, and where it came from.

    A job's own ``scrape_interval``, else the config's global one, else Prometheus' default (1 m). A job the
    config does not name (federated, or renamed by relabelling) counts with the global interval. No job at
    all: the global interval. Raises ``InputRefused``/``ValueError`` on a config that cannot be read.
    """
    doc = parse_yaml_bounded(config_text, CONFIG) or {}
    if not isinstance(doc, dict):
        raise ValueError("the source's config is not a mapping")
    glob = doc.get("global") if isinstance(doc.get("global"), dict) else {}
    default = parse_duration(str(glob.get("scrape_interval") or "1m"))
    per_job: dict[str, float] = {}
    for job in doc.get("scrape_configs") or []:
        if isinstance(job, dict) and job.get("job_name"):
            own = job.get("scrape_interval")
            per_job[str(job["job_name"])] = parse_duration(str(own)) if own else default
    wanted = sorted(set(jobs))
    if not wanted:
        return default, f"global scrape_interval {default:g}s (no job label on the group's series)"
    found = {j: per_job.get(j, default) for j in wanted}
    job = max(found, key=lambda j: (found[j], j))
    where = f"job {job!r}" if job in per_job else f"global (job {job!r} not in the config)"
    return found[job], f"scrape_interval {found[job]:g}s of {where}"


def comparison_step(step_s: float, scrape_interval_s: float | None) -> tuple[float, str | None]:
    """The step parity compares at: the catalog's, raised to the source's scrape interval when below it.

    Below one scrape interval an instant can fall where the source answers from a sample older than the
    step, which the target (or the other scraper) may not hold: a step is never below the interval.
    Returns the step and, when raised, the sentence that says so in the evidence.
    """
    if scrape_interval_s is None or step_s >= scrape_interval_s:
        return step_s, None
    return scrape_interval_s, (f"step raised from {step_s:g}s to {scrape_interval_s:g}s: below the source's scrape "
                               f"interval an instant can read a sample the other side does not hold")


def settle_time(step_s: float, scrape_interval_s: float | None = None) -> float:
    """How long after dual-write began the first compared instant may be: two steps, and at least one scrape
    interval plus a step (the source's newest sample at that instant was scraped after dual-write began)."""
    return max(2 * step_s, (scrape_interval_s or 0.0) + step_s)



def edge_allowance(scrape_interval_s: float, step_s: float) -> float:
    """How far from a gap in one side's series a point may be missing on the other, for two independent scrapers.

    Their phases differ by less than one scrape interval, so each sees an outage begin and end up to one
    interval apart; a sample counts in the step bucket it falls in, which rounds that to the grid (one step).
    """
    return scrape_interval_s + step_s


def near_gap(points: Points, grid: tuple[float, float, float], within_s: float) -> Callable[[float], bool]:
    """A test: is an instant within ``within_s`` of an instant of ``grid`` (start, end, step) where ``points``
    has no value? Points off the grid count as present where they fall."""
    start, end, step = grid
    have = {round(t, 3) for t, _ in points}
    n = int(round((end - start) / step)) if step > 0 else -1
    gaps = [start + k * step for k in range(n + 1) if round(start + k * step, 3) not in have]

    def test(t: float) -> bool:
        i = bisect.bisect_left(gaps, t - within_s - 1e-6)
        return i < len(gaps) and gaps[i] <= t + within_s + 1e-6

    return test
