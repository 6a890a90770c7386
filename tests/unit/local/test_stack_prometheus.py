"""One way to run a Prometheus: the command lines promshift starts (``stack.prometheus.prometheus_argv``)."""

from __future__ import annotations

from pathlib import Path

from promshift.local.stack.local import SOURCE, TARGET, LocalStack, StackConfig
from promshift.local.stack.prometheus import PROMETHEUS_BIN, PrometheusProcess, prometheus_argv


def test_argv_is_config_tsdb_loopback_listen_then_the_flags_in_order() -> None:
    assert prometheus_argv("/c.yml", Path("/d"), 9999, "--b", "--a", binary="/bin/p") == (
        "/bin/p", "--config.file=/c.yml", "--storage.tsdb.path=/d", "--web.listen-address=127.0.0.1:9999", "--b", "--a")
    assert prometheus_argv("/c.yml", "/d", 1)[0] == PROMETHEUS_BIN


def test_the_local_stacks_source_and_target_command_lines_are_unchanged(tmp_path: Path) -> None:
    """``_plan`` reuses a running component only when its command line is exactly this: it must not move."""
    stack = LocalStack(StackConfig(home=tmp_path, source_port=9190, target_port=9191, prometheus_bin="/opt/prom"))
    components = stack._components()
    home = tmp_path.resolve()
    assert components[SOURCE].argv == (
        "/opt/prom", f"--config.file={home}/source/prometheus.yml", f"--storage.tsdb.path={home}/source/data",
        "--web.listen-address=127.0.0.1:9190", "--web.enable-lifecycle", "--web.enable-admin-api",
        "--storage.tsdb.retention.time=2d")
    assert components[TARGET].argv == (
        "/opt/prom", f"--config.file={home}/target/prometheus.yml", f"--storage.tsdb.path={home}/target/data",
        "--web.listen-address=127.0.0.1:9191", "--web.enable-remote-write-receiver", "--web.enable-lifecycle",
        "--web.enable-admin-api", "--rules.alert.resend-delay=5s", "--web.route-prefix=/workspaces/ws-local",
        "--web.external-url=http://127.0.0.1:9191/workspaces/ws-local")


def test_a_process_writes_its_config_or_uses_the_given_file(tmp_path: Path) -> None:
    written = PrometheusProcess("a", tmp_path, port=1, config="global: {}\n", start=False)
    assert (tmp_path / "a.yml").read_text() == "global: {}\n" and written.data_dir == tmp_path / "a"
    assert written.argv[1:4] == (f"--config.file={tmp_path / 'a.yml'}", f"--storage.tsdb.path={tmp_path / 'a'}",
                                 "--web.listen-address=127.0.0.1:1")
    given = tmp_path / "mine.yml"
    given.write_text("# theirs\n")
    used = PrometheusProcess("b", tmp_path, port=2, config=given, data_dir=tmp_path / "tsdb", flags=("--x",),
                             start=False)
    assert given.read_text() == "# theirs\n" and not (tmp_path / "b.yml").exists()
    assert used.argv[1:] == (f"--config.file={given}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             "--web.listen-address=127.0.0.1:2", "--x")
    assert used.url == "http://127.0.0.1:2" and not used.alive() and used.rss_mb() is None
    used.stop()  # never started: nothing to do
