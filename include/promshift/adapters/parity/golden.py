"""Layer 4, golden: the group's dashboard queries, each over its own look-back-aware window, on both sides."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from promshift.adapters.files import read_user_file
from promshift.adapters.parity.common import (
    ParityLayer,
    each_side,
    group_matcher,
    group_selectors_of,
    lookback_span,
    refused_for_size,
    series_behind,
    with_sizing,
)
from promshift.adapters.parity.sized import RefusedForSize
from promshift.adapters.prometheus import PrometheusClient, PrometheusError
from promshift.core.aggregation import rewrite_group_read
from promshift.core.catalog import MetricGroup
from promshift.core.golden import (
    COMPARED,
    NEEDS_VARIABLE,
    NOT_THIS_GROUP,
    UNSUPPORTED,
    DashboardQuery,
    WindowShortfall,
    dashboard_queries,
    dropped_label_uses,
    fit_window,
    golden_names,
    read_either_name,
)
from promshift.core.inputs import DASHBOARD, InputRefused, parse_json_bounded
from promshift.core.parity import (
    GoldenInventory,
    GoldenRow,
    GoldenSide,
    engine_tolerance,
    golden_comparison,
    golden_failure,
    normalize_labels,
    rewrite_comparison,
    undeclared_rename_note,
    without_dropped,
)
from promshift.core.promql import (
    PromQLBudgetError,
    PromQLError,
    Selector,
    analyse,
    functions_used,
    grafana_builtins,
    metric_names,
    promql_string,
    restrict_nameless,
    substitute,
)
from promshift.core.verdicts import Layer, Measurement, Verdict


def golden_lookbacks(group: MetricGroup, catalog_dir: Path | None,
                     problems: list[str] | None = None) -> dict[str, float]:
    """Each golden dashboard query that reads the group's metrics, by name, and how far back it reads (seconds).

    Queries that do not parse, or name none of the group's metrics, are left out (the parity check reports
    them); unreadable dashboards too. ``problems``, when given, gets one line per dashboard outside its input
    budget and per query outside the PromQL budget (``core.promql.check_budget``).
    """
    policy = group.parity
    found: dict[str, float] = {}
    for entry in policy.golden_dashboards:
        path = Path(entry) if Path(entry).is_absolute() or catalog_dir is None else catalog_dir / entry
        files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            try:
                dashboard = parse_json_bounded(read_user_file(file, DASHBOARD), DASHBOARD)
            except InputRefused as exc:
                if problems is not None:
                    problems.append(f"group {group.name!r}: golden dashboard {file.name}: {exc}")
                continue
            if not isinstance(dashboard, dict):
                continue
            for q in dashboard_queries(dashboard, name=file.name):
                sub = substitute(q.expr, dict(policy.golden_variables), builtins=grafana_builtins(policy.step_s,
                                                                                           group.bake.parity_window_s))
                try:
                    analysis = analyse(sub.expr)
                    names = metric_names(sub.expr)
                except PromQLBudgetError as exc:
                    if problems is not None:
                        problems.append(f"group {group.name!r}: golden query {file.name}/{q.panel}: {exc}")
                    continue
                except PromQLError:
                    continue
                if any(group.reads(n) for n in names):
                    found[f"{file.name}/{q.panel}"] = analysis.lookback_s
    return found


class GoldenLayer(ParityLayer):
    """``golden[...]`` measurements and the inventory of every dashboard expression."""

    def measure(self, start: float, end: float) -> tuple[list[Measurement], GoldenInventory]:
        """The group's dashboard queries, each over its own look-back-aware window, and the inventory.

        ``start`` is the first settled instant of dual-write, ``end`` the last instant old enough
        to read. Every dashboard expression is listed in the inventory with its disposition:
        compared, not this group's metrics, needs variable X, or unsupported (why).
        """
        policy = self.policy
        rows: list[GoldenRow] = []
        measurements: list[Measurement] = []
        queries: list[DashboardQuery] = []
        for path in self._dashboard_files(measurements):
            try:
                dashboard = parse_json_bounded(read_user_file(path, DASHBOARD), DASHBOARD)
            except (OSError, ValueError) as exc:
                measurements.append(Measurement("golden", Verdict.ERROR, f"dashboard {path.name} unreadable: {exc}"))
                continue
            queries.extend(dashboard_queries(dashboard, name=path.name))
        names: dict[str, list[str]] = {}
        for q, name in zip(queries, golden_names(queries), strict=True):
            disposition, detail, m = self._golden_query(name, q, start, end, names)
            rows.append(GoldenRow(q.dashboard, q.panel, q.expr, disposition, detail, q.ref_id, m.name if m else None))
            if m is not None:
                measurements.append(m)
        counts = Counter(row.disposition for row in rows)
        summary = ", ".join(f"{n} {d}" for d, n in counts.items()) or "no dashboard queries"
        if not any(m.layer == Layer.GOLDEN and m.name != "golden" for m in measurements):
            if policy.golden_required:
                measurements.append(Measurement("golden", Verdict.INCONCLUSIVE,
                                                "no golden query reads this group's metrics (parity.golden_required)"))
            elif not policy.golden_dashboards:
                summary = "no golden layer: no dashboard configured (parity.golden_dashboards)"
            else:
                summary = "no golden layer: no dashboard query reads this group's metrics" + (
                    f" ({summary})" if queries else "")
        return measurements, GoldenInventory(tuple(policy.golden_dashboards), policy.golden_required, tuple(rows),
                                             summary)

    def _dashboard_files(self, problems: list[Measurement]) -> list[Path]:
        files: list[Path] = []
        for entry in self.policy.golden_dashboards:
            path = Path(entry)
            if not path.is_absolute() and self.ctx.catalog_dir is not None:
                path = self.ctx.catalog_dir / path
            if path.is_dir():
                files.extend(sorted(path.glob("*.json")))
            elif path.is_file():
                files.append(path)
            else:
                problems.append(Measurement("golden", Verdict.ERROR, f"dashboard {entry} not found ({path})"))
        return files

    def _golden_query(self, name: str, q: DashboardQuery, start: float, end: float,
                      names: dict[str, list[str]]) -> tuple[str, str, Measurement | None]:
        """Disposition, detail and (for this group's queries) the measurement of one dashboard expression."""
        values = dict(self.policy.golden_variables)
        sub = substitute(q.expr, values, builtins=grafana_builtins(self.policy.step_s, end - start))
        needs = ", ".join(f"${v}" for v in sub.unknown)
        hint = ", ".join(f"parity.golden_variables.{v}" for v in sub.unknown)
        try:
            analysis = analyse(sub.expr)
            aggregated = any(self.group.aggregate_of(n) for n in metric_names(sub.expr))
        except PromQLError as exc:
            if not any(self.group.reads(n) for n in metric_names(sub.expr)):
                return NOT_THIS_GROUP, "names none of this group's metrics", None
            if sub.unknown:
                return (f"{NEEDS_VARIABLE} {needs}", f"set {hint}",
                        Measurement(name, Verdict.INCONCLUSIVE, f"needs variable {needs} (set {hint})", (sub.expr,)))
            return (UNSUPPORTED, str(exc),
                    Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (sub.expr,)))
        if aggregated:  # the target holds the recorded series: its selectors are the rewritten read's
            try:
                analysis = analyse(rewrite_group_read(sub.expr, self.group.aggregations))
            except PromQLError as exc:
                return COMPARED, Verdict.FAILED.value, self._not_rewritable(name, sub.expr, exc)
        try:
            group_selectors, restrict, others = group_selectors_of(self.group, self.source, analysis, start, end,
                                                                   names)
        except PrometheusError as exc:
            return COMPARED, "selector names unknown", Measurement(name, Verdict.ERROR, str(exc), (sub.expr,))
        if not group_selectors:
            shown = sorted({s.name or s.promql() for s in analysis.selectors})
            return NOT_THIS_GROUP, "reads " + (", ".join(shown) or "no series"), None
        if sub.unknown:
            return (f"{NEEDS_VARIABLE} {needs}", f"set {hint}",
                    Measurement(name, Verdict.INCONCLUSIVE, f"needs variable {needs} (set {hint})", (sub.expr,)))
        m = self._golden_one(name, q.expr, group_selectors, start, end, restrict=restrict, others=others,
                             aggregated=aggregated)
        return COMPARED, m.verdict.value, m

    def _not_rewritable(self, name: str, expr: str, exc: PromQLError) -> Measurement:
        """A read of a metric the group ships aggregated that cannot read the recorded series: the target, which
        holds only those, cannot answer it as the source does."""
        metrics = sorted({n for n in metric_names(expr) if self.group.aggregate_of(n)})
        return Measurement(name, Verdict.FAILED, f"reads {', '.join(metrics)}, which the group ships aggregated "
                           f"(aggregations), and cannot be rewritten to the recorded series: {exc}", (expr,),
                           {"aggregated": metrics})

    def _recording_phase(self, expr: str, at: float) -> float | None:
        """An instant of the recording rules' evaluations: their newest sample's timestamp on the target at ``at``
        (None when it has none)."""
        names = sorted({r for n in metric_names(expr) if (a := self.group.aggregate_of(n)) for r in a.recorded})
        # One recorded metric is enough (one rule group, one phase); timestamp() drops the name, so not several.
        return self.target.scalar(f"max(timestamp({{__name__={promql_string(names[0])}}}))", at=at)

    @property
    def _group_matcher(self) -> tuple[str, str, str]:
        return group_matcher(self.group)

    def _golden_one(self, name: str, raw: str, group_selectors: Sequence[Selector], start: float, end: float, *,
                    restrict: frozenset[Selector] = frozenset(), others: Sequence[Selector] = (),
                    aggregated: bool = False) -> Measurement:
        """One golden query over its own window: what both backends did, the data behind it, the answers.

        ``aggregated``: the query reads a metric the group ships aggregated; the source answers it as written, the
        target its rewrite over the recorded series, on a grid of the recording's interval (the group's scrape
        interval), compared by ``rewrite_comparison``."""
        step = self.group.scrape_interval_s if aggregated else self.policy.step_s
        values = dict(self.policy.golden_variables)
        try:
            fit = fit_window(raw, values, earliest=start, latest=end, step=step)
        except PromQLError as exc:
            return Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (raw,))
        if isinstance(fit, WindowShortfall):
            return Measurement(name, Verdict.INCONCLUSIVE, fit.reason, (raw,), {"wait_s": fit.wait_s})
        read = dropped_label_uses(fit.expr, self.group.drop_labels)
        if read:
            how = ", ".join(f"{label} ({use})" for label, use in read.items())
            return Measurement(name, Verdict.FAILED, f"reads {how}, which the group drops (drop_labels): "
                               f"the target has no such label, so this query cannot answer as on the source",
                               (fit.expr,), {"dropped_labels_read": list(read)})
        # A declared rename: a fleet may be part-way through it, so each side reads every series under either
        # name, normalised to one (the dashboard's), and the same query is asked of both.
        renames = tuple(self.policy.rename_labels)
        try:
            rewritten = rewrite_group_read(fit.expr, self.group.aggregations) if aggregated else fit.expr
        except PromQLError as exc:
            return self._not_rewritable(name, fit.expr, exc)
        try:
            asked, asked_target = (
                read_either_name(e, renames) if renames else e
                for e in ((restrict_nameless(e, group_matcher(self.group), restrict.__contains__) if restrict else e)
                          for e in (fit.expr, rewritten)))
        except PromQLError as exc:
            return Measurement(name, Verdict.INCONCLUSIVE, f"unsupported: {exc}", (fit.expr,))
        queries = asked
        sized = self.ctx.sizer()
        edges = self.ctx.edges(fit.start, fit.end)  # independent_scraper: read past the window to see its gaps
        low, high = edges["grid"][:2] if edges else (fit.start, fit.end)
        phase = None
        if aggregated:  # on the recording's own evaluation instants: there each side holds the same evaluation
            try:
                phase = self._recording_phase(fit.expr, high)
            except PrometheusError as exc:
                return Measurement(name, Verdict.ERROR, f"reading the recorded series' evaluation instants: {exc}",
                                   (asked, asked_target))
            low = high + step if phase is None else low + (phase - low) % step
            if low > high:
                return Measurement(name, Verdict.INCONCLUSIVE, "the target holds no evaluation of the recorded "
                                   "series this read needs in its window", (asked, asked_target))

        def answer(client: PrometheusClient, asked: str) -> GoldenSide:
            try:
                # Asked in step-aligned parts when the workspace refuses it whole (exact: each step is its own).
                answered, warnings = sized.range_query(client, asked, start=low, end=high, step=step, series=None)
            except PrometheusError as exc:
                text = str(exc).removeprefix(f"{exc.base_url}: ")
                return GoldenSide(error=text, http_status=exc.http_status, kind=exc.kind)
            rename = dict(self.policy.rename_labels)
            series = {normalize_labels(s.labels, ignore=self.policy.ignore_labels, rename=rename): s.points
                      for s in answered}
            if client is self.source:  # declared drops: the target's answer has the source's without them
                series = without_dropped(series, self.group.drop_labels)
            return GoldenSide(series=series, warnings=warnings)

        try:
            source, target = each_side(lambda: answer(self.source, asked), lambda: answer(self.target, asked_target))
        except RefusedForSize as exc:
            return refused_for_size(name, exc, (queries,))
        failed = golden_failure(name, queries, source, target)
        if failed is not None:
            return failed
        warnings = [*source.warnings, *target.warnings]
        if warnings:
            return Measurement(name, Verdict.INCONCLUSIVE, f"backend warnings (partial data): {'; '.join(warnings)}",
                               (queries,))
        try:
            counts = series_behind(self.source, self.target, [*group_selectors, *others],
                                   lookback_span(fit.analysis, fit.start, fit.end), renames,
                                   sized=sized, partition=self.ctx.host_partition())
        except RefusedForSize as exc:
            return refused_for_size(name, exc, (queries,))
        except PrometheusError as exc:
            return Measurement(name, Verdict.ERROR, f"counting the series behind the query failed: {exc}", (queries,))
        behind = (sum(c[0] for c in counts[:len(group_selectors)]), sum(c[1] for c in counts[:len(group_selectors)]))
        # A pair declared as different engines: the query's function family may round differently (said so).
        rel_tol, widened = engine_tolerance(functions_used(fit.expr), engines=self.policy.engines,
                                            rel_tol=max(self.policy.rel_tolerance, 1e-9))
        if aggregated:  # the original read on the source against its rewrite on the target
            m = rewrite_comparison(name, asked, asked_target, source.series or {}, target.series or {},
                                   behind=behind, step=step, abs_tol=self.policy.abs_tolerance, rel_tol=rel_tol,
                                   phase=phase)
            return with_sizing(m, sized)
        m = golden_comparison(name, queries, source.series or {}, target.series or {}, behind=behind,
                              abs_tol=self.policy.abs_tolerance, rel_tol=rel_tol,
                              answers_without_series=fit.analysis.answers_without_series, noise_k=self.ctx.noise_k,
                              **edges,
                              numbers={"window": fit.to_dict(), "selectors": [s.promql() for s in group_selectors],
                                       **({"tolerance": widened} if widened else {})})
        lacking = [sel.promql() for sel, (src, tgt) in zip(others, counts[len(group_selectors):], strict=True)
                   if src and not tgt]
        note = undeclared_rename_note(self.ctx.undeclared, self.group.host_label) if self.ctx.undeclared else None
        if m.verdict == Verdict.FAILED and note:
            # The answers differ because hosts send the host label under another name: say so first.
            m = dataclasses.replace(m, reason=f"{note}; {m.reason}",
                                    numbers={**m.numbers, "undeclared_rename": {
                                        side: {v: sorted(h) for v, h in found.items()}
                                        for side, found in zip(("source", "target"), self.ctx.undeclared,
                                                               strict=True)}})
        if m.verdict == Verdict.FAILED and lacking:
            # Another group's metrics the target was never sent: the difference says nothing about this group.
            return Measurement(name, Verdict.INCONCLUSIVE, f"answers differ, but the query also reads "
                               f"{', '.join(lacking)} (not this group's metrics), which the target does not have",
                               m.queries, {**m.numbers, "not_on_target": lacking})
        return with_sizing(m, sized)
