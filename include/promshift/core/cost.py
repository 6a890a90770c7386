"""Monthly AMP cost projection for one metric group, from measured or estimated query samples.

Amazon Managed Service for Prometheus bills three usage dimensions for a workspace, and a
fourth for its managed collector (the AMP scraper), when one scrapes instead of a Prometheus:

- **Ingestion** — metric samples ingested, priced *per 10 million samples*
  (``AmpPrices.ingest_per_10m_samples``). AMP's price per 10M falls in tiers as the
  monthly volume grows: with ``ingest_tiers`` given (``[(up_to_samples, per_10m), ...,
  (None, per_10m)]``, cumulative per month) the volume is priced tier by tier, else at the
  single rate.
- **Storage** — compressed samples and metadata kept, priced *per GB-month*
  (``AmpPrices.storage_per_gb_month``). The size of a stored sample is configuration
  too (``AmpPrices.bytes_per_sample``); series metadata is not modelled.
- **Query** — query samples processed (QSP), priced *per billion samples*
  (``AmpPrices.query_per_billion_samples``). AMP bills the same number Prometheus
  reports as ``data.stats.samples.totalQueryableSamples`` when a query is sent with
  ``stats=all`` (AMP's user guide: "the information to use for billing").

- **Collector** — a managed collector's hours (``collector_per_hour``) and the samples it
  collects (``collector_per_10m_samples``).
- **Free tier** — per account and month, samples ingested, query samples processed and GB
  stored that are not billed (``free_*``); applied once, to a whole workspace's month
  (:func:`monthly_bill`), never to one group's share.

Prices are configuration, never constants here: they differ per region and change
over time. A month is 730 hours (8,760 h / 12, the convention of AWS' pricing
calculator) and a GB is 10^9 bytes.

Pure: no I/O, no clock, no environment. The caller measures queries (``stats=all``
through :func:`samples_from_stats`) or estimates them (:func:`estimate_samples`,
:func:`estimate_range_samples`) and says which in :class:`QueryCost.measured`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "BYTES_PER_GB",
    "MONTH_S",
    "AmpPrices",
    "CostConfigError",
    "CostEvidence",
    "CostProjection",
    "QueryCost",
    "QueryCostLine",
    "estimate_range_samples",
    "ingest_usd",
    "monthly_bill",
    "estimate_samples",
    "project_monthly_cost",
    "samples_from_stats",
]

MONTH_S = 730 * 3600.0
"""Seconds in a billing month: 730 hours, as AWS' pricing calculator counts a month."""

BYTES_PER_GB = 1e9
SAMPLES_PER_INGEST_UNIT = 10_000_000  # AMP prices ingestion per 10M samples
SAMPLES_PER_QUERY_UNIT = 1_000_000_000  # ...and query samples processed per billion


class CostConfigError(ValueError):
    """Cost inputs are invalid; ``problems`` lists every problem found, one per entry."""

    def __init__(self, what: str, problems: Iterable[str]) -> None:
        self.what = what
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"invalid {what} ({count} problem{'s' if count != 1 else ''}):\n{lines}")

    def __reduce__(self) -> tuple[type[CostConfigError], tuple[str, tuple[str, ...]]]:
        return (CostConfigError, (self.what, self.problems))


def _number_problem(name: str, value: Any, *, positive: bool = False) -> str | None:
    """Why ``value`` is not a finite real number >= 0 (> 0 when ``positive``), or None if it is."""
    # bool is an int subclass; a YAML `true` where a price belongs is a mistake, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name!r} must be a number, got {value!r} ({type(value).__name__})"
    if not math.isfinite(value):
        return f"{name!r} must be finite, got {value!r}"
    if positive and value <= 0:
        return f"{name!r} must be > 0, got {value!r}"
    if value < 0:
        return f"{name!r} must be >= 0, got {value!r}"
    return None


