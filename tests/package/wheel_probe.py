"""Run by tests/package/test_wheel.py inside the fresh venv that holds only requirements.txt and the wheel.

``python wheel_probe.py DAGS_DIR`` prints a line ``PROBE {json}`` (Airflow may log on stdout too): where
promshift was imported from, what the ``apache_airflow_provider`` entry point returns and what Airflow's
ProvidersManager made of it, the DagBag's import errors and DAG ids, the package data read back, and which lab
packages are importable (none should be).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import warnings
from importlib.metadata import entry_points
from typing import Any


def provider() -> dict[str, Any]:
    (ep,) = [e for e in entry_points(group="apache_airflow_provider") if e.dist and e.dist.name == "promshift"]
    info = ep.load()()
    hooks = {}
    for conn in info["connection-types"]:
        module, _, cls = conn["hook-class-name"].rpartition(".")
        hooks[conn["connection-type"]] = getattr(importlib.import_module(module), cls).__name__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from airflow.providers_manager import ProvidersManager

        manager = ProvidersManager()
        managed = {t: manager.hooks[t].hook_class_name for t in hooks if manager.hooks.get(t)}
    return {"entry_point": ep.value, "package_name": info["package-name"], "hooks": hooks, "managed": managed,
            "providers": sorted(manager.providers)}


def dagbag(folder: str) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=folder)  # examples off: AIRFLOW__CORE__LOAD_EXAMPLES=False
    return {"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "dag_ids": sorted(bag.dag_ids)}


def data() -> dict[str, Any]:
    from promshift.board.pages import error_html
    from promshift.data import load_dcgm_counters

    page = error_html(404, "no such group", airflow_root="/", base="/promshift")
    return {"dcgm_counters": len(load_dcgm_counters()), "error_page": "no such group" in page and "<html" in page}


def main() -> None:
    import promshift

    print("PROBE " + json.dumps({
        "promshift_file": promshift.__file__,
        "provider": provider(),
        "dagbag": dagbag(sys.argv[1]),
        "data": data(),
        "lab_importable": sorted(m for m in ("moto", "aiosmtpd", "promshift.local")
                                 if importlib.util.find_spec(m) is not None),
    }))


if __name__ == "__main__":
    main()
