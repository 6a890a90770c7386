"""PromQL analysis on a real parser: quoting, selectors, look-back, read-ahead, Grafana variables.

Built on ``promql_parser`` 0.12.0 (bindings to a Rust PromQL parser; pure, no I/O). Checked
against Debian's Prometheus 2.42 on 656 expressions (the PromQL compliance suite's 539
variants, the dcgm-exporter dashboards, and hand-picked edge cases): both accept and reject
the same ones except ``holt_winters`` (2.42 has it, the parser only its Prometheus 3 name:
registered here), backtick strings with a backslash (raw in PromQL, escapes to the parser:
handed over double-quoted here), and Prometheus 3 additions the parser accepts and 2.42
rejects (``limitk``, ``info``, ``x{a="b" or c="d"}``, quoted label names, unit-less
durations); those reach the backends, which reject them on both sides.

Times are relative to a query's evaluation instant ``t``: a read ``(back_s, ahead_s)``
takes samples from ``t - back_s`` to ``t + ahead_s``. ``@ start()``/``@ end()``/``@ <time>``
anchor a read to the query range's start, end or a fixed time instead of ``t``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import promql_parser

# Prometheus 2.x's name for what Prometheus 3 calls double_exponential_smoothing (registration is
# process-wide and idempotent; a parser that knows it as a built-in refuses it, which is fine).
try:
    promql_parser.register_extra_functions([promql_parser.Function(
        "holt_winters", [promql_parser.ValueType.Matrix, promql_parser.ValueType.Scalar,
                         promql_parser.ValueType.Scalar], promql_parser.ValueType.Vector)])
except ValueError:
    pass

# Functions that answer something even when no series exists.
_ANSWER_WITHOUT_SERIES = frozenset({"vector", "absent", "absent_over_time", "time", "pi", "scalar"})
# MatchOp is not hashable: look operators up by position.
_OPS = ((promql_parser.MatchOp.Equal, "="), (promql_parser.MatchOp.NotEqual, "!="),
        (promql_parser.MatchOp.Re, "=~"), (promql_parser.MatchOp.NotRe, "!~"))
# Grafana's own variable syntax: $var, [[var]] / [[var:fmt]], ${var} / ${var.field} / ${var:fmt}.
_GRAFANA_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::\w+)?\]\]|\$\{(\w+)(?:\.[^:^}]+)?(?::[^}]+)?\}")


class PromQLError(ValueError):
    """An expression this module cannot analyse: it does not parse, or uses what is not supported."""


def promql_string(value: str) -> str:
    """Quote ``value`` as a PromQL double-quoted string literal.

    PromQL strings use Go's escapes; JSON's (``\\\\``, ``\\"``, ``\\n``, ``\\uXXXX``) are a
    subset of them, so a JSON string is a valid PromQL one.
    """
    return json.dumps(value, ensure_ascii=False)


def _seconds(delta: timedelta | None) -> float:
    return 0.0 if delta is None else delta.total_seconds()


@dataclass(frozen=True)
class Selector:
    """One vector selector: its metric name (None when it has none) and its other matchers."""

    name: str | None
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value), op one of = != =~ !~

    def promql(self, *extra: tuple[str, str, str]) -> str:
        """The selector as PromQL, without offset or ``@``; ``extra`` matchers are appended."""
        parts = [f"{label}{op}{promql_string(value)}" for label, op, value in (*self.matchers, *extra)]
        body = "{" + ", ".join(parts) + "}"
        return (self.name or "") + body if parts or not self.name else self.name


@dataclass(frozen=True)
class Read:
    """Where one selector's samples come from: ``anchor`` - ``back_s`` to ``anchor`` + ``ahead_s``.

    ``anchor`` is ``"t"`` (each evaluation instant), ``"start"``/``"end"`` (the query range's,
    from ``@ start()``/``@ end()``) or ``"fixed"`` (``@ <at>``).
    """

    selector: Selector
    anchor: str
    back_s: float
    ahead_s: float
    at: float | None = None


@dataclass(frozen=True)
class Analysis:
    """What a parsed expression reads and whether it answers with nothing behind it."""

    expr: str
    reads: tuple[Read, ...]
    answers_without_series: bool

    @property
    def selectors(self) -> tuple[Selector, ...]:
        """Distinct selectors in expression order."""
        return tuple(dict.fromkeys(r.selector for r in self.reads))

    @property
    def lookback_s(self) -> float:
        """How far before its evaluation instant the expression reads (0 for plain selectors)."""
        return max([0.0, *(r.back_s for r in self.reads if r.anchor == "t")])

    @property
    def readahead_s(self) -> float:
        """How far after its evaluation instant it reads (negative offsets), 0 when it does not."""
        return max([0.0, *(r.ahead_s for r in self.reads if r.anchor == "t")])

    @property
    def anchored(self) -> tuple[Read, ...]:
        """Reads pinned by ``@``: to the range's start or end, or to a fixed time."""
        return tuple(r for r in self.reads if r.anchor != "t")


# --------------------------------------------------------------------------- the budget before the parser
#
# The Rust parser's memory and time grow with the square of the syntax tree's depth (4,000 nested
# parentheses: 290 MB; 4,000 `+` terms, left-nested: 630 MB; 10,000: an abort at 2.8 GB), and the walks
# below recurse once per level. Every expression is measured first, in one linear pass over its text:
# its length, how deeply its brackets nest and how many operators it has (a chain of binary operators
# nests as deep as it is long). At these limits the parser takes milliseconds and a few MB; no
# dashboard, rule or golden query we have seen comes near them.
MAX_QUERY_CHARS = 65_536

# promshift's own reads (parity, latency, bake, retire proofs) end in this PromQL comment line: the server ignores it,
# its query log keeps it, so reading a query log (the plan's usage, what retiring a source ends) leaves them out.
OWN_READ_COMMENT = "# promshift"


def mark_own_read(expr: str) -> str:
    """``expr`` as promshift sends it: the same query, with its own-read comment line."""
    return f"{expr}\n{OWN_READ_COMMENT}"


def is_own_read(query: str) -> bool:
    """A query promshift sent itself (``mark_own_read``)."""
    return query.endswith("\n" + OWN_READ_COMMENT)

MAX_NESTING = 64
MAX_OPERATORS = 256
_OPERATOR_WORDS = frozenset({"and", "or", "unless", "atan2"})
# One step of the scan: a quote or comment start (handled by hand), a bracket, an operator, a word.
_SCAN = re.compile(r"""["'`#]|[(\[{]|[)\]}]|[-+*/%^]|[=!<>]=|[<>]|[A-Za-z_][A-Za-z0-9_:]*""")


class PromQLBudgetError(PromQLError):
    """An expression over the size budget: refused before the parser sees it."""


def _string_end(expr: str, start: int) -> int:
    """The index after the string literal opened at ``start``; -1 when it is never closed."""
    quote = expr[start]
    index = start + 1
    while True:
        index = expr.find(quote, index)
        if index < 0:
            return -1
        if quote != "`":
            backslashes = 0
            while expr[index - 1 - backslashes] == "\\":
                backslashes += 1
            if backslashes % 2:
                index += 1
                continue
        return index + 1


def check_budget(expr: str) -> None:
    """Refuse ``expr`` (PromQLBudgetError, one line) when it is longer, nests deeper or has more operators than
    the parser is given; linear in its length, without recursion."""
    if not isinstance(expr, str):
        raise PromQLBudgetError(f"a query must be text, not {type(expr).__name__}")
    if len(expr) > MAX_QUERY_CHARS:
        raise PromQLBudgetError(f"query of {len(expr):,} characters (at most {MAX_QUERY_CHARS:,})")
    depth = deepest = operators = 0
    index, end = 0, len(expr)
    while index < end:
        match = _SCAN.search(expr, index)
        if match is None:
            break
        token = match.group()
        index = match.end()
        first = token[0]
        if first in "\"'`":
            index = _string_end(expr, match.start())
            if index < 0:  # never closed: the parser says so, in its words
                break
        elif first == "#":
            newline = expr.find("\n", index)
            index = end if newline < 0 else newline
        elif first in "([{":
            depth += 1
            if depth > MAX_NESTING:
                raise PromQLBudgetError(f"query nests deeper than {MAX_NESTING} brackets")
            deepest = max(deepest, depth)
        elif first in ")]}":
            depth = max(0, depth - 1)
        elif first.isalpha() or first == "_":
            if token.lower() in _OPERATOR_WORDS:
                operators += 1
        else:
            operators += 1
        if operators > MAX_OPERATORS:
            raise PromQLBudgetError(f"query has more than {MAX_OPERATORS} operators")


def parse(expr: str) -> Any:
    """The parser's AST; a clear PromQLError when the expression does not parse or is over the budget.

    Backtick strings are raw in PromQL (`n\\d` is a regex), but promql_parser 0.12.0 reads
    escapes in them: they are handed to it as the equivalent double-quoted strings.
    """
    check_budget(expr)
    if "`" in expr:
        expr = "".join(promql_string(tok[1:-1]) if tok.startswith("`") else tok for tok in _TOKEN.findall(expr))
    try:
        return promql_parser.parse(expr)
    except (ValueError, TypeError) as exc:
        raise PromQLError(f"does not parse: {exc}") from exc


def analyse(expr: str) -> Analysis:
    """Parse ``expr`` and collect its reads (with look-back and read-ahead) and constant-ness."""
    node = parse(expr)
    reads = tuple(_reads(node))
    return Analysis(expr=expr, reads=reads, answers_without_series=_answers_without_series(node))


def _selector(node: Any) -> Selector:
    if node.matchers.or_matchers:
        raise PromQLError("`or` inside a selector's braces is Prometheus 3 syntax, not supported here")
    name = node.name
    matchers = []
    for m in node.matchers.matchers:
        op = next(text for match_op, text in _OPS if m.op == match_op)
        if m.name == "__name__" and op == "=" and name is None:
            name = m.value
            continue
        matchers.append((m.name, op, m.value))
    return Selector(name=name, matchers=tuple(matchers))


def _anchor(at: Any) -> tuple[str, float | None]:
    if at is None:
        return "t", None
    if at.type == promql_parser.AtModifierType.Start:
        return "start", None
    if at.type == promql_parser.AtModifierType.End:
        return "end", None
    return "fixed", at.at.timestamp()


def _children(node: Any) -> list[Any]:
    if isinstance(node, promql_parser.Call):
        return [a for a in node.args if isinstance(a, promql_parser.Expr)]
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.AggregateExpr):
        return [node.expr, *([node.param] if isinstance(node.param, promql_parser.Expr) else [])]
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
        return [node.expr]
    return []


