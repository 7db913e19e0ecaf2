"""The invariants check over rows: Arrow columns in, `PartitionChecker`s fed, rows out.

Feeds the checkers (`audit.partition_checker`) from rows of the audit schema, reading the
columns in bulk (`_values`: numpy for plain ints, absent and all-null columns never
converted): `feed_rows` feeds a `LogChecker` one bucket's partition records and the
broker-, topic- and cluster-level events, exactly as the plain pass feeds it a log
(`audit.log_checker.LogChecker.feed`); `feed_sorted` runs one checker per partition over
a stream sorted by partition and offset (the ``invariants`` job's rows method, inside
``mapInArrow``). A finished checker's violations and its one statistics row
(``STATS_RULE``) become output rows of `OUTPUT_ARROW` (`checker_rows`, `to_batch`), the
same for every method of the job and for the plain pass (`audit.plain`).

It must not read logs or run Spark (`audit.jobs.invariants` does), and judges nothing
itself: the rules are the checker's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from audit.log_checker import LogChecker
from audit.partition_checker import PartitionChecker
from audit.rows import paused_gc

STATS_RULE = "_checked"
OUTPUT_ARROW = pa.schema(
    [
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("rule", pa.string()),
        pa.field("broker", pa.int32()),
        pa.field("detail", pa.string()),
        pa.field("records", pa.int64()),
        pa.field("skipped", pa.int64()),
        pa.field("generations", pa.int64()),
    ]
)
OUTPUT_DDL = (
    "cluster string, topic string, partition int, offset long, timestamp timestamp, "
    "rule string, broker int, detail string, records long, skipped long, generations long"
)
# --- rows to checkers ----------------------------------------------------------------------

# Record types as the small ints the row loops dispatch on.
_TYPE_CODES = (
    "PartitionChange",
    "Partition",
    "UncleanRecovery",
    "RegisterBroker",
    "ClearElr",
    "UnregisterBroker",
    "RemoveTopic",
    "FeatureLevel",
)
(_CHANGE, _PARTITION, _RECOVERY, _REGISTER, _CLEAR, _UNREGISTER, _REMOVE, _FEATURE) = range(8)
_PARTITION_COLUMNS = (
    "offset",
    "timestamp",
    "topic",
    "partition",
    "leader",
    "leader_epoch",
    "partition_epoch",
    "isr",
    "elr",
    "last_known_elr",
    "reason",
    "chosen",
    "min_isr",
    "election_kind",
    "replicas",
    "adding_replicas",
    "removing_replicas",
)
_ROW_COLUMNS = (
    *_PARTITION_COLUMNS,
    "broker",
    "clean",
    "first_partition",
    "end_partition",
    "feature",
    "level",
)
_SLICE_ROWS = 65_536


def _values(batch: pa.RecordBatch, name: str) -> Any:
    """A column as Python values, cheaply: absent or all-null columns are a repeat of
    None; int columns without nulls go through numpy; timestamps become epoch ms."""
    n = batch.num_rows
    i = batch.schema.get_field_index(name)
    if i < 0:
        return itertools.repeat(None, n)
    col = batch.column(i)
    if col.null_count == n:
        return itertools.repeat(None, n)
    if pa.types.is_timestamp(col.type):
        return (col.cast(pa.int64()).to_numpy() // 1000).tolist()
    if col.null_count == 0 and pa.types.is_integer(col.type):
        return col.to_numpy().tolist()
    return col.to_pylist()


def _codes(batch: pa.RecordBatch) -> list[int]:
    found = pc.index_in(batch.column("record_type"), value_set=pa.array(_TYPE_CODES))
    codes: list[int] = found.fill_null(-1).to_numpy().tolist()
    return codes


_NO_MORE: Final = 1 << 63


def feed_event(lc: LogChecker, row: dict[str, Any]) -> None:
    """A broker-, topic- or cluster-level event (a row of the audit schema as a dict)."""
    rt, offset = row["record_type"], row["offset"]
    ts = int(row["timestamp"].timestamp() * 1000)
    if rt == "RegisterBroker":
        lc.registration(offset, ts, row["broker"], bool(row["clean"]))
    elif rt == "ClearElr":
        lc.clear_elr(
            offset,
            ts,
            row["topic"],
            min_isr=row["min_isr"],
            first=row["first_partition"],
            end=row["end_partition"],
        )
    elif rt == "UnregisterBroker":
        lc.unregistration(offset, ts, row["broker"])
    elif rt == "RemoveTopic":
        lc.removal(offset, ts, row["topic"])
    elif rt == "FeatureLevel":
        lc.feature(offset, ts, row["feature"], row["level"])


def feed_rows(lc: LogChecker, parts: pa.Table, events: list[dict[str, Any]]) -> None:
    """Hand one cluster's history to `lc` in offset order, as `LogChecker.feed` hands it
    the records of a log (the same calls): `parts`, the partition records (Partition,
    PartitionChange, UncleanRecovery) in offset order, and `events`, the broker-, topic-
    and cluster-level rows (few) in offset order, each fed where its offset falls."""
    checkers = lc.checkers
    pending = iter(events)
    event = next(pending, None)
    at = _NO_MORE if event is None else event["offset"]
    for batch in parts.to_batches(max_chunksize=_SLICE_ROWS):
        rows = zip(_codes(batch), *(_values(batch, c) for c in _PARTITION_COLUMNS), strict=True)
        for (
            code,
            offset,
            ts,
            topic,
            part,
            leader,
            le,
            pe,
            isr,
            elr,
            lkelr,
            reason,
            chosen,
            min_isr,
            election,
            replicas,
            adding,
            removing,
        ) in rows:
            while at < offset:
                assert event is not None
                feed_event(lc, event)
                event = next(pending, None)
                at = _NO_MORE if event is None else event["offset"]
            if code == _CHANGE:
                c = checkers.get((topic, part)) or lc.checker(topic, part)
                if c is None:
                    continue
                if replicas is not None:
                    lc.route(c, replicas)
                c.on_change(
                    offset,
                    ts,
                    reason=reason,
                    leader=leader,
                    isr=isr,
                    elr=elr,
                    last_known_elr=lkelr,
                    leader_epoch=le,
                    partition_epoch=pe,
                    election=election,
                    replicas=replicas,
                    adding=adding,
                    removing=removing,
                    min_isr=min_isr,
                )
            elif code == _PARTITION:
                c = lc.checker(topic, part)
                if c is None:
                    continue
                lc.route(c, replicas)
                lc.join_topic(c)
                c.on_partition(
                    offset,
                    ts,
                    isr=isr,
                    elr=elr,
                    last_known_elr=lkelr,
                    leader=leader,
                    leader_epoch=le,
                    partition_epoch=pe,
                    min_isr=min_isr,
                    replicas=replicas,
                    adding=adding,
                    removing=removing,
                )
            elif code == _RECOVERY:
                lc.recovery(offset, ts, topic, part, chosen)
    while event is not None:
        feed_event(lc, event)
        event = next(pending, None)


def feed_sorted(batches: Iterator[pa.RecordBatch]) -> Iterator[PartitionChecker]:
    """Rows sorted by (cluster, topic, partition, offset), the broker-, topic- and
    cluster-level events already fanned out to each partition (the rows method): one
    finished `PartitionChecker` per metadata partition."""
    checker: PartitionChecker | None = None
    for batch in batches:
        keys = zip(
            _values(batch, "cluster"),
            _values(batch, "topic"),
            _values(batch, "partition"),
            strict=True,
        )
        rows = zip(keys, _codes(batch), *(_values(batch, c) for c in _ROW_COLUMNS), strict=True)
        for (
            key,
            code,
            offset,
            ts,
            _topic,
            _part,
            leader,
            le,
            pe,
            isr,
            elr,
            lkelr,
            reason,
            chosen,
            min_isr,
            election,
            replicas,
            adding,
            removing,
            broker,
            _clean,
            first,
            end,
            _feature,
            level,
        ) in rows:
            if checker is None or key != (checker.cluster, checker.topic, checker.partition):
                if checker is not None:
                    checker.finish()
                    yield checker
                checker = PartitionChecker(*key)
            if code == _CHANGE:
                checker.on_change(
                    offset,
                    ts,
                    reason=reason,
                    leader=leader,
                    isr=isr,
                    elr=elr,
                    last_known_elr=lkelr,
                    leader_epoch=le,
                    partition_epoch=pe,
                    election=election,
                    replicas=replicas,
                    adding=adding,
                    removing=removing,
                    min_isr=min_isr,
                )
            elif code == _PARTITION:
                checker.on_partition(
                    offset,
                    ts,
                    isr=isr or (),
                    elr=elr,
                    last_known_elr=lkelr,
                    leader=leader,
                    leader_epoch=le,
                    partition_epoch=pe,
                    min_isr=min_isr,
                    replicas=replicas,
                    adding=adding,
                    removing=removing,
                )
            elif code == _RECOVERY:
                checker.on_recovery(offset, ts, chosen=chosen)
            elif code == _REGISTER:
                checker.on_unclean_registration(offset, ts, broker=broker)
            elif code == _CLEAR:
                checker.on_clear_elr(offset, ts, min_isr=min_isr, first=first, end=end)
            elif code == _UNREGISTER:
                checker.on_unregister(offset, ts, broker=broker)
            elif code == _REMOVE:
                checker.on_remove(offset, ts)
            elif code == _FEATURE:
                checker.on_feature(offset, ts, level=level)
    if checker is not None:
        checker.finish()
        yield checker


def check_sorted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows method's ``mapInArrow`` function (see `feed_sorted`)."""
    out: list[tuple[Any, ...]] = []
    with paused_gc():
        for checker in feed_sorted(batches):
            checker_rows(checker, out)
            if len(out) >= 10_000:
                yield to_batch(out)
                out = []
    if out:
        yield to_batch(out)


def checker_rows(checker: PartitionChecker, out: list[tuple[Any, ...]]) -> None:
    """The checker's violations (it is finished) and its statistics row, as output rows."""
    for v in checker.out:
        out.append((*v[:4], v.timestamp_ms * 1000, v.rule, v.broker, v.detail, None, None, None))
    out.append(
        (
            checker.cluster,
            checker.topic,
            checker.partition,
            None,
            None,
            STATS_RULE,
            None,
            None,
            checker.records,
            checker.skipped,
            # Each creation of the partition is one (a topic deleted and created again
            # under its name is a new topic); one that never saw its creation counts once.
            max(1, checker.generation + int(checker.created)),
        )
    )


def to_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in OUTPUT_ARROW]
    arrays = []
    for field, values in zip(OUTPUT_ARROW, columns, strict=True):
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_ARROW)
