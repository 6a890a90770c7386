"""Parity's label maths: label sets, host sampling and the host label's names, label drift and renames.

Re-exported by ``core.parity``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LabelSet = tuple[tuple[str, str], ...]
Points = Sequence[tuple[float, float]]


def sample_hosts(hosts: Iterable[str], k: int, seed: str) -> list[str]:
    """A deterministic sample of ``k`` hosts: the same hosts, seed and k give the same answer."""
    ranked = sorted(set(hosts), key=lambda h: hashlib.sha256(f"{seed}\x00{h}".encode()).hexdigest())
    return sorted(ranked[:k])


def normalize_labels(labels: Mapping[str, str], *, ignore: Iterable[str] = (),
                     rename: Mapping[str, str] | None = None) -> LabelSet:
    """Drop ignored labels (external labels, replica labels), apply renames, sort."""
    skip = set(ignore)
    rename = rename or {}
    out: dict[str, str] = {}
    for name, value in labels.items():
        if name in skip:
            continue
        out[rename.get(name, name)] = value
    return tuple(sorted(out.items()))


def without_dropped(series: Mapping[LabelSet, Points], dropped: Iterable[str]) -> dict[LabelSet, Points]:
    """The source's series as the target should hold them after the group's declared ``labeldrop``.

    Each label set loses ``dropped``; series that then share a label set are summed point by point
    (``sum without (dropped)``). Where the drop is safe (the plan's uniqueness check) every series
    stays apart and this is a plain strip; where two collide, the target (which received both under
    one label set) cannot equal their sum, so the comparison fails rather than passing on one of them.
    """
    gone = set(dropped)
    if not gone:
        return dict(series)
    out: dict[LabelSet, Points] = {}
    merged: dict[LabelSet, dict[float, float]] = {}
    for labels, points in series.items():
        key = tuple((k, v) for k, v in labels if k not in gone)
        if key not in out:
            out[key] = points
            continue
        acc = merged.get(key)
        if acc is None:
            acc = merged[key] = {t: v for t, v in out[key]}
        for t, v in points:
            acc[t] = acc.get(t, 0.0) + v
    for key, acc in merged.items():
        out[key] = sorted(acc.items())
    return out


def format_labels(labels: LabelSet) -> str:
    name = dict(labels).get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return f"{name}{{{rest}}}"


KIND_FROM_METADATA = "source_metadata"
KIND_FROM_DCGM = "dcgm_list"
KIND_DEFAULT = "default"


def metric_kinds(names: Iterable[str], metadata: Mapping[str, Sequence[Mapping[str, str]]],
                 fallback: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Per metric, its kind (``counter``, ``gauge``...) and where that came from.

    The source Prometheus's metadata (``/api/v1/metadata``: what its targets declared in ``# TYPE``)
    decides; ``fallback`` (dcgm-exporter's list) only when the source declares no type for a metric,
    only ``unknown``, or conflicting types; a metric in neither is a ``gauge`` (compared per bucket
    average, as an untyped series is) with ``from`` ``default``.
    """
    out: dict[str, dict[str, str]] = {}
    for name in names:
        declared = {e.get("type", "") for e in metadata.get(name, ())} - {"", "unknown"}
        if len(declared) == 1:
            out[name] = {"kind": declared.pop(), "from": KIND_FROM_METADATA}
        elif name in fallback:
            out[name] = {"kind": fallback[name], "from": KIND_FROM_DCGM}
        else:
            out[name] = {"kind": "gauge", "from": KIND_DEFAULT}
        if len(declared) > 1:
            out[name]["conflict"] = ", ".join(sorted(declared))
    return out


@dataclass(frozen=True)
class HostLabels:
    """The names a side may give the host label: the group's own, its declared aliases, undeclared variants.

    ``aliases`` are labels the group's ``rename_labels`` map onto the host label (``{hostname: Hostname}``
    makes ``hostname`` an alias of ``Hostname``): a host found under one is the same host. ``variants``
    are the names an undeclared rename most likely took (the case variants dcgm-exporter's 2026
    ``Hostname`` -> ``hostname`` rename produced): a host found only under one is drift, named as such.
    """

    name: str
    aliases: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()

    @classmethod
    def for_group(cls, host_label: str, rename: Mapping[str, str]) -> HostLabels:
        canonical = rename.get(host_label, host_label)
        aliases = sorted(n for n in set(rename) | set(rename.values())
                         if n != host_label and rename.get(n, n) == canonical)
        cases = {host_label.lower(), host_label[:1].upper() + host_label[1:], host_label[:1].lower() + host_label[1:]}
        return cls(host_label, tuple(aliases), tuple(sorted(cases - {host_label, *aliases})))

    @property
    def names(self) -> tuple[str, ...]:
        """Every name to group by, the host label first."""
        return (self.name, *self.aliases, *self.variants)

    @property
    def declared(self) -> tuple[str, ...]:
        """The host label and its declared aliases: the names a host may carry without drift."""
        return (self.name, *self.aliases)

    def locate(self, labels: Mapping[str, str]) -> tuple[str, str | None]:
        """``(host, None)`` under a declared name, ``(host, variant)`` only under an undeclared one.

        ``("", None)`` when the series has no name of the host label at all.
        """
        for n in self.declared:
            if labels.get(n):
                return labels[n], None
        for n in self.variants:
            if labels.get(n):
                return labels[n], n
        return "", None


def count_hosts(rows: Iterable[tuple[Mapping[str, str], float]], hosts: HostLabels
                ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Sum ``(labels, count)`` rows per host: ``(by_host, by_variant)``.

    ``by_host`` keys hosts found under the host label or a declared alias (``""``: no host label at
    all); ``by_variant`` maps an undeclared variant (e.g. ``hostname``) to the hosts found only under it.
    """
    by_host: dict[str, float] = {}
    by_variant: dict[str, dict[str, float]] = {}
    for labels, n in rows:
        host, variant = hosts.locate(labels)
        into = by_host if variant is None else by_variant.setdefault(variant, {})
        into[host] = into.get(host, 0.0) + n
    return by_host, by_variant


def rename_hint(from_label: str, to_label: str) -> str:
    """The catalog line that would declare a rename, in the words every layer uses."""
    return f"renamed? add `parity.rename_labels: {{{from_label}: {to_label}}}` if intended"


def hosts_per_label(per_side: Mapping[str, Mapping[str, int]], declared: Sequence[str]) -> str:
    """How many hosts each side has under each name of the host label, e.g.
    ``hosts per label name: source Hostname 100; target Hostname 50, hostname 50``.

    ``per_side`` maps ``source``/``target`` to name -> hosts; the ``declared`` names are always shown
    (0 renamed is a fleet that has not started a declared rename), other names only when used.
    """
    parts = []
    for side in ("source", "target"):
        counts = per_side.get(side, {})
        shown = [f"{n} {counts.get(n, 0)}" for n in declared]
        shown += [f"{n} {c}" for n, c in sorted(counts.items()) if n not in declared and c]
        parts.append(f"{side} {', '.join(shown)}")
    return "hosts per label name: " + "; ".join(parts)


def undeclared_rename_note(under: tuple[Mapping[str, Iterable[str]], Mapping[str, Iterable[str]]],
                           label: str) -> str | None:
    """Why a golden answer may differ: hosts found only under an undeclared name of the host label.

    ``under`` (source, target) maps an undeclared name (``hostname``) to the hosts found only under it
    on that side (the host coverage layer's finding); None when there are none.
    """
    parts = []
    for side, found in zip(("source", "target"), under, strict=True):
        for variant, hosts in sorted(found.items()):
            if hosts:
                parts.append(f"`{variant}` instead of `{label}` on {_some(sorted(hosts), 'host')} of the {side}: "
                             f"{rename_hint(variant, label)}")
    return "; ".join(parts) or None


def _some(keys: Sequence[str], key: str) -> str:
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"{len(keys)} {key}{'s' if len(keys) != 1 else ''} ({shown})"


def label_drift(source: Mapping[str, Iterable[str]], target: Mapping[str, Iterable[str]], *,
                ignore: Iterable[str] = (), rename: Mapping[str, str] | None = None,
                dropped: Iterable[str] = ()) -> dict[str, Any]:
    """Compare label names per metric after normalization; name what differs on each side.

    ``source``/``target`` map metric -> label names. Renames apply to both sides (the
    group's rules say how the target's labels map to the source's). ``dropped`` (the group's
    declared ``drop_labels``) leave the source's side only: a target that still has one is drift. A metric's entry has
    ``only_source``, ``only_target`` and, when a name on one side only is a case variant of
    one the other side has (``hostname`` vs ``Hostname``), ``renamed``: ``{that name: the other}``.
    """
    skip = set(ignore) | {"__name__"}
    gone = set(dropped)
    rename = rename or {}
    drift: dict[str, Any] = {}
    for metric in sorted(set(source) | set(target)):
        src = {rename.get(n, n) for n in source.get(metric, ()) if n not in skip and n not in gone}
        tgt = {rename.get(n, n) for n in target.get(metric, ()) if n not in skip}
        if src != tgt:
            drift[metric] = {"only_source": sorted(src - tgt), "only_target": sorted(tgt - src)}
            renamed = _case_renames(src, tgt)
            if renamed:
                drift[metric]["renamed"] = renamed
    return drift


def _case_renames(src: set[str], tgt: set[str]) -> dict[str, str]:
    """Names on one side only whose case variant the other side has: ``{name: variant}``.

    The target's extra names are read as renames of the source's first (the source is the
    reference); a source-only name is a rename only if it is not already the other end of one.
    """
    out: dict[str, str] = {}
    for t in sorted(tgt - src):
        match = sorted(n for n in src if n != t and n.lower() == t.lower())
        if match:
            out[t] = match[0]
    for s in sorted(src - tgt):
        if s in out.values():
            continue
        match = sorted(n for n in tgt if n != s and n.lower() == s.lower() and n not in out)
        if match:
            out[s] = match[0]
    return out


def label_renames(drift: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """Every suspected rename in a ``label_drift`` result: ``(from, to) -> side`` the ``from`` name is on."""
    out: dict[tuple[str, str], str] = {}
    for d in drift.values():
        for frm, to in (d.get("renamed") or {}).items():
            out[(frm, to)] = "target" if frm in d.get("only_target", ()) else "source"
    return out


def describe_label_drift(drift: Mapping[str, Mapping[str, Any]],
                         hosts: Mapping[str, Sequence[str]] | None = None) -> str:
    """Plain words, e.g. ``DCGM_FI_DEV_GPU_UTIL: `Hostname` only on source, `hostname` only on target``.

    Metrics with the same drift share one part. Each suspected rename ends with the hosts that
    carry the renamed name (``hosts``: name -> hosts, when the caller looked them up) and the
    ``rename_labels`` line that would declare it.
    """
    same: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for metric, d in drift.items():
        same.setdefault((tuple(d.get("only_source", ())), tuple(d.get("only_target", ()))), []).append(metric)
    parts = []
    for (only_source, only_target), metrics in same.items():
        sides = []
        if only_source:
            sides.append(", ".join(f"`{n}`" for n in only_source) + " only on source")
        if only_target:
            sides.append(", ".join(f"`{n}`" for n in only_target) + " only on target")
        named = ", ".join(metrics[:5]) + (f" and {len(metrics) - 5} more metrics" if len(metrics) > 5 else "")
        parts.append(f"{named}: {' and '.join(sides)}")
    for (frm, to), side in sorted(label_renames(drift).items()):
        on = hosts.get(frm) if hosts else None
        where = f"`{frm}` on {_some(list(on), 'host')} of the {side}" if on else f"`{frm}` on the {side}"
        parts.append(f"{where}: {rename_hint(frm, to)}")
    return "; ".join(parts)
