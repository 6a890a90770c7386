"""An auth manager that scopes one user to some DAGs, for testing the board's per-group access.

The Simple auth manager's roles read every DAG or none. Production auth managers (FAB, Keycloak, a
multi-team setup) grant DAGs one by one; this subclass adds that to the Simple one: ``viewer-vic``
keeps her viewer role but may not read ``promshift__migrate__amp_c``, the migration DAG of gpu-memory's
target in the board tests' catalog (``scoped_catalog``: gpu-memory alone on connection ``amp_c``).
Everything else is Airflow's.

Access follows Airflow's DAGs, and a migration DAG is a target workspace's: denying it denies every group
migrating to that workspace, never one group of several (test_board_access.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

SCOPED_USER = "viewer-vic"
DENIED_TARGET = "amp_c"
DENIED_DAG = f"promshift__migrate__{DENIED_TARGET}"
REPO = Path(__file__).resolve().parents[2]


def scoped_catalog(folder: Path) -> Path:
    """A copy of the shipped catalog folder in ``folder``, with gpu-memory moved to its own target connection
    ``DENIED_TARGET`` (so its migration DAG is ``DENIED_DAG``; the other three groups share
    ``promshift__migrate__promshift_target``)."""
    shutil.copytree(REPO / "catalog", folder, dirs_exist_ok=True)  # its dashboards and AMP prices beside it
    path = folder / "metric_groups.yaml"
    doc = yaml.safe_load(path.read_text())
    next(g for g in doc["groups"] if g["name"] == "gpu-memory")["target"] = DENIED_TARGET
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class GroupScopedAuthManager(SimpleAuthManager):
    """Simple auth manager, except that ``SCOPED_USER`` is denied ``denied_dag`` (and any-DAG checks stay hers)."""

    denied_dag = DENIED_DAG

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if user.get_name() == SCOPED_USER and details is not None and details.id == self.denied_dag:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def get_authorized_dag_ids(self, *, user: Any, method: Any = "GET", session: Any = None) -> set[str]:
        """Airflow's per-DAG filter over the catalog's DAG ids (the base class lists them from Airflow's DB)."""
        from promshift.adapters.settings import load_catalog

        return self.filter_authorized_dag_ids(dag_ids={g.dag_id for g in load_catalog().groups}, user=user,
                                              method=method)
