"""The production wheel, built and installed as the Dockerfile builds and installs it, without a container engine.

The wheel is built (no build isolation, setuptools from the dev venv) from exactly what the Dockerfile's builder
stage copies; its file list must be the production package (core, adapters, steps, orchestration, board, cli,
data and their package data) and nothing of the lab. A fresh venv then gets requirements.txt and the wheel with
``--no-deps`` (as the image does), and in it: the ``apache_airflow_provider`` entry point registers the
connection types, Airflow's DagBag imports every file of ``dags/`` without an error, ``promshift --help`` and
``promshift catalog check`` run, and ``import promshift.local`` fails. The Dockerfile is read too, so that it keeps
installing this wheel over the same requirements file.
"""

from __future__ import annotations

import email
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "include" / "promshift"
CATALOG = REPO / "catalog" / "metric_groups.yaml"
PROBE = Path(__file__).with_name("wheel_probe.py")
PRODUCTION_LAYERS = ("core", "adapters", "steps", "orchestration", "board", "cli", "data")
LAB_WORDS = ("victoria-metrics", "vmagent", "moto", "aiosmtpd", "requirements-dev", "requirements-lab",
             "promshift.local", "promshift/local", "chromium")


@dataclass
class Stage:
    base: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, its arguments)

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.steps if i == instruction]



