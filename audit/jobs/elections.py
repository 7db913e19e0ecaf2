"""``elections``: leader elections per topic and kind over time, and preferred-leader imbalance.

An election is a PartitionChange that names a newly elected leader (its
``election_kind``: isr, elr, unclean_recovery, preferred, manual). Elections are counted
in the [since, until) window, per topic (a generation of its name, `audit.lifecycle`: a
topic deleted and created again is two rows, told apart by ``topic_id``) and time bucket
(minute, hour or day, chosen from the span unless given). Imbalance is measured at the
end (until, or the end of the log): a partition whose leader is not its first assigned
replica (replicas[0], as the last Partition record or reassignment left them), among the
partitions with a leader. Partitions without one are counted apart: *stopped* when they
lost it in the cluster's final clean shutdown (`audit.lifecycle`), else *offline*.
Partitions of a deleted topic are not counted at all.

How it runs: on an export with buckets, the span of elections (Spark SQL over two
columns) picks the time bucket, then one task per bucket counts its elections per
(cluster, topic, kind, bucket) and finds each partition's last leader and replicas with
numpy (`bucket_elections`); other inputs run the same as Spark SQL aggregations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from audit.buckets import committed, export_root, read_bucket, run_buckets
from audit.jobs.common import (
    JobResult,
    counts_text,
    fmt_time,
    in_window,
    lifecycle,
    ms_col,
    nullable_ints,
    source_text,
    window_text,
    with_topic_ids,
)
from audit.lifecycle import Lifecycle, split_keys, topic_keys
from audit.report import bar_chart, section, table_html
from audit.spark import AuditInput

COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "partition",
    "leader",
    "election_kind",
    "replicas",
)
BUCKETS = ("minute", "hour", "day")


def pick_bucket(span_ms: int) -> str:
    if span_ms > 3 * 86_400_000:
        return "day"
    if span_ms > 3 * 3_600_000:
        return "hour"
    return "minute"


def run(spark: Any, inp: AuditInput, *, bucket: str | None = None) -> JobResult:
    from audit.progress import step

    if bucket is not None and bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}")
    step(spark, "elections: topics and brokers")
    life = lifecycle(spark, inp)
    if export_root(inp) is not None:
        unit, by_bucket, final = _from_buckets(spark, inp, bucket, life)
    else:
        unit, by_bucket, final = _from_rows(spark, inp, bucket, life)
    return _result(inp, unit, by_bucket, final, life)


KEY = ["cluster", "topic", "topic_id", "partition"]
FINAL_COLUMNS = [*KEY, "leader", "leader_offset", "replicas", "preferred"]


def _final(final: pd.DataFrame, life: Lifecycle) -> pd.DataFrame:
    """Each partition's last leader and replicas, but those of deleted topics."""
    removed = life.removed
    gone = [(c, t) in removed for c, t in zip(final["cluster"], final["topic_id"], strict=True)]
    final = final[~np.array(gone, dtype=bool)] if len(final) else final
    final = final.sort_values(KEY).reset_index(drop=True)
    final["preferred"] = [r[0] if r is not None and len(r) else None for r in final["replicas"]]
    final["partition"] = final["partition"].astype("int32")
    return nullable_ints(final[FINAL_COLUMNS].copy(), ["leader", "leader_offset", "preferred"])


