"""Issue 24, items 1 and 5: golden queries on a fleet half-way through a declared rename, and the small ones
(unique measurement names, Grafana's millisecond and second variables, a body that is not UTF-8)."""

from __future__ import annotations

import pytest

from promshift.adapters.prometheus import Answer, PrometheusClient, PrometheusError
from promshift.core.errors import ErrorKind
from promshift.core.golden import DashboardQuery, either_name_selectors, golden_names, read_either_name
from promshift.core.parity import hosts_per_label, undeclared_rename_note
from promshift.core.promql import PromQLError, Selector, analyse, grafana_builtins, substitute

RENAME = (("hostname", "Hostname"),)


def carried(inner: str) -> str:
    return (f'label_replace(label_replace({inner}, "Hostname", "$1", "hostname", "(.+)"), '
            f'"hostname", "", "", "")')


def test_an_aggregation_by_the_old_name_reads_every_host_under_either_name() -> None:
    out = read_either_name("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", RENAME)
    assert out == ('avg by (Hostname) ((DCGM_FI_DEV_GPU_UTIL{hostname=""} or '
                   + carried('DCGM_FI_DEV_GPU_UTIL{hostname!=""}') + "))")


def test_a_range_selector_reads_its_function_twice_and_renames_the_matcher() -> None:
    out = read_either_name('sum by (Hostname) (rate(X{Hostname=~"n.*", gpu="0"}[5m] offset 1m))', RENAME)
    assert out == ('sum by (Hostname) ((rate(X{Hostname=~"n.*", gpu="0", hostname=""}[5m] offset 1m) or '
                   + carried('rate(X{hostname=~"n.*", gpu="0", hostname!=""}[5m] offset 1m)') + "))")


@pytest.mark.parametrize("expr", [
    "max_over_time(X[1h:1m])", "X @ end()", "X offset -5m", "count(X @ 1700000000)",
    "quantile_over_time(0.9, X[5m]) / on(Hostname) group_left Y",
    "a * on(x) group_left rate(b[5m])", 'label_replace(X, "h", "$1", "Hostname", "(.*)")',
    "histogram_quantile(0.9, sum by (le) (rate(X_bucket[5m])))", "rate(X[5m])[30m:1m]", "sum(X) / count(X)",
    '{Hostname="a", __name__=~"X|Y"}', "sum without (Hostname) (X)", "topk(3, X)", 'count_values("v", X)',
])
def test_every_selector_is_read_under_both_names_and_the_rest_is_kept(expr: str) -> None:
    out = read_either_name(expr, RENAME)
    parts = set(analyse(out).selectors)
    for sel in analyse(expr).selectors:
        assert Selector(sel.name, (*sel.matchers, ("hostname", "=", ""))) in parts
        renamed = tuple(("hostname" if k == "Hostname" else k, op, v) for k, op, v in sel.matchers)
        assert Selector(sel.name, (*renamed, ("hostname", "!=", ""))) in parts
    assert len(parts) == 2 * len(analyse(expr).selectors)


def test_a_query_written_with_the_new_name_is_normalised_the_other_way() -> None:
    out = read_either_name("avg by (hostname) (X)", RENAME)
    assert out.startswith('avg by (hostname) ((X{Hostname=""} or label_replace(label_replace(X{Hostname!=""}, '
                          '"hostname", "$1", "Hostname", "(.+)")')


def test_a_bare_range_vector_is_refused_not_rewritten_wrongly() -> None:
    with pytest.raises(PromQLError):
        read_either_name("X[5m]", RENAME)


def test_series_behind_split_only_where_the_selector_names_the_label() -> None:
    plain = Selector("X", (("gpu", "=", "0"),))
    assert either_name_selectors(plain, RENAME) == [plain]
    on_host = Selector("X", (("Hostname", "=", "a"),))
    assert either_name_selectors(on_host, RENAME) == [
        Selector("X", (("Hostname", "=", "a"), ("hostname", "=", ""))),
        Selector("X", (("hostname", "=", "a"), ("hostname", "!=", "")))]


def test_hosts_per_label_name_shows_the_declared_names_even_at_zero() -> None:
    text = hosts_per_label({"source": {"Hostname": 100}, "target": {"Hostname": 50, "hostname": 50}},
                           ("Hostname", "hostname"))
    assert text == "hosts per label name: source Hostname 100, hostname 0; target Hostname 50, hostname 50"
    assert hosts_per_label({"source": {"Hostname": 3}, "target": {"hostname": 3}}, ("Hostname",)) == (
        "hosts per label name: source Hostname 3; target Hostname 0, hostname 3")


