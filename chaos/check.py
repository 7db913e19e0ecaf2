"""The checker of a chaos run: what became of every acknowledged record.

An acknowledged batch is (partition, base_offset, count, leader_epoch) from the acked
log, plus `bound`: the controller's committed metadata end offset in the first
DescribeCluster answer whose request left *after* the batch was durably in the acked
log. The controller's committed end only grows, so every metadata record at an offset
>= `bound` was committed after the acknowledgement.

Each record (offset o, written in leader epoch e) is classified:

- **present**: the final leader's log holds o below its high watermark, in epoch e;
- **lost_reported**: not present, and an UncleanRecoveryRecord of that partition with
  `potential_data_loss` sits at a metadata offset >= the batch's `bound` (the controller
  reported a potential data loss after the record was acknowledged);
- **lost_silent**: not present and no such record. A batch without a `bound` (no
  DescribeCluster answer came after it) can only be lost silently: when unsure, the
  checker says silent, never reported;
- **unreadable**: its partition could not be read at the end (no leader: e.g. a manual
  recovery waiting for the operator). Neither present nor lost.

With `--client librdkafka` an acknowledgement is one record (partition, offset, value)
from librdkafka's delivery report, which carries no leader epoch, and the read-back is
the final log's offset -> (leader epoch, value) through Kafka Fetch. `content_inputs`
turns both into `classify`'s inputs: a record is present iff the final log holds its
value at its offset (content, not epoch); the rest of the rules are the same.

Also here: leaderless partition-seconds from the metadata log's record timestamps, the
sum of a counter and the value of a gauge in a Prometheus text page.

Pure: no processes, no network.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.consumer import Range
from metadata_log.records import (
    NO_LEADER,
    PartitionChangeRecord,
    PartitionRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.broker_controller import FetchedRecord

TOPIC = "chaos"  # the one topic a chaos run creates and produces to
SILENT_EXAMPLES = 20


@dataclass(frozen=True)
class Ack:
    partition: int
    base_offset: int
    count: int
    leader_epoch: int
    bound: int | None  # committed metadata end offset seen after the ack (None: never)


@dataclass(frozen=True)
class Recovery:
    offset: int  # in the metadata log
    timestamp_ms: int
    partition: int
    strategy: str
    chosen: int
    trigger: str
    potential_data_loss: bool


@dataclass
class Verdict:
    present: int = 0
    lost_reported: int = 0
    lost_silent: int = 0
    unreadable: int = 0
    silent_examples: list[dict[str, Any]] = field(default_factory=list)
    by_partition: dict[int, Counter[str]] = field(default_factory=dict)

    def add(self, partition: int, what: str, n: int) -> None:
        if n <= 0:
            return
        setattr(self, what, getattr(self, what) + n)
        self.by_partition.setdefault(partition, Counter())[what] += n


def recoveries_of(records: Iterable[FetchedRecord], topic: str) -> list[Recovery]:
    return [
        Recovery(
            offset=f.offset,
            timestamp_ms=f.timestamp_ms,
            partition=r.partition,
            strategy=r.strategy,
            chosen=r.chosen,
            trigger=r.trigger,
            potential_data_loss=r.potential_data_loss,
        )
        for f in records
        if isinstance(r := f.record, UncleanRecoveryRecord) and r.topic == topic
    ]


def held(ranges: Sequence[Range], base: int, count: int, epoch: int) -> int:
    """How many of the records [base, base+count) of `epoch` the committed ranges hold."""
    return sum(
        max(0, min(end, base + count) - max(start, base)) for start, end, e in ranges if e == epoch
    )


def classify(
    acks: Iterable[Ack], committed: dict[int, list[Range]], recoveries: Iterable[Recovery]
) -> Verdict:
    """Classify every acknowledged record; `committed` holds the partitions read."""
    reported: dict[int, list[int]] = {}
    for r in recoveries:
        if r.potential_data_loss:
            reported.setdefault(r.partition, []).append(r.offset)
    v = Verdict()
    for a in acks:
        if a.partition not in committed:
            v.add(a.partition, "unreadable", a.count)
            continue
        present = held(committed[a.partition], a.base_offset, a.count, a.leader_epoch)
        v.add(a.partition, "present", present)
        lost = a.count - present
        if lost <= 0:
            continue
        after = a.bound is not None and any(o >= a.bound for o in reported.get(a.partition, ()))
        if after:
            v.add(a.partition, "lost_reported", lost)
        else:
            v.add(a.partition, "lost_silent", lost)
            if len(v.silent_examples) < SILENT_EXAMPLES:
                v.silent_examples.append(
                    {
                        "partition": a.partition,
                        "base_offset": a.base_offset,
                        "count": a.count,
                        "leader_epoch": a.leader_epoch,
                        "lost": lost,
                        "ack_metadata_bound": a.bound,
                    }
                )
    return v


NOT_HELD = -2  # an acknowledged record whose value is not at its offset: no log epoch is -2


@dataclass(frozen=True)
class ValueAck:
    """One record librdkafka reported delivered, with the bound taken after it was
    logged (as `Ack.bound`)."""

    partition: int
    offset: int
    value: bytes
    bound: int | None


KafkaLog = dict[int, tuple[int, bytes | None]]  # offset -> (leader epoch, value), one partition


def content_inputs(
    acks: Iterable[ValueAck], logs: dict[int, KafkaLog]
) -> tuple[list[Ack], dict[int, list[Range]]]:
    """`classify`'s inputs for acknowledgements judged by content. `logs` holds the
    partitions read back (a partition absent is unreadable). Each partition's log
    becomes committed ranges of its leader epochs (runs of consecutive offsets in one
    epoch); an acknowledgement takes the epoch of the record at its offset when that
    record has its value, else `NOT_HELD`, which no range has, so it is not present."""
    committed: dict[int, list[Range]] = {}
    for partition, log in logs.items():
        runs: list[Range] = []
        for offset in sorted(log):
            epoch = log[offset][0]
            if runs and runs[-1][1] == offset and runs[-1][2] == epoch:
                runs[-1] = (runs[-1][0], offset + 1, epoch)
            else:
                runs.append((offset, offset + 1, epoch))
        committed[partition] = runs
    out: list[Ack] = []
    for a in acks:
        got = logs.get(a.partition, {}).get(a.offset)
        epoch = got[0] if got is not None and got[1] == a.value else NOT_HELD
        out.append(Ack(a.partition, a.offset, 1, epoch, a.bound))
    return out, committed


def leaderless_seconds(
    records: Iterable[FetchedRecord], topic: str, end_ms: int, start_ms: int | None = None
) -> float:
    """Partition-seconds without a leader in the committed metadata, from the records'
    timestamps, from the topic's creation (or `start_ms`) to `end_ms`."""
    since: dict[int, int] = {}  # partition -> leaderless since (ms)
    total_ms = 0

    def set_leader(p: int, new: int, ts: int) -> None:
        nonlocal total_ms
        if start_ms is not None:
            ts = max(ts, start_ms)
        if new == NO_LEADER:
            since.setdefault(p, ts)
        elif p in since:
            total_ms += max(0, ts - since.pop(p))

    for f in records:
        r = f.record
        if (
            isinstance(r, PartitionRecord | PartitionChangeRecord)
            and r.topic == topic
            and r.leader is not None  # None: a change that leaves the leader as it was
        ):
            set_leader(r.partition, r.leader, f.timestamp_ms)
    for begin in since.values():
        total_ms += max(0, end_ms - begin)
    return total_ms / 1000


def counter_sum(text: str, name: str) -> float:
    """The sum of every series of counter `name` (its `_total` samples) in a
    Prometheus text page."""
    total = 0.0
    sample = name + "_total"
    for line in text.splitlines():
        if line.startswith((sample + "{", sample + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def gauge_value(text: str, name: str) -> float | None:
    """The value of the unlabelled sample `name` in a Prometheus text page (None: absent)."""
    prefix = name + " "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None