def _int_problem(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name!r} must be an integer, got {value!r} ({type(value).__name__})"
    if value < 0:
        return f"{name!r} must be >= 0, got {value!r}"
    return None


def _raise_if(what: str, problems: Iterable[str | None]) -> None:
    found = [p for p in problems if p]
    if found:
        raise CostConfigError(what, found)


@dataclass(frozen=True)
class AmpPrices:
    """AMP list prices in USD for one region, one per billed dimension (see the module docstring).

    ``ingest_per_10m_samples``: USD per 10 million samples ingested.
    ``storage_per_gb_month``: USD per GB stored for a month.
    ``query_per_billion_samples``: USD per billion query samples processed (QSP).
    ``bytes_per_sample``: average stored size of one sample, in bytes (> 0).

    Optional (the price table's other lines): ``ingest_tiers`` (``(up_to_samples, per_10m)``
    ascending, the last ``(None, per_10m)``), the free tier's ``free_ingest_samples``,
    ``free_query_samples`` and ``free_storage_gb``, the managed collector's
    ``collector_per_hour`` and ``collector_per_10m_samples``, and ``prices_date`` (when the table
    was last checked against AWS' page: the plan prints it).
    """

    ingest_per_10m_samples: float
    storage_per_gb_month: float
    query_per_billion_samples: float
    bytes_per_sample: float
    ingest_tiers: tuple[tuple[float | None, float], ...] = ()
    free_ingest_samples: float = 0.0
    free_query_samples: float = 0.0
    free_storage_gb: float = 0.0
    collector_per_hour: float = 0.0
    collector_per_10m_samples: float = 0.0
    prices_date: str = ""

    OPTIONAL = ("ingest_tiers", "free_tier", "collector_per_hour", "collector_per_10m_samples", "prices_date")
    FREE_TIER_KEYS = {"ingest_samples": "free_ingest_samples", "query_samples": "free_query_samples",
                      "storage_gb": "free_storage_gb"}

    def __post_init__(self) -> None:
        _raise_if("AMP prices", (
            _number_problem("ingest_per_10m_samples", self.ingest_per_10m_samples),
            _number_problem("storage_per_gb_month", self.storage_per_gb_month),
            _number_problem("query_per_billion_samples", self.query_per_billion_samples),
            _number_problem("bytes_per_sample", self.bytes_per_sample, positive=True),
            *(_number_problem(name, getattr(self, name)) for name in (
                "free_ingest_samples", "free_query_samples", "free_storage_gb", "collector_per_hour",
                "collector_per_10m_samples")),
            *_tier_problems(self.ingest_tiers),
            None if isinstance(self.prices_date, str) else f"'prices_date' must be text, got {self.prices_date!r}",
        ))

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AmpPrices:
        """Build from a parsed config mapping with exactly the four field names as keys.

        Every problem is reported at once: missing keys, unknown keys (a typo would
        otherwise silently fall back to nothing), and values that are not finite
        non-negative numbers (``bytes_per_sample`` must be > 0). Numbers given as
        strings are refused, so ``"$0.90"`` or ``"0,90"`` cannot slip through.
        """
        if not isinstance(d, Mapping):
            raise CostConfigError("AMP prices", [f"expected a mapping of prices, got {type(d).__name__}"])
        names = [f.name for f in fields(cls)][:4]
        known = [*names, *cls.OPTIONAL]
        problems: list[str | None] = [f"missing key {name!r}" for name in names if name not in d]
        problems += [f"unknown key {key!r} (expected one of {', '.join(known)})"
                     for key in d if key not in known]
        problems += [_number_problem(name, d[name], positive=name == "bytes_per_sample")
                     for name in names if name in d]
        extra: dict[str, Any] = {}
        tiers = d.get("ingest_tiers", [])
        if not isinstance(tiers, list) or not all(isinstance(t, Mapping) for t in tiers):
            problems.append("'ingest_tiers' must be a list of {up_to: samples, per_10m_samples: USD} "
                            "(the last without up_to)")
        else:
            for i, t in enumerate(tiers):
                unknown = set(t) - {"up_to", "per_10m_samples"}
                if unknown or "per_10m_samples" not in t:
                    problems.append(f"ingest_tiers[{i}]: keys up_to and per_10m_samples only, per_10m_samples "
                                    "required")
            if not any(p for p in problems if p and p.startswith("ingest_tiers")):
                extra["ingest_tiers"] = tuple((t.get("up_to"), t["per_10m_samples"]) for t in tiers)
                problems += _tier_problems(extra["ingest_tiers"])
        free = d.get("free_tier", {})
        if not isinstance(free, Mapping) or set(free) - set(cls.FREE_TIER_KEYS):
            problems.append(f"'free_tier' must be a mapping of {', '.join(cls.FREE_TIER_KEYS)}")
        else:
            for key, value in free.items():
                problems.append(_number_problem(f"free_tier.{key}", value))
                extra[cls.FREE_TIER_KEYS[key]] = value
        for name in ("collector_per_hour", "collector_per_10m_samples"):
            if name in d:
                problems.append(_number_problem(name, d[name]))
                extra[name] = d[name]
        if "prices_date" in d:
            date = d["prices_date"]
            extra["prices_date"] = date.isoformat() if hasattr(date, "isoformat") else date
        _raise_if("AMP prices", problems)
        return cls(**{name: float(d[name]) for name in names}, **extra)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ingest_tiers"] = [{"up_to": up, "per_10m_samples": price} for up, price in self.ingest_tiers]
        return out


