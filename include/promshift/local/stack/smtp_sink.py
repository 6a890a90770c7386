"""A local SMTP sink: a real SMTP server on 127.0.0.1 that keeps every message as a file and delivers nothing.

It stands in for the mail relay a deployment's ``smtp_default`` connection names, so the
notifications promshift sends (``promshift.orchestration.notify``) can be read back by a test or a
person. The SMTP dialogue is aiosmtpd's (EHLO, MAIL, RCPT, DATA, QUIT); no TLS and no AUTH, as a
relay on the loopback interface would be.

Each accepted message becomes two files in the sink's directory, named by arrival order:
``<NNNNNN>-<time>.json`` (the envelope: sender, recipients, peer, time) and ``<same>.eml``
(the message as received). The ``.eml`` is written last, atomically, so a reader that lists
``*.eml`` only ever sees whole messages. ``sink.json`` says where the sink listens (the port
it bound, which with ``--port 0`` the kernel chose) and its pid.

Run as ``python -m promshift.local.stack.smtp_sink --dir DIR [--port N]``; ``LocalStack`` does that
as its ``mail`` component. ``read_mail(DIR)`` returns what arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import email
import email.policy
import itertools
import json
import os
import signal
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

STATE_FILE = "sink.json"
HOST = "127.0.0.1"
# Notifications are a few KB; a runaway sender is refused, not stored.
MAX_MESSAGE_BYTES = 10 * 2**20


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _Store:
    """aiosmtpd's handler: keeps each message as <seq>-<time>.json + .eml in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        existing = [int(p.name.split("-", 1)[0]) for p in directory.glob("*.eml") if p.name.split("-", 1)[0].isdigit()]
        self._seq = itertools.count(max(existing, default=0) + 1)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        now = datetime.now(UTC)
        stem = f"{next(self._seq):06d}-{now.strftime('%Y%m%dT%H%M%S.%fZ')}"
        content = envelope.original_content or envelope.content or b""
        if isinstance(content, str):
            content = content.encode("utf-8", errors="surrogateescape")
        meta = {"received_at": now.isoformat(), "mail_from": envelope.mail_from, "rcpt_tos": list(envelope.rcpt_tos),
                "peer": list(session.peer) if isinstance(session.peer, tuple) else str(session.peer),
                "bytes": len(content)}
        _write_atomically(self.directory / f"{stem}.json", json.dumps(meta, indent=1).encode())
        _write_atomically(self.directory / f"{stem}.eml", content)
        return "250 Message accepted for delivery"


async def serve(directory: Path, port: int = 0, host: str = HOST, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT when run as a process); write ``sink.json`` once bound."""
    from aiosmtpd.smtp import SMTP

    directory.mkdir(parents=True, exist_ok=True)
    handler = _Store(directory)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="localhost", data_size_limit=MAX_MESSAGE_BYTES, loop=loop),
        host=host, port=port, family=socket.AF_INET, reuse_address=True)
    bound = int(server.sockets[0].getsockname()[1])
    _write_atomically(directory / STATE_FILE, json.dumps({"host": host, "port": bound, "pid": os.getpid()}).encode())
    stop = stop or asyncio.Event()
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


def sink_address(directory: Path) -> tuple[str, int, int] | None:
    """(host, port, pid) the sink of ``directory`` wrote when it bound, or None."""
    try:
        state = json.loads((Path(directory) / STATE_FILE).read_text())
        return str(state["host"]), int(state["port"]), int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether an SMTP server greets on ``host:port`` (a ``220`` banner)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            banner = conn.recv(512)
            conn.sendall(b"QUIT\r\n")
    except OSError:
        return False
    return banner.startswith(b"220")


@dataclass(frozen=True)
class ReceivedMail:
    """One message the sink accepted: its envelope and the parsed message."""

    path: Path
    mail_from: str
    rcpt_tos: tuple[str, ...]
    received_at: str
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message.get("Subject", ""))

    def body(self) -> str:
        """Every text part (HTML and plain), decoded, one after the other."""
        parts = []
        for part in self.message.walk():
            if part.get_content_maintype() == "text":
                parts.append(part.get_content())
        return "\n".join(parts)


def read_mail(directory: Path) -> list[ReceivedMail]:
    """Every whole message in ``directory``, oldest first."""
    mails = []
    for eml in sorted(Path(directory).glob("*.eml")):
        meta_path = eml.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta = {}
        message = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        mails.append(ReceivedMail(path=eml, mail_from=str(meta.get("mail_from", "")),
                                  rcpt_tos=tuple(meta.get("rcpt_tos", ())),
                                  received_at=str(meta.get("received_at", "")), message=message))
    return mails


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m promshift.local.stack.smtp_sink",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="where messages are kept")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one, see sink.json)")
    args = parser.parse_args(argv)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        ready = asyncio.Event()
        task = asyncio.create_task(serve(args.dir.resolve(), args.port, ready=ready, stop=stop))
        done, _ = await asyncio.wait({task, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # bind failed: raise it
        state = sink_address(args.dir.resolve())
        print(f"smtp sink listening on {HOST}:{state[1] if state else '?'}, keeping mail in {args.dir}", flush=True)
        await task

    try:
        asyncio.run(run())
    except OSError as exc:
        print(f"smtp sink: cannot listen on {HOST}:{args.port}: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
