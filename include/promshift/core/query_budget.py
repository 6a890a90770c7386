"""A query budget per target workspace: how many queries promshift's checks may send it, across every worker.

Latency probes and parity checks of many groups share a workspace, and its query quota (AMP bills and throttles by
query). The budget bounds what promshift sends: at most ``per_minute`` queries in each clock minute (UTC minutes,
whatever worker sends them) and at most ``per_run`` queries for one check run (one group's DAG run: its parity
plan, shards and latency probe together). The counts live in a shared ledger (the audit database,
``adapters.query_budget``); this module only decides, from the counts it is given and ``now``.

A check that finds the minute spent waits for the next one (at most ``max_wait_s``); a check whose run budget is
spent, or that would wait longer, ends INCONCLUSIVE with the reason (``QueryBudgetExhausted``): a human decides,
never an automatic FAILED, since the workspace answered nothing wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from promshift.core.durations import parse_duration

MINUTE_S = 60.0
# Bounds on what a catalog or connection may configure: a budget is a limit, not a way to disable checks silently.
MAX_QUERIES = 10_000_000
MAX_WAIT_S = 3600.0


class QueryBudgetExhausted(Exception):
    """The workspace's query budget is spent; the message names the budget, the workspace and what was used.

    Not a backend error: a check that meets it ends INCONCLUSIVE with this reason, never FAILED or ERROR."""


class QueryBudgetError(ValueError):
    """A query budget setting is not valid; the message names the field."""


@dataclass(frozen=True)
class QueryBudget:
    """How many queries checks may send one workspace (None: no limit of that kind)."""

    per_minute: int | None = None
    per_run: int | None = None
    max_wait_s: float = 60.0

    @property
    def limited(self) -> bool:
        return self.per_minute is not None or self.per_run is not None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, *, where: str = "query_budget") -> QueryBudget:
        """From a connection extra's or catalog's ``query_budget``: ``per_minute``, ``per_run`` (positive integers
        up to 10,000,000), ``max_wait`` (a duration such as ``90s``, at most 1h; default 60s)."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise QueryBudgetError(f"{where} must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {"per_minute", "per_run", "max_wait"})
        if unknown:
            raise QueryBudgetError(f"{where}: unknown key(s) {', '.join(unknown)} (per_minute, per_run, max_wait)")

        def count(key: str) -> int | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUERIES:
                raise QueryBudgetError(f"{where}.{key} must be an integer from 1 to {MAX_QUERIES:,}, got {value!r}")
            return value

        wait = data.get("max_wait", "60s")
        if not isinstance(wait, str) or (wait != "0" and wait.replace(".", "", 1).isdigit()):
            raise QueryBudgetError(f"{where}.max_wait must be a duration with its unit (such as '30s'), got "
                                   f"{wait!r}")
        try:
            wait_s = float(parse_duration(str(wait)))
        except ValueError as exc:
            raise QueryBudgetError(f"{where}.max_wait: {exc}") from None
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise QueryBudgetError(f"{where}.max_wait must be from 0s to 1h, got {wait!r}")
        return cls(per_minute=count("per_minute"), per_run=count("per_run"), max_wait_s=wait_s)


@dataclass(frozen=True)
class BudgetCount:
    """One ledger row: queries ``used`` in the window starting at ``window`` (a minute's start; 0 for a run)."""

    window: float
    used: int


@dataclass(frozen=True)
class Grant:
    """What ``take`` decided: ``ok`` with the new counts to store, or why not and whether waiting helps."""

    ok: bool
    minute: BudgetCount
    run: BudgetCount
    wait_s: float | None = None  # refused: seconds until the next minute (None: waiting does not help)
    reason: str | None = None


def minute_of(now: float) -> float:
    """The start of the clock minute ``now`` falls in."""
    return math.floor(now / MINUTE_S) * MINUTE_S


def take(budget: QueryBudget, *, workspace: str, minute: BudgetCount | None, run: BudgetCount | None, now: float,
         queries: int = 1) -> Grant:
    """Take ``queries`` from the workspace's minute and the run's budget, or say why not (counts unchanged)."""
    this_minute = minute_of(now)
    if minute is not None and minute.window > this_minute:
        # Another worker's clock is ahead and started a newer minute: count in it, never reset it to an older one.
        this_minute = minute.window
    used_minute = minute.used if minute is not None and minute.window == this_minute else 0
    used_run = run.used if run is not None else 0
    new_minute, new_run = BudgetCount(this_minute, used_minute + queries), BudgetCount(0.0, used_run + queries)
    if budget.per_run is not None and used_run + queries > budget.per_run:
        return Grant(False, BudgetCount(this_minute, used_minute), BudgetCount(0.0, used_run), None,
                     f"query budget of workspace {workspace!r} spent: {used_run} of {budget.per_run} queries per "
                     "check run used")
    if budget.per_minute is not None and used_minute + queries > budget.per_minute:
        return Grant(False, BudgetCount(this_minute, used_minute), BudgetCount(0.0, used_run),
                     this_minute + MINUTE_S - now,
                     f"query budget of workspace {workspace!r} spent: {used_minute} of {budget.per_minute} queries "
                     "per minute used")
    return Grant(True, new_minute, new_run)