def _from_rows(
    spark: Any, inp: AuditInput, bucket: str | None, life: Lifecycle
) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """Spark SQL over the rows (any input)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from audit.progress import step

    loaded = inp.load(spark, COLUMNS, ["Partition", "PartitionChange"], any_of="leader,replicas")
    rows = with_topic_ids(loaded, life).withColumn("ts_ms", ms_col("timestamp"))
    # Three queries read these rows. From data directories each scan decodes the logs in
    # Python: decode once and cache. From Parquet a scan of the few columns each query
    # needs costs less than caching every row (measured: 7.5 s to cache 10M rows, ~1 s
    # per pruned scan).
    if inp.data_dirs:
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        elections = rows.where(F.col("election_kind").isNotNull() & in_window(F.col("ts_ms"), inp))
        step(spark, "elections: the span of elections")
        span = elections.agg(F.min("ts_ms").alias("lo"), F.max("ts_ms").alias("hi")).first()
        lo, hi = (span["lo"], span["hi"]) if span is not None else (None, None)
        unit = bucket or pick_bucket(0 if lo is None else hi - lo)
        step(spark, f"elections: counts per topic and {unit}")
        by_bucket = (
            elections.groupBy(
                "cluster",
                "topic",
                "topic_id",
                "election_kind",
                F.date_trunc(unit, "timestamp").alias("bucket"),
            )
            .agg(F.count(F.lit(1)).alias("elections"))
            .toPandas()
            .sort_values(["bucket", "cluster", "topic", "topic_id", "election_kind"])
            .reset_index(drop=True)
        )
        # The last leader and the last replicas of each partition, aggregated apart: an
        # int's max_by is a hash aggregation; an array's falls back to sorting its rows,
        # which only the few rows that set replicas (creations, reassignments) then need.
        key = KEY

        def last(col: str) -> Any:
            """Each partition's last non-null `col`, and the offset that set it."""
            return (
                rows.where(F.col(col).isNotNull())
                .groupBy(*key)
                .agg(F.max("offset").alias(f"{col}_offset"), F.max_by(col, "offset").alias(col))
            )

        leaders, assignments = last("leader"), last("replicas")
        step(spark, "elections: each partition's last leader and replicas")
        final = (
            assignments.join(leaders, key, "left")
            .select(*key, "leader", "leader_offset", "replicas")
            .toPandas()
        )
    finally:
        rows.unpersist()
    return unit, by_bucket, _final(final, life)


# --- from an export's buckets ------------------------------------------------------------------

_UNIT_MS = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
BUCKET_COLUMNS = COLUMNS  # the log's columns, read from each bucket
OUTPUT_ARROW = pa.schema(
    [
        pa.field("what", pa.string()),
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("election_kind", pa.string()),
        pa.field("bucket_ms", pa.int64()),
        pa.field("elections", pa.int64()),
        pa.field("leader", pa.int32()),
        pa.field("leader_offset", pa.int64()),
        pa.field("replicas", pa.list_(pa.field("element", pa.int32()))),
        pa.field("replicas_offset", pa.int64()),
    ]
)
OUTPUT_DDL = (
    "what string, cluster string, topic string, topic_id string, partition int, "
    "election_kind string, "
    "bucket_ms long, elections long, leader int, leader_offset long, replicas array<int>, "
    "replicas_offset long"
)


