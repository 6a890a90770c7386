"""The PromQL module: look-back, read-ahead, selectors, constant answers, Grafana variables."""

from __future__ import annotations

import pytest

from promshift.core.promql import (
    PromQLError,
    Selector,
    analyse,
    grafana_builtins,
    lookback_s,
    metric_names,
    promql_string,
    rename_labels_in,
    restrict_nameless,
    substitute,
    widest_range_s,
)


@pytest.mark.parametrize("expr,back,ahead", [
    ("rate(x[5m])", 300, 0),
    ("sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))", 300, 0),
    ("x offset 10m", 600, 0),
    ("rate(x[5m] offset 1h)", 3900, 0),
    ("max_over_time(rate(x[1m])[1h:1m] offset 1h)", 7260, 0),  # offset + subquery range + inner range
    ("x offset -5m", 0, 300),
    ("rate(x[1m] offset -5m)", 0, 300),
    ("x", 0, 0),
    ("holt_winters(x[10m], 0.5, 0.5)", 600, 0),  # Prometheus 2.x's name, registered
    ("rate(a[1m]) / rate(b[15m])", 900, 0),
])
def test_look_back_and_read_ahead(expr: str, back: float, ahead: float) -> None:
    a = analyse(expr)
    assert (a.lookback_s, a.readahead_s) == (back, ahead)
    assert lookback_s(expr) == (back or None)


def test_at_modifiers_are_anchored_not_relative() -> None:
    (end,) = analyse("rate(x[5m] @ end())").anchored
    assert (end.anchor, end.back_s) == ("end", 300)
    (start,) = analyse("x @ start() offset -1m").anchored
    assert (start.anchor, start.ahead_s) == ("start", 60)
    (fixed,) = analyse("x[10m:1m] @ 1700000000").anchored
    assert (fixed.anchor, fixed.at, fixed.back_s) == ("fixed", 1700000000, 600)
    assert analyse("x @ end()").lookback_s == 0


def test_selectors_with_and_without_metric_name() -> None:
    a = analyse('sum(m{a="b"}) / on() group_left {__name__="n", c!~"d"} + {type="free", instance!="x"}')
    assert a.selectors == (Selector("m", (("a", "=", "b"),)), Selector("n", (("c", "!~", "d"),)),
                           Selector(None, (("type", "=", "free"), ("instance", "!=", "x"))))
    assert [s.promql() for s in a.selectors] == ['m{a="b"}', 'n{c!~"d"}', '{type="free", instance!="x"}']
    assert a.selectors[2].promql(("__name__", "=~", "A|B")) == '{type="free", instance!="x", __name__=~"A|B"}'
    assert metric_names('rate(m[5m]) + {__name__="n"}') == ["m", "n"]


@pytest.mark.parametrize("expr,without_series", [
    ('sum(m{namespace="x"}) or vector(0)', True),
    ('absent(m{a="b"})', True),
    ("absent_over_time(m[5m])", True),
    ("count(m) or on() vector(0)", True),
    ("time()", True), ("1 + 2", True), ("scalar(m) * 2", True), ("day_of_month()", True),
    ("m", False), ("sum(rate(m[5m]))", False), ("m * 2", False), ("m and vector(1)", False),
    ("m unless n", False), ("day_of_month(m)", False), ("topk(3, m)", False),
    ('label_replace(m, "a", "$1", "b", "(.*)")', False),
])
def test_answers_without_series(expr: str, without_series: bool) -> None:
    assert analyse(expr).answers_without_series is without_series


def test_capture_groups_are_not_variables_and_unknown_variables_stay_as_written() -> None:
    sub = substitute('label_replace(m{i=~"$instance", h="${Hostname}"}[$__rate_interval], "a", "$1-${2}", "b", '
                     '"(.*):(.*)")', {"instance": ".+"}, builtins=grafana_builtins(30, 3600))
    assert sub.expr == 'label_replace(m{i=~".+", h="${Hostname}"}[120s], "a", "$1-${2}", "b", "(.*):(.*)")'
    assert sub.unknown == ("Hostname",)


