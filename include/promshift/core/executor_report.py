"""The report's ``executor`` block: which worker ran which task of the run (pure; Airflow's records are the input).

The input is Airflow's own record of each task instance (the REST API's ``taskInstances`` of the run:
``task_id``, ``map_index``, ``hostname``, ``pid``, ``state``, ``try_number``). ``hostname`` is what
the worker reported when it started the task (Airflow's ``[core] hostname_callable``); under the local
demo's CeleryExecutor it is the Celery worker's own name (``w1-<port>@<host>``), so two workers on one
machine are told apart. A task that never ran on a worker (skipped, or not reached) has no hostname
and is listed under ``not_run``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EXECUTOR_KINDS = ("local", "celery")
PARITY_SHARDS_TASK = "parity_samples"


def task_label(task_id: str, map_index: int | None) -> str:
    """``parity_samples[1]`` for a mapped task instance, else the task id."""
    return f"{task_id}[{map_index}]" if map_index is not None and map_index >= 0 else task_id


def executor_block(kind: str, task_instances: Iterable[Mapping[str, Any]],
                   processes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """``{kind, workers: [{hostname, tasks: [...], pid?}], not_run: [...], parity_samples_workers}``.

    ``processes``: the worker processes the caller started (``{hostname, pid}``: the Celery worker's
    name and its process id); a worker that ran nothing is still listed, with no tasks. Workers are
    sorted by hostname and each worker's tasks in the order given.
    """
    if kind not in EXECUTOR_KINDS:
        raise ValueError(f"executor kind must be one of {', '.join(EXECUTOR_KINDS)}, got {kind!r}")
    workers: dict[str, dict[str, Any]] = {}
    for proc in processes:
        workers[str(proc["hostname"])] = {"hostname": str(proc["hostname"]), "pid": proc.get("pid"), "tasks": []}
    not_run: list[str] = []
    for ti in task_instances:
        map_index = ti.get("map_index")
        label = task_label(str(ti["task_id"]), None if map_index is None else int(map_index))
        host = ti.get("hostname")
        if not host:
            not_run.append(label)
            continue
        worker = workers.setdefault(str(host), {"hostname": str(host), "tasks": []})
        worker["tasks"].append({"task": label, "task_id": str(ti["task_id"]),
                                "map_index": -1 if map_index is None else int(map_index),
                                "pid": ti.get("pid"), "state": ti.get("state"),
                                "try_number": ti.get("try_number")})
    ordered = [workers[name] for name in sorted(workers)]
    return {"kind": kind, "workers": ordered, "not_run": not_run,
            "parity_samples_workers": workers_of(ordered, PARITY_SHARDS_TASK)}


def workers_of(workers: Sequence[Mapping[str, Any]], task_id: str) -> list[str]:
    """The hostnames of the workers that ran some instance of ``task_id`` (every map index counts)."""
    return sorted({str(w["hostname"]) for w in workers for t in w["tasks"] if t["task_id"] == task_id})


def executor_line(block: Mapping[str, Any]) -> str:
    """One line for the printed report: the executor and how many tasks each worker ran."""
    workers = block.get("workers") or []
    parts = [f"{w['hostname']} ({len(w['tasks'])} task(s)" + (f", pid {w['pid']}" if w.get("pid") else "") + ")"
             for w in workers]
    shards = block.get("parity_samples_workers") or []
    return (f"{block.get('kind')}, {len(workers)} worker(s): {', '.join(parts) or 'none'}; "
            f"parity shards ran on {len(shards)} worker(s)")
