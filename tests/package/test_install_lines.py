"""Every install line docs/deployment.md documents resolves with uv; the command line installs without Airflow.

The package tier: it needs the package index (uv resolves against it). The lines are read from the docs' block, so
a line added there is resolved here. ``pip install`` becomes ``uv pip install --dry-run`` in a fresh Python 3.11
venv, with the wheel built from this checkout in the folder the line runs in; the first line (the CLI-only wheel) is
then installed for real, and each read-only command runs there with Airflow not importable.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.package.test_wheel import clean_env, uv

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deployment.md"
CONSTRAINTS = REPO / "constraints" / "airflow-3.3.2-python3.11.txt"


def install_lines() -> list[list[str]]:
    section = DOC.read_text().split("## The package and the image", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "docs/deployment.md lost its install lines"
    lines = [shlex.split(ln) for ln in block.group(1).splitlines() if ln.startswith("pip install")]
    assert len(lines) >= 5
    return lines


def venv(path: Path) -> Path:
    done = subprocess.run([uv(), "venv", "-q", "--python", "3.11", str(path)], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert done.returncode == 0, done.stderr
    return path


def pip(target: Path, args: list[str], cwd: Path, *, dry_run: bool) -> subprocess.CompletedProcess[str]:
    argv = [uv(), "pip", "install", "--python", str(target / "bin" / "python")] + (["--dry-run"] if dry_run else [])
    return subprocess.run(argv + args, capture_output=True, text=True, cwd=cwd, timeout=400, env=clean_env())


@pytest.fixture(scope="module")
def workdir(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each line runs: the repository's files the lines name, and the wheel by its documented name."""
    work = tmp_path_factory.mktemp("work")
    (work / "requirements.txt").write_text((REPO / "requirements.txt").read_text())
    (work / "constraints").mkdir()
    (work / "constraints" / CONSTRAINTS.name).write_text(CONSTRAINTS.read_text())
    (work / wheel.name).write_bytes(wheel.read_bytes())
    return work


@pytest.mark.parametrize("index", range(len(install_lines())))
def test_each_documented_install_line_resolves(index: int, workdir: Path, tmp_path: Path) -> None:
    line = install_lines()[index]
    assert line[:2] == ["pip", "install"]
    done = pip(venv(tmp_path / "venv"), line[2:], workdir, dry_run=True)
    assert done.returncode == 0, f"{shlex.join(line)}\n{done.stderr[-3000:]}"
    if "apache-airflow-providers-amazon[s3fs]" in line or any("[airflow" in a for a in line):
        assert re.search(r"^ \+ s3fs==", done.stderr, re.M), done.stderr[-2000:]  # the s3fs extra is in


def test_the_requirements_are_compiled_under_the_constraints_with_s3fs() -> None:
    done = subprocess.run([uv(), "pip", "compile", "-q", "--python-version", "3.11", str(REPO / "requirements.in"),
                           "-c", str(CONSTRAINTS), "--no-header", "--no-annotate"], capture_output=True, text=True,
                          timeout=300, env=clean_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = {ln for ln in done.stdout.splitlines() if "==" in ln}
    pinned = {ln.split()[0] for ln in (REPO / "requirements.txt").read_text().splitlines() if "==" in ln
              and not ln.startswith((" ", "#"))}
    assert compiled == pinned  # requirements.txt is exactly what the constraints give
    assert any(ln.startswith("s3fs==") for ln in pinned) and any(ln.startswith("aiobotocore==") for ln in pinned)


def test_the_command_line_installs_and_runs_without_airflow(workdir: Path, wheel: Path, tmp_path: Path) -> None:
    (first,) = [ln for ln in install_lines() if ln[2:] == [wheel.name]]
    target = venv(tmp_path / "cli")
    done = pip(target, first[2:], workdir, dry_run=False)
    assert done.returncode == 0, done.stderr[-3000:]
    python, promshift = target / "bin" / "python", target / "bin" / "promshift"
    probe = subprocess.run([str(python), "-c", "import airflow"], capture_output=True, text=True, env=clean_env())
    assert "No module named 'airflow'" in probe.stderr
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(promshift), *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                              env=clean_env() | {"PROMSHIFT_CATALOG": str(REPO / "catalog" / "metric_groups.yaml")})

    assert cli("--version").stdout == f"promshift {version.group(1)}\n"
    checked = cli("catalog", "check")
    assert checked.returncode == 0 and ": OK (" in checked.stdout, checked.stderr
    config = REPO / "tests" / "data" / "configs" / "bom.yml"
    rendered = cli("render", "gpu-memory", "--config", str(config))
    assert rendered.returncode == 0 and "+  - name: \"promshift-gpu-memory\"" in rendered.stdout, rendered.stderr
    audit = cli("audit", "verify")
    assert audit.returncode == 66 and "no audit database" in audit.stdout + audit.stderr  # read only: nothing created
    # check and plan reach their own servers: a closed port is their one-line refusal, never an ImportError
    for args in (["check", "parity", "--group", "gpu-memory", "--source", "http://127.0.0.1:1",
                  "--target", "http://127.0.0.1:1"], ["plan", "--source", "http://127.0.0.1:1"]):
        ran = cli(*args)
        assert ran.returncode not in (0, 1) and "Traceback" not in ran.stderr, (args, ran.stderr[-2000:])
    assert not (tmp_path / ".state").exists()