def _tier_problems(tiers: Any) -> list[str | None]:
    if not tiers:
        return []
    problems: list[str | None] = []
    previous = 0.0
    for i, tier in enumerate(tiers):
        up, price = tier
        problems.append(_number_problem(f"ingest_tiers[{i}].per_10m_samples", price))
        last = i == len(tiers) - 1
        if up is None:
            if not last:
                problems.append(f"ingest_tiers[{i}]: only the last tier may leave up_to out")
            continue
        problem = _number_problem(f"ingest_tiers[{i}].up_to", up, positive=True)
        if problem is None and up <= previous:
            problem = f"ingest_tiers[{i}].up_to must grow: {up!r} after {previous!r}"
        problems.append(problem)
        if problem is None:
            previous = float(up)
    if tiers[-1][0] is not None:
        problems.append("ingest_tiers: the last tier has no up_to (it prices the rest)")
    return problems


def ingest_usd(samples: float, prices: AmpPrices, *, already: float = 0.0) -> float:
    """USD for ``samples`` ingested in a month, tier by tier when the table has tiers; ``already``: samples of the
    same month before these (they fill the cheaper tiers' bottoms first)."""
    if not prices.ingest_tiers:
        return samples / SAMPLES_PER_INGEST_UNIT * prices.ingest_per_10m_samples
    usd, low, start, end = 0.0, 0.0, already, already + samples
    for up, price in prices.ingest_tiers:
        high = math.inf if up is None else float(up)
        part = max(0.0, min(end, high) - max(start, low))
        usd += part / SAMPLES_PER_INGEST_UNIT * price
        low = high
    return usd