def _last_per_group(keys: Any, offsets: Any, valid: Any) -> Any:
    """Positions of the last (greatest offset) valid row of each key, sorted by key."""
    idx = np.flatnonzero(valid)
    if not len(idx):
        return idx
    order = idx[np.lexsort((offsets[idx], keys[idx]))]
    k = keys[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = k[1:] != k[:-1]
    return order[last]


def bucket_elections(
    table: pa.Table,
    *,
    unit: str,
    since_ms: int | None,
    until_ms: int | None,
) -> pa.RecordBatch:
    """One bucket's share of the job (rows of `BUCKET_COLUMNS`, committed, before
    `until_ms`): election counts per (cluster, topic, kind, time bucket of `unit`), and
    each partition's last leader and last replicas. Topics are generations: (``topic``,
    ``topic_id``) pairs (the table holds its rows' ids). Vectorised (numpy), no row in
    Python."""
    rt = table.column("record_type")
    state = table.filter(
        pc.and_(
            pc.is_in(rt, pa.array(["Partition", "PartitionChange"])),
            pc.or_(pc.is_valid(table.column("leader")), pc.is_valid(table.column("replicas"))),
        )
    ).combine_chunks()
    n = state.num_rows
    if not n:
        return pa.RecordBatch.from_pylist([], schema=OUTPUT_ARROW)
    cl = state.column("cluster").dictionary_encode().chunk(0)
    tp = topic_keys(state.column("topic"), state.column("topic_id")).dictionary_encode()
    k_topic, k_id = split_keys(tp.dictionary)
    cl_i = cl.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    tp_i = tp.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    ts = pc.divide(state.column("timestamp").cast(pa.int64()), 1000).to_numpy()
    kinds = state.column("election_kind").chunk(0)
    elected = kinds.is_valid().to_numpy(zero_copy_only=False)
    if since_ms is not None:
        elected &= ts >= since_ms
    if until_ms is not None:
        elected &= ts < until_ms
    batches = []
    pos = np.flatnonzero(elected)
    if len(pos):
        kd = kinds.take(pa.array(pos)).dictionary_encode()
        kd_i = kd.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        stamps = ts[pos]
        step = _UNIT_MS[unit]
        start = stamps - stamps % step
        first = int(start.min())
        slots = (int(start.max()) - first) // step + 1
        n_t, n_k = len(tp.dictionary), len(kd.dictionary)
        group = (cl_i[pos] * n_t + tp_i[pos]) * n_k + kd_i
        keys, counts = np.unique(group * slots + (start - first) // step, return_counts=True)
        g, slot = np.divmod(keys, slots)
        c_i, rest = np.divmod(g, n_t * n_k)
        t_i, k_i = np.divmod(rest, n_k)
        m = len(counts)
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(["count"] * m, pa.string()),
                    cl.dictionary.take(pa.array(c_i)),
                    k_topic.take(pa.array(t_i)),
                    k_id.take(pa.array(t_i)),
                    pa.nulls(m, pa.int32()),
                    kd.dictionary.take(pa.array(k_i)),
                    pa.array(first + slot * step, pa.int64()),
                    pa.array(counts, pa.int64()),
                    pa.nulls(m, pa.int32()),
                    pa.nulls(m, pa.int64()),
                    pa.nulls(m, OUTPUT_ARROW.field("replicas").type),
                    pa.nulls(m, pa.int64()),
                ],
                schema=OUTPUT_ARROW,
            )
        )
    # Each partition's last leader and last replicas (by offset).
    part = state.column("partition").to_numpy().astype(np.int64)
    n_p = int(part.max()) + 1 if n else 1
    keys = (cl_i * len(tp.dictionary) + tp_i) * n_p + part
    offsets = state.column("offset").to_numpy()
    leader = state.column("leader").chunk(0)
    replicas = state.column("replicas").chunk(0)
    at_l = _last_per_group(keys, offsets, leader.is_valid().to_numpy(zero_copy_only=False))
    at_r = _last_per_group(keys, offsets, replicas.is_valid().to_numpy(zero_copy_only=False))
    # Partitions with replicas (every created one); their leader, where one was set.
    found = np.searchsorted(keys[at_l], keys[at_r]) if len(at_l) else np.zeros(0, np.int64)
    has = np.zeros(len(at_r), dtype=bool)
    if len(at_l):
        found = np.minimum(found, len(at_l) - 1)
        has = keys[at_l][found] == keys[at_r]
    lpos = at_l[found] if len(at_l) else np.zeros(len(at_r), np.int64)
    take_r = pa.array(at_r)
    batches.append(
        pa.RecordBatch.from_arrays(
            [
                pa.array(["final"] * len(at_r), pa.string()),
                state.column("cluster").chunk(0).take(take_r),
                state.column("topic").chunk(0).take(take_r),
                state.column("topic_id").chunk(0).take(take_r),
                pa.array(part[at_r], pa.int32()),
                pa.nulls(len(at_r), pa.string()),
                pa.nulls(len(at_r), pa.int64()),
                pa.nulls(len(at_r), pa.int64()),
                pa.array(
                    leader.fill_null(0).to_numpy(zero_copy_only=False)[lpos], pa.int32(), mask=~has
                ),
                pa.array(offsets[lpos], pa.int64(), mask=~has),
                replicas.take(take_r),
                pa.array(offsets[at_r], pa.int64()),
            ],
            schema=OUTPUT_ARROW,
        )
    )
    return pa.Table.from_batches(batches, schema=OUTPUT_ARROW).combine_chunks().to_batches()[0]