def _reads(node: Any) -> list[Read]:
    if isinstance(node, promql_parser.VectorSelector):
        anchor, at = _anchor(node.at)
        offset = _seconds(node.offset)
        return [Read(_selector(node), anchor, back_s=offset, ahead_s=0.0 - offset, at=at)]
    if isinstance(node, promql_parser.MatrixSelector):
        vs = node.vector_selector
        anchor, at = _anchor(vs.at)
        offset = _seconds(vs.offset)
        return [Read(_selector(vs), anchor, back_s=offset + _seconds(node.range), ahead_s=0.0 - offset, at=at)]
    if isinstance(node, promql_parser.SubqueryExpr):
        offset, span = _seconds(node.offset), _seconds(node.range)
        anchor, at = _anchor(node.at)
        out = []
        for inner in _reads(node.expr):
            if inner.anchor != "t":  # pinned by its own @: the subquery does not move it
                out.append(inner)
                continue
            out.append(Read(inner.selector, anchor, back_s=offset + span + inner.back_s,
                            ahead_s=inner.ahead_s - offset, at=at))
        return out
    return [r for child in _children(node) for r in _reads(child)]


def _is_scalar(node: Any) -> bool:
    if isinstance(node, promql_parser.NumberLiteral):
        return True
    if isinstance(node, promql_parser.Call):
        return node.func.return_type == promql_parser.ValueType.Scalar
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr)):
        return _is_scalar(node.expr)
    if isinstance(node, promql_parser.BinaryExpr):
        return _is_scalar(node.lhs) and _is_scalar(node.rhs)
    return False


