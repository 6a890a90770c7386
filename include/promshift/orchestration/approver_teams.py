"""Where ``team:<name>`` approvers are read when an approval is asked (``core.approvers``).

With the FAB auth manager and the Airflow connection ``promshift_fab_api`` (the API server's URL, and a FAB user
allowed to read users), a team is a FAB role or group, asked of the API server (``adapters/fab_teams.py``; the board
answers it there): its members' ids are FAB's numeric user ids, as HITL knows them. A worker holds no database
login; an API server that cannot be reached asks nobody (one line), never the database. With the AWS auth manager
and the Airflow connection ``promshift_identity_store`` (an ``aws`` connection whose extra names
``identity_store_id``), a team is an IAM Identity Center group (``adapters/identity_store_teams.py``): its members'
ids are Identity Center user ids. Otherwise the teams live in the Airflow Variable ``promshift_teams``: a JSON
object ``{"gpu-oncall": ["<user id>", ...]}`` in the auth manager's ids (the simple auth manager: user names; FAB:
numeric ids; AWS auth manager: IAM Identity Center user ids). An on-call tool keeps it current (``airflow variables
set`` or the REST API), and a task reads it through the Task SDK like any Variable, so workers need no access to the
auth manager's own database. With the simple auth manager the members are also checked against its configured users
(``[core] simple_auth_manager_users``); other auth managers do not list their users to a task.
"""

from __future__ import annotations

from typing import Any

from promshift.core.approvers import ApproversError, MappingTeams, TeamDirectory, parse_teams, teams_json

TEAMS_VARIABLE = "promshift_teams"
SIMPLE_AUTH_MANAGER = "SimpleAuthManager"
FAB_AUTH_MANAGER = "FabAuthManager"
FAB_API_CONN_ID = "promshift_fab_api"
AWS_AUTH_MANAGER = "AwsAuthManager"
IDENTITY_STORE_CONN_ID = "promshift_identity_store"


def simple_auth_manager_users(conf: Any) -> list[str] | None:
    """The simple auth manager's configured user names, or None when another auth manager is configured."""
    if not str(conf.get("core", "auth_manager", fallback="")).endswith(SIMPLE_AUTH_MANAGER):
        return None
    users = conf.get("core", "simple_auth_manager_users", fallback="") or ""
    return [entry.split(":", 1)[0].strip() for entry in users.split(",") if entry.strip()]


def api_server_url(conn_type: str | None, host: str | None, port: int | None, schema: str | None) -> str:
    """The base URL an ``http`` connection names: ``host`` as a whole URL, or scheme (``schema``, default http),
    host and port."""
    host = (host or "").strip().rstrip("/")
    if "://" in host:
        return host
    if not host:
        raise ApproversError(f"connection {FAB_API_CONN_ID} names no host (the API server's URL)")
    scheme = schema if schema in ("http", "https") else ("https" if conn_type == "https" else "http")
    return f"{scheme}://{host}" + (f":{port}" if port else "")


def fab_team_directory(conf: Any) -> TeamDirectory | None:
    """FAB's roles and groups, asked of the API server (``FabApiTeams``), when the FAB auth manager is configured
    and the connection ``promshift_fab_api`` exists; else None."""
    if not str(conf.get("core", "auth_manager", fallback="")).endswith(FAB_AUTH_MANAGER):
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from promshift.adapters.fab_teams import FabApiTeams

    try:
        conn = BaseHook.get_connection(FAB_API_CONN_ID)
    except AirflowNotFoundException:
        return None
    base = api_server_url(conn.conn_type, conn.host, conn.port, conn.schema)
    return FabApiTeams(base, username=conn.login or "", password=conn.password or "",
                       source=f"the API server's FAB teams (connection {FAB_API_CONN_ID})")


def identity_store_team_directory(conf: Any) -> TeamDirectory | None:
    """IAM Identity Center groups (``IdentityStoreTeams``) when the AWS auth manager is configured and the
    connection ``promshift_identity_store`` exists; else None. Its extra: ``identity_store_id`` (``d-...``),
    ``region_name``, and ``user_name_attribute`` (``UserName``, or ``email`` when the SAML Subject is the email)."""
    if not str(conf.get("core", "auth_manager", fallback="")).endswith(AWS_AUTH_MANAGER):
        return None
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from promshift.adapters.identity_store_teams import IdentityStoreTeams

    source = f"IAM Identity Center (connection {IDENTITY_STORE_CONN_ID})"
    try:
        conn = BaseHook.get_connection(IDENTITY_STORE_CONN_ID)
    except AirflowNotFoundException:
        return None
    extra = conn.extra_dejson
    store = extra.get("identity_store_id")
    if not isinstance(store, str) or not store:
        raise ApproversError(f"{source}: the connection's extra names no identity_store_id")
    client = AwsBaseHook(aws_conn_id=IDENTITY_STORE_CONN_ID, client_type="identitystore").get_conn()
    return IdentityStoreTeams(client, identity_store_id=store, source=source,
                              name_attribute=str(extra.get("user_name_attribute") or "UserName"))


def team_directory() -> TeamDirectory | None:
    """The auth manager's own directory (FAB roles and groups, IAM Identity Center groups), else the teams of
    ``promshift_teams``, else None (then a team entry is refused)."""
    from airflow.configuration import conf
    from airflow.sdk import Variable

    own = fab_team_directory(conf) or identity_store_team_directory(conf)
    if own is not None:
        return own
    source = f"the Airflow Variable {TEAMS_VARIABLE}"
    raw = Variable.get(TEAMS_VARIABLE, default=None)
    if raw is None:
        return None
    value = teams_json(raw, source=source) if isinstance(raw, str) else raw
    return MappingTeams(parse_teams(value, source=source), source=source,
                        known_users=simple_auth_manager_users(conf))
