"""The strict local AMP's remote-write path: decode a WriteRequest, refuse what AMP refuses, count each discard.

The wire format is Prometheus remote write 1.0: a snappy-compressed (block format) protobuf ``WriteRequest``
(``timeseries = 1``, ``metadata = 3``; ``TimeSeries``: ``labels = 1``, ``samples = 2``; ``Label``: ``name = 1``,
``value = 2``; ``Sample``: ``value = 1`` double, ``timestamp = 2`` int64 ms). Neither python-snappy nor cramjam is
installed, so both codecs are written here: ``snappy_decompress`` reads any snappy block, ``snappy_compress``
writes literals only (valid snappy, uncompressed, what the Prometheus behind the front door then reads).

``WorkspaceIngest.ingest`` applies the rules of ``promshift.core.ingest_limits`` in AMP's order: the request's
size (400), the ingestion rate and burst on the request's samples (429, nothing kept), each series' labels (400:
the series is dropped, the rest kept), the active-series capacity (adaptive, 429) and ``limitsPerLabelSet`` for
a new series, then each sample against its series (too old, out of order, duplicate: 400). The answer names the
first refusal in AMP's words; the accepted part is re-encoded for the Prometheus standing in for the workspace.
Discards are counted by reason (``DiscardedSamples``), with one example series per reason.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from promshift.core.ingest_limits import (
    ACTIVE_SERIES_WINDOW_S,
    ADAPTIVE_WINDOW_S,
    LABEL_SET_LIMIT,
    RATE_LIMITED,
    REQUEST_TOO_LARGE,
    SERIES_LIMIT,
    TOO_MANY_HA_CLUSTERS,
    DiscardCounts,
    HaTracker,
    TokenBucket,
    WorkspaceLimits,
    adaptive_capacity,
    ha_judge,
    judge_sample,
    label_problem,
    label_set_limit_message,
    rate_limit_message,
    series_limit_message,
    series_text,
)


class WireError(ValueError):
    """The body is not a snappy-compressed WriteRequest."""


# -- snappy (block format) ---------------------------------------------------------------------------------
def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _put_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def snappy_decompress(data: bytes, *, max_length: int) -> bytes:
    """A snappy block; refuses one that says it is longer than ``max_length`` before expanding it."""
    length, pos = _varint(data, 0)
    if length > max_length:
        raise WireError(f"decompressed length {length} > {max_length}")
    out = bytearray()
    n = len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                size = int.from_bytes(data[pos:pos + extra], "little")
                pos += extra
            size += 1
            if pos + size > n:
                raise WireError("truncated literal")
            out += data[pos:pos + size]
            pos += size
            continue
        if kind == 1:
            size = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        elif kind == 2:
            size = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos:pos + 2], "little")
            pos += 2
        else:
            size = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        if offset == 0 or offset > len(out):
            raise WireError("bad copy offset")
        start = len(out) - offset
        if offset >= size:
            out += out[start:start + size]
        else:
            for i in range(size):
                out.append(out[start + i])
        if len(out) > length:
            raise WireError("longer than its header says")
    if len(out) != length:
        raise WireError("shorter than its header says")
    return bytes(out)


def snappy_compress(data: bytes) -> bytes:
    """``data`` as a valid snappy block of literals (no compression)."""
    out = bytearray(_put_varint(len(data)))
    for i in range(0, len(data), 65536):
        chunk = data[i:i + 65536]
        size = len(chunk) - 1
        if size < 60:
            out.append(size << 2)
        elif size < 256:
            out += bytes((60 << 2, size))
        else:
            out += bytes((61 << 2,)) + size.to_bytes(2, "little")
        out += chunk
    return bytes(out)


# -- protobuf ------------------------------------------------------------------------------------------------
Labels = tuple[tuple[str, str], ...]


@dataclass
class Series:
    labels: Labels
    samples: list[tuple[int, float]] = field(default_factory=list)


def _fields(data: bytes | memoryview) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    pos, n = 0, len(data)
    while pos < n:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > n:
                raise WireError("truncated field")
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise WireError(f"unsupported wire type {wire}")
        if pos > n:
            raise WireError("truncated field")
        out.append((number, wire, value))
    return out


def decode_write_request(data: bytes) -> tuple[list[Series], list[bytes]]:
    """The series (labels, samples) and the raw metadata entries of a WriteRequest."""
    series: list[Series] = []
    metadata: list[bytes] = []
    view = memoryview(data)
    for number, wire, value in _fields(view):
        if number == 3 and wire == 2:
            metadata.append(bytes(value))
        if number != 1 or wire != 2:
            continue
        labels: list[tuple[str, str]] = []
        samples: list[tuple[int, float]] = []
        for inner, inner_wire, item in _fields(value):
            if inner == 1 and inner_wire == 2:
                name = value_ = ""
                for f, w, v in _fields(item):
                    if f == 1 and w == 2:
                        name = bytes(v).decode("utf-8", "replace")
                    elif f == 2 and w == 2:
                        value_ = bytes(v).decode("utf-8", "replace")
                labels.append((name, value_))
            elif inner == 2 and inner_wire == 2:
                sample_value, ts = 0.0, 0
                for f, w, v in _fields(item):
                    if f == 1 and w == 1:
                        sample_value = struct.unpack("<d", bytes(v))[0]
                    elif f == 2 and w == 0:
                        ts = v - (1 << 64) if v >= 1 << 63 else v
                samples.append((ts, sample_value))
        series.append(Series(tuple(labels), samples))
    return series, metadata


def _len_field(number: int, payload: bytes) -> bytes:
    return _put_varint((number << 3) | 2) + _put_varint(len(payload)) + payload


def encode_write_request(series: Sequence[Series], metadata: Sequence[bytes] = ()) -> bytes:
    out = bytearray()
    for one in series:
        body = bytearray()
        for name, value in one.labels:
            body += _len_field(1, _len_field(1, name.encode()) + _len_field(2, value.encode()))
        for ts, value in one.samples:
            sample = b"\x09" + struct.pack("<d", value) + b"\x10" + _put_varint(ts)
            body += _len_field(2, sample)
        out += _len_field(1, bytes(body))
    for entry in metadata:
        out += _len_field(3, entry)
    return bytes(out)


# -- the workspace's state -------------------------------------------------------------------------------------
@dataclass
class IngestOutcome:
    """What the front door answers (status, AMP's message) and what it forwards (the accepted series)."""

    status: int
    message: str
    accepted: list[Series]
    metadata: list[bytes]
    discarded: DiscardCounts


def _matches(labels: Labels, label_set: tuple[tuple[str, str], ...]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in label_set)


class WorkspaceIngest:
    """One workspace's ingestion state: each series' last sample, the active series, the rate bucket, the discards."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[Labels, tuple[int, float]] = {}
        self.active: dict[Labels, float] = {}  # series -> when (wall time) it last got a sample
        self.newest_ms: int | None = None
        self.bucket: TokenBucket | None = None
        self.history: deque[tuple[float, int]] = deque()  # (when, active series) for the adaptive capacity
        self.discards = DiscardCounts()
        self.ha = HaTracker()
        self.deduped = 0  # samples of a non-leading HA replica: accepted, not stored
        self.unpublished: dict[str, float] = {}
        self._pruned_at = 0.0

    def capacity(self, limits: WorkspaceLimits, now: float) -> float:
        """The active series the workspace takes now (the adaptive rule over the last 30 min)."""
        start = now - ADAPTIVE_WINDOW_S
        # The last point before the window holds the count at its start; older ones are forgotten.
        while len(self.history) > 1 and self.history[1][0] <= start:
            self.history.popleft()
        # The time-weighted average over the 30 min: a step function of the recorded counts, 0 before the first.
        area = 0.0
        points = list(self.history)
        for i, (at, count) in enumerate(points):
            until = points[i + 1][0] if i + 1 < len(points) else now
            area += count * max(0.0, min(until, now) - max(at, start))
        return adaptive_capacity(limits.active_series, area / ADAPTIVE_WINDOW_S, floor=limits.series_floor)

    def snapshot(self, limits: WorkspaceLimits, now: float) -> dict[str, Any]:
        with self.lock:
            return {"active_series": len(self.active), "capacity": self.capacity(limits, now),
                    "deduplicated_samples": self.deduped, "ha_leaders": {c: r for c, (r, _) in self.ha.leaders.items()},
                    "discarded": dict(self.discards.counts), "examples": dict(self.discards.examples)}

    def _discard(self, out: DiscardCounts, reason: str, n: int, labels: Labels) -> None:
        example = series_text(labels)
        out.add(reason, n, example)
        self.discards.add(reason, n, example)
        self.unpublished[reason] = self.unpublished.get(reason, 0.0) + n

    def take_unpublished(self) -> dict[str, float]:
        with self.lock:
            out, self.unpublished = self.unpublished, {}
            return out

    def ingest(self, body: bytes, limits: WorkspaceLimits, now: float) -> IngestOutcome:
        """Judge one remote-write body (snappy-compressed) at wall time ``now``. Raises WireError on a bad body."""
        raw = snappy_decompress(body, max_length=max(limits.request_bytes * 4, 16 * 1024 * 1024))
        series, metadata = decode_write_request(raw)
        counts = DiscardCounts()
        total = sum(len(s.samples) for s in series)
        with self.lock:
            if len(raw) > limits.request_bytes:
                for one in series:
                    self._discard(counts, REQUEST_TOO_LARGE, len(one.samples), one.labels)
                return IngestOutcome(400, f"received message larger than max ({len(raw)} vs {limits.request_bytes})",
                                     [], [], counts)
            if self.bucket is None or (self.bucket.rate, self.bucket.burst) != (limits.ingestion_rate,
                                                                                limits.ingestion_burst):
                self.bucket = TokenBucket(limits.ingestion_rate, limits.ingestion_burst)
            if total and not self.bucket.take(total, now):
                for one in series:
                    self._discard(counts, RATE_LIMITED, len(one.samples), one.labels)
                return IngestOutcome(429, rate_limit_message(limits.ingestion_rate, total, len(metadata)), [], [],
                                     counts)
            self._prune(now)
            capacity = self.capacity(limits, now)
            first_400 = first_429 = ""
            accepted: list[Series] = []
            for one in series:
                verdict_ha, stored = ha_judge(one.labels, self.ha, now, limits)
                if verdict_ha == "too_many":
                    self._discard(counts, TOO_MANY_HA_CLUSTERS, len(one.samples), one.labels)
                    first_400 = first_400 or f"too many HA clusters (limit: {limits.ha_clusters})"
                    continue
                if verdict_ha == "dedupe":
                    self.deduped += len(one.samples)
                    continue
                one = Series(stored, one.samples)
                problem = label_problem(one.labels, limits)
                if problem is not None:
                    self._discard(counts, problem[0], len(one.samples), one.labels)
                    first_400 = first_400 or problem[1]
                    continue
                if one.labels not in self.active and one.samples:
                    refused = self._new_series_problem(one.labels, limits, capacity)
                    if refused is not None:
                        self._discard(counts, refused[0], len(one.samples), one.labels)
                        first_429 = first_429 or refused[1]
                        continue
                kept: list[tuple[int, float]] = []
                for ts, value in sorted(one.samples):
                    verdict = judge_sample(ts, value, last=self.last.get(one.labels), newest_ms=self.newest_ms,
                                           limits=limits)
                    if not verdict.accepted:
                        self._discard(counts, verdict.reason, 1, one.labels)
                        first_400 = first_400 or f"{verdict.message}; series: '{series_text(one.labels)}'"
                        continue
                    if verdict.ignored:
                        continue
                    kept.append((ts, value))
                    if ts >= self.last.get(one.labels, (ts - 1, 0.0))[0]:
                        self.last[one.labels] = (ts, value)
                    self.newest_ms = ts if self.newest_ms is None else max(self.newest_ms, ts)
                if kept:
                    self.active[one.labels] = now
                    accepted.append(Series(one.labels, kept))
            if not self.history or now - self.history[-1][0] >= 5.0:
                self.history.append((now, len(self.active)))
        if first_429:
            return IngestOutcome(429, first_429, accepted, metadata, counts)
        if first_400:
            return IngestOutcome(400, first_400, accepted, metadata, counts)
        return IngestOutcome(200, "", accepted, metadata, counts)

    def _new_series_problem(self, labels: Labels, limits: WorkspaceLimits, capacity: float) -> tuple[str, str] | None:
        if len(self.active) >= capacity:
            return SERIES_LIMIT, series_limit_message(capacity)
        for label_set, max_series in limits.label_set_limits:
            if max_series > 0 and _matches(labels, label_set):
                held = sum(1 for active in self.active if _matches(active, label_set))
                if held >= max_series:
                    return LABEL_SET_LIMIT, label_set_limit_message(label_set, max_series)
        return None

    def _prune(self, now: float) -> None:
        """Forget series with no sample in the last 2 h (no longer active), at most once a minute."""
        if now - self._pruned_at < 60:
            return
        self._pruned_at = now
        stale = [labels for labels, at in self.active.items() if at < now - ACTIVE_SERIES_WINDOW_S]
        for labels in stale:
            del self.active[labels]
            self.last.pop(labels, None)