def _answers_without_series(node: Any) -> bool:
    """Whether the expression can answer something when every selector selects nothing."""
    if isinstance(node, (promql_parser.NumberLiteral, promql_parser.StringLiteral)):
        return True
    if isinstance(node, (promql_parser.VectorSelector, promql_parser.MatrixSelector)):
        return False
    if isinstance(node, promql_parser.Call):
        if node.func.name in _ANSWER_WITHOUT_SERIES or node.func.return_type == promql_parser.ValueType.Scalar:
            return True
        data = [a for a in node.args if isinstance(a, promql_parser.Expr) and not _is_scalar(a)
                and not isinstance(a, promql_parser.StringLiteral)]
        # day_of_month() and friends default to vector(time()).
        return not data or any(_answers_without_series(a) for a in data)
    if isinstance(node, promql_parser.BinaryExpr):
        op = str(node.op)
        lhs, rhs = _answers_without_series(node.lhs), _answers_without_series(node.rhs)
        if op == "or":
            return lhs or rhs
        if op == "unless":
            return lhs
        if _is_scalar(node.lhs):
            return rhs
        if _is_scalar(node.rhs):
            return lhs
        return lhs and rhs
    if isinstance(node, promql_parser.AggregateExpr):
        return _answers_without_series(node.expr)
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        return _answers_without_series(node.expr)
    return False


