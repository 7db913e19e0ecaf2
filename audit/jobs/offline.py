"""``offline``: per partition, the intervals with no leader, and time under MinISR and on the ELR.

A partition is a generation of its topic (`audit.lifecycle`: a topic deleted and created
again under its name is a new one, with its own rows). Its state is rebuilt in offset
order (PartitionRecord, then each PartitionChangeRecord's changed fields; a ClearElr of
its topic empties the ELR). Each state lasts until the partition's next record, the last
one until the end of its history: the topic's deletion, else --until or the log's newest
record. Everything is clipped to [since, until).

* An offline interval starts at a change that sets the leader to -1 and ends at the next
  change that sets a leader (``ended``: ``leader``). One without a leader at the end of
  the history ended with it: ``topic_deleted`` when the topic was deleted; ``stopped``
  when it began in the cluster's final, clean shutdown (`audit.lifecycle`: every broker
  in controlled shutdown or fenced at the end of the log); else it is still ``open``.
  An *outage* is an interval that was not stopped and lasted longer than 0 ms (a leader
  elected again within the millisecond it was lost, usually in the same committed batch,
  was seen by nobody), or is still open: only outages are counted in the summary, the
  per-partition figures and the durations (p50, p99 by linear interpolation, max); the
  intervals table lists every interval, with ``outage`` saying which are. Time offline
  is the time of outages.
* Time under MinISR: |ISR| < MinISR (the partition's effective MinISR); and of it, the
  time it had a leader (``under_min_isr_led_ms``): what the report's chart stacks on the
  time offline, since offline time is usually under MinISR too (issue 22: stacking the
  two counted that time twice).
* Time on the ELR: the ELR is not empty.

How it runs (`_per_partition`): on an export with buckets, one task per bucket computes
the measures of its partitions with numpy (`timelines`: sort by partition and offset,
forward fills, next-leader lookups, sums per group; no Python per row); on data
directories one task per core reads the logs and keeps its bucket's partitions (the
plain pass's accumulator, `audit.plain_offline.offline_bucket`); any other input has its rows
shuffled by partition and sorted, then `timelines` per Spark partition. All give the
answers of the plain pass (tests hold them equal); the classification of intervals
(`classify`) is the job's own, in `_result`, the same for every path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from audit.buckets import committed, export_root, read_bucket, read_events, run_buckets
from audit.jobs.common import (
    cluster_end_ms,
    lifecycle,
    ms_col,
    with_topic_ids,
)
from audit.jobs.offline_result import _result
from audit.lifecycle import Lifecycle, split_keys, topic_keys
from audit.logread import log_info
from audit.plain_offline import offline_bucket
from audit.spark import AuditInput

__all__ = ["KEY", "OUTPUT_ARROW", "OUTPUT_DDL", "TIMELINE", "_result", "run", "timelines"]

STATE_COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "partition",
    "leader",
    "isr",
    "elr",
    "min_isr",
)
DIRECTORY_COLUMNS = ("cluster", "offset", "timestamp", "record_type", "topic", "partition")
KEY = ("cluster", "topic", "topic_id", "partition")
# What the timeline reads: a row per state change (or ELR clear), list columns as sizes.
TIMELINE = pa.schema(
    [
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("ts_ms", pa.int64()),
        pa.field("leader", pa.int32()),
        pa.field("isr_n", pa.int32()),
        pa.field("elr_n", pa.int32()),
        pa.field("min_isr", pa.int32()),
    ]
)
_INTERVAL = pa.struct(
    [
        pa.field("start_ms", pa.int64()),
        pa.field("end_ms", pa.int64()),
        pa.field("open", pa.bool_()),
        pa.field("offset", pa.int64()),
    ]
)
OUTPUT_ARROW = pa.schema(
    [
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offline_ms", pa.int64()),
        pa.field("under_min_isr_ms", pa.int64()),
        pa.field("elr_ms", pa.int64()),
        pa.field("intervals", pa.list_(pa.field("element", _INTERVAL))),
        pa.field("leader_at_end", pa.int32()),
        pa.field("under_min_isr_led_ms", pa.int64()),
    ]
)
OUTPUT_DDL = (
    "cluster string, topic string, topic_id string, partition int, offline_ms long, "
    "under_min_isr_ms long, "
    "elr_ms long, intervals array<struct<start_ms:long,end_ms:long,open:boolean,offset:long>>, "
    "leader_at_end int, under_min_isr_led_ms long"
)
_NEVER = -(2**62)


def _filled(values: Any, valid: Any, starts: Any) -> tuple[Any, Any]:
    """Per row, the last valid value at or before it within its group (``last(x,
    ignorenulls)`` over the rows so far): (values, validity)."""
    n = len(values)
    at = np.where(valid, np.arange(n), -1)
    np.maximum.accumulate(at, out=at)
    ok = at >= starts
    return values[np.maximum(at, 0)], ok


def _ints(col: Any, order: Any) -> tuple[Any, Any]:
    """A nullable int column as (int64 values with nulls as 0, validity), in `order`."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    values = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return values[order], valid[order]