def test_an_undeclared_rename_is_named_with_its_hosts() -> None:
    note = undeclared_rename_note(({}, {"hostname": {"n2", "n1"}}), "Hostname")
    assert note == ("`hostname` instead of `Hostname` on 2 hosts (n1, n2) of the target: renamed? add "
                    "`parity.rename_labels: {hostname: Hostname}` if intended")
    assert undeclared_rename_note(({}, {}), "Hostname") is None


def test_golden_names_are_unique_across_dashboards() -> None:
    queries = [DashboardQuery("p0", "A", "x", "one.json"), DashboardQuery("p0", "A", "y", "two.json"),
               DashboardQuery("p1", "A", "z", "one.json"), DashboardQuery("p2", "A", "z", "one.json"),
               DashboardQuery("p2", "B", "z", "one.json")]
    names = golden_names(queries)
    assert names == ["golden[one.json/p0/A]", "golden[two.json/p0/A]", "golden[p1]", "golden[p2/A]",
                     "golden[p2/B]"]
    twice = golden_names([DashboardQuery("p0", "A", "x", "d.json")] * 2)
    assert twice == ["golden[d.json/p0/A]", "golden[d.json/p0/A#2]"]


@pytest.mark.parametrize("expr,expected", [
    ("rate(x[$__interval_ms])", "rate(x[30000ms])"),
    ("rate(x[${__interval_ms}ms])", "rate(x[30000ms])"),
    ("rate(x[$__rate_interval_ms])", "rate(x[120000ms])"),
    ("max_over_time(x[$__range_ms])", "max_over_time(x[3600000ms])"),
    ("max_over_time(x[$__range_s])", "max_over_time(x[3600s])"),
    ("max_over_time(x[${__range_s}s])", "max_over_time(x[3600s])"),
    ("x[$__range_s:]", "x[3600s:]"),
    ("x / $__range_ms", "x / 3600000"),
    ("x / $__range_s", "x / 3600"),
])
def test_grafana_millisecond_and_second_variables_keep_their_unit(expr: str, expected: str) -> None:
    out = substitute(expr, {}, builtins=grafana_builtins(30, 3600)).expr
    assert out == expected
    if "[" in out:
        assert analyse(out).lookback_s in (30.0, 120.0, 3600.0)


def test_a_json_object_that_is_not_utf8_is_named_so() -> None:
    client = PrometheusClient("http://127.0.0.1:9")
    with pytest.raises(PrometheusError) as excinfo:
        client._success_body(Answer(200, b'{"status": "success", "data": "\xff"}'), "'q'")
    assert excinfo.value.kind == ErrorKind.MALFORMED
    assert "body is not valid UTF-8 (byte 0xff at offset 31)" in str(excinfo.value)
    with pytest.raises(PrometheusError, match="body is not a JSON object"):
        client._success_body(Answer(200, b"<html>hi</html>"), "'q'")


def test_check_parity_prints_hosts_per_label_name_and_the_noise_model() -> None:
    import dataclasses

    from promshift.adapters.settings import load_catalog
    from promshift.cli.checks import _parity_evidence
    from promshift.core.parity import ParityResult
    from promshift.core.verdicts import Measurement, Verdict

    group = load_catalog(profile="demo").get("gpu-memory")
    group = dataclasses.replace(group, parity=dataclasses.replace(group.parity, rename_labels=RENAME))
    host = Measurement("host_coverage", Verdict.SUCCESSFUL, "ok", numbers={
        "hosts_per_label": {"source": {"Hostname": 100}, "target": {"Hostname": 50, "hostname": 50}}})
    samples = Measurement("samples", Verdict.SUCCESSFUL, "ok", numbers={"noise_model": {"per_metric": {
        "X:avg5s": {"bias": 0.01, "allowed": 0.5}}}})
    text = _parity_evidence(ParityResult(Verdict.SUCCESSFUL, (host, samples)), group)
    assert text == ("\nhosts per label name: source Hostname 100, hostname 0; target Hostname 50, hostname 50"
                    "\nindependent scrapers, mean target-source difference per metric: X:avg5s +0.01 (allowed 0.5)")