def labels_relied_on(expr: str) -> frozenset[str]:
    """The labels ``expr`` selects on (matchers), groups by (``by``) or matches on (``on``, ``group_left/right``):
    a label dropped from the series changes what such a query answers. Labels only named in ``without`` or
    ``ignoring`` are not counted (dropping them changes nothing there). PromQLError when it does not parse."""
    found: set[str] = set()
    stack = [parse(expr)]
    while stack:
        node = stack.pop()
        if isinstance(node, promql_parser.MatrixSelector):
            node = node.vector_selector
        if isinstance(node, promql_parser.VectorSelector):
            found.update(m.name for m in node.matchers.matchers if m.name != "__name__")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            if node.modifier.type == promql_parser.AggModifierType.By:
                found.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None and matching.type == promql_parser.LabelModifierType.Include:
                found.update(matching.labels)
            found.update(node.modifier.group_labels or ())
        if isinstance(node, promql_parser.SubqueryExpr):
            stack.append(node.expr)
        stack.extend(_children(node))
    return frozenset(found)


def lookback_s(expr: str) -> float | None:
    """The longest look-back of ``expr`` in seconds (range selectors, subqueries, offsets), None for none.

    An expression that does not parse raises PromQLError.
    """
    reads = analyse(expr).reads
    back = max((r.back_s for r in reads if r.anchor == "t"), default=0.0)
    return back if back > 0 else None


# --------------------------------------------------------------------------- Grafana variables


@dataclass(frozen=True)
class Substitution:
    """A dashboard expression with Grafana's variables replaced; ``unknown`` were left as written."""

    expr: str
    unknown: tuple[str, ...]


