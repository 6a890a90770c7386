"""A small client for chromedriver's W3C WebDriver HTTP API (no Selenium dependency): headless Chromium."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import requests

from promshift.local.stack.local import find_free_ports

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C web element reference key
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,900"]


class WebDriverError(RuntimeError):
    """chromedriver answered with an error (its ``value.error`` and ``message``)."""


class Browser:
    """One chromedriver on 127.0.0.1 driving one headless Chromium with a fresh profile."""

    def __init__(self, workdir: Path, *, chromium: str | None = None, chromedriver: str | None = None) -> None:
        self.chromium = chromium or shutil.which("chromium") or "/usr/bin/chromium"
        driver = chromedriver or shutil.which("chromedriver") or "/usr/bin/chromedriver"
        self.port = find_free_ports(1)[0]
        workdir.mkdir(parents=True, exist_ok=True)
        self.profile = workdir / "chromium-profile"
        self.log = open(workdir / "chromedriver.log", "ab")  # noqa: SIM115 (closed in quit)
        self.proc = subprocess.Popen([driver, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 30
        while True:
            try:
                if requests.get(f"{self.base}/status", timeout=2).json()["value"]["ready"]:
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.quit()
                raise RuntimeError(f"chromedriver did not start; see {workdir / 'chromedriver.log'}")
            time.sleep(0.3)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": self.chromium, "args": [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]}}}}
        try:
            self.session = self._call("POST", "/session", caps, session=False)["sessionId"]
        except Exception:
            self.quit()
            raise

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, session: bool = True) -> Any:
        url = f"{self.base}/session/{self.session}{path}" if session else f"{self.base}{path}"
        resp = requests.request(method, url, json=body if body is not None else ({} if method == "POST" else None),
                                timeout=60)
        value = resp.json().get("value")
        if resp.status_code >= 400:
            raise WebDriverError(f"{method} {path}: {value.get('error')}: {value.get('message', '')[:300]}")
        return value

    # -- navigation and scripts ------------------------------------------------------------
    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    @property
    def url(self) -> str:
        return str(self._call("GET", "/url"))

    def script(self, source: str, *args: Any) -> Any:
        return self._call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def wait_for(self, source: str, *args: Any, timeout_s: float = 20.0, what: str = "condition") -> Any:
        """Poll a script until it returns something truthy; returns that value."""
        deadline = time.time() + timeout_s
        while True:
            value = self.script(source, *args)
            if value:
                return value
            if time.time() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what} at {self.url}")
            time.sleep(0.3)

    def cdp(self, cmd: str, params: dict[str, Any]) -> Any:
        """A Chrome DevTools command through chromedriver (e.g. emulate prefers-color-scheme)."""
        return self._call("POST", "/goog/cdp/execute", {"cmd": cmd, "params": params})

    # -- elements ------------------------------------------------------------------------
    def find(self, css: str, *, timeout_s: float = 20.0) -> dict[str, str]:
        deadline = time.time() + timeout_s
        while True:
            try:
                return dict(self._call("POST", "/element", {"using": "css selector", "value": css}))
            except WebDriverError as exc:
                if "no such element" not in str(exc) or time.time() > deadline:
                    raise
            time.sleep(0.3)

    def click(self, element: dict[str, str]) -> None:
        self._call("POST", f"/element/{element[ELEMENT]}/click")

    def type(self, element: dict[str, str], text: str) -> None:
        self._call("POST", f"/element/{element[ELEMENT]}/value", {"text": text})

    def text(self, element: dict[str, str]) -> str:
        return str(self._call("GET", f"/element/{element[ELEMENT]}/text"))

    def frame(self, element: dict[str, str] | None) -> None:
        """Switch into an iframe element, or back to the top document with None."""
        self._call("POST", "/frame", {"id": element})

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))
        return path

    def quit(self) -> None:
        try:
            if getattr(self, "session", None):
                requests.delete(f"{self.base}/session/{self.session}", timeout=30)
        except requests.RequestException:
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self.log.close()
