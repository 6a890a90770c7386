"""Who may approve a run: the catalog names users and teams; a team is resolved when the approval is asked.

A catalog entry is a user id as the auth manager knows it (``oncall-alice``; FAB: the user's numeric id) or a team
(``team:gpu-oncall``). On-call engineers are a rotation, so a team's members are read from a ``TeamDirectory`` at
approval time, not when the DAG is parsed: whoever is on the team then is asked. The run's trigger user is never
asked (four eyes); an approval with nobody left to ask is refused with one line, because Airflow lets *any*
user answer a request whose assignee list is empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

TEAM_PREFIX = "team:"
TEAM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def teams_json(raw: str, *, source: str, max_bytes: int = 1 << 20, max_depth: int = 8) -> Any:
    """A teams document (``{"team": ["user", ...]}``) from JSON, within a budget: size, nesting, and no key given
    twice (JSON parsers keep the last, silently dropping a team's first list). One-line ApproversError."""
    from promshift.core.inputs import json_depth

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, members in pairs:
            if name in out:
                raise ApproversError(f"{source}: team {name[:80]!r} is given twice")
            out[name] = members
        return out

    if len(raw) > max_bytes:
        raise ApproversError(f"{source} is {len(raw):,} characters, more than {max_bytes:,}")
    try:
        value = json.loads(raw, object_pairs_hook=unique)
    except ApproversError:
        raise
    except RecursionError:
        raise ApproversError(f"{source}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise ApproversError(f"{source} is not JSON: {' '.join(str(exc).split())[:200]}") from None
    if json_depth(value) > max_depth:
        raise ApproversError(f"{source}: nested deeper than {max_depth} levels")
    return value


class ApproversError(ValueError):
    """Nobody can be asked, or a team cannot be read: one line naming the team or the group."""


class UnknownTeam(ApproversError):
    """The directory was read and has no such team (the API server answers it 404, not 503)."""


@dataclass(frozen=True)
class Approver:
    """One user as the auth manager identifies it (``id``) and shows it (``name``)."""

    id: str
    name: str


class TeamDirectory(Protocol):
    """Where a team's members are read. ``members`` raises ``ApproversError`` for a team it does not know."""

    def members(self, team: str) -> list[Approver]: ...


def team_of(entry: str) -> str | None:
    """The team an entry names (``team:<name>``), or None for a user id."""
    return entry[len(TEAM_PREFIX):] if entry.startswith(TEAM_PREFIX) else None


def team_name_problem(entry: str) -> str | None:
    """Why a ``team:`` entry's name is not one (None when it is fine or the entry is a user)."""
    team = team_of(entry)
    if team is not None and not TEAM_NAME_RE.fullmatch(team):
        return f"team name {team!r} must match {TEAM_NAME_RE.pattern}"
    return None


def resolve(entries: Sequence[str], directory: TeamDirectory | None, *, group: str,
            exclude: Iterable[str | None] = ()) -> list[Approver]:
    """The users to ask, in catalog order without repeats; ``exclude`` (the trigger user's id or name) left out.

    ``directory`` may be None only when no entry is a team. ApproversError when nobody is left.
    """
    out: dict[str, Approver] = {}
    for entry in entries:
        team = team_of(entry)
        if team is None:
            out.setdefault(entry, Approver(entry, entry))
            continue
        if directory is None:
            raise ApproversError(f"group {group}: approvers name {entry}, but no team directory is configured "
                                 "for this auth manager (see docs/approvals.md)")
        for member in directory.members(team):
            out.setdefault(member.id, member)
    excluded = {e for e in exclude if e}
    left = [a for a in out.values() if a.id not in excluded and a.name not in excluded]
    if not left:
        who = ", ".join(entries)
        raise ApproversError(f"group {group}: nobody may approve: {who} resolve to "
                             f"{', '.join(a.name for a in out.values()) or 'nobody'}, and the run's trigger user "
                             "cannot approve it (four eyes)")
    return left


class MappingTeams:
    """Teams kept as a mapping ``{team: [user id, ...]}`` (an Airflow Variable for the simple auth manager).

    ``known_users``: the auth manager's user ids, when it can list them; a member who is not one is refused
    (a typo would otherwise leave a team with nobody who can log in to answer).
    """

    def __init__(self, teams: Mapping[str, Sequence[str]], *, source: str,
                 known_users: Iterable[str] | None = None) -> None:
        self.teams = {str(k): [str(v) for v in vs] for k, vs in teams.items()}
        self.source = source
        self.known = set(known_users) if known_users is not None else None

    def members(self, team: str) -> list[Approver]:
        if team not in self.teams:
            known = ", ".join(sorted(self.teams)) or "none"
            raise UnknownTeam(f"team {team!r} is not in {self.source} (teams there: {known})")
        if self.known is not None:
            strangers = [m for m in self.teams[team] if m not in self.known]
            if strangers:
                raise ApproversError(f"team {team!r} in {self.source} names {', '.join(strangers)}, "
                                     "who are not users of the auth manager")
        return [Approver(m, m) for m in self.teams[team]]


def parse_teams(value: object, *, source: str) -> dict[str, list[str]]:
    """A teams mapping as stored (JSON object of team -> list of user ids), or ApproversError naming ``source``."""
    if not isinstance(value, Mapping):
        raise ApproversError(f"{source} must be a JSON object of team -> list of user ids, got "
                             f"{type(value).__name__}")
    teams: dict[str, list[str]] = {}
    for team, members in value.items():
        if not isinstance(team, str) or not TEAM_NAME_RE.fullmatch(team):
            raise ApproversError(f"{source}: team name {team!r} must match {TEAM_NAME_RE.pattern}")
        if not isinstance(members, list) or not all(isinstance(m, str) and m.strip() == m and m for m in members):
            raise ApproversError(f"{source}: team {team!r} must list user ids (non-empty strings)")
        teams[team] = list(members)
    return teams
