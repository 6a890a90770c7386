"""``LocalStack.reset``: a fresh demo starts from the stack's own files, never an earlier demo's edits."""

from __future__ import annotations

from pathlib import Path

from promshift.local.stack.local import LocalStack, StackConfig


def test_reset_removes_a_switched_dashboard_so_the_next_demo_provisions_the_original(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(home=tmp_path))
    switched = stack.dashboards_dir / "dcgm.json"
    switched.parent.mkdir(parents=True)
    switched.write_text('{"datasource": {"uid": "amp-local"}}')  # what an earlier lifecycle demo left
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("kept")
    stack.reset()
    assert not stack.dashboards_dir.exists()
    assert unrelated.read_text() == "kept"  # only what the stack creates goes