@pytest.mark.parametrize("expr,expected", [
    ('avg(m{instance=~"$instance", gpu=~"$gpu"})', 'avg(m{instance=~".+", gpu=~"0|1"})'),
    ('m{gpu=~"${gpu}"}', 'm{gpu=~"0|1"}'),
    ('m{gpu=~"${gpu:regex}"}', 'm{gpu=~"0|1"}'),
    ('m{gpu=~"[[gpu]]"}', 'm{gpu=~"0|1"}'),
    ("rate(m[$__rate_interval])", "rate(m[60s])"),
    ("max_over_time(m[$__range]) / $__range_s", "max_over_time(m[3600s]) / 3600"),
])
def test_substitution(expr: str, expected: str) -> None:
    sub = substitute(expr, {"instance": ".+", "gpu": "0|1"}, builtins=grafana_builtins(15, 3600))
    assert (sub.expr, sub.unknown) == (expected, ())


def test_raw_strings_keep_their_backslashes() -> None:
    # Prometheus reads `n\d` as a raw string; promql_parser 0.12.0 alone would refuse it.
    sel = analyse('x{a=~`n\\d`, b="`"}').selectors[0]
    assert sel.matchers == (("a", "=~", "n\\d"), ("b", "=", "`"))


def test_unparseable_is_a_clear_error() -> None:
    with pytest.raises(PromQLError, match="does not parse"):
        analyse("avg(m{")
    with pytest.raises(PromQLError, match="does not parse"):
        analyse("rate(m[$__rate_interval])")  # unsubstituted: Prometheus rejects it too
    # Not parsed: the identifiers outside strings, enough to tell whose metrics it names.
    assert "DCGM_FI_DEV_GPU_TEMP" in metric_names('avg(DCGM_FI_DEV_GPU_TEMP{gpu="$gpu"')


def test_promql_string_escapes() -> None:
    assert promql_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    assert analyse("m{a=" + promql_string('x"y') + "}").selectors[0].matchers == (("a", "=", 'x"y'),)


def test_widest_range_ignores_offsets() -> None:
    assert widest_range_s("rate(x[5m] offset 1h)") == 300
    assert widest_range_s("max_over_time(x[1h:1m]) + rate(y[30s])") == 3600
    assert widest_range_s("x offset 1h") is None


@pytest.mark.parametrize("expr,expected", [
    ('sum by (Hostname) (rate(x{Hostname=~"a.*", gpu="0"}[5m] offset 1m))',
     'sum by (hostname) (rate(x{hostname=~"a.*", gpu="0"}[5m] offset 1m))'),
    ("x / on(Hostname) group_left(gpu) y", "x / on(hostname) group_left(gpu) y"),
    ('label_replace(x, "h", "$1", "Hostname", "(Hostname.*)")',
     'label_replace(x, "h", "$1", "hostname", "(Hostname.*)")'),
    ('label_join(x, "Hostname", ",", "Hostname", "gpu")', 'label_join(x, "hostname", ",", "hostname", "gpu")'),
    ('sum(x{a="Hostname"}) by (Hostname) # Hostname', 'sum(x{a="Hostname"}) by (hostname) # Hostname'),
    ("Hostname", "Hostname"),  # a metric that happens to be called so
    ('count_values("Hostname", x)', 'count_values("Hostname", x)'),  # an output label, the same on both sides
    # Escapes survive: the text is not re-printed.
    ('x{a="b\\"c", Hostname!~`n\\d`}', 'x{a="b\\"c", hostname!~`n\\d`}'),
])
def test_label_renames_reach_every_place_a_label_is_named(expr: str, expected: str) -> None:
    assert rename_labels_in(expr, {"Hostname": "hostname"}) == expected
    assert rename_labels_in(expr, {}) == expr


def test_nameless_selectors_are_restricted_to_the_group_where_asked() -> None:
    group = ("__name__", "=~", "A|B")
    assert (restrict_nameless('sum({gpu="0", a!="}"}) or {b="1",}', group, lambda s: True)
            == 'sum({gpu="0", a!="}", __name__=~"A|B"}) or {b="1", __name__=~"A|B"}')
    assert (restrict_nameless('x{gpu="0"} or {gpu="1"}', group, lambda s: True)
            == 'x{gpu="0"} or {gpu="1", __name__=~"A|B"}')
    assert restrict_nameless('rate({a="b"}[5m] offset 1m)', group, lambda s: True) == \
        'rate({a="b", __name__=~"A|B"}[5m] offset 1m)'
    only_a = restrict_nameless('{a="1"} + {b="2"}', group, lambda s: s.matchers[0][0] == "a")
    assert only_a == '{a="1", __name__=~"A|B"} + {b="2"}'
    assert restrict_nameless('{__name__="x"}', group, lambda s: True) == '{__name__="x"}'  # has a name
