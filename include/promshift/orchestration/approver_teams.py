"""Where ``team:<name>`` approvers are read when an approval is asked (``core.approvers``).

The teams live in the Airflow Variable ``promshift_teams``: a JSON object ``{"gpu-oncall": ["<user id>", ...]}``
in the auth manager's ids (the simple auth manager: user names; FAB: numeric ids; AWS auth manager: IAM Identity
Center user ids). An on-call tool keeps it current (``airflow variables set`` or the REST API), and a task reads
it through the Task SDK like any Variable, so workers need no access to the auth manager's own database. With the
simple auth manager the members are also checked against its configured users (``[core]
simple_auth_manager_users``); other auth managers do not list their users to a task.
"""

from __future__ import annotations

import json
from typing import Any

from promshift.core.approvers import ApproversError, MappingTeams, TeamDirectory, parse_teams

TEAMS_VARIABLE = "promshift_teams"
SIMPLE_AUTH_MANAGER = "SimpleAuthManager"


def simple_auth_manager_users(conf: Any) -> list[str] | None:
    """The simple auth manager's configured user names, or None when another auth manager is configured."""
    if not str(conf.get("core", "auth_manager", fallback="")).endswith(SIMPLE_AUTH_MANAGER):
        return None
    users = conf.get("core", "simple_auth_manager_users", fallback="") or ""
    return [entry.split(":", 1)[0].strip() for entry in users.split(",") if entry.strip()]


def team_directory() -> TeamDirectory | None:
    """The teams of ``promshift_teams``, or None when the Variable is not set (then a team entry is refused)."""
    from airflow.configuration import conf
    from airflow.sdk import Variable

    source = f"the Airflow Variable {TEAMS_VARIABLE}"
    raw = Variable.get(TEAMS_VARIABLE, default=None)
    if raw is None:
        return None
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise ApproversError(f"{source} is not JSON: {exc}") from None
    return MappingTeams(parse_teams(value, source=source), source=source,
                        known_users=simple_auth_manager_users(conf))