def _version() -> str:
    """The package version, as pyproject.toml says."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])

def dockerfile_stages(text: str) -> list[Stage]:
    """The Dockerfile's stages: comments dropped, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        logical.append(pending)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            words = rest.split()
            stages.append(Stage(base=words[0], name=words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].steps.append((instruction.upper(), rest.strip()))
    return stages


def copy_sources(stage: Stage) -> list[str]:
    """The build-context paths a stage's COPY instructions take (not those ``--from`` another stage)."""
    sources = []
    for args in stage.args("COPY"):
        words = [w for w in args.split() if not w.startswith("--")]
        if "--from=" not in args:
            sources += words[:-1]
    return sources


def pinned(name: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if canonicalize_name(line.partition("==")[0].split("[")[0]) == canonicalize_name(name) and "==" in line:
            return line.partition("==")[2].split()[0]
    raise AssertionError(f"{name} is not pinned in requirements.txt")


def uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("uv is not on PATH (make venv installs it)")
    return found


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dockerfile_stages((REPO / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def wheel(stages: list[Stage], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of exactly what the Dockerfile's builder stage copies (less .dockerignore)."""
    root = tmp_path_factory.mktemp("wheel")
    src, dist = root / "src", root / "dist"
    ignored = [p.strip().removeprefix("**/") for p in (REPO / ".dockerignore").read_text().splitlines()
               if p.strip().startswith("**/")]
    src.mkdir()
    for name in copy_sources(stages[0]):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns(*ignored))
        else:
            shutil.copy2(REPO / name, src / name)
    done = run([uv(), "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
                "--out-dir", str(dist), str(src)], cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = dist.glob("promshift-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with requirements.txt and the wheel (``--no-deps``), as the image installs them."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    for argv in ([uv(), "venv", "-q", "--python", sys.executable, str(root)],
                 [uv(), "pip", "install", "-q", "--python", str(root / "bin" / "python"),
                  "-r", str(REPO / "requirements.txt")],
                 [uv(), "pip", "install", "-q", "--python", str(root / "bin" / "python"), "--no-deps", str(wheel)]):
        done = run(argv, env=clean_env(), timeout=300)
        assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    return root


def clean_env(airflow_home: Path | None = None) -> dict[str, str]:
    """This process' environment without anything that points Python at the checkout or the dev venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP") and not k.startswith("AIRFLOW")}
    if airflow_home is not None:
        env.update(AIRFLOW_HOME=str(airflow_home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                   PROMSHIFT_CATALOG=str(CATALOG),
                   # connections as env vars, as tests/dags does, so parsing needs nothing live
                   AIRFLOW_CONN_PROMSHIFT_SOURCE='{"conn_type": "prometheus", "host": "http://127.0.0.1:1"}',
                   AIRFLOW_CONN_PROMSHIFT_TARGET='{"conn_type": "prometheus", "host": "http://127.0.0.1:2"}')
    return env


@pytest.fixture(scope="module")
def probe(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cwd = tmp_path_factory.mktemp("probe")
    done = run([str(venv / "bin" / "python"), str(PROBE), str(REPO / "dags")],
               env=clean_env(cwd / "airflow_home"), cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


def production_files() -> set[str]:
    """What the wheel must hold: every module outside local/, and the package data pyproject names."""
    names = {f"promshift/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")
             if p.relative_to(PACKAGE).parts[0] != "local"}
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["promshift"]
    for pattern in patterns:
        names |= {f"promshift/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.glob(pattern)}
    return names


def test_the_wheel_is_the_production_package_and_nothing_of_the_lab(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    package = {n for n in names if n.startswith("promshift/")}
    assert not [n for n in names if n.startswith("promshift/local") or "/stack/" in n]
    assert len(list((PACKAGE / "local").rglob("*.py"))) > 10, "the checkout's lab, which the wheel leaves out"
    assert package == production_files()
    for layer in PRODUCTION_LAYERS:
        assert any(n.startswith(f"promshift/{layer}/") and n.endswith(".py") for n in package), layer
    assert {"promshift/py.typed", "promshift/data/dcgm_default_counters.csv",
            "promshift/board/templates/base.html", "promshift/cli/__init__.py",
            "promshift/orchestration/provider_info.py", "promshift/core/waves.py"} <= package
    # The tests' and benches' migration DAG with its group chosen is lab-only: in the checkout, not in the wheel.
    assert (PACKAGE / "local" / "group_dag.py").is_file() and "promshift/local/group_dag.py" not in names
    assert {n.split("/")[0] for n in names} == {"promshift", wheel.name.split("-py3")[0] + ".dist-info"}


def test_the_wheel_declares_pyprojects_dependencies_and_entry_points(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_string(zf.read(f"{dist_info}/METADATA").decode())
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        licence = zf.read(f"{dist_info}/licenses/LICENSE").decode()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {str(Requirement(r)) for r in project["dependencies"]}
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    assert {str(r) for r in requires if r.marker is None} == declared
    assert set(meta.get_all("Provides-Extra") or []) == set(project["optional-dependencies"])
    assert "promshift = promshift.cli:main" in entry_points
    # released as Apache-2.0 with its license text, its README as the description, its version
    assert meta["License-Expression"] == "Apache-2.0" and meta["Version"] == project["version"]
    assert "Apache License" in licence and "# promshift" in meta.get_payload()
    assert "provider_info = promshift.orchestration.provider_info:get_provider_info" in entry_points


def test_the_fresh_venv_imports_the_wheel_not_the_checkout(venv: Path, probe: dict[str, Any]) -> None:
    assert Path(probe["promshift_file"]).is_relative_to(venv)
    assert probe["lab_importable"] == []


def test_the_provider_entry_point_registers_the_connection_types(probe: dict[str, Any]) -> None:
    provider = probe["provider"]
    assert provider["entry_point"] == "promshift.orchestration.provider_info:get_provider_info"
    assert provider["hooks"] == {"prometheus": "PrometheusHook", "amp": "AmpHook"}
    assert provider["managed"] == {"prometheus": "promshift.orchestration.hooks.PrometheusHook",
                                   "amp": "promshift.orchestration.amp_hook.AmpHook"}
    assert "promshift" in provider["providers"]
    for name in ("amazon", "cncf-kubernetes", "smtp", "standard"):
        assert f"apache-airflow-providers-{name}" in provider["providers"]


def test_the_dagbag_imports_every_dag_file(probe: dict[str, Any]) -> None:
    from promshift.adapters.settings import load_catalog

    groups = load_catalog(CATALOG).groups
    assert len(groups) >= 3
    # One migration DAG per target connection (the group chosen in its form), not one per group.
    migrations = {f"promshift__migrate__{g.target}" for g in groups}
    assert {g.dag_id for g in groups} == migrations
    by_hand = {f"promshift__{action}" for action in ("decommission", "recommission", "rollback", "retire", "unretire")}
    assert probe["dagbag"]["import_errors"] == {}
    assert set(probe["dagbag"]["dag_ids"]) == migrations | by_hand | {"promshift__bake_watch", "promshift__plan",
                                                                     "promshift__waves"}


def test_package_data_is_read_back(probe: dict[str, Any]) -> None:
    assert probe["data"]["dcgm_counters"] > 10
    assert probe["data"]["error_page"] is True


def test_the_promshift_command_runs_without_the_lab(venv: Path, tmp_path: Path) -> None:
    promshift = str(venv / "bin" / "promshift")
    env = clean_env(tmp_path / "airflow_home")
    helped = run([promshift, "--help"], env=env, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    commands = helped.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert "catalog" in commands and "audit" in commands and "stack" not in commands
    checked = run([promshift, "catalog", "check", str(CATALOG)], env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{CATALOG}: OK" in checked.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups: {}\nnot: [valid\n")
    refused = run([promshift, "catalog", "check", str(bad)], env=env, cwd=tmp_path)
    assert refused.returncode != 0, "catalog check passed a broken catalog: the OK above would prove nothing"


def test_the_lab_is_not_importable(venv: Path, tmp_path: Path) -> None:
    env = clean_env(tmp_path / "airflow_home")
    done = run([str(venv / "bin" / "python"), "-c", "import promshift.local"], env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'promshift.local'" in done.stderr
    ok = run([str(venv / "bin" / "python"), "-c", "import promshift.cli, promshift.orchestration.operators"],
             env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_the_dockerfile_installs_this_wheel(stages: list[Stage]) -> None:
    builder, promtool, image = stages[0], stages[1], stages[-1]
    assert len(stages) == 3 and builder.name
    # same Airflow and Python as the pins and the venv this test proves the Python layer in
    tag = f"apache/airflow:{pinned('apache-airflow')}-python{sys.version_info.major}.{sys.version_info.minor}"
    assert builder.base == image.base == tag
    # the builder copies what the wheel fixture builds from, and builds it the same way
    assert sorted(copy_sources(builder)) == ["LICENSE", "README.md", "include", "pyproject.toml", "requirements.txt"]
    build = " ".join(builder.args("RUN"))
    assert "pip wheel" in build and "--no-deps" in build and "--no-build-isolation" in build
    assert "^setuptools==" in build and pinned("setuptools")  # setuptools at requirements.txt's pin
    # the image: requirements.txt, then the builder's wheel with --no-deps, and no source tree
    assert "include" not in copy_sources(image) and "pyproject.toml" not in copy_sources(image)
    requirements = [a.split()[-1] for a in image.args("COPY") if a.split()[-2] == "requirements.txt"]
    assert len(requirements) == 1
    installs = [a for a in image.args("RUN") if "pip install" in a]
    assert any(f"-r {requirements[0]}" in a for a in installs), installs
    from_builder = [a for a in image.args("COPY") if f"--from={builder.name}" in a]
    assert len(from_builder) == 1
    wheel_dir = from_builder[0].split()[-1].rstrip("/")
    assert any("--no-deps" in a and fnmatch.fnmatch(f"{wheel_dir}/promshift-{_version()}-py3-none-any.whl",
                                                    a.split()[-1]) for a in installs), installs
    assert not any(" -e " in a or "--editable" in a for a in installs)
    # no lab, no stand-in servers, no Debian package: promtool is the official image's, of the fleet's version
    everything = " ".join(a for s in stages for _, a in s.steps)
    assert not [w for w in LAB_WORDS if w in everything]
    assert not [a for a in image.args("RUN") if "apt-get" in a]
    assert (promtool.base, promtool.name, promtool.steps) == ("prom/prometheus:v${PROMETHEUS_VERSION}", "promtool", [])
    assert re.search(r"^ARG PROMETHEUS_VERSION=\d+\.\d+\.\d+$", (REPO / "Dockerfile").read_text(), re.M)
    assert f"--from={promtool.name} /bin/promtool /usr/local/bin/promtool" in image.args("COPY")


@pytest.mark.parametrize("case", ["lab copy", "debian promtool", "editable", "other requirements"])
def test_the_dockerfile_check_can_fail(case: str) -> None:
    text = (REPO / "Dockerfile").read_text()
    if case == "lab copy":
        text += "\nCOPY include /opt/promshift/include\n"
    elif case == "debian promtool":
        text = text.replace("FROM prom/prometheus:v${PROMETHEUS_VERSION} AS promtool", "FROM debian:12 AS promtool")
    elif case == "editable":
        text = text.replace("--no-deps /opt/promshift/dist/promshift-*.whl", "--no-deps -e /opt/promshift")
    else:
        text = text.replace("-r /opt/promshift/requirements.txt", "-r /opt/promshift/requirements-dev.txt")
    with pytest.raises(AssertionError):
        test_the_dockerfile_installs_this_wheel(dockerfile_stages(text))
