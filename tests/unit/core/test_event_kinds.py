"""Audit event kinds: one ``EventKind`` enum, used at every append and every comparison.

The stored values never change (the audit log is append-only and old events keep their kinds), and no
production module spells a kind as a string literal: ``kind="..."``, ``.record("...")``, or a string
compared with an event's ``kind``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from promshift.core.events import APPROVAL_ANSWERS, EventKind, approval_kind

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "include" / "promshift"
SOURCES = [*sorted(PACKAGE.rglob("*.py")), *sorted((REPO / "dags").glob("*.py")),
           *sorted((REPO / "plugins").glob("*.py"))]
EVENTS_MODULE = PACKAGE / "core" / "events.py"

# Every kind ever written, as stored. Add new kinds at the end; never edit or remove one.
STORED_VALUES = [
    "validated", "validation_failed", "start_refused", "snapshot_taken", "quota_refused", "deploy_failed",
    "dual_write_deployed", "warmup_started", "warmup_ready", "warmup_timeout", "warmup_error", "gate_passed",
    "gate_inconclusive", "gate_failed", "evidence_shown", "approved", "approval_reject", "approval_timeout",
    "approval_refused_four_eyes", "approval_refused_evidence_changed", "cut_over", "run_complete",
    "rolled_back", "rollback_not_needed", "rollback_failed", "report_published", "notified", "dry_run_step",
    "dry_run_gate", "dry_run_complete", "rules_snapshot", "rules_records_added", "rules_moved", "rules_restored",
    "rules_move_failed", "rules_restore_failed", "read_path_snapshot", "read_path_switched", "read_path_restored",
    "read_path_switch_failed", "read_path_restore_failed", "bake_started", "bake_check", "baked",
    "reads_rolled_back", "restore_reads_failed", "decommission_approved", "decommission_approval_reject",
    "decommission_approval_timeout", "decommission_approval_refused_four_eyes",
    "decommission_approval_refused_evidence_changed", "decommission_refused", "decommission_failed",
    "decommissioned", "recommissioned", "approval_refused_evidence_unverified", "quota_reserved", "run_overdue",
    "warmup_failed",
    "queue_swap_added", "queue_swap_done", "queue_swap_undone", "queue_cap_refused", "horizon_waiting",
    "horizon_switched", "source_retire_refused", "source_retire_prepared",
    "source_retire_approved", "source_retired", "source_retire_failed", "source_unretired", "source_unretire_failed",
    "source_queues_consolidated",
]
# Modules whose constants share words with event kinds in another vocabulary: the owners' notices.
_OTHER_VOCABULARIES = {PACKAGE / "core" / "notify.py"}
# Names an event's kind goes by in the code (``e.kind``, ``last_kind``, a ``kind`` parameter).
_KIND_NAMES = ("kind", "last_kind")


def _stringish(node: ast.AST) -> bool:
    """A string built in place: a literal, an f-string, or a concatenation with one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _stringish(node.left) or _stringish(node.right)
    return False


def _strings(node: ast.AST) -> list[str]:
    """The string literals of ``node`` and of a tuple, list or set literal of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _is_kind(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr == "kind")
            or (isinstance(node, ast.Name) and node.id in _KIND_NAMES))


def _constant_values(node: ast.AST) -> list[str]:
    """The strings of a module constant: a literal, a tuple/list/set of them, or a dict's values."""
    if isinstance(node, ast.Dict):
        return [s for value in node.values if value is not None for s in _strings(value)]
    return _strings(node)


def literal_kinds(source: str, where: str, *, constants: bool = True) -> list[str]:
    """Where ``source`` spells an audit event kind as a string: one ``where:line: what`` each."""
    values = {k.value for k in EventKind}
    found: list[str] = []
    tree = ast.parse(source)
    if constants:
        for stmt in tree.body:
            assigned = isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None
            strings = _constant_values(stmt.value) if assigned else []  # type: ignore[union-attr]
            if strings and all(v in values for v in strings):  # a constant of kinds, not a list of names
                found.append(f"{where}:{stmt.lineno}: a module constant {ast.unparse(stmt)[:60]}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "kind" and _stringish(kw.value):
                    found.append(f"{where}:{node.lineno}: kind={ast.unparse(kw.value)}")
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "record" and node.args and _stringish(node.args[0]):
                found.append(f"{where}:{node.lineno}: record({ast.unparse(node.args[0])}, ...)")
            if (isinstance(func, ast.Attribute) and func.attr == "startswith" and _is_kind(func.value)
                    and any(v.startswith(s) for s in _strings(node.args[0]) for v in values)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(v in values for s in sides for v in _strings(s)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_stored_values_never_change() -> None:
    assert [k.value for k in EventKind] == STORED_VALUES


def test_each_kind_is_listed_once_with_a_comment() -> None:
    lines = EVENTS_MODULE.read_text().splitlines()
    for kind in EventKind:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{kind.name} = "))
        assert "#" in lines[at] or lines[at - 1].strip().startswith("#"), f"{kind.name} has no comment"


def test_no_production_module_spells_a_kind_as_a_string() -> None:
    found = [hit for path in SOURCES if path != EVENTS_MODULE
             for hit in literal_kinds(path.read_text(), str(path.relative_to(REPO)),
                                      constants=path not in _OTHER_VOCABULARIES)]
    assert not found, "audit event kinds as string literals (use core.events.EventKind):\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for() -> None:
    probe = ('m.record("cut_over", now, {})\naudit.append(kind="x" + s)\nif e.kind == "baked": pass\n'
             'if last_kind in ("rolled_back",): pass\ne.kind.startswith("approval_")\nDONE = ("baked", "cut_over")\n'
             # not kinds: another vocabulary's ``kind``, and a list of names that happens to hold one
             'if node.kind == "map": pass\nFIELDS = ("host_label", "approval_timeout")\n')
    assert sorted(int(hit.split(":")[1]) for hit in literal_kinds(probe, "probe")) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(("decision", "prefix", "kind"), [
    ("Approve", "", EventKind.APPROVED), ("Reject", "", EventKind.APPROVAL_REJECT),
    ("timeout", "", EventKind.APPROVAL_TIMEOUT), ("refused_four_eyes", "", EventKind.APPROVAL_REFUSED_FOUR_EYES),
    ("Approve", "decommission_", EventKind.DECOMMISSION_APPROVED),
    ("refused_evidence_changed", "decommission_", EventKind.DECOMMISSION_APPROVAL_REFUSED_EVIDENCE_CHANGED),
])
def test_approval_kind(decision: str, prefix: str, kind: EventKind) -> None:
    assert approval_kind(decision, prefix=prefix) is kind


def test_an_unknown_decision_is_no_kind() -> None:
    with pytest.raises(ValueError):
        approval_kind("Maybe")


def test_members_compare_equal_to_stored_strings() -> None:
    stored = "approved"  # what the database hands back
    assert stored == EventKind.APPROVED and stored in APPROVAL_ANSWERS and type(str(EventKind.APPROVED)) is str