def monthly_bill(*, ingest_samples: float, storage_gb: float, query_samples: float, prices: AmpPrices,
                 collectors: int = 0, collected_samples: float | None = None, free_tier: bool = True) -> dict[str, Any]:
    """A workspace's month: tiered ingestion, storage, queries and managed collectors, the free tier taken off once.

    ``collected_samples`` defaults to ``ingest_samples`` (a collector sends what it scrapes); with ``collectors``
    0 (a Prometheus remote-writes) there is no collector line.
    """
    free_i = prices.free_ingest_samples if free_tier else 0.0
    free_q = prices.free_query_samples if free_tier else 0.0
    free_s = prices.free_storage_gb if free_tier else 0.0
    billed_i = max(0.0, ingest_samples - free_i)
    ingest = ingest_usd(billed_i, prices)
    storage = max(0.0, storage_gb - free_s) * prices.storage_per_gb_month
    query = max(0.0, query_samples - free_q) / SAMPLES_PER_QUERY_UNIT * prices.query_per_billion_samples
    collected = ingest_samples if collected_samples is None else collected_samples
    hours = collectors * MONTH_S / 3600.0
    collector = (hours * prices.collector_per_hour
                 + (collected / SAMPLES_PER_INGEST_UNIT * prices.collector_per_10m_samples if collectors else 0.0))
    return {"ingest_samples": round(ingest_samples), "ingest_usd": round(ingest, 4), "storage_gb": round(storage_gb, 4),
            "storage_usd": round(storage, 4), "query_samples": round(query_samples), "query_usd": round(query, 4),
            "collectors": collectors, "collector_hours": hours, "collector_usd": round(collector, 4),
            "free_tier": free_tier, "total_usd": round(ingest + storage + query + collector, 4)}


@dataclass(frozen=True)
class QueryCost:
    """One dashboard/alert query and how many samples one execution of it processes.

    ``window_s`` is the query's time range (0 for an instant query), kept for the report.
    ``samples_processed`` is per execution: Prometheus' ``totalQueryableSamples`` when
    ``measured`` is True, an estimate (:func:`estimate_samples`) when False.
    """

    query: str
    window_s: float
    samples_processed: float
    measured: bool

    def __post_init__(self) -> None:
        _raise_if(f"query cost for {self.query!r}", (
            None if isinstance(self.query, str) and self.query.strip() else "'query' must be a non-empty string",
            _number_problem("window_s", self.window_s),
            _number_problem("samples_processed", self.samples_processed),
            None if isinstance(self.measured, bool) else f"'measured' must be true or false, got {self.measured!r}",
        ))


@dataclass(frozen=True)
class QueryCostLine:
    """One query's share of the monthly query bill."""

    query: str
    window_s: float
    samples_per_execution: float
    executions_per_month: float
    samples_per_month: float
    usd: float
    measured: bool

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QueryCostLine:
        return cls(query=str(d["query"]), window_s=float(d["window_s"]),
                   samples_per_execution=float(d["samples_per_execution"]),
                   executions_per_month=float(d["executions_per_month"]),
                   samples_per_month=float(d["samples_per_month"]),
                   usd=float(d["usd"]), measured=bool(d["measured"]))


