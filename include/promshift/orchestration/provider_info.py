"""promshift as an Airflow provider: its connection types (``prometheus``, ``amp``) and their forms.

Airflow finds this through the ``apache_airflow_provider`` entry point in pyproject.toml.
Airflow 3.2+ reads the form declaratively (``conn-fields`` and ``ui-field-behaviour``), as the
amazon provider declares its ``aws`` type; the hooks' ``get_ui_field_behaviour`` returns the
same dicts. This module imports nothing, so provider discovery stays cheap.
"""

from __future__ import annotations

import json
from typing import Any

PROMETHEUS_UI: dict[str, Any] = {
    "hidden-fields": ["login", "password"],
    "relabeling": {"host": "Base URL (http://host, or with extra.base_url)"},
    "placeholders": {
        "host": "http://127.0.0.1",
        "port": "9090",
        "extra": json.dumps({"config_path": "/etc/prometheus/prometheus.yml", "promtool": "promtool",
                             "timeout_s": 60}, indent=2),
    },
}
PROMETHEUS_FIELDS: dict[str, Any] = {
    "config_path": {"label": "Config file (source only)", "schema": {"type": ["string", "null"]},
                    "description": "The source Prometheus' config file the dual-write entry is added to"},
    "remote_write_url": {"label": "Remote-write URL (target only)", "schema": {"type": ["string", "null"]}},
    "timeout_s": {"label": "Query timeout (s)", "schema": {"type": ["integer", "null"], "default": 60}},
}

AMP_UI: dict[str, Any] = {
    "hidden-fields": ["host", "schema", "port"],
    "relabeling": {"login": "AWS Access Key ID", "password": "AWS Secret Access Key"},
    "placeholders": {
        "login": "empty: AWS_ACCESS_KEY_ID / the default credential chain",
        "password": "empty: AWS_SECRET_ACCESS_KEY / the default credential chain",
        "extra": json.dumps({"region_name": "us-east-1", "workspace_alias": "gpu-fleet",
                             "role_arn": "arn:aws:iam::123456789012:role/promshift"}, indent=2),
    },
}
AMP_FIELDS: dict[str, Any] = {
    "region_name": {"label": "Region", "schema": {"type": ["string", "null"]},
                    "description": "The workspace's AWS region (required)"},
    "workspace_id": {"label": "Workspace id", "schema": {"type": ["string", "null"]},
                     "description": "ws-...; or give the alias instead"},
    "workspace_alias": {"label": "Workspace alias", "schema": {"type": ["string", "null"]}},
    "role_arn": {"label": "Role to assume", "schema": {"type": ["string", "null"]},
                 "description": "promshift's own role, assumed as the amazon provider assumes roles (optional)"},
    "writer_role_arn": {"label": "Writer role (sigv4)", "schema": {"type": ["string", "null"]},
                        "description": "The role the source Prometheus assumes to write (aps:RemoteWrite only); "
                                       "empty: it writes with its own IRSA role (recommended)"},
}


def field_behaviour(ui: dict[str, Any]) -> dict[str, Any]:
    """The provider-info form (kebab-case keys) as ``get_ui_field_behaviour`` returns it."""
    return {"hidden_fields": list(ui["hidden-fields"]), "relabeling": dict(ui["relabeling"]),
            "placeholders": dict(ui["placeholders"])}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "promshift",
        "name": "promshift",
        "description": "Migrate Prometheus metric groups to Amazon Managed Service for Prometheus.",
        "connection-types": [
            {"connection-type": "prometheus", "hook-class-name": "promshift.orchestration.hooks.PrometheusHook",
             "hook-name": "Prometheus (promshift)", "conn-fields": PROMETHEUS_FIELDS,
             "ui-field-behaviour": PROMETHEUS_UI},
            {"connection-type": "amp", "hook-class-name": "promshift.orchestration.amp_hook.AmpHook",
             "hook-name": "Amazon Managed Service for Prometheus (promshift)", "conn-fields": AMP_FIELDS,
             "ui-field-behaviour": AMP_UI},
        ],
        "extra-links": ["promshift.orchestration.links.MigrationReportLink"],
    }
