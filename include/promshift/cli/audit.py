"""``promshift audit show GROUP`` and ``promshift audit verify``.

Neither creates anything: a missing SQLite file exits 66 (EX_NOINPUT); ``verify`` exits 0 when
the chain is intact, 2 when it is broken or cannot be read (corrupt file, dropped table, no key).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from promshift.adapters.audit_store import AuditDatabaseMissing, AuditStore, short_error
from promshift.core.audit import AuditKeyError, ChainCheck

EXIT_BROKEN = 2
EXIT_NO_DATABASE = 66


def _open(args: argparse.Namespace) -> AuditStore:
    return AuditStore(args.url, create=False)


def _show(args: argparse.Namespace) -> int:
    try:
        store = _open(args)
        corrupt = store.integrity_problem()
        events = store.events(group=args.group, run_id=args.run_id)
    except AuditDatabaseMissing as exc:
        print(f"error: {exc}; nothing created")
        return EXIT_NO_DATABASE
    except Exception as exc:  # noqa: BLE001 - an unreadable database is a one-line error, not a traceback
        print(f"error: the audit database is corrupt or unreadable: {short_error(exc)}")
        return EXIT_BROKEN
    if corrupt:
        print(f"warning: the audit database is corrupt ({corrupt}); run promshift audit verify", file=sys.stderr)
    if args.json:
        print(json.dumps([{
            "seq": e.seq, "group": e.group, "run_id": e.run_id, "kind": e.kind,
            "stage_from": e.stage_from, "stage_to": e.stage_to, "actor": e.actor,
            "at": e.at.isoformat(), "evidence": e.evidence_data, "hash": e.hash, "scheme": e.scheme,
        } for e in events], indent=2))
        return 0
    if not events:
        print(f"no audit events for group {args.group!r}")
        return 1
    print(f"{'seq':>5}  {'at (UTC)':<20} {'kind':<22} {'stage':<28} {'actor':<16} hash")
    for e in events:
        move = f"{e.stage_from or '-'} -> {e.stage_to}" if e.stage_to else ""
        print(f"{e.seq:>5}  {e.at.strftime('%Y-%m-%d %H:%M:%S'):<20} {e.kind:<22} {move:<28} "
              f"{e.actor:<16} {e.hash[:12]}")
    print(f"current stage of {args.group}: {store.stage_of(args.group).value}")
    return 0


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
    except (AuditKeyError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}) if args.json else f"error: {exc}")
        return EXIT_BROKEN
    check = store.verify()
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
    verify.set_defaults(handler=_verify)