def substitute(expr: str, values: Mapping[str, str], *, builtins: Mapping[str, str] | None = None) -> Substitution:
    """Replace Grafana template variables the way Grafana does.

    Known variables (``values`` and the ``builtins`` such as ``$__rate_interval``) are
    replaced; unknown ones stay as written and are reported in ``unknown``. ``$1``, ``$2``,
    ``${1}`` are regex capture groups (``label_replace``), never variables. Multi-value
    variables are given as a regex (``a|b``), as Grafana renders them for ``=~``.
    """
    known = {**(builtins or {}), **values}
    unknown: list[str] = []

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():
            return m.group(0)
        if name in known:
            return known[name] + _unit_in_range(name, expr, m, builtins or {})
        if name not in unknown:
            unknown.append(name)
        return m.group(0)

    return Substitution(_GRAFANA_VARIABLE.sub(repl, expr), tuple(unknown))


def _unit_in_range(name: str, expr: str, m: re.Match[str], builtins: Mapping[str, str]) -> str:
    """The unit Grafana's ``$__interval_ms``, ``$__range_ms``, ``$__range_s`` count in, when one stands bare
    in a range (``[$__interval_ms]``): Grafana puts a number there (milliseconds or seconds), which a
    unit-less duration would read as seconds. Written with a unit (``[${__range_s}s]``), it stays as written."""
    if name not in builtins or not name.endswith(("_ms", "_s")):
        return ""
    before, after = expr[:m.start()], expr[m.end():]
    inside = before.rfind("[") > before.rfind("]")
    if not inside or (after[:1].isalpha()):
        return ""
    return "ms" if name.endswith("_ms") else "s"


def grafana_builtins(step_s: float, range_s: float) -> dict[str, str]:
    """What Grafana would put in its built-in interval variables for this step and query range.

    ``$__rate_interval`` is four steps (Grafana: at least four scrape intervals; the step is at
    least the scrape interval here).
    """
    step = max(1, int(step_s))
    rate = max(1, int(4 * step_s))
    span = max(1, int(range_s))
    return {"__interval": f"{step}s", "__interval_ms": str(step * 1000), "__rate_interval": f"{rate}s",
            "__rate_interval_ms": str(rate * 1000), "__range": f"{span}s", "__range_s": str(span),
            "__range_ms": str(span * 1000)}


# A label no exporter writes: keeps each metric's series apart once a function drops ``__name__``.
NAME_KEEPER = "__promshift_metric"


def newest_sample_expr(selector: str) -> str:
    """The time of the newest sample any series of ``selector`` holds, as one instant query.

    ``timestamp()`` drops the metric name, so a selector over several metrics whose series share their other
    labels (DCGM_FI_DEV_FB_USED and _FREE of one GPU) would make a vector with duplicate label sets, which
    Prometheus refuses (HTTP 422). The name is first copied into ``NAME_KEEPER``, which ``timestamp()`` keeps.
    """
    return (f"max(timestamp(label_replace({selector}, {promql_string(NAME_KEEPER)}, \"$1\", \"__name__\", "
            f"\"(.+)\")))")


