"""``promshift audit show GROUP`` and ``promshift audit verify``.

Neither creates anything: a missing SQLite file exits 66 (EX_NOINPUT); ``verify`` exits 0 when
the chain is intact, 2 when it is broken or cannot be read (corrupt file, dropped table, no key).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from promshift.adapters.audit_store import AuditDatabaseMissing, AuditStore, redacted, short_error
from promshift.core.audit import AuditEvent, AuditKeyError, ChainCheck
from promshift.core.stages import Stage, current_stage
from promshift.core.text import shown

EXIT_BROKEN = 2
EXIT_NO_DATABASE = 66


class BadAuditUrl(ValueError):
    """``--url`` (or ``PROMSHIFT_AUDIT_URL``) is no database URL promshift can open; one line, no password."""


def _shown_url(url: str) -> str:
    """The URL for a message: without its password, or, unparsable, cut short and without user:password@."""
    shown_ = redacted(url)
    if shown_ != "<unparsable database URL>":
        return shown_
    return re.sub(r"//[^/@\s]*@", "//***@", url[:80])


def _open(args: argparse.Namespace) -> AuditStore:
    try:
        return AuditStore(args.url, create=False)
    except ArgumentError:
        raise BadAuditUrl(f"--url {_shown_url(args.url or '')!r} is not a database URL (sqlite:///PATH or "
                          "postgresql://USER@HOST/DB)") from None
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        missing = getattr(exc, "name", None) or str(exc).rsplit(":", 1)[-1].strip()
        raise BadAuditUrl(f"--url {_shown_url(args.url or '')}: no driver for it here ({missing}); the audit "
                          "log runs on sqlite and postgresql") from None


def _event_line(e: AuditEvent) -> str:
    move = f"{e.stage_from or '-'} -> {e.stage_to}" if e.stage_to else ""
    return (f"{e.seq:>5}  {e.at.strftime('%Y-%m-%d %H:%M:%S'):<20} {shown(e.kind):<22} {shown(move):<28} "
            f"{shown(e.actor):<16} {e.hash[:12]}")


def _evidence(e: AuditEvent, problems: list[str]) -> Any:
    try:
        return e.evidence_data
    except ValueError as exc:
        problems.append(f"event seq {e.seq}: evidence is not JSON ({exc.__class__.__name__}: {exc}; the row was "
                        "edited)")
        return None


def _stage(events: list[AuditEvent], group: str, problems: list[str]) -> str | None:
    """The group's stage replayed from the events shown; None (and a problem) when the replay is refused."""
    try:
        return current_stage(Stage(e.stage_to) for e in events if e.stage_to).value
    except ValueError as exc:  # IllegalTransition, or a stage name that is no Stage
        problems.append(f"cannot replay the stage of {group}: {shown(str(exc))}")
        return None


def _show(args: argparse.Namespace) -> int:
    """The events that can be read, always; each tampered row or refused replay as one ``error:`` line, exit 2."""
    try:
        store = _open(args)
        corrupt = store.integrity_problem()
        events, problems = store.read_events(group=args.group, run_id=args.run_id)
    except AuditDatabaseMissing as exc:
        print(f"error: {exc}; nothing created")
        return EXIT_NO_DATABASE
    except BadAuditUrl as exc:
        print(f"error: {exc}")
        return EXIT_BROKEN
    except Exception as exc:  # noqa: BLE001 - an unreadable database is a one-line error, not a traceback
        print(f"error: the audit database is corrupt or unreadable: {short_error(exc)}")
        return EXIT_BROKEN
    if corrupt:
        print(f"warning: the audit database is corrupt ({corrupt}); run promshift audit verify", file=sys.stderr)
    if args.json:
        print(json.dumps([{
            "seq": e.seq, "group": e.group, "run_id": e.run_id, "kind": e.kind,
            "stage_from": e.stage_from, "stage_to": e.stage_to, "actor": e.actor,
            "at": e.at.isoformat(), "evidence": _evidence(e, problems), "hash": e.hash, "scheme": e.scheme,
        } for e in events], indent=2))
    elif not events and not problems:
        print(f"no audit events for group {args.group!r}")
        return 1
    else:
        print(f"{'seq':>5}  {'at (UTC)':<20} {'kind':<22} {'stage':<28} {'actor':<16} hash")
        for e in events:
            print(_event_line(e))
        # The stage is the replay of all the group's events, not only the run shown.
        history = events if args.run_id is None else store.read_events(group=args.group)[0]
        stage = _stage(history, args.group, problems)
        if stage is not None:
            print(f"current stage of {args.group}: {stage}")
    for problem in problems:
        print(f"error: {problem}; run promshift audit verify", file=sys.stderr)
    return EXIT_BROKEN if problems else 0


def _print_check(check: ChainCheck, store: AuditStore) -> None:
    if check.ok:
        print(f"audit chain OK: {check.events} events, every hash and back-link verified")
    else:
        print(f"audit chain BROKEN ({check.events} events): {check.problems[0]}")
    for run in check.schemes:
        print(f"  seq {run.first_seq}..{run.last_seq}: {run.scheme} ({run.events} events)")
    if check.anchor is not None:
        print(f"  anchored head: seq {check.anchor.seq} {check.anchor.head[:12]} in {store.anchor.where}")
    for problem in check.problems[1:]:
        print(f"  - {problem}")
    for note in check.notes:
        print(f"  note: {note}")


def _verify(args: argparse.Namespace) -> int:
    try:
        store = _open(args)
    except AuditDatabaseMissing as exc:
        message = f"{exc}; nothing created"
        print(json.dumps({"ok": False, "error": message}) if args.json else f"error: {message}")
        return EXIT_NO_DATABASE
    except (AuditKeyError, ValueError) as exc:  # BadAuditUrl too
        print(json.dumps({"ok": False, "error": str(exc)}) if args.json else f"error: {exc}")
        return EXIT_BROKEN
    check = store.verify(allow_unanchored_tail=args.allow_unanchored_tail)
    if args.json:
        anchor_where = None
        try:
            anchor_where = store.anchor.where
        except Exception:  # noqa: BLE001 - already a problem in the check
            pass
        print(json.dumps({**check.to_dict(), "database": store.where, "anchor_store": anchor_where}, indent=2))
    else:
        _print_check(check, store)
    return 0 if check.ok else EXIT_BROKEN


def add_audit_commands(subparsers: Any) -> None:
    audit = subparsers.add_parser("audit", help="show and verify the audit history")
    sub = audit.add_subparsers(dest="audit_command", required=True)
    url_help = "SQLAlchemy URL (default: PROMSHIFT_AUDIT_URL or SQLite under PROMSHIFT_HOME)"

    show = sub.add_parser("show", help="events of one metric group, oldest first")
    show.add_argument("group")
    show.add_argument("--run-id", default=None)
    show.add_argument("--json", action="store_true")
    show.add_argument("--url", default=None, help=url_help)
    show.set_defaults(handler=_show)

    verify = sub.add_parser(
        "verify", help="check the whole chain (HMAC with the audit key) against its anchored head; "
                       "exit 2 if broken or unreadable, 66 if the database file does not exist")
    verify.add_argument("--url", default=None, help=url_help)
    verify.add_argument("--json", action="store_true", help="print the details as JSON")
    verify.add_argument("--allow-unanchored-tail", action="store_true",
                        help="accept events after the last anchored head (an anchor outage you have checked in "
                             "the writer's log); without it they fail the check")
    verify.set_defaults(handler=_verify)
