"""Where alerts and mail go: the target's Alertmanager (Debian's ``prometheus-alertmanager``, when installed) and
the SMTP sink (``promshift.local.stack.smtp_sink``), which keeps every message under ``mail/`` and delivers
nothing: the mail relay the notifications' ``smtp_default`` names (``smtp_connection_env``). The sink's port
is ``PROMSHIFT_SMTP_PORT``, or by default any free one, recorded in ``mail/sink.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from promshift.local.stack.parts.prometheus import PrometheusPart
from promshift.local.stack.smtp_sink import answers as smtp_answers
from promshift.local.stack.smtp_sink import read_mail, sink_address
from promshift.local.stack.spec import ALERTMANAGER, MAIL, Component, StackError, find_free_ports


class AlertingPart(PrometheusPart):
    """The SMTP sink and the target's Alertmanager: addresses, files, processes, health."""

    @property
    def mail_dir(self) -> Path:
        """Where the SMTP sink keeps every message it accepted (``read_mail`` reads them)."""
        return self.home / MAIL

    @property
    def smtp_port(self) -> int:
        """The sink's port: ``smtp_port`` when set, else the one the running sink bound (0 before it has)."""
        if self.config.smtp_port:
            return self.config.smtp_port
        address = sink_address(self.mail_dir)
        return address[1] if address else 0

    def smtp_connection_env(self, conn_id: str = "smtp_default") -> dict[str, str]:
        """``AIRFLOW_CONN_<CONN_ID>`` naming the running sink, for the processes that send notifications.

        The SMTP provider's connection: host and port, no TLS (the sink is plain SMTP on the loopback),
        no login, the sender in ``extra.from_email``, and short timeouts so a stopped sink is noticed fast.
        """
        port = self.smtp_port
        if not port or not smtp_answers("127.0.0.1", port):
            raise StackError("the SMTP sink is not running: run `python -m promshift.local stack up`")
        conn = {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                "extra": {"from_email": "promshift@localhost", "disable_ssl": True, "disable_tls": True,
                          "timeout": 10, "retry_limit": 1}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}

    def mail(self) -> list[Any]:
        """Every message the sink has accepted, oldest first (``smtp_sink.ReceivedMail``)."""
        return list(read_mail(self.mail_dir))

    @property
    def alertmanager_dir(self) -> Path:
        """The Alertmanager's configuration, storage, port record and the target's file_sd of it."""
        return self.home / ALERTMANAGER

    @property
    def alertmanager_config_path(self) -> Path:
        return self.alertmanager_dir / "alertmanager.yml"

    @property
    def alertmanager_installed(self) -> bool:
        binary = self.config.alertmanager_bin
        return os.path.isfile(binary) and os.access(binary, os.X_OK)

    @property
    def alertmanager_port(self) -> int:
        """``alertmanager_port`` when set, else the free port chosen at the first ``up`` (0 before)."""
        if self.config.alertmanager_port:
            return self.config.alertmanager_port
        try:
            return int((self.alertmanager_dir / "port").read_text().strip())
        except (OSError, ValueError):
            return 0

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def _prepare_alertmanager(self) -> None:
        """Its port (chosen once), a configuration while none was written, and the target's file_sd of it."""
        from promshift.local.stack.alert_definitions import NO_DEFINITION_CONFIG

        self.alertmanager_dir.mkdir(parents=True, exist_ok=True)
        if not self.alertmanager_port:
            (self.alertmanager_dir / "port").write_text(f"{find_free_ports(1)[0]}\n")
        if not self.alertmanager_config_path.exists():
            self.alertmanager_config_path.write_text(
                "# The target's Alertmanager; the local AMP control plane rewrites it from the workspace's alert "
                "manager definition.\n" + yaml.safe_dump(NO_DEFINITION_CONFIG, sort_keys=False), encoding="utf-8")
        targets = json.dumps([{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]) + "\n"
        sd = self.alertmanager_dir / "targets.json"
        if not sd.exists() or sd.read_text() != targets:
            tmp = sd.with_name(".targets.json.tmp")
            tmp.write_text(targets)
            os.replace(tmp, sd)

    def _add_alerting(self) -> bool:
        """The target's ``alerting:`` names the Alertmanager (through a file_sd the stack keeps current); added
        at the end of its config when it has none, every other byte kept. True when added."""
        from promshift.adapters.deploy import write_keeping

        config = self.target_config_path.read_bytes()
        loaded = yaml.safe_load(config) or {}
        if isinstance(loaded, dict) and "alerting" in loaded:
            return False
        block = ("# The target's Alertmanager (the local stack's prometheus-alertmanager).\n"
                 "alerting:\n  alertmanagers:\n    - file_sd_configs:\n"
                 f"        - files: [{json.dumps(str(self.alertmanager_dir / 'targets.json'))}]\n").encode()
        write_keeping(self.target_config_path, config + (b"" if config.endswith(b"\n") else b"\n") + block)
        return True

    def _alerting_components(self) -> dict[str, Component]:
        cfg = self.config
        mail_argv = (sys.executable, "-m", "promshift.local.stack.smtp_sink", "--dir", str(self.mail_dir),
                     "--port", str(cfg.smtp_port))
        smtp_url = f"smtp://127.0.0.1:{self.smtp_port}"
        am_data = self.alertmanager_dir / "data"
        am_argv = (cfg.alertmanager_bin, f"--config.file={self.alertmanager_config_path}",
                   f"--storage.path={am_data}", f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                   "--cluster.listen-address=", f"--web.external-url={self.alertmanager_url}")
        return {
            MAIL: Component(MAIL, cfg.smtp_port, mail_argv, smtp_url, smtp_url,
                            f"promshift.local.stack.smtp_sink --dir {self.mail_dir}", "PROMSHIFT_SMTP_PORT"),
            ALERTMANAGER: Component(ALERTMANAGER, self.alertmanager_port, am_argv, self.alertmanager_url,
                                    f"{self.alertmanager_url}/-/ready", f"--storage.path={am_data}",
                                    "PROMSHIFT_ALERTMANAGER_PORT"),
        }

    def _healthy(self, component: Component) -> bool:
        if component.name != MAIL:
            return super()._healthy(component)
        # The port the sink bound (written once it listens), and the sink must be the one the pid file names.
        address = sink_address(self.mail_dir)
        if address is None or (self.config.smtp_port and address[1] != self.config.smtp_port):
            return False
        return address[2] == self._read_pid(MAIL) and smtp_answers(address[0], address[1])

    def _before_start(self, component: Component) -> None:
        if component.name == MAIL:
            (self.mail_dir / "sink.json").unlink(missing_ok=True)  # a dead sink's port must not pass for the new one's
        super()._before_start(component)
