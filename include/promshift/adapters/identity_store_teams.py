"""Teams as IAM Identity Center groups: the team directory when Airflow runs the AWS auth manager.

The AWS auth manager's user id is its SAML application's ``id`` attribute, which Airflow's setup maps to
``${user:AD_GUID}``: the identity store's ``UserId``. So ``team:<name>`` is the identity-store group whose display
name is ``<name>`` (``GetGroupId``), its members are ``ListGroupMemberships``' user ids, and each one's name is
read with ``DescribeUser``: ``UserName`` by default, or its primary email when the application's Subject (the
SAML NameID, Airflow's user name and a run's ``triggering_user_name``) is the email. Disabled users are left out.

Calls: ``identitystore:GetGroupId``, ``ListGroupMemberships`` and ``DescribeUser`` (deploy/iam, statement
``ApproverTeamsIdentityCenter``), in the account and Region that hold the identity store.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from promshift.core.approvers import Approver, ApproversError

# A team is an on-call rotation, and HITL's request lists every assignee.
MAX_TEAM_MEMBERS = 100
NAME_ATTRIBUTES = ("UserName", "email")
_PAGE = 100


class IdentityStoreTeams:
    """``TeamDirectory`` over an IAM Identity Center identity store (a boto3 ``identitystore`` client)."""

    def __init__(self, client: Any, *, identity_store_id: str, source: str, name_attribute: str = "UserName") -> None:
        if name_attribute not in NAME_ATTRIBUTES:
            raise ApproversError(f"{source}: the user name attribute must be one of {', '.join(NAME_ATTRIBUTES)}, "
                                 f"got {name_attribute!r}")
        self.client = client
        self.store = identity_store_id
        self.source = source
        self.name_attribute = name_attribute

    def _name(self, user: dict[str, Any]) -> str:
        if self.name_attribute == "email":
            emails = [e for e in user.get("Emails") or [] if isinstance(e, dict) and e.get("Value")]
            primary = next((e for e in emails if e.get("Primary")), emails[0] if emails else None)
            if primary is not None:
                return str(primary["Value"])
        return str(user.get("UserName") or user["UserId"])

    def members(self, team: str) -> list[Approver]:
        try:
            try:
                group_id = self.client.get_group_id(
                    IdentityStoreId=self.store,
                    AlternateIdentifier={"UniqueAttribute": {"AttributePath": "DisplayName",
                                                             "AttributeValue": team}})["GroupId"]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                    raise ApproversError(f"team {team!r} is not a group in {self.source}") from None
                raise
            user_ids: list[str] = []
            pages = self.client.get_paginator("list_group_memberships").paginate(
                IdentityStoreId=self.store, GroupId=group_id, PaginationConfig={"PageSize": _PAGE})
            for page in pages:
                user_ids += [str(m["MemberId"]["UserId"]) for m in page.get("GroupMemberships", [])
                             if "UserId" in (m.get("MemberId") or {})]
                if len(user_ids) > MAX_TEAM_MEMBERS:
                    raise ApproversError(f"team {team!r}: the group in {self.source} has more than "
                                         f"{MAX_TEAM_MEMBERS} members; a team is an on-call rotation")
            users = [self.client.describe_user(IdentityStoreId=self.store, UserId=uid) for uid in user_ids]
        except (ClientError, BotoCoreError) as exc:
            raise ApproversError(f"team {team!r}: {self.source} could not be read: "
                                 f"{str(exc).splitlines()[0][:200]}") from None
        return [Approver(str(u["UserId"]), self._name(u)) for u in users if u.get("UserStatus") != "DISABLED"]
