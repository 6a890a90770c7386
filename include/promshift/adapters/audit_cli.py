"""``promshift audit show GROUP`` and ``promshift audit verify``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from promshift.adapters.audit_store import AuditStore


def _show(args: argparse.Namespace) -> int:
    store = AuditStore(args.url)
    events = store.events(group=args.group, run_id=args.run_id)
    if args.json:
        print(json.dumps([{
            "seq": e.seq, "group": e.group, "run_id": e.run_id, "kind": e.kind,
            "stage_from": e.stage_from, "stage_to": e.stage_to, "actor": e.actor,
            "at": e.at.isoformat(), "evidence": e.evidence_data, "hash": e.hash,
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


def _verify(args: argparse.Namespace) -> int:
    check = AuditStore(args.url).verify()
    if check.ok:
        print(f"audit chain OK: {check.events} events, every hash and back-link verified")
        return 0
    print(f"audit chain BROKEN ({check.events} events):")
    for problem in check.problems:
        print(f"  - {problem}")
    return 2


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

    verify = sub.add_parser("verify", help="check the whole hash chain; exit 2 if broken")
    verify.add_argument("--url", default=None, help=url_help)
    verify.set_defaults(handler=_verify)