def metric_names(expr: str) -> list[str]:
    """The metric names an expression names, parsed when it parses, else read off its identifiers.

    The fallback serves inventories of expressions that do not parse (they are reported,
    not compared).
    """
    try:
        return [s.name for s in analyse(expr).selectors if s.name]
    except PromQLBudgetError:
        return []  # over the budget: not read at all, not even by the fallback
    except PromQLError:
        return re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", re.sub(r'"(?:[^"\\]|\\.)*"', "", expr))


def widest_range_s(expr: str) -> float | None:
    """The widest range (``[5m]``, a subquery's ``[1h:1m]``) in ``expr`` in seconds; None without one.

    For cost estimates (samples read per evaluation), so offsets do not count. An expression
    that does not parse raises PromQLError.
    """
    widths: list[float] = []

    def visit(node: Any) -> None:
        if isinstance(node, (promql_parser.MatrixSelector, promql_parser.SubqueryExpr)):
            widths.append(_seconds(node.range))
        if isinstance(node, promql_parser.SubqueryExpr):
            visit(node.expr)
        for child in _children(node):
            visit(child)

    visit(parse(expr))
    return max(widths) if widths else None


# --------------------------------------------------------------------------- label renames

# Strings (three quotings), comments, identifiers, numbers/durations, two-character matchers, the rest.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|#[^\n]*'
                    r"|[A-Za-z_:][A-Za-z0-9_:]*|[0-9.][0-9A-Za-z_.]*|!=|=~|!~|\s+|.", re.S)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Functions whose string arguments at these positions (0-based) are label names.
_LABEL_ARGS = {"label_replace": lambda i: i in (1, 3), "label_join": lambda i: i == 1 or i >= 3}


def rename_labels_in(expr: str, renames: Mapping[str, str]) -> str:
    """``expr`` with label names renamed (``{old: new}``) wherever PromQL names a label.

    Matchers, ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` lists and the
    label-name arguments of ``label_replace``/``label_join`` are renamed; metric names, strings
    that are values and everything else stay as written (the text is not re-printed, so
    escapes and formatting survive). The result is checked against the parse of ``expr``:
    PromQLError when it would read other selectors than the renamed original.
    """
    if not renames:
        return expr
    original = analyse(expr)
    out: list[str] = []
    braces = 0
    grouping = False  # inside the label list after by/without/on/...
    expect_list = False
    calls: list[list[Any]] = []  # [function name or None, depth, argument index]
    depth = 0
    pending_call: str | None = None
    for tok in _TOKEN.findall(expr):
        text = tok
        if tok[0].isspace() or tok.startswith("#"):
            out.append(tok)
            continue
        if tok[0] in "\"'`":
            frame = calls[-1] if calls else None
            if (frame and frame[0] in _LABEL_ARGS and frame[1] == depth and _LABEL_ARGS[frame[0]](frame[2])
                    and tok[0] != "`" and tok[1:-1] in renames):
                text = tok[0] + renames[tok[1:-1]] + tok[0]
        elif tok[0].isalpha() or tok[0] in "_:":
            if (braces or grouping) and tok in renames:
                text = renames[tok]
            expect_list = tok in _GROUPING and not braces
            pending_call = tok
            out.append(text)
            continue
        elif tok == "(":
            depth += 1
            if expect_list:
                grouping = True
            calls.append([pending_call, depth, 0])
        elif tok == ")":
            grouping = False
            depth -= 1
            if calls:
                calls.pop()
        elif tok == "{":
            braces += 1
        elif tok == "}":
            braces -= 1
        elif tok == "," and calls and calls[-1][1] == depth and not grouping:
            calls[-1][2] += 1
        expect_list = False
        pending_call = None
        out.append(text)
    rewritten = "".join(out)
    wanted = tuple(Selector(s.name, tuple((renames.get(label, label), op, value) for label, op, value in s.matchers))
                   for s in original.selectors)
    if analyse(rewritten).selectors != wanted:
        raise PromQLError(f"cannot apply the label renames {dict(renames)} to {expr!r}")
    return rewritten


_KEYWORDS = frozenset({"and", "or", "unless", "bool", "atan2", "offset"})


def restrict_nameless(expr: str, matcher: tuple[str, str, str], which: Any) -> str:
    """``expr`` with ``matcher`` added to each selector without a metric name for which ``which(selector)``.

    E.g. ``{gpu="0"}`` becomes ``{gpu="0", __name__=~"A|B"}``: a golden query then compares only
    the group's metrics, which is all a per-group dual-write sends. Checked against the parse.
    """
    original = analyse(expr)
    tokens = _TOKEN.findall(expr)
    out: list[str] = []
    previous = ""
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        named = bool(previous) and (previous[0].isalpha() or previous[0] in "_:") and previous not in _KEYWORDS
        if tok == "{" and not named:
            j = i
            while j < len(tokens) and tokens[j] != "}":
                j += 1
            body = "".join(tokens[i:j + 1])
            sel = analyse(body).selectors[0] if j < len(tokens) else None
            if sel is not None and sel.name is None and which(sel):
                inner = "".join(tokens[i + 1:j]).rstrip().rstrip(",")
                label, op, value = matcher
                body = "{" + inner + (", " if inner.strip() else "") + f"{label}{op}{promql_string(value)}" + "}"
            out.append(body)
            previous = "}"
            i = j + 1
            continue
        out.append(tok)
        if not tok[0].isspace() and not tok.startswith("#"):
            previous = tok
        i += 1
    rewritten = "".join(out)
    wanted = tuple(dict.fromkeys(
        Selector(None, (*s.matchers, matcher)) if s.name is None and which(s) else s for s in original.selectors))
    if analyse(rewritten).selectors != wanted:
        raise PromQLError(f"cannot restrict the selectors without a metric name in {expr!r}")
    return rewritten


# --------------------------------------------------------------------------- which labels an answer depends on

# Functions whose string arguments at these positions (0-based) name labels they read or write.
_LABEL_NAME_ARGS = {"label_replace": (1, 3), "label_join": (1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
                    "sort_by_label": (1, 2, 3, 4, 5, 6, 7, 8), "sort_by_label_desc": (1, 2, 3, 4, 5, 6, 7, 8)}


def labels_depended_on(expr: str) -> dict[str, str]:
    """The label names ``expr``'s answer could depend on, each with how it is used.

    A label is depended on when a selector matches on it, an aggregation groups ``by`` it, a binary
    operator joins ``on``/``ignoring`` it or copies it with ``group_left``/``group_right``, ``count_values``
    writes it, or ``label_replace``/``label_join`` (and ``sort_by_label``) name it. A label only removed
    (``without``, or an aggregation without grouping, which drops every label) is not: the answer is the
    same whether the series carried it or not. An expression that does not parse raises PromQLError.
    """
    found: dict[str, str] = {}

    def note(label: str, how: str) -> None:
        found.setdefault(label, how)

    for node in _nodes(parse(expr)):
        if isinstance(node, promql_parser.MatrixSelector):
            node = node.vector_selector
        if isinstance(node, promql_parser.VectorSelector):
            for group in (node.matchers.matchers, *(node.matchers.or_matchers or ())):
                for m in group:
                    if m.name != "__name__":
                        note(m.name, "matched")
        elif isinstance(node, promql_parser.AggregateExpr):
            modifier = node.modifier
            if modifier is not None and modifier.type == promql_parser.AggModifierType.By:
                for label in modifier.labels:
                    note(label, "grouped by")
            if str(node.op) == "count_values" and isinstance(node.param, promql_parser.StringLiteral):
                note(node.param.val, "written by count_values")
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                way = "joined on" if matching.type == promql_parser.LabelModifierType.Include else "joined ignoring"
                for label in matching.labels:
                    note(label, way)
            for label in node.modifier.group_labels or ():
                note(label, "copied by group_left/group_right")
        elif isinstance(node, promql_parser.Call) and node.func.name in _LABEL_NAME_ARGS:
            positions = _LABEL_NAME_ARGS[node.func.name]
            for i, arg in enumerate(node.args):
                if i in positions and isinstance(arg, promql_parser.StringLiteral) and arg.val:
                    note(arg.val, f"named by {node.func.name}")
    return found


def _nodes(node: Any) -> Iterator[Any]:
    """``node`` and every node under it (a subquery's expression included)."""
    yield node
    if isinstance(node, promql_parser.SubqueryExpr):
        yield from _nodes(node.expr)
    for child in _children(node):
        yield from _nodes(child)


def functions_used(expr: str) -> set[str]:
    """Every function and aggregation operator ``expr`` calls (``rate``, ``sum``, ``deriv``...).

    An expression that does not parse raises PromQLError.
    """
    found: set[str] = set()
    for node in _nodes(parse(expr)):
        if isinstance(node, promql_parser.Call):
            found.add(node.func.name)
        elif isinstance(node, promql_parser.AggregateExpr):
            found.add(str(node.op))
    return found
