"""The ``promshift`` command line: ``audit``, and the read-only ``check``, ``catalog check``, ``render`` and ``plan``.

The lab's ``stack`` commands are not here: ``python -m promshift.local`` adds them (``promshift.local.cli``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import NoReturn

from promshift import __version__
from promshift.cli.checks import EX_USAGE


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 64: argparse's own 2 is ``check``'s INCONCLUSIVE."""

    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"{self.prog}: error: {message} (see --help)\n")


Commands = argparse._SubParsersAction  # what an ``add_*_commands`` function extends


def build_parser(*more: Callable[[Commands], None], prog: str = "promshift") -> argparse.ArgumentParser:
    """The production commands, plus ``more`` (the lab passes its ``stack`` commands)."""
    parser = _Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"promshift {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in more:
        add(commands)

    from promshift.cli.audit import add_audit_commands

    add_audit_commands(commands)

    from promshift.cli.checks import add_check_commands

    add_check_commands(commands)

    from promshift.cli.plan import add_plan_command

    add_plan_command(commands)
    return parser


def main(argv: list[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
