"""A cluster policy of the local celery demo only: pin mapped parity shards to workers, round robin.

Installed by ``LocalAirflow(executor="celery")`` as ``$AIRFLOW_HOME/config/airflow_local_settings.py``
(Airflow's ``task_instance_mutation_hook``). With ``PROMSHIFT_SHARD_QUEUES=q1,q2`` set, shard ``i`` of
``parity_samples`` goes to queue ``q[i % n]``; each demo worker consumes the common queue and one of
these, so the shards provably run on different workers (one finished in a second can otherwise be
followed by the next on the same worker before the other worker polls). Every other task stays on the
common queue. A production deployment installs no such policy: any free worker takes any shard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

SHARD_QUEUES_ENV = "PROMSHIFT_SHARD_QUEUES"
SHARDED_TASK = "parity_samples"
LOCAL_SETTINGS = (
    '"""Written by promshift.local.airflow_lab for the local celery demo: pins parity shards to workers."""\n'
    "from promshift.local.demo_policy import task_instance_mutation_hook  # noqa: F401\n"
)


def shard_queue(task_id: str, map_index: int | None, queues: Sequence[str]) -> str | None:
    """The queue of one task instance: shard ``i`` of ``parity_samples`` on ``queues[i % n]``; None: leave it."""
    if task_id != SHARDED_TASK or map_index is None or map_index < 0 or not queues:
        return None
    return queues[map_index % len(queues)]


def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
    queues = [q for q in os.environ.get(SHARD_QUEUES_ENV, "").split(",") if q]
    queue = shard_queue(task_instance.task_id, task_instance.map_index, queues)
    if queue is not None:
        task_instance.queue = queue