def _from_buckets(
    spark: Any, inp: AuditInput, bucket: str | None, life: Lifecycle
) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """One task per bucket of an export (`audit.buckets`): no shuffle."""
    from pyspark.sql import functions as F

    from audit.progress import step

    aborted, since, until = inp.aborted(spark), inp.since_ms, inp.until_ms
    # The unit needs the span of all elections first: a scan of two columns.
    elected = inp.load(spark, ("timestamp", "election_kind"), ["PartitionChange"]).where(
        F.col("election_kind").isNotNull() & in_window(ms_col("timestamp"), inp)
    )
    step(spark, "elections: the span of elections")
    span = elected.agg(
        F.min(ms_col("timestamp")).alias("lo"), F.max(ms_col("timestamp")).alias("hi")
    ).first()
    lo, hi = (span["lo"], span["hi"]) if span is not None else (None, None)
    unit = bucket or pick_bucket(0 if lo is None or hi is None else hi - lo)

    def per_bucket(root: str, b: int) -> pa.RecordBatch | None:
        table = read_bucket(root, b, BUCKET_COLUMNS)
        if table is None:
            return None
        table = committed(table, aborted, until)
        ids = life.topic_ids(table["cluster"], table["topic"], table["offset"])
        table = table.append_column("topic_id", ids)
        return bucket_elections(table, unit=unit, since_ms=since, until_ms=until)

    step(spark, f"elections: each bucket's counts per {unit}, last leaders and replicas")
    rows = run_buckets(spark, inp, per_bucket, OUTPUT_DDL).toPandas()
    # A topic's partitions are in several buckets: their counts add up.
    by_bucket = (
        rows[rows["what"] == "count"]
        .groupby(["cluster", "topic", "topic_id", "election_kind", "bucket_ms"], as_index=False)[
            "elections"
        ]
        .sum()
        .rename(columns={"bucket_ms": "bucket"})
    )
    by_bucket["bucket"] = pd.to_datetime(by_bucket["bucket"], unit="ms")
    by_bucket["elections"] = by_bucket["elections"].astype("int64")
    by_bucket = by_bucket.sort_values(["bucket", "cluster", "topic", "topic_id", "election_kind"])
    final = rows[rows["what"] == "final"][[*KEY, "leader", "leader_offset", "replicas"]].copy()
    return unit, by_bucket.reset_index(drop=True), _final(final, life)


def _stopped(final: pd.DataFrame, life: Lifecycle) -> Any:
    """Partitions that lost their leader in their cluster's final clean shutdown."""
    at = np.array([life.stops[c].offset if c in life.stops else -1 for c in final["cluster"]])
    lost = (final["leader"] == -1).fillna(False).to_numpy(dtype=bool)
    since = final["leader_offset"].fillna(-1).to_numpy(dtype=np.int64)
    return lost & (at >= 0) & (since >= at)


