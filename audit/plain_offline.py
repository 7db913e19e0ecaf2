"""The offline job's measures, computed in plain Python over decoded records.

`OfflineMeasures` follows each partition (a generation of its topic, `audit.lifecycle`:
the topic records it reads say which) through its leader, ISR, ELR and MinISR changes (a
`Timeline` each, ending at its topic's deletion or the history's end) and adds up, in
[since, until), how long it was offline, under MinISR (and under MinISR while led) and
with a non-empty ELR, with its offline intervals. Two passes feed it: the plain pass
(`audit.plain.run_jobs`, every partition) and the ``offline`` job's logs method
(`audit.jobs.offline`, one bucket of partitions per Spark task, `offline_bucket`), so
both give the job's own table.

It must not summarize or report (each job's ``_result`` does), and reads logs only
through `audit.logread` and `audit.transactions` (read-only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pandas as pd

from audit.log_checker import bucket_of
from audit.logread import log_info
from audit.rows import paused_gc
from audit.transactions import committed_batches
from metadata_log.records import (
    ClearElrRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)

_NEVER: Final = -(2**62)
PartitionKey = tuple[str, str, str, int]  # (cluster, topic, topic id, partition)


class Timeline:
    """One partition: its state so far, what it has added up, its pending interval."""

    __slots__ = (
        "at_ts",
        "elr",
        "elr_ms",
        "ends_at",
        "intervals",
        "isr",
        "leader",
        "min_isr",
        "offline_ms",
        "pending",
        "under_led_ms",
        "under_ms",
    )

    def __init__(self) -> None:
        self.at_ts: int | None = None  # the previous row's time
        self.leader: int | None = None
        self.isr: int | None = None
        self.elr: int | None = None
        self.min_isr: int | None = None
        self.offline_ms = 0
        self.under_ms = 0
        self.under_led_ms = 0  # under MinISR with a leader (the rest of it is offline)
        self.elr_ms = 0
        self.intervals: list[dict[str, Any]] = []
        self.pending: tuple[int, int] | None = None  # (start ts, offset) of a leader -1 row
        self.ends_at: int | None = None  # its topic's deletion


class OfflineMeasures:
    """The offline measures, per partition; with ``buckets > 1`` only of the partitions
    of `bucket` (`audit.log_checker.bucket_of`: the offline job's logs method runs one such
    pass per Spark task)."""

    def __init__(
        self, since: int | None, until: int | None, *, bucket: int = 0, buckets: int = 1
    ) -> None:
        self.lo = since if since is not None else _NEVER
        self.until = until
        self.bucket, self.buckets = bucket, buckets
        self._mine: dict[tuple[str, str, int], bool] = {}
        self.parts: dict[PartitionKey, Timeline] = {}
        # (cluster, topic, topic id) -> its partitions with a PartitionRecord, in order
        self.created: dict[tuple[str, str, str], list[PartitionKey]] = {}
        self.known: set[PartitionKey] = set()
        self.ids: dict[tuple[str, str], str] = {}  # (cluster, topic) -> its current id
        self.ends: dict[str, int] = {}

    def _row(  # noqa: PLR0917 - one call per record: positional is the cheap call
        self,
        key: PartitionKey,
        offset: int,
        ts: int,
        leader: int | None,
        isr: int | None,
        elr: int | None,
        min_isr: int | None,
    ) -> None:
        t = self.parts.get(key)
        if t is None:
            t = self.parts[key] = Timeline()
        end = self.ends[key[0]]
        if t.at_ts is not None:
            self._account(t, min(ts, end), end)
        if leader is not None:
            if t.pending is not None:
                self._close(t, ts, end, closed=True)
            if leader == -1:
                t.pending = (ts, offset)
            t.leader = leader
        if isr is not None:
            t.isr = isr
        if elr is not None:
            t.elr = elr
        if min_isr is not None:
            t.min_isr = min_isr
        t.at_ts = ts

    def _account(self, t: Timeline, upto: int, end: int) -> None:
        assert t.at_ts is not None
        dur = max(0, min(upto, end) - max(t.at_ts, self.lo))
        if not dur:
            return
        if t.leader == -1:
            t.offline_ms += dur
        if t.isr is not None and t.min_isr is not None and t.isr < t.min_isr:
            t.under_ms += dur
            if t.leader != -1:
                t.under_led_ms += dur
        if t.elr is not None and t.elr > 0:
            t.elr_ms += dur

    def _close(self, t: Timeline, at: int, end: int, *, closed: bool) -> None:
        assert t.pending is not None
        start, offset = t.pending
        t.pending = None
        if (at > self.lo or start >= self.lo) and start <= end:
            t.intervals.append(
                {"start_ms": start, "end_ms": at, "open": not closed, "offset": offset}
            )

    def _elsewhere(self, cluster: str, topic: str, partition: int) -> bool:
        key = (cluster, topic, partition)
        mine = self._mine.get(key)
        if mine is None:
            mine = self._mine[key] = bucket_of(topic, partition, self.buckets) == self.bucket
        return not mine

    def _removed(self, cluster: str, ts: int, r: RemoveTopicRecord) -> None:
        """The generation's history ends here (its state lasts no longer)."""
        for key in self.created.get((cluster, r.name, r.topic_id), ()):
            self.parts[key].ends_at = ts  # `table` accounts its last state up to here

    def feed(self, cluster: str, base: int, ts: int, records: Sequence[Any]) -> None:
        split = self.buckets > 1
        ids = self.ids
        for i, r in enumerate(records):
            kind = type(r)
            if kind is PartitionChangeRecord:
                if r.leader is None and r.isr is None and r.elr is None:
                    continue
                if split and self._elsewhere(cluster, r.topic, r.partition):
                    continue
                self._row(
                    (cluster, r.topic, ids.get((cluster, r.topic), ""), r.partition),
                    base + i,
                    ts,
                    r.leader,
                    None if r.isr is None else len(r.isr),
                    None if r.elr is None else len(r.elr),
                    r.min_isr,
                )
            elif kind is PartitionRecord:
                if split and self._elsewhere(cluster, r.topic, r.partition):
                    continue
                topic_id = ids.get((cluster, r.topic), "")
                key = (cluster, r.topic, topic_id, r.partition)
                if key not in self.known:
                    self.known.add(key)
                    self.created.setdefault((cluster, r.topic, topic_id), []).append(key)
                self._row(key, base + i, ts, r.leader, len(r.isr), len(r.elr), r.min_isr)
            elif kind is ClearElrRecord:
                # Every partition of the topic (those created later are not touched: a
                # clear before a partition's creation changes none of its measures).
                topic_id = ids.get((cluster, r.topic), "")
                for key in self.created.get((cluster, r.topic, topic_id), ()):
                    self._row(key, base + i, ts, None, None, 0, None)
            elif kind is TopicRecord:
                ids[(cluster, r.name)] = r.topic_id
            elif kind is RemoveTopicRecord:
                self._removed(cluster, ts, r)

    def table(self) -> pd.DataFrame:
        rows = []
        for key in sorted(self.parts):
            t = self.parts[key]
            end = self.ends[key[0]] if t.ends_at is None else min(t.ends_at, self.ends[key[0]])
            if t.at_ts is not None:
                self._account(t, end, end)
            if t.pending is not None:
                self._close(t, end, end, closed=False)
            rows.append(
                (
                    *key,
                    t.offline_ms,
                    t.under_ms,
                    t.elr_ms,
                    t.intervals,
                    t.leader,
                    t.under_led_ms,
                )
            )
        return pd.DataFrame.from_records(
            rows,
            columns=[
                "cluster",
                "topic",
                "topic_id",
                "partition",
                "offline_ms",
                "under_min_isr_ms",
                "elr_ms",
                "intervals",
                "leader_at_end",
                "under_min_isr_led_ms",
            ],
        )


def offline_bucket(
    sources: Sequence[tuple[str, str]],
    *,
    bucket: int,
    buckets: int,
    ends: dict[str, int],
    since_ms: int | None,
    until_ms: int | None,
) -> pd.DataFrame:
    """The offline job's per-partition table for the partitions of one bucket, from a
    pass over every log (`sources`: (log file, cluster)); the job's logs method runs one
    per Spark task."""
    acc = OfflineMeasures(since_ms, until_ms, bucket=bucket, buckets=buckets)
    acc.ends = dict(ends)
    with paused_gc():
        for path, cluster in sources:
            info = log_info(path)
            stored = committed_batches(path, info.start_offset, info.end_offset, until_ms)
            for base, ts, records in stored:
                acc.feed(cluster, base, ts, records)
    return acc.table()
