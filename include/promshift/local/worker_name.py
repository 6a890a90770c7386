"""Airflow's ``[core] hostname_callable`` for workers that share a machine (the local Celery demo).

Airflow records ``TaskInstance.hostname`` from this callable when a worker starts a task. Two Celery
workers on one machine would both report the machine's name; each is started with
``PROMSHIFT_WORKER_NAME`` set to its Celery hostname (``w1-<port>@<host>``), so Airflow's own record
says which worker ran the task. Without the variable it is Airflow's default, the machine's FQDN.
"""

from __future__ import annotations

import os
import socket

WORKER_NAME_ENV = "PROMSHIFT_WORKER_NAME"
# What the local demo sets AIRFLOW__CORE__HOSTNAME_CALLABLE to.
HOSTNAME_CALLABLE = f"{__name__}.hostname"


def hostname() -> str:
    return os.environ.get(WORKER_NAME_ENV) or socket.getfqdn()
