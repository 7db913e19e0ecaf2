"""The data plane's consumer: every partition's committed records as (offset, leader
epoch) ranges, read from its leader, and what they say of an acked log.

`consume` reads each partition's committed ranges (ReadLog) from its current leader
(`clients.data`), or the error reading it; `ranges` turns a ReadLog answer into [start,
end) ranges, each in one leader epoch; `digest` fingerprints them; `missing_records`
says which acknowledged records (`read_acked_log`, the producer's acked log) they lack:
a record acknowledged at (o, e) survives iff a range holds offset o in epoch e.

Used by `metactl consume` (ops/data_cmds.py) and the chaos runner's read-back. It reads
only, and must not import the CLI (`ops`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from clients.controller import INSECURE, Security
from clients.data import DATA_RETRY, Connections, Leaders, leader_request
from metactl.errors import InvalidRequestError, MetactlError, UnknownTopicOrPartitionError
from protocol.client import RetryPolicy
from protocol.messages.admin import PartitionState
from protocol.messages.data import ReadLogRequest, ReadLogResponse

Range = tuple[int, int, int]  # [start, end) offsets, all in one leader epoch


def ranges(leader_epochs: Sequence[tuple[int, int]], high_watermark: int) -> list[Range]:
    """The committed records as [start, end) offset ranges, each in one leader epoch."""
    out: list[Range] = []
    entries = [(int(e), int(s)) for e, s in leader_epochs if s < high_watermark]
    for i, (epoch, begin) in enumerate(entries):
        end = entries[i + 1][1] if i + 1 < len(entries) else high_watermark
        if end > begin:
            out.append((begin, end, epoch))
    return out


def digest(rs: Iterable[Range]) -> str:
    """A short fingerprint of a partition's committed records."""
    data = json.dumps([list(r) for r in rs], separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def missing_records(
    acked: Iterable[dict[str, Any]], committed: dict[int, list[Range]]
) -> dict[int, int]:
    """Per partition, how many acknowledged records the committed ranges lack. A record
    acknowledged at (offset o, epoch e) survives iff a range holds o in epoch e."""
    missing: Counter[int] = Counter()
    for a in acked:
        part, base, n, epoch = a["partition"], a["base_offset"], a["count"], a["leader_epoch"]
        if part not in committed:
            continue
        held = 0
        for start, end, e in committed[part]:
            if e == epoch:
                held += max(0, min(end, base + n) - max(start, base))
        if held < n:
            missing[part] += n - held
    return dict(missing)


def read_acked_log(path: Path, topic: str) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if doc["topic"] == topic:
                    out.append(doc)
            except (ValueError, KeyError, TypeError) as exc:
                problem = f"{path}:{number}: not an acked-log line: {exc}"
                raise InvalidRequestError(problem) from None
    return out


async def consume(
    *,
    controller: str,
    topic: str,
    partition: int | None,
    retry: RetryPolicy = DATA_RETRY,
    security: Security = INSECURE,
    timeout_s: float = 10.0,
) -> list[tuple[PartitionState, ReadLogResponse | MetactlError]]:
    """Each partition's committed ranges, or the error reading it; `timeout_s` bounds
    each answer of the controller and of a leader."""
    leaders = Leaders(controller, topic, retry, security, timeout_s=timeout_s)
    await leaders.refresh()
    targets = [partition] if partition is not None else sorted(leaders.partitions)
    conns = Connections(security)
    out: list[tuple[PartitionState, ReadLogResponse | MetactlError]] = []
    try:
        for t in targets:
            if t not in leaders.partitions:
                raise UnknownTopicOrPartitionError(f"no partition {topic}-{t}")
            req = ReadLogRequest(topic=topic, partition=t)
            try:
                r = await leader_request(leaders, conns, t, req, timeout_s=timeout_s, retry=retry)
                if not isinstance(r, ReadLogResponse):
                    raise InvalidRequestError(f"unexpected {type(r).__name__}")
            except MetactlError as exc:
                out.append((leaders.partitions[t], exc))
            else:
                out.append((leaders.partitions[t], r))
    finally:
        await conns.close()
    return out