@dataclass(frozen=True)
class CostProjection:
    """A month of AMP usage and its price, per billed dimension and in total (USD)."""

    ingestion_samples_per_month: float
    ingestion_usd: float
    storage_gb: float
    storage_usd: float
    query_samples_per_month: float
    query_usd: float
    queries: tuple[QueryCostLine, ...] = ()

    @property
    def total_usd(self) -> float:
        return self.ingestion_usd + self.storage_usd + self.query_usd

    @property
    def estimated_queries(self) -> int:
        """How many queries' sample counts are estimates rather than ``stats=all`` measurements."""
        return sum(not line.measured for line in self.queries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ingestion": {"samples_per_month": self.ingestion_samples_per_month, "usd": self.ingestion_usd},
            "storage": {"gb": self.storage_gb, "usd": self.storage_usd},
            "query": {"samples_per_month": self.query_samples_per_month, "usd": self.query_usd,
                      "estimated_queries": self.estimated_queries,
                      "queries": [line.to_dict() for line in self.queries]},
            "total_usd": self.total_usd,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostProjection:
        """Read ``to_dict``'s form (``total_usd`` and ``estimated_queries`` are derived, not read)."""
        query = d["query"]
        return cls(ingestion_samples_per_month=float(d["ingestion"]["samples_per_month"]),
                   ingestion_usd=float(d["ingestion"]["usd"]), storage_gb=float(d["storage"]["gb"]),
                   storage_usd=float(d["storage"]["usd"]), query_samples_per_month=float(query["samples_per_month"]),
                   query_usd=float(query["usd"]),
                   queries=tuple(QueryCostLine.from_dict(q) for q in query.get("queries") or ()))


@dataclass(frozen=True)
class CostEvidence:
    """The cost projection as the latency check records it, with what it was computed from; or why
    there is none (``error``)."""

    projection: CostProjection | None = None
    active_series: int = 0
    scrape_interval_s: float = 0.0
    window: str = ""
    dashboard_refresh_s: float = 0.0
    dashboard_viewers: int = 0
    error: str | None = None

    CONTEXT = ("active_series", "scrape_interval_s", "window", "dashboard_refresh_s", "dashboard_viewers")

    @classmethod
    def unavailable(cls, error: str) -> CostEvidence:
        return cls(error=error)

    def to_dict(self) -> dict[str, Any]:
        if self.projection is None:
            return {"error": self.error or "no cost projection"}
        return {**self.projection.to_dict(), **{k: getattr(self, k) for k in self.CONTEXT}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostEvidence:
        if d.get("error") or "ingestion" not in d:
            return cls(error=str(d.get("error") or "no cost projection"))
        return cls(CostProjection.from_dict(d), active_series=int(d["active_series"]),
                   scrape_interval_s=float(d["scrape_interval_s"]), window=str(d["window"]),
                   dashboard_refresh_s=float(d["dashboard_refresh_s"]), dashboard_viewers=int(d["dashboard_viewers"]))


def estimate_samples(series: int, window_s: float, scrape_interval_s: float) -> float:
    """Samples one query touches when the backend cannot tell us: series x window / scrape interval.

    This is exact for an *instant* query over a range selector (``f(metric[window])``
    evaluated once: Prometheus counts each sample in the window once). For a *range*
    query Prometheus counts samples per step, so a sample inside several steps'
    lookback is counted several times; use :func:`estimate_range_samples` there, or
    measure with ``stats=all``.
    """
    _raise_if("sample estimate", (
        _int_problem("series", series),
        _number_problem("window_s", window_s),
        _number_problem("scrape_interval_s", scrape_interval_s, positive=True),
    ))
    return series * window_s / scrape_interval_s


def estimate_range_samples(*, series: int, range_s: float, step_s: float, scrape_interval_s: float,
                           selector_window_s: float | None = None) -> float:
    """Samples a range query processes, counted per step as Prometheus' ``totalQueryableSamples`` does.

    Steps are ``floor(range / step) + 1``. Per step and series, an instant-vector
    selector (``metric``) loads one sample; a range selector (``metric[w]``, pass
    ``selector_window_s=w``) loads ``w / scrape_interval`` samples. Checked against
    Prometheus 2.42: ``up`` over 60 s at a 1 s step and 1 s scrape counted 61,
    ``rate(up[10s])`` counted 610.
    """
    _raise_if("range-query sample estimate", (
        _int_problem("series", series),
        _number_problem("range_s", range_s),
        _number_problem("step_s", step_s, positive=True),
        _number_problem("scrape_interval_s", scrape_interval_s, positive=True),
        None if selector_window_s is None else _number_problem("selector_window_s", selector_window_s),
    ))
    steps = math.floor(range_s / step_s) + 1
    per_step = 1.0 if selector_window_s is None else selector_window_s / scrape_interval_s
    return series * steps * per_step


def samples_from_stats(stats: Mapping[str, Any]) -> float | None:
    """``totalQueryableSamples`` from a ``stats=all`` answer, or None when the backend did not report it.

    ``stats`` is the ``data.stats`` object (``QueryResult.stats``); a whole response
    body or its ``data`` object is accepted too. Prometheus 2.42 answers
    ``{"timings": {...}, "samples": {"totalQueryableSamples": N, "peakSamples": M}}``;
    AMP adds ``totalQueryableSamplesPerStep`` (``[[timestamp, n], ...]``), which is
    summed when the total is missing. Raises ValueError for a count that is present
    but not a non-negative number.
    """
    node: Any = stats
    for key in ("data", "stats"):
        if isinstance(node, Mapping) and "samples" not in node and isinstance(node.get(key), Mapping):
            node = node[key]
    samples = node.get("samples") if isinstance(node, Mapping) else None
    if not isinstance(samples, Mapping):
        return None
    total = samples.get("totalQueryableSamples")
    if total is None:
        per_step = samples.get("totalQueryableSamplesPerStep")
        if not per_step:
            return None
        try:
            total = sum(float(pair[1]) for pair in per_step)
        except (TypeError, ValueError, IndexError, KeyError):
            raise ValueError(f"malformed totalQueryableSamplesPerStep: {str(per_step)[:200]}") from None
    problem = _number_problem("totalQueryableSamples", total)
    if problem:
        raise ValueError(problem)
    return float(total)


def project_monthly_cost(*, active_series: int, scrape_interval_s: float, retention_days: float,
                         queries: Sequence[QueryCost], dashboard_refresh_s: float, dashboard_viewers: int,
                         prices: AmpPrices) -> CostProjection:
    """Project one metric group's monthly AMP bill at steady state.

    - Ingestion: ``active_series x MONTH_S / scrape_interval_s`` samples, priced per 10M (tier by tier
      when the table has tiers, as if the group were the workspace's only volume; no free tier here).
    - Storage: the retention window full of samples, ``active_series x retention_days x
      86,400 / scrape_interval_s x bytes_per_sample`` bytes, priced per GB-month. (The
      first months cost less while the workspace fills up to its retention.)
    - Query: every viewer's dashboard re-runs every query each ``dashboard_refresh_s``
      around the clock, ``dashboard_viewers x MONTH_S / dashboard_refresh_s`` executions
      of each query, times its samples per execution, priced per billion. Alerting and
      recording rules are queries too: pass them with their evaluation interval as a
      separate projection (one viewer) if they move with the group.
    """
    _raise_if("cost projection inputs", (
        _int_problem("active_series", active_series),
        _number_problem("scrape_interval_s", scrape_interval_s, positive=True),
        _number_problem("retention_days", retention_days),
        _number_problem("dashboard_refresh_s", dashboard_refresh_s, positive=True),
        _int_problem("dashboard_viewers", dashboard_viewers),
        None if isinstance(prices, AmpPrices) else f"'prices' must be AmpPrices, got {type(prices).__name__}",
        *(None if isinstance(q, QueryCost) else f"queries[{i}] must be a QueryCost, got {type(q).__name__}"
          for i, q in enumerate(queries)),
    ))
    ingest_samples = active_series * MONTH_S / scrape_interval_s
    ingest_cost = ingest_usd(ingest_samples, prices)
    stored_samples = active_series * retention_days * 86_400.0 / scrape_interval_s
    storage_gb = stored_samples * prices.bytes_per_sample / BYTES_PER_GB
    storage_usd = storage_gb * prices.storage_per_gb_month
    executions = dashboard_viewers * MONTH_S / dashboard_refresh_s
    lines = tuple(
        QueryCostLine(
            query=q.query,
            window_s=q.window_s,
            samples_per_execution=q.samples_processed,
            executions_per_month=executions,
            samples_per_month=q.samples_processed * executions,
            usd=q.samples_processed * executions / SAMPLES_PER_QUERY_UNIT * prices.query_per_billion_samples,
            measured=q.measured,
        )
        for q in queries
    )
    return CostProjection(
        ingestion_samples_per_month=ingest_samples,
        ingestion_usd=ingest_cost,
        storage_gb=storage_gb,
        storage_usd=storage_usd,
        query_samples_per_month=sum(line.samples_per_month for line in lines),
        query_usd=sum(line.usd for line in lines),
        queries=lines,
    )
