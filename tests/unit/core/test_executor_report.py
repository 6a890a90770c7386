"""The report's ``executor`` block, built from Airflow's task-instance records (pure)."""

from __future__ import annotations

import pytest

from promshift.core.executor_report import executor_block, executor_line, task_label, workers_of

W1, W2 = "w1-28080@vm", "w2-28080@vm"


def ti(task_id: str, hostname: str | None, *, map_index: int = -1, pid: int | None = 100,
       state: str = "success") -> dict[str, object]:
    return {"task_id": task_id, "map_index": map_index, "hostname": hostname, "pid": pid, "state": state,
            "try_number": 1}


def test_each_worker_lists_the_tasks_airflow_recorded_it_ran() -> None:
    block = executor_block("celery", [
        ti("validate", W2, pid=11), ti("parity_samples", W1, map_index=0, pid=12),
        ti("parity_samples", W2, map_index=1, pid=13), ti("rollback", "", state="skipped"),
    ], processes=[{"hostname": W1, "pid": 501}, {"hostname": W2, "pid": 502}])
    assert block["kind"] == "celery"
    assert [w["hostname"] for w in block["workers"]] == [W1, W2]
    assert block["workers"][0]["pid"] == 501
    assert [t["task"] for t in block["workers"][0]["tasks"]] == ["parity_samples[0]"]
    assert [(t["task"], t["pid"]) for t in block["workers"][1]["tasks"]] == [("validate", 11),
                                                                            ("parity_samples[1]", 13)]
    assert block["not_run"] == ["rollback"]
    assert block["parity_samples_workers"] == [W1, W2]


def test_shards_all_on_one_worker_count_as_one() -> None:
    block = executor_block("celery", [ti("parity_samples", W1, map_index=i) for i in range(3)],
                           processes=[{"hostname": W1, "pid": 1}, {"hostname": W2, "pid": 2}])
    assert block["parity_samples_workers"] == [W1]
    # The idle worker is still listed: it was started and ran nothing.
    assert [(w["hostname"], len(w["tasks"])) for w in block["workers"]] == [(W1, 3), (W2, 0)]
    assert "parity shards ran on 1 worker(s)" in executor_line(block)


def test_local_executor_block_names_the_machine() -> None:
    block = executor_block("local", [ti("validate", "vm"), ti("done", "vm")])
    assert block == {"kind": "local", "workers": [{"hostname": "vm", "tasks": block["workers"][0]["tasks"]}],
                     "not_run": [], "parity_samples_workers": []}
    assert [t["task"] for t in block["workers"][0]["tasks"]] == ["validate", "done"]
    assert executor_line(block).startswith("local, 1 worker(s): vm (2 task(s))")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="executor kind"):
        executor_block("kubernetes", [])


def test_labels_and_workers_of() -> None:
    assert task_label("parity_samples", 2) == "parity_samples[2]"
    assert task_label("validate", -1) == "validate" == task_label("validate", None)
    assert workers_of([{"hostname": "b", "tasks": [{"task_id": "x"}]},
                       {"hostname": "a", "tasks": [{"task_id": "x"}, {"task_id": "y"}]}], "x") == ["a", "b"]
