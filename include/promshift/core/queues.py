"""Bounded write queues: how many promshift ``remote_write`` queues a source carries, and the swaps that merge them.

Every ``remote_write`` entry keeps its own queue tailing the source's WAL, and memory grows with each
filtered destination (prometheus/prometheus#13174; measured here in ``bench/results/source-queues.json``).
So a source carries at most ``cap`` promshift queues (the source connection's ``extra.max_queues``; default
``DEFAULT_QUEUE_CAP``). Groups that have cut over share one merged
entry per (source, target) (``core.render.merged_remote_write_entry``), reached by a *swap* that loses
nothing:

1. **add** the new merged entry beside the live ones (a new entry never restarts live queues);
2. **prove** it carries every series of every group it takes over (``swap_proof``: a count per group on the
   target against the source, and the merged queue's own sent-samples counter on the source);
3. **remove** the entries it replaces.

During the overlap the target receives every sample twice, and a duplicate older than its series' newest sample
is out of order: a Prometheus receiver without an out-of-order window refuses the whole remote-write batch that
holds one (HTTP 400, never retried), newer samples included. So a swap that adds an entry starts only when the
target's out-of-order window covers the overlap (``overlap_refusal``); otherwise nothing is edited.

A live entry is never edited: a new member set is a new entry (its name is a digest of its members). A
group that rolls back after merging *leaves* the merged entry by one more swap (a merged entry of the
others replaces it; none when it was the last). Everything here reads the config itself, so a swap
resumed after a crash finds where it stood (``swap_phase``) and ends the same way; undoing a swap before
its removal is ``remove_remote_write`` of the added entry, which gives back the snapshot byte for byte.

The cap counts entries at rest: during a swap's overlap the source carries one more entry for as long as
the proof takes (documented in ``docs/lifecycle.md``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# The catalog holds the cap's default and bound (render imports the catalog); re-exported here.
from promshift.core.catalog.model import DEFAULT_QUEUE_CAP as DEFAULT_QUEUE_CAP
from promshift.core.catalog.model import MAX_QUEUE_CAP as MAX_QUEUE_CAP
from promshift.core.durations import parse_duration
from promshift.core.inputs import CONFIG, parse_yaml_bounded
from promshift.core.promql import promql_string
from promshift.core.render import (
    ENTRY_PREFIX,
    MEMBER_LABEL,
    QueueMember,
    RenderError,
    add_remote_write,
    is_merged_name,
    is_promshift_name,
    merged_remote_write_entry,
    queue_members,
    remote_write_entries,
    remote_write_name,
    remote_write_names,
    remove_remote_write,
)
from promshift.core.stages import CUT_OVER_OR_LATER, Stage
from promshift.core.verdicts import Verdict

NAME_COPY = "promshift_metric_name"

# Groups whose own entries a merge takes over: cut over (reads on the target) and still scraped by the source. A
# decommissioned group's series are dropped at scrape, so a swap could never prove it carries them (no data never
# passes): its own entry stays until it is recommissioned.
MERGEABLE_STAGES: frozenset[Stage] = CUT_OVER_OR_LATER - {Stage.DECOMMISSIONED}


class QueueCapError(ValueError):
    """A new dual-write would take the source past its queue cap and nothing can be merged."""


def check_queue_cap(value: Any, what: str = "max_queues") -> int:
    """A queue cap from a catalog or a connection: an integer 1..MAX_QUEUE_CAP (one clear line otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUEUE_CAP:
        raise ValueError(f"{what} must be an integer from 1 to {MAX_QUEUE_CAP}, got {value!r}")
    return value


def queue_cap_of(connection_value: Any, catalog_cap: int, *, conn_id: str) -> int:
    """The cap of one source: its connection's ``extra.max_queues`` when set, else the catalog's
    ``defaults.max_queues`` (itself DEFAULT_QUEUE_CAP unless set). A bad connection value is a ValueError in one
    line, never a fallback to the default: a production setting fails closed."""
    if connection_value is None:
        return check_queue_cap(catalog_cap, "defaults.max_queues")
    return check_queue_cap(connection_value, f"connection {conn_id!r} extra.max_queues")


@dataclass(frozen=True)
class QueueEntry:
    """One promshift ``remote_write`` entry of a source config: a group's own, or a merged one."""

    name: str
    url: str
    members: tuple[QueueMember, ...]
    settings: tuple[tuple[str, Any], ...]  # sigv4 and queue_config as loaded (members must agree to merge)

    @property
    def merged(self) -> bool:
        return is_merged_name(self.name)

    def groups(self) -> tuple[str, ...]:
        return tuple(m.group for m in self.members)


def _settings(entry: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """An entry's signing and queue settings, canonical: the same mapping in another key order is the same settings
    (a ``Prometheus`` resource's entries come back in whatever order each was written)."""
    return tuple((k, json.dumps(entry[k], sort_keys=True, default=str)) for k in ("sigv4", "queue_config")
                 if k in entry)


def promshift_queues(config: str | bytes) -> tuple[QueueEntry, ...]:
    """The promshift entries of a source config, in file order (other teams' entries are not counted)."""
    found = []
    for entry in remote_write_entries(config):
        name = str(entry.get("name", ""))
        if is_promshift_name(name):
            found.append(QueueEntry(name, str(entry.get("url", "")), queue_members(entry), _settings(entry)))
    return tuple(found)


def carrying_entry(config: str | bytes, group: str) -> str | None:
    """The name of the promshift entry that writes ``group`` now (its own or a merged one), None when none does.

    The bake watch reads the group's queue health (lag, failed samples) from this queue: once merged, the
    group has no queue of its own."""
    found = [str(e.get("name")) for e in remote_write_entries(config) if group in entry_groups(e)]
    return found[-1] if found else None  # mid-swap both carry it: the newer (later in the file) is the one that stays


def entry_groups(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """The groups a promshift entry writes, by name only: readable also from the config a server reports
    (``/api/v1/status/config`` adds defaults and leaves out ``replacement: ""``, prometheus/prometheus#18652),
    where ``queue_members``' exact shape check would refuse it. Not a promshift entry: ()."""
    name = str(entry.get("name", ""))
    if not is_promshift_name(name):
        return ()
    if not is_merged_name(name):
        return (name[len(ENTRY_PREFIX):],)
    rules = entry.get("write_relabel_configs") or []
    return tuple(str(r.get("replacement")) for r in rules
                 if isinstance(r, Mapping) and r.get("target_label") == MEMBER_LABEL and r.get("action") == "replace")


def _raw(config: str | bytes, name: str) -> dict[str, Any]:
    return next(e for e in remote_write_entries(config) if e.get("name") == name)


@dataclass(frozen=True)
class Swap:
    """One swap of a source's entries: add ``add`` (None: nothing replaces them), prove ``prove``, remove ``remove``.

    ``kind`` is ``merge`` (cut-over groups join the merged entry) or ``leave`` (``leaving`` rolls back out of it).
    """

    kind: str
    url: str
    add: Mapping[str, Any] | None
    remove: tuple[str, ...]
    prove: tuple[QueueMember, ...]
    leaving: str | None = None

    @property
    def added_name(self) -> str | None:
        return None if self.add is None else str(self.add["name"])

    def to_dict(self) -> dict[str, Any]:
        """What the audit records of a swap (no credentials: an entry holds a URL and a role ARN at most)."""
        return {"kind": self.kind, "url": self.url, "add": self.added_name, "remove": list(self.remove),
                "prove": [m.group for m in self.prove], "leaving": self.leaving}


def _merged_for(queues: Sequence[QueueEntry], url: str) -> list[QueueEntry]:
    return [q for q in queues if q.merged and q.url == url]


def _merged_of(members: Iterable[QueueMember], url: str, like: dict[str, Any]) -> dict[str, Any]:
    return merged_remote_write_entry(members=members, url=url, queue_config=like.get("queue_config"),
                                     sigv4=like.get("sigv4"))


def plan_merge(config: str | bytes, *, url: str, cut_over: Iterable[str]) -> Swap | None:
    """The swap that merges every cut-over group's own entry to ``url`` into one merged entry, or None.

    The new merged entry holds the old merged entry's members and the cut-over groups; it replaces both.
    A swap left half-done by a crash (two merged entries to ``url``: the old one and its successor)
    resumes: the successor stays, and the entries it covers go.
    """
    queues = promshift_queues(config)
    done = set(cut_over)
    merged = _merged_for(queues, url)
    if len(merged) > 1:
        return _resume(config, queues, merged, url)
    joining = [q for q in queues if not q.merged and q.url == url and q.groups()[0] in done]
    if not joining:
        return None
    _same_settings([*merged, *joining])
    members = [m for q in (*merged, *joining) for m in q.members]
    like = _raw(config, joining[0].name)
    add = _merged_of(members, url, like)
    # A merged entry already holding exactly these groups is this swap's own add (a crash after it): it stays.
    remove = tuple(q.name for q in (*merged, *joining) if q.name != add["name"])
    return Swap("merge", url, add, remove, tuple(sorted({m.group: m for m in members}.values(),
                                                        key=lambda m: m.group)))


def _resume(config: str | bytes, queues: Sequence[QueueEntry], merged: list[QueueEntry], url: str) -> Swap:
    newest = max(merged, key=lambda q: len(q.members))
    covered = set(newest.groups())
    stale = [q for q in queues if q.url == url and q.name != newest.name and set(q.groups()) <= covered]
    if len(stale) + 1 < len(merged):
        raise RenderError(f"source has {len(merged)} merged entries to {url} that do not nest; merge them by hand")
    kind = "merge" if any(not q.merged for q in stale) or len(newest.members) >= max(
        len(q.members) for q in stale) else "leave"
    return Swap(kind, url, _raw(config, newest.name), tuple(q.name for q in stale), newest.members)


def _same_settings(queues: Sequence[QueueEntry]) -> None:
    kinds = {q.settings for q in queues}
    if len(kinds) > 1:
        names = ", ".join(q.name for q in queues)
        raise RenderError(f"entries {names} sign or queue differently; they cannot share one queue")


def plan_leave(config: str | bytes, *, group: str) -> Swap | None:
    """The swap that takes ``group`` out of its merged entry (a rollback after merging), or None if not merged.

    The others stay in a new merged entry (proven before the old one goes); when ``group`` was the last
    member nothing is added and the merged entry is simply removed.
    """
    queues = promshift_queues(config)
    holding = [q for q in queues if q.merged and group in q.groups()]
    if not holding:
        return None
    if len(holding) > 1:
        # A swap interrupted by a crash: finish it first (plan_merge resumes it), then leave.
        raise RenderError(f"group {group!r} is in {len(holding)} merged entries (a swap was interrupted); "
                          "run the merge again first")
    old = holding[0]
    rest = tuple(m for m in old.members if m.group != group)
    add = _merged_of(rest, old.url, _raw(config, old.name)) if rest else None
    return Swap("leave", old.url, add, (old.name,), rest, leaving=group)


def swap_phase(config: str | bytes, swap: Swap) -> str:
    """Where ``swap`` stands in ``config``: ``start`` (nothing added), ``added`` (overlap), ``done``."""
    names = {q.name for q in promshift_queues(config)}
    if not any(name in names for name in swap.remove):
        return "done" if swap.add is None or swap.added_name in names else "start"
    return "added" if swap.add is None or swap.added_name in names else "start"


def with_added(config: bytes, swap: Swap) -> bytes:
    """The config with the swap's new entry added (no-op when it is there, or when nothing is added)."""
    return config if swap.add is None else add_remote_write(config, swap.add)


def with_removed(config: bytes, swap: Swap) -> bytes:
    """The config without the entries the swap replaces (each removal a no-op when already gone)."""
    for name in swap.remove:
        config = remove_remote_write(config, name)
    return config


def undo_added(config: bytes, swap: Swap) -> bytes:
    """The config before the swap's add (the proof failed): the added entry's exact lines go, nothing else."""
    if swap_phase(config, swap) == "done":
        raise RenderError("the swap's old entries are gone already; undo it with a leave swap, not a removal")
    return config if swap.add is None else remove_remote_write(config, str(swap.add["name"]))


# -- the cap -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """May a new group dual-write to this source: ``allowed``, after ``merge_first`` if it is set."""

    allowed: bool
    count: int
    cap: int
    merge_first: Swap | None
    reason: str


def admit_dual_write(config: str | bytes, *, group: str, url: str, cap: int,
                     cut_over: Iterable[str]) -> Admission:
    """Whether ``group`` may add its own entry without the source passing ``cap`` promshift queues.

    A retried deploy (its entry is there already) is allowed. Past the cap, merging the cut-over
    groups' entries makes room if it frees at least one; otherwise the refusal is one line with the count.
    """
    ours = [n for n in remote_write_names(config) if is_promshift_name(n)]  # by name: under the cap nothing is parsed
    count = len(ours)
    if remote_write_name(group) in ours or count + 1 <= cap:
        return Admission(True, count, cap, None, f"{count} of {cap} promshift queues in use")
    swap = plan_merge(config, url=url, cut_over=cut_over)  # RenderError: an entry promshift cannot read back
    after = count - len(swap.remove) + (swap.add is not None) if swap else count
    if swap is not None and after + 1 <= cap:
        return Admission(True, count, cap, swap,
                         f"{count} of {cap} promshift queues in use: merging {len(swap.remove)} into one first")
    return Admission(False, count, cap, None, cap_refusal(count, cap, group))


def cap_refusal(count: int, cap: int, group: str, why: str = "no group among them has cut over") -> str:
    """The pre-flight's refusal, one line with the count."""
    return (f"source already carries {count} promshift remote_write queues (cap {cap}) and none can be merged "
            f"({why}); cut one over or raise the cap before {group!r}")


def own_entry_groups(names: Iterable[str]) -> list[str]:
    """The groups that write through an entry of their own, from ``remote_write`` names (merged ones left out)."""
    return [n[len(ENTRY_PREFIX):] for n in names if is_promshift_name(n) and not is_merged_name(n)]


def admit_loaded(names: Iterable[str], *, group: str, cap: int, cut_over: Iterable[str] = (),
                 can_merge: bool = False) -> Admission:
    """The cap's check on the remote_write names a source has loaded (every deploy path: the file, the Kubernetes
    objects and the git repository all end in a server's loaded config). Never merges: past the cap it is refused,
    naming why nothing is merged here (``can_merge``: the path has a swap, which its snapshot step runs first)."""
    ours = [n for n in names if is_promshift_name(n)]
    count = len(ours)
    if remote_write_name(group) in ours or count + 1 <= cap:
        return Admission(True, count, cap, None, f"{count} of {cap} promshift queues in use")
    waiting = sorted(set(cut_over) & set(own_entry_groups(ours)))
    if not waiting:
        why = "no group among them has cut over"
    elif can_merge:
        why = f"another deploy took the room since this run merged; {len(waiting)} cut over: run again to merge them"
    else:
        why = (f"{len(waiting)} of them cut over, but a merge swap is built on the file path and the Prometheus "
               "resource only")
    return Admission(False, count, cap, None, cap_refusal(count, cap, group, why))


def check_admission(admission: Admission) -> None:
    if not admission.allowed:
        raise QueueCapError(admission.reason)


# -- the proof -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SwapProof:
    """Whether a merged entry carries every series of the groups it takes over."""

    verdict: Verdict
    reason: str
    per_group: Mapping[str, tuple[int, int]]  # group -> (series on the source, fresh on the target)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "reason": self.reason,
                "per_group": {g: {"source": s, "target": t} for g, (s, t) in self.per_group.items()}}


def swap_proof(prove: Sequence[str], *, source_series: Mapping[str, int], target_fresh: Mapping[str, int],
               merged_sent: float | None, expected_sent: int) -> SwapProof:
    """Judge a swap's overlap from what was measured.

    ``source_series[g]``: the group's series on the source now; ``target_fresh[g]``: its series on the
    target with a sample newer than the merged entry's start; ``merged_sent``: samples the merged queue
    has sent since it started (the source's ``prometheus_remote_storage_samples_total`` for its name);
    ``expected_sent``: one scrape's samples of all its members (the source's own count).

    SUCCESSFUL only when every group has series on the source, all of them fresh on the target, and the
    merged queue itself has sent at least one scrape's worth; a group without data, or a queue not yet
    sending, is INCONCLUSIVE (wait and measure again), never a pass. Fewer fresh series on the target
    than on the source is INCONCLUSIVE too while the overlap lasts (the caller fails it at its deadline).
    """
    per_group = {g: (int(source_series.get(g, 0)), int(target_fresh.get(g, 0))) for g in prove}
    empty = sorted(g for g, (s, _) in per_group.items() if s <= 0)
    short = sorted(g for g, (s, t) in per_group.items() if s > 0 and t < s)
    if not prove:
        return SwapProof(Verdict.SUCCESSFUL, "nothing to prove (the last member left)", per_group)
    if empty:
        return SwapProof(Verdict.INCONCLUSIVE, f"no series on the source for {', '.join(empty[:5])}", per_group)
    if merged_sent is None or merged_sent < expected_sent:
        shown = "not seen" if merged_sent is None else f"{merged_sent:.0f}"
        return SwapProof(Verdict.INCONCLUSIVE,
                         f"merged queue sent {shown} samples, fewer than one scrape of its members ({expected_sent})",
                         per_group)
    if short:
        worst = ", ".join(f"{g} {per_group[g][1]}/{per_group[g][0]}" for g in short[:5])
        return SwapProof(Verdict.INCONCLUSIVE, f"not every series fresh on the target yet: {worst}", per_group)
    total = sum(s for s, _ in per_group.values())
    return SwapProof(Verdict.SUCCESSFUL, f"{len(prove)} groups, {total} series, all fresh on the target; "
                                         f"merged queue sent {merged_sent:.0f} samples", per_group)


def fresh_series_query(member: QueueMember, *, since: float, extra_matchers: str = "") -> str:
    """PromQL: how many of the group's series have a sample newer than ``since`` (unix seconds)."""
    selector = "{__name__=~" + promql_string(member.name_regex) + extra_matchers + "}"
    # timestamp() drops __name__: keep it in a label first, or two metrics' series would collide.
    named = f'label_replace({selector}, "{NAME_COPY}", "$1", "__name__", "(.+)")'
    return f"count(timestamp({named}) > {since:.3f}) or vector(0)"


def series_query(member: QueueMember) -> str:
    """PromQL: the group's series on the source now."""
    return "count({__name__=~" + promql_string(member.name_regex) + "}) or vector(0)"


def queue_sent_samples(metrics_text: str, name: str) -> float | None:
    """``prometheus_remote_storage_samples_total`` of the queue called ``name`` from a source's ``/metrics``."""
    prefix = "prometheus_remote_storage_samples_total{"
    needle = f'remote_name="{name}"'
    for line in metrics_text.splitlines():
        if line.startswith(prefix) and needle in line:
            try:
                return float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
    return None


# -- the overlap's guard: the target must take the overlap's older duplicates --------------------------------

# How far behind the target's newest sample an overlap's duplicate can arrive: the lag between the two queues
# tailing the same WAL (a partial batch waits batch_send_deadline, 5 s by default; a retried one backs off up to
# max_backoff, 5 s) plus the time a scrape's samples take to reach the WAL after their timestamp (the scrape's
# duration, at most its timeout, itself at most one interval). The window must cover one interval for the scrape
# and one for the queues' lag: 2 scrape intervals, and never under 30 s (several batch deadlines and retries on
# fast scrapes). AMP's default window (60 s) covers groups scraped every 30 s or faster.
MIN_OVERLAP_WINDOW_S = 30.0

# The target's out-of-order window, read when a swap is about to start: (seconds, where it came from); seconds None
# when it cannot be known (a swap is then refused: fail closed).
OutOfOrderWindow = Callable[[], tuple[float | None, str]]


class OverlapRefused(QueueCapError):
    """A swap with an overlap was not started: the target would refuse its older duplicates (nothing edited)."""


def overlap_window_needed(scrape_interval_s: float) -> float:
    """The out-of-order window a swap's overlap needs on the target (see ``MIN_OVERLAP_WINDOW_S``)."""
    return max(MIN_OVERLAP_WINDOW_S, 2.0 * float(scrape_interval_s))


def overlap_refusal(window_s: float | None, *, scrape_interval_s: float, origin: str = "") -> str | None:
    """Why a swap's overlap may not start on a target whose out-of-order window is ``window_s`` (None: unknown),
    in one line; None when the window covers it. Unknown, 0 (no out-of-order ingestion) or shorter than
    ``overlap_window_needed`` refuses: the overlap sends every sample twice, and a target refusing an older
    duplicate refuses its whole batch, newer samples included."""
    needed = overlap_window_needed(scrape_interval_s)
    where = f" ({origin})" if origin else ""
    fix = (f"give it an out-of-order window of at least {needed:g}s (Prometheus: "
           "storage.tsdb.out_of_order_time_window; AMP: the workspace's outOfOrderTimeWindowInSeconds)")
    if window_s is None:
        return (f"the target's out-of-order window is unknown{where}, and a merge swap's overlap sends every sample "
                f"twice: {fix}")
    if not window_s > 0:
        return (f"the target accepts no out-of-order samples{where}, and a merge swap's overlap sends every sample "
                f"twice (a target refuses a whole batch holding an older duplicate): {fix}")
    if not window_s >= needed:
        return (f"the target's out-of-order window of {window_s:g}s{where} is shorter than the {needed:g}s a merge "
                f"swap's overlap needs (2 scrape intervals of {scrape_interval_s:g}s, at least "
                f"{MIN_OVERLAP_WINDOW_S:g}s): {fix}")
    return None


def out_of_order_window_of(config_text: str) -> float:
    """A Prometheus config's ``storage.tsdb.out_of_order_time_window`` in seconds (absent: 0, no out-of-order
    ingestion), as ``/api/v1/status/config`` reports it; read within the config's input budget. A value that is not
    a duration is a one-line ValueError."""
    document = parse_yaml_bounded(config_text, CONFIG)
    if document is None:
        return 0.0
    if not isinstance(document, dict):
        raise ValueError("the target's config is not a YAML mapping")
    storage = document.get("storage") or {}
    tsdb = storage.get("tsdb") if isinstance(storage, dict) else None
    value = tsdb.get("out_of_order_time_window") if isinstance(tsdb, dict) else None
    return 0.0 if value is None else parse_duration(value)


# -- the ports a swap needs (the shell implements them) ---------------------------------------------------


@dataclass(frozen=True)
class ConfigChange:
    """An edit of the source config that a deployer puts live: the new bytes from the live ones, and what to verify.

    ``live`` names the ``remote_write`` entries the loaded config must list afterwards, ``gone`` those it must
    not; ``apply`` is pure (``with_added``, ``with_removed`` of a swap), so a retried deploy computes the same.
    """

    describe: str
    apply: Callable[[bytes], bytes]
    live: frozenset[str] = frozenset()
    gone: frozenset[str] = frozenset()


@runtime_checkable
class QueueProbe(Protocol):
    """What a swap's proof reads: series on the source, fresh series on the target, a queue's sent samples."""

    def source_series(self, member: QueueMember) -> int: ...

    def target_fresh(self, member: QueueMember, since: float) -> int: ...

    def queue_sent(self, name: str) -> float | None: ...


def swap_changes(swap: Swap) -> tuple[ConfigChange, ConfigChange]:
    """The swap's two edits: add its new entry (the overlap begins), then remove the entries it replaces."""
    added = frozenset({swap.added_name} if swap.added_name else ())
    add = ConfigChange(f"add {swap.added_name or 'nothing'} ({swap.kind})", lambda data: with_added(data, swap),
                       live=added | frozenset(swap.remove))
    remove = ConfigChange(f"remove {', '.join(swap.remove)} ({swap.kind})", lambda data: with_removed(data, swap),
                          live=added, gone=frozenset(swap.remove))
    return add, remove
