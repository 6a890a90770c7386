"""A Slack incoming-webhook contract server on 127.0.0.1: it checks what it receives and answers as Slack does.

What it holds a request to (Slack's documented webhook contract, https://api.slack.com/messaging/webhooks):

- ``POST`` to the webhook's own path ``/services/T…/B…/<secret>``; any other path is ``404 no_service``
  (a removed or invalid webhook), a wrong secret for a known team and bot ``403 invalid_token``;
- ``Content-Type: application/json`` (a charset allowed); a body that is not a JSON object ``400 invalid_payload``;
- ``text`` or ``blocks``: neither is ``400 no_text``; ``text`` a string of at most 40,000 characters;
- ``blocks`` a list of at most 50 known block types; a header's ``plain_text`` at most 150 characters, a
  section's text object (``mrkdwn``/``plain_text``) at most 3,000, a context at most 10 elements: any other
  shape is ``400 invalid_blocks``; a body over 1 MiB is refused unread (``413``).

A good request is answered ``200 ok`` (``text/html``, as Slack does). ``script`` queues answers to give
instead, in order (e.g. ``(429, "rate_limited", {"Retry-After": "1"})`` or ``(500, "rollup_error", {})``);
every request, accepted or not, is kept in ``received`` with its path, headers, and parsed body. ``echo_path``
makes every refusal quote the request's path, as a careless error page does (the secret in it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20
MAX_TEXT = 40_000
MAX_BLOCKS = 50
MAX_HEADER = 150
MAX_SECTION = 3000
MAX_CONTEXT_ELEMENTS = 10
BLOCK_TYPES = {"header", "section", "context", "divider", "actions", "image", "rich_text", "input", "file",
               "video"}
TEXT_TYPES = {"mrkdwn", "plain_text"}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    answer: str


@dataclass
class SlackWebhook:
    """The server's state: the one webhook path it serves, what it got, and answers queued for the next requests."""

    path: str
    url: str = ""
    received: list[Received] = field(default_factory=list)
    script: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # A careless error page: every answer but 200 quotes the request's path (the webhook's secret with it).
    echo_path: bool = False

    @property
    def accepted(self) -> list[Any]:
        """The bodies answered ``200 ok``: the messages Slack would have posted."""
        return [r.body for r in self.received if r.status == 200]


def blocks_problem(blocks: Any) -> str | None:
    """Why Slack would refuse these blocks (``invalid_blocks``), or None."""
    if not isinstance(blocks, list) or not blocks or len(blocks) > MAX_BLOCKS:
        return f"blocks must be a list of 1..{MAX_BLOCKS}"
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
            return f"blocks[{i}]: unknown type"
        kind = block["type"]
        if kind == "header":
            text = block.get("text")
            if not (isinstance(text, dict) and text.get("type") == "plain_text" and isinstance(text.get("text"), str)
                    and 0 < len(text["text"]) <= MAX_HEADER):
                return f"blocks[{i}]: a header's text must be plain_text of 1..{MAX_HEADER} characters"
        elif kind == "section":
            text = block.get("text")
            if not (isinstance(text, dict) and text.get("type") in TEXT_TYPES and isinstance(text.get("text"), str)
                    and 0 < len(text["text"]) <= MAX_SECTION):
                return f"blocks[{i}]: a section's text must be 1..{MAX_SECTION} characters"
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 0 < len(elements) <= MAX_CONTEXT_ELEMENTS or not all(
                    isinstance(e, dict) and e.get("type") in TEXT_TYPES and isinstance(e.get("text"), str)
                    and 0 < len(e["text"]) <= MAX_SECTION for e in elements):
                return f"blocks[{i}]: bad context elements"
    return None


def judge(hook: SlackWebhook, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, str, Any]:
    """(status, answer, parsed body) as Slack would answer this request, before any scripted answer."""
    if path != hook.path:
        team_bot = hook.path.rsplit("/", 1)[0]
        return (403, "invalid_token", None) if path.startswith(team_bot + "/") else (404, "no_service", None)
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return 400, "invalid_payload", None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return 400, "invalid_payload", None
    if not isinstance(body, dict):
        return 400, "invalid_payload", body
    text, blocks = body.get("text"), body.get("blocks")
    if not text and not blocks:
        return 400, "no_text", body
    if text is not None and (not isinstance(text, str) or len(text) > MAX_TEXT):
        return 400, "invalid_payload", body
    if blocks is not None and blocks_problem(blocks):
        return 400, "invalid_blocks", body
    return 200, "ok", body


def _handler(hook: SlackWebhook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _answer(self, status: int, answer: str, extra: dict[str, str] | None = None) -> None:
            data = answer.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(405 if self.path == hook.path else 404, "invalid_method" if self.path == hook.path
                         else "no_service")

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            headers = {k.lower(): v for k, v in self.headers.items()}
            if length > MAX_BODY:
                self._answer(413, "request_too_large")
                with hook.lock:
                    hook.received.append(Received(self.path, headers, None, 413, "request_too_large"))
                return
            raw = self.rfile.read(length)
            status, answer, body = judge(hook, self.path, headers, raw)
            extra: dict[str, str] = {}
            with hook.lock:
                if status == 200 and hook.script:
                    status, answer, extra = hook.script.pop(0)
                hook.received.append(Received(self.path, headers, body, status, answer))
            if hook.echo_path and status != 200:
                answer = f"{answer} (POST {self.path})"
            self._answer(status, answer, extra)

    return Handler


@contextmanager
def slack_webhook(path: str = "/services/T0PROMSHIFT/B0NOTIFY/s3cr3tW3bh00kT0k3n") -> Iterator[SlackWebhook]:
    """A running contract server on 127.0.0.1 (a free port); ``url`` is its base (``http://127.0.0.1:port``)."""
    hook = SlackWebhook(path=path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hook))
    hook.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="slack-webhook-contract", daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def slack_conn(hook: SlackWebhook) -> str:
    """The ``slackwebhook`` connection (AIRFLOW_CONN_*) that points the provider's hook at ``hook``: the host is
    the base up to ``/services``, the password the webhook's token (``T…/B…/secret``), as Airflow's form takes them."""
    token = hook.path.removeprefix("/services/")
    return json.dumps({"conn_type": "slackwebhook", "host": f"{hook.url}/services", "password": token,
                       "extra": {"timeout": 5}})
