"""An auth manager that scopes one user to some DAGs, for testing the board's per-group access.

The Simple auth manager's roles read every DAG or none. Production auth managers (FAB, Keycloak, a
multi-team setup) grant DAGs one by one; this subclass adds that to the Simple one: ``viewer-vic``
keeps her viewer role but may not read ``promshift__gpu_memory``. Everything else is Airflow's.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

SCOPED_USER = "viewer-vic"
DENIED_DAG = "promshift__gpu_memory"


class GroupScopedAuthManager(SimpleAuthManager):
    """Simple auth manager, except that ``SCOPED_USER`` is denied ``DENIED_DAG`` (and any-DAG checks stay hers)."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if user.get_name() == SCOPED_USER and details is not None and details.id == DENIED_DAG:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def get_authorized_dag_ids(self, *, user: Any, method: Any = "GET", session: Any = None) -> set[str]:
        """Airflow's per-DAG filter over the catalog's DAG ids (the base class lists them from Airflow's DB)."""
        from promshift.adapters.settings import load_catalog

        return self.filter_authorized_dag_ids(dag_ids={g.dag_id for g in load_catalog().groups}, user=user,
                                              method=method)