def _result(
    inp: AuditInput,
    unit: str,
    by_bucket: pd.DataFrame,
    final: pd.DataFrame,
    life: Lifecycle | None = None,
) -> JobResult:
    life = life if life is not None else Lifecycle()
    res = JobResult("elections")
    kinds = (
        by_bucket.groupby("election_kind")["elections"].sum().to_dict()
        if not by_bucket.empty
        else {}
    )
    total = int(sum(kinds.values()))
    topic = ["cluster", "topic", "topic_id"]
    by_topic = (
        by_bucket.pivot_table(
            index=topic,
            columns="election_kind",
            values="elections",
            aggfunc="sum",
            fill_value=0,
        ).reset_index()
        if not by_bucket.empty
        else pd.DataFrame(columns=topic)
    )
    by_topic.columns.name = None
    kind_cols = [c for c in by_topic.columns if c not in topic]
    by_topic["total"] = by_topic[kind_cols].sum(axis=1) if kind_cols else 0
    by_topic = by_topic.sort_values(["total", *topic], ascending=[False, True, True, True])

    stopped = _stopped(final, life)
    no_leader = (final["leader"] == -1).fillna(False).to_numpy(dtype=bool)
    led = final["leader"].notna().to_numpy(dtype=bool) & ~no_leader
    offline = final[no_leader & ~stopped]
    led_final = final[led]
    imbalanced = led_final[led_final["leader"] != led_final["preferred"]]
    none = pd.MultiIndex.from_arrays([[], []], names=["cluster", "broker"])
    leaders = (
        led_final.groupby(["cluster", "leader"]).size().rename("leads")
        if not led_final.empty
        else pd.Series(dtype="int64", name="leads", index=none)
    )
    preferred = (
        final.groupby(["cluster", "preferred"]).size().rename("preferred_for")
        if not final.empty
        else pd.Series(dtype="int64", name="preferred_for", index=none)
    )
    per_broker = (
        pd.concat(
            [
                leaders.rename_axis(["cluster", "broker"]),
                preferred.rename_axis(["cluster", "broker"]),
            ],
            axis=1,
        )
        .fillna(0)
        .astype("int64")
        .reset_index()
        .sort_values(["cluster", "broker"])
    )
    if not per_broker.empty:
        per_broker["excess"] = per_broker["leads"] - per_broker["preferred_for"]

    res.tables = {
        "elections_by_bucket": by_bucket,
        "elections_by_topic": by_topic,
        "imbalance": imbalanced.drop(columns=["leader_offset"]).reset_index(drop=True),
        "leaders_by_broker": per_broker,
    }
    res.stats = {
        "elections": total,
        "by_kind": {k: int(v) for k, v in kinds.items()},
        "partitions": len(final),
        "led": len(led_final),
        "imbalanced": len(imbalanced),
        "offline": len(offline),
        "stopped": int(stopped.sum()),
        "bucket": unit,
    }
    n = len(led_final)
    res.summary = [
        f"elections audit of {source_text(inp)} ({window_text(inp)})",
        f"elections: {total:,} ({counts_text(res.stats['by_kind'])})",
    ]
    for row in by_topic.head(5).itertuples(index=False):
        detail = ", ".join(f"{k}={getattr(row, k)}" for k in kind_cols if getattr(row, k))
        name = life.label(row.cluster, row.topic, row.topic_id)
        res.summary.append(f"  {row.cluster}/{name}: {row.total:,} ({detail})")
    if len(by_topic) > 5:
        res.summary.append(f"  ... {len(by_topic) - 5} more topics in elections_by_topic")
    share = f" ({100 * len(imbalanced) / n:.1f}%)" if n else ""
    res.summary.append(
        f"preferred-leader imbalance at the end: {len(imbalanced):,} of {n:,} partitions with "
        f"a leader{share} not led by replicas[0]; {len(offline):,} offline"
    )
    stops = sorted(set(final["cluster"][stopped]))
    for cluster in stops:
        mine = int((stopped & (final["cluster"] == cluster).to_numpy(dtype=bool)).sum())
        res.summary.append(
            f"  {cluster} was stopped cleanly at {fmt_time(life.stops[cluster].ts_ms)}: "
            f"{mine:,} partition(s) without a leader since its shutdown (not offline)"
        )
    if not n:
        res.summary.append("  no partition has a leader at the end")
    elif not per_broker.empty:
        worst = per_broker.sort_values("excess", ascending=False).head(3)
        res.summary.append(
            "  most over-loaded: "
            + ", ".join(
                f"broker {r.broker} leads {r.leads} (preferred for {r.preferred_for})"
                for r in worst.itertuples(index=False)
                if r.excess > 0
            )
            if (worst["excess"] > 0).any()
            else "  every leader is its partition's preferred replica"
        )

    # HTML: elections over time by kind, leaders per broker.
    if not by_bucket.empty:
        pivot = by_bucket.pivot_table(
            index="bucket", columns="election_kind", values="elections", aggfunc="sum", fill_value=0
        ).sort_index()
        labels = [pd.Timestamp(b).strftime(_LABEL[unit]) for b in pivot.index]
        chart = bar_chart(
            labels,
            {str(k): pivot[k].tolist() for k in pivot.columns},
            title=f"elections per {unit}, by kind",
            y_label="elections",
        )
        res.html.append(section("Elections over time", chart))
    if not per_broker.empty:
        chart = bar_chart(
            [
                f"{r.cluster}/{r.broker}"
                if inp.data_dirs and len(inp.data_dirs) > 1
                else str(r.broker)
                for r in per_broker.itertuples(index=False)
            ],
            {
                "leads": per_broker["leads"].tolist(),
            },
            title="partitions led per broker at the end",
            y_label="partitions",
        )
        res.html.append(
            section(
                "Leadership at the end",
                chart,
                table_html(per_broker),
            )
        )
    res.html.append(section("Elections per topic", table_html(by_topic)))
    res.html.append(
        section(
            "Partitions not led by their preferred replica",
            table_html(imbalanced.drop(columns=["leader_offset"])),
        )
    )
    return res


_LABEL = {"minute": "%m-%d %H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}
