"""The ``promshift`` command line: ``stack``, ``audit``, and the read-only ``check``, ``catalog check``
and ``render``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from promshift.checks_cli import EX_USAGE


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 64: argparse's own 2 is ``check``'s INCONCLUSIVE."""

    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="promshift", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    from promshift.stack.cli import add_stack_commands

    add_stack_commands(commands)

    from promshift.adapters.audit_cli import add_audit_commands

    add_audit_commands(commands)

    from promshift.checks_cli import add_check_commands

    add_check_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