def timelines(
    table: pa.Table,
    ends: dict[str, int],
    since_ms: int | None,
    removed: dict[tuple[str, str], int] | None = None,
) -> pa.RecordBatch:
    """Per partition, the job's measures from its rows (`TIMELINE` columns, any order):
    the state rebuilt in offset order, each state lasting until the partition's next row
    (the last until the end of its history: its topic's deletion, `removed`'s time per
    (cluster, topic id), else its cluster's end), clipped to [since, end). Vectorised:
    numpy over the whole table, no Python per row (the rows path and the buckets path
    both run it)."""
    if not table.num_rows:
        return _empty()
    n = table.num_rows
    cl = table.column("cluster").combine_chunks().dictionary_encode()
    tp = topic_keys(table.column("topic"), table.column("topic_id")).dictionary_encode()
    k_topic, k_id = split_keys(tp.dictionary)
    # Grouped by partition, in offset order within: numpy's lexsort of integer keys (the
    # groups' own order does not matter; the caller sorts the result).
    cl_i = cl.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    tp_i = tp.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    part = table.column("partition").to_numpy().astype(np.int64)
    offsets = table.column("offset").to_numpy()
    order = np.lexsort((offsets, part, tp_i, cl_i))
    cl_i, tp_i, part, offsets = cl_i[order], tp_i[order], part[order], offsets[order]
    ts = table.column("ts_ms").to_numpy()[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (cl_i[1:] != cl_i[:-1]) | (tp_i[1:] != tp_i[:-1]) | (part[1:] != part[:-1])
    heads = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    starts = heads[group]
    tails = np.append(heads[1:], n)  # one past each group's last row
    stops = tails[group]
    leader, leader_ok = _ints(table.column("leader"), order)
    isr_n, isr_ok = _ints(table.column("isr_n"), order)
    elr_n, elr_ok = _ints(table.column("elr_n"), order)
    min_isr, min_ok = _ints(table.column("min_isr"), order)
    leader_now, leader_now_ok = _filled(leader, leader_ok, starts)
    isr_now, isr_now_ok = _filled(isr_n, isr_ok, starts)
    elr_now, elr_now_ok = _filled(elr_n, elr_ok, starts)
    min_now, min_now_ok = _filled(min_isr, min_ok, starts)
    names = cl.dictionary.to_pylist()
    group_end = np.array([ends.get(name, _NEVER) for name in names], dtype=np.int64)[cl_i[heads]]
    for (cluster, topic_id), ms in (removed or {}).items():
        if cluster in names:
            ids = np.flatnonzero(pc.equal(k_id, topic_id).to_numpy(zero_copy_only=False))
            gone = (cl_i[heads] == names.index(cluster)) & np.isin(tp_i[heads], ids)
            group_end[gone] = np.minimum(group_end[gone], ms)
    end = group_end[group]
    lo = since_ms if since_ms is not None else _NEVER
    last = np.arange(n) + 1 == stops
    next_ms = np.where(last, end, np.append(ts[1:], 0))
    # The next row of the group that sets a leader (any, -1 too): when an offline interval
    # that starts here ends.
    setting = np.where(leader_ok, np.arange(n), n)
    after = np.append(np.minimum.accumulate(setting[::-1])[::-1][1:], n)
    closed = after < stops
    next_leader_ms = ts[np.minimum(after, n - 1)]
    start = np.maximum(ts, lo)
    dur = np.maximum(0, np.minimum(next_ms, end) - start)
    is_offline = leader_now_ok & (leader_now == -1)
    offline = np.add.reduceat(np.where(is_offline, dur, 0), heads)
    under = isr_now_ok & min_now_ok & (isr_now < min_now)
    under_ms = np.add.reduceat(np.where(under, dur, 0), heads)
    under_led_ms = np.add.reduceat(np.where(under & ~is_offline, dur, 0), heads)
    elr_ms = np.add.reduceat(np.where(elr_now_ok & (elr_now > 0), dur, 0), heads)
    off_end = np.where(closed, next_leader_ms, end)
    went = leader_ok & (leader == -1) & ((off_end > lo) | (ts >= lo)) & (ts <= end)
    picked = np.flatnonzero(went)
    intervals = pa.StructArray.from_arrays(
        [
            pa.array(ts[picked], pa.int64()),
            pa.array(off_end[picked], pa.int64()),
            pa.array(~closed[picked], pa.bool_()),
            pa.array(offsets[picked], pa.int64()),
        ],
        fields=list(_INTERVAL),
    )
    per_group = np.add.reduceat(went.astype(np.int64), heads)
    bounds = np.concatenate([[0], np.cumsum(per_group)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(
        pa.array(bounds), intervals, type=OUTPUT_ARROW.field("intervals").type
    )
    ends_at = tails - 1
    at_end = pa.array(leader_now[ends_at], pa.int32(), mask=~leader_now_ok[ends_at])
    return pa.RecordBatch.from_arrays(
        [
            cl.dictionary.take(pa.array(cl_i[heads])),
            k_topic.take(pa.array(tp_i[heads])),
            k_id.take(pa.array(tp_i[heads])),
            pa.array(part[heads], pa.int32()),
            pa.array(offline, pa.int64()),
            pa.array(under_ms, pa.int64()),
            pa.array(elr_ms, pa.int64()),
            lists,
            at_end,
            pa.array(under_led_ms, pa.int64()),
        ],
        schema=OUTPUT_ARROW,
    )


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=OUTPUT_ARROW)


def _timeline_rows(table: pa.Table) -> pa.Table:
    """Audit-schema rows (state changes, or ELR clears with ``elr = []``) as `TIMELINE`."""
    size = pc.list_value_length
    stamps = pc.divide(table.column("timestamp").cast(pa.int64()), 1000)
    return pa.Table.from_arrays(
        [
            table.column("cluster"),
            table.column("topic"),
            table.column("topic_id"),
            table.column("partition"),
            table.column("offset"),
            stamps,
            table.column("leader"),
            size(table.column("isr")).cast(pa.int32()),
            size(table.column("elr")).cast(pa.int32()),
            table.column("min_isr"),
        ],
        schema=TIMELINE,
    )


def bucket_timelines(
    root: str,
    bucket: int,
    *,
    ends: dict[str, int],
    since_ms: int | None,
    aborted: dict[str, list[tuple[int, int]]],
    until_ms: int | None,
    life: Lifecycle | None = None,
) -> pa.RecordBatch | None:
    """`timelines` of one bucket of an export (`audit.buckets`): its state rows, and
    every ClearElr of a topic fanned out to the bucket's partitions of that topic (the
    generation current at the clear: `life`'s, which also ends deleted topics)."""
    life = life if life is not None else Lifecycle()
    cols = (*STATE_COLUMNS, "partition")
    parts = read_bucket(root, bucket, list(dict.fromkeys(cols)))
    if parts is None:
        return None
    parts = committed(parts, aborted, until_ms)
    parts = parts.append_column(
        "topic_id", life.topic_ids(parts["cluster"], parts["topic"], parts["offset"])
    )
    rt = parts.column("record_type")
    created = parts.filter(pc.equal(rt, "Partition")).select(list(KEY))
    state = parts.filter(
        pc.and_(
            pc.is_in(rt, pa.array(["Partition", "PartitionChange"])),
            pc.or_(
                pc.or_(pc.is_valid(parts.column("leader")), pc.is_valid(parts.column("isr"))),
                pc.is_valid(parts.column("elr")),
            ),
        )
    )
    rows = [_timeline_rows(state)]
    clears = read_events(root, DIRECTORY_COLUMNS, ["ClearElr"])
    if clears is not None and clears.num_rows and created.num_rows:
        clears = committed(clears, aborted, until_ms).drop_columns(["partition"])
        clears = clears.append_column(
            "topic_id", life.topic_ids(clears["cluster"], clears["topic"], clears["offset"])
        )
        fanned = clears.join(
            created.group_by(list(KEY)).aggregate([]),
            ["cluster", "topic", "topic_id"],
            join_type="inner",
        )
        rows.append(
            pa.Table.from_arrays(
                [
                    fanned.column("cluster"),
                    fanned.column("topic"),
                    fanned.column("topic_id"),
                    fanned.column("partition"),
                    fanned.column("offset"),
                    pc.divide(fanned.column("timestamp").cast(pa.int64()), 1000),
                    pa.nulls(fanned.num_rows, pa.int32()),
                    pa.nulls(fanned.num_rows, pa.int32()),
                    pa.array(np.zeros(fanned.num_rows, dtype=np.int32)),
                    pa.nulls(fanned.num_rows, pa.int32()),
                ],
                schema=TIMELINE,
            )
        )
    return timelines(pa.concat_tables(rows), ends, since_ms, _removed_ms(life))


def _removed_ms(life: Lifecycle) -> dict[tuple[str, str], int]:
    return {key: ms for key, (_, ms) in life.removed.items()}


def clear_elr_events(spark: Any, inp: AuditInput, life: Lifecycle) -> Any:
    """ClearElr records, one row per partition of the topic's generation at the clear
    (cheap: two record types)."""
    from pyspark.sql import functions as F

    small = with_topic_ids(inp.load(spark, DIRECTORY_COLUMNS, ["Partition", "ClearElr"]), life)
    parts = small.where(F.col("record_type") == "Partition").select(*KEY)
    clears = small.where(F.col("record_type") == "ClearElr").drop("partition")
    return clears.join(F.broadcast(parts.distinct()), ["cluster", "topic", "topic_id"])


def _per_partition(spark: Any, inp: AuditInput, ends: dict[str, int], life: Lifecycle) -> Any:
    """The per-partition measures as a DataFrame (OUTPUT_DDL): on an export with buckets,
    one task per bucket; on data directories, one task per core reading the logs
    (`_from_logs`); otherwise the rows shuffled by partition and sorted, then the same
    `timelines` per Spark partition (``mapInArrow``)."""
    from pyspark.sql import functions as F

    from audit.progress import step

    since = inp.since_ms
    removed = _removed_ms(life)
    step(spark, "offline: each partition's timeline")
    if export_root(inp) is not None:
        aborted, until = inp.aborted(spark), inp.until_ms

        def per_bucket(root: str, bucket: int) -> pa.RecordBatch | None:
            return bucket_timelines(
                root,
                bucket,
                ends=ends,
                since_ms=since,
                aborted=aborted,
                until_ms=until,
                life=life,
            )

        return run_buckets(spark, inp, per_bucket, OUTPUT_DDL)

    if inp.data_dirs:
        return _from_logs(spark, inp, ends)

    def size_of(col: str) -> Any:
        return F.when(F.col(col).isNotNull(), F.size(col)).cast("int")

    loaded = inp.load(
        spark, STATE_COLUMNS, ["Partition", "PartitionChange"], any_of="leader,isr,elr"
    )
    state = with_topic_ids(loaded, life).select(
        *KEY,
        "offset",
        ms_col("timestamp").alias("ts_ms"),
        "leader",
        size_of("isr").alias("isr_n"),
        size_of("elr").alias("elr_n"),
        "min_isr",
    )
    clears = clear_elr_events(spark, inp, life).select(
        *KEY,
        "offset",
        ms_col("timestamp").alias("ts_ms"),
        F.lit(None).cast("int").alias("leader"),
        F.lit(None).cast("int").alias("isr_n"),
        F.lit(0).cast("int").alias("elr_n"),
        F.lit(None).cast("int").alias("min_isr"),
    )
    n = int(spark.conf.get("spark.sql.shuffle.partitions"))

    def per_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        got = list(batches)  # topic_id may come marked not null: cast to the schema
        table = pa.Table.from_batches(got).cast(TIMELINE) if got else TIMELINE.empty_table()
        if table.num_rows:
            yield timelines(table, ends, since, removed)

    return (
        state.unionByName(clears)
        .repartition(n, *KEY)
        .sortWithinPartitions(*KEY, "offset")
        .mapInArrow(per_partition, OUTPUT_DDL)
    )


def _from_logs(spark: Any, inp: AuditInput, ends: dict[str, int]) -> Any:
    """Data directories: one task per core, each reads every log (`audit.logread`),
    decodes every batch and keeps the partitions of its bucket
    (`audit.plain_offline.offline_bucket`), as the invariants job's logs method does: no
    rows through the JVM, no shuffle."""
    from audit.source import resolve_sources

    k = max(1, int(spark.sparkContext.defaultParallelism))
    sources = [
        (log_info(src.path).path, src.cluster)
        for src in resolve_sources(list(inp.data_dirs), list(inp.clusters))
    ]
    since, until = inp.since_ms, inp.until_ms

    def per_bucket(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for bucket in batch.column("id").to_pylist():
                table = offline_bucket(
                    sources,
                    bucket=int(bucket),
                    buckets=k,
                    ends=ends,
                    since_ms=since,
                    until_ms=until,
                )
                if len(table):
                    yield pa.RecordBatch.from_pandas(
                        table, schema=OUTPUT_ARROW, preserve_index=False
                    )

    return spark.range(0, k, 1, k).mapInArrow(per_bucket, OUTPUT_DDL)


def run(spark: Any, inp: AuditInput, *, top: int = 20) -> Any:
    """The job (a `audit.jobs.common.JobResult`)."""
    from audit.progress import step

    step(spark, "offline: the history's end, topics and brokers")
    ends = cluster_end_ms(spark, inp)
    life = lifecycle(spark, inp)
    per_partition = (
        _per_partition(spark, inp, ends, life)
        .toPandas()
        .sort_values(list(KEY))
        .reset_index(drop=True)
    )
    return _result(inp, per_partition, top, life)
