"""A release is tagged ``v<version>`` on a commit whose ``pyproject.toml`` carries that version (git runs here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_release_tag_if_present_is_on_a_commit_of_its_version() -> None:
    """Tags are not always cloned; where ``v<version>`` exists it must point at a commit whose pyproject says so."""
    tags = subprocess.run(["git", "tag", "--list", "v*"], cwd=REPO, capture_output=True, text=True, timeout=30)
    for tag in tags.stdout.split():
        shown = subprocess.run(["git", "show", f"{tag}:pyproject.toml"], cwd=REPO, capture_output=True, text=True,
                               timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert f'version = "{tag[1:]}"' in shown.stdout, f"{tag} is on a commit whose version is not {tag[1:]}"
