"""The production image's Python layer, built by running the Dockerfile's own steps (no container engine here).

Each stage gets a directory standing in for its filesystem and a fresh venv standing in for the image's Python.
WORKDIR, COPY (from the build context or ``--from`` the builder stage), ENV and every RUN that calls pip are
carried out in order, with the RUN text as written run by bash: only absolute paths are moved under the stage's
directory, and ``pip install`` goes through ``uv pip install`` into the stage's venv (the same arguments, less
``--no-cache-dir``, so the package cache keeps the test under two minutes); ``pip wheel`` is the venv's own pip.
RUNs that do not call pip (apt-get for promtool) are listed, not run. The final venv must then hold an
importable provider, DagBag-importable DAGs from the stage's /opt/airflow/dags, and the classes deploy/helm's
values name (auth manager, secrets backend).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.package.test_wheel import PROBE, Stage, clean_env, dockerfile_stages, uv

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@dataclass
class StageRun:
    """One stage carried out: its filesystem root, venv, environment and the RUN steps it skipped."""
    stage: Stage
    root: Path
    venv: Path
    env: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")


def rebase(text: str, root: Path) -> str:
    """Absolute paths of the image (/tmp/..., /opt/...) moved under the stage's directory."""
    return re.sub(r"(?<![\w./-])/(tmp|opt)/", lambda m: f"{root}/{m.group(1)}/", text)


def copy(src: Path, dest: Path, into_dir: bool) -> None:
    target = dest / src.name if into_dir and not src.is_dir() else dest
    if src.is_dir():
        shutil.copytree(src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def carry_out(stage: Stage, root: Path, done: dict[str, StageRun]) -> StageRun:
    venv = root / "venv"
    made = subprocess.run([uv(), "venv", "-q", "--seed", "--python", sys.executable, str(venv)],
                          capture_output=True, text=True, env=clean_env(), timeout=120)
    assert made.returncode == 0, made.stderr
    run = StageRun(stage=stage, root=root, venv=venv)
    workdir = run.path("/")
    for instruction, args in stage.steps:
        if instruction == "WORKDIR":
            workdir = run.path(args)
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY":
            words = shlex.split(args)
            source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            paths = [w for w in words if not w.startswith("--")]
            dest_text = paths[-1]
            dest = workdir / dest_text if not dest_text.startswith("/") else run.path(dest_text)
            into_dir = dest_text.endswith("/") or len(paths) > 2
            if source_stage and not done[source_stage].stage.steps:
                run.skipped.append(f"COPY {args}")  # from an image used as it is (promtool's): nothing built here
                continue
            for src in paths[:-1]:
                origin = done[source_stage].path(src) if source_stage else REPO / src
                copy(origin, dest, into_dir)
        elif instruction == "ENV":
            name, _, value = args.partition("=")
            run.env[name] = rebase(value, root)
        elif instruction == "RUN" and re.search(r"\bpip\b", args):
            script = ('pip() { if [ "$1" = install ]; then shift; args=(); for a in "$@"; do '
                      '[ "$a" = --no-cache-dir ] || args+=("$a"); done; '
                      f'{shlex.quote(uv())} pip install -q --python {shlex.quote(str(venv / "bin" / "python"))} '
                      '"${args[@]}"; '
                      f'else {shlex.quote(str(venv / "bin" / "pip"))} -q "$@"; fi; }}\n'
                      "set -euo pipefail\n" + rebase(args, root))
            env = clean_env() | run.env
            done_run = subprocess.run(["bash", "-c", script], cwd=workdir, capture_output=True, text=True, env=env,
                                      timeout=400)
            assert done_run.returncode == 0, f"RUN {args}\n{done_run.stdout[-2000:]}\n{done_run.stderr[-3000:]}"
            run.ran.append(args)
        elif instruction == "RUN":
            run.skipped.append(args)
    return run


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> StageRun:
    stages = dockerfile_stages((REPO / "Dockerfile").read_text())
    done: dict[str, StageRun] = {}
    last = None
    for i, stage in enumerate(stages):
        last = carry_out(stage, tmp_path_factory.mktemp(f"stage{i}"), done)
        if stage.name:
            done[stage.name] = last
    assert last is not None
    return last


@pytest.fixture(scope="module")
def probe(image: StageRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cwd = tmp_path_factory.mktemp("probe")
    env = clean_env(cwd / "airflow_home") | image.env
    done = subprocess.run([str(image.venv / "bin" / "python"), str(PROBE), str(image.path("/opt/airflow/dags"))],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


def test_the_dockerfile_steps_ran_as_written(image: StageRun) -> None:
    # both pip steps of the final stage ran, the builder's wheel was the one installed, and only promtool's copy from
    # the official Prometheus image was skipped
    assert any("-r " in r and "requirements.txt" in r for r in image.ran), image.ran
    assert any("--no-deps" in r and ".whl" in r for r in image.ran), image.ran
    assert image.skipped == ["COPY --from=promtool /bin/promtool /usr/local/bin/promtool"], image.skipped
    wheels = list(image.path("/opt/promshift/dist").glob("promshift-*.whl"))
    assert len(wheels) == 1
    assert Path(image.env["PROMSHIFT_CATALOG"]).is_file()


def test_the_image_venv_loads_the_provider_and_every_dag(image: StageRun, probe: dict[str, Any]) -> None:
    from promshift.adapters.settings import load_catalog

    assert Path(probe["promshift_file"]).is_relative_to(image.venv)  # the installed wheel, not the checkout
    assert probe["lab_importable"] == []
    assert probe["provider"]["hooks"] == {"prometheus": "PrometheusHook", "amp": "AmpHook"}
    assert set(probe["provider"]["managed"]) == {"prometheus", "amp"}
    assert probe["dagbag"]["import_errors"] == {}
    groups = {g.dag_id for g in load_catalog(Path(image.env["PROMSHIFT_CATALOG"])).groups}
    assert groups and groups <= set(probe["dagbag"]["dag_ids"])


def test_the_classes_the_helm_values_name_import_in_the_image(image: StageRun, tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())["config"]
    names = [config["core"]["auth_manager"], config["secrets"]["backend"]]
    bogus = "promshift.local.Nothing"  # not in the image: shows the check can fail
    code = ("import importlib, json, sys\nmissing = []\nfor n in sys.argv[1:]:\n    m, _, c = n.rpartition('.')\n"
            "    try:\n        getattr(importlib.import_module(m), c)\n"
            "    except (ImportError, AttributeError) as e:\n        missing.append([n, repr(e)])\n"
            "print('MISSING ' + json.dumps(missing))\n")
    env = clean_env(tmp_path / "airflow_home") | image.env
    done = subprocess.run([str(image.venv / "bin" / "python"), "-c", code, *names, bogus], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("MISSING ")]
    missing = json.loads(line.removeprefix("MISSING "))
    assert [n for n, _ in missing] == [bogus], missing


def test_the_rebase_moves_only_image_paths(tmp_path: Path) -> None:
    text = 'pip wheel --wheel-dir /tmp/dist . && pip install -r /opt/promshift/requirements.txt "$(grep x y)"'
    moved = rebase(text, tmp_path)
    assert f"{tmp_path}/tmp/dist" in moved and f"{tmp_path}/opt/promshift/requirements.txt" in moved
    assert "$(grep x y)" in moved and os.sep + "tmp" + os.sep + "dist" in moved
