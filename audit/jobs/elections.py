"""``elections``: leader elections per topic and kind over time, and preferred-leader imbalance.

An election is a PartitionChange that names a newly elected leader (its
``election_kind``: isr, elr, unclean_recovery, preferred, manual). Elections are counted
in the [since, until) window, per time bucket (minute, hour or day, chosen from the span
unless given). Imbalance is measured at the end (until, or the end of the log): a
partition whose leader is not its first assigned replica (replicas[0], as the last
Partition record or reassignment left them); offline partitions (no leader) are counted
apart, and partitions of a topic deleted after their last record are not counted at all
(a topic created again under the name counts from its new partitions' records).

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
    in_window,
    ms_col,
    source_text,
    window_text,
)
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
    if bucket is not None and bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}")
    if export_root(inp) is not None:
        unit, by_bucket, final = _from_buckets(spark, inp, bucket)
    else:
        unit, by_bucket, final = _from_rows(spark, inp, bucket)
    return _result(inp, unit, by_bucket, final)


def _removed(spark: Any, inp: AuditInput) -> Any:
    """Per (cluster, topic), the offset of its last RemoveTopicRecord."""
    from pyspark.sql import functions as F

    return (
        inp.load(spark, ("cluster", "offset", "topic"), ["RemoveTopic"])
        .groupBy("cluster", "topic")
        .agg(F.max("offset").alias("removed_at"))
    )


def _final(final: pd.DataFrame) -> pd.DataFrame:
    final = final.sort_values(["cluster", "topic", "partition"]).reset_index(drop=True)
    final["preferred"] = [r[0] if len(r) else None for r in final["replicas"]]
    return final[["cluster", "topic", "partition", "leader", "replicas", "preferred"]]


def _from_rows(
    spark: Any, inp: AuditInput, bucket: str | None
) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """Spark SQL over the rows (any input)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rows = inp.load(
        spark, COLUMNS, ["Partition", "PartitionChange"], any_of="leader,replicas"
    ).withColumn("ts_ms", ms_col("timestamp"))
    # Three queries read these rows. From data directories each scan decodes the logs in
    # Python: decode once and cache. From Parquet a scan of the few columns each query
    # needs costs less than caching every row (measured: 7.5 s to cache 10M rows, ~1 s
    # per pruned scan).
    if inp.data_dirs:
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        elections = rows.where(F.col("election_kind").isNotNull() & in_window(F.col("ts_ms"), inp))
        span = elections.agg(F.min("ts_ms").alias("lo"), F.max("ts_ms").alias("hi")).first()
        lo, hi = (span["lo"], span["hi"]) if span is not None else (None, None)
        unit = bucket or pick_bucket(0 if lo is None else hi - lo)
        by_bucket = (
            elections.groupBy(
                "cluster", "topic", "election_kind", F.date_trunc(unit, "timestamp").alias("bucket")
            )
            .agg(F.count(F.lit(1)).alias("elections"))
            .toPandas()
            .sort_values(["bucket", "cluster", "topic", "election_kind"])
            .reset_index(drop=True)
        )
        # The last leader and the last replicas of each partition, aggregated apart: an
        # int's max_by is a hash aggregation; an array's falls back to sorting its rows,
        # which only the few rows that set replicas (creations, reassignments) then need.
        key = ["cluster", "topic", "partition"]

        def last(col: str) -> Any:
            """Each partition's last non-null `col`, and the offset that set it."""
            return (
                rows.where(F.col(col).isNotNull())
                .groupBy(*key)
                .agg(F.max("offset").alias(f"{col}_offset"), F.max_by(col, "offset").alias(col))
            )

        leaders, assignments = last("leader"), last("replicas")
        final = (
            assignments.join(leaders, key, "left")
            .withColumn(
                "last_offset",
                F.greatest("replicas_offset", F.coalesce("leader_offset", "replicas_offset")),
            )
            .join(F.broadcast(_removed(spark, inp)), ["cluster", "topic"], "left")
            .where(F.col("removed_at").isNull() | (F.col("removed_at") < F.col("last_offset")))
            .select(*key, "leader", "replicas")
            .toPandas()
        )
    finally:
        rows.unpersist()
    return unit, by_bucket, _final(final)


# --- from an export's buckets ------------------------------------------------------------------

_UNIT_MS = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
BUCKET_COLUMNS = COLUMNS  # the log's columns, read from each bucket
OUTPUT_ARROW = pa.schema(
    [
        pa.field("what", pa.string()),
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
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
    "what string, cluster string, topic string, partition int, election_kind string, "
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
    each partition's last leader and last replicas. Vectorised (numpy), no row in Python."""
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
    tp = state.column("topic").dictionary_encode().chunk(0)
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
                    tp.dictionary.take(pa.array(t_i)),
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
    spark: Any, inp: AuditInput, bucket: str | None
) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """One task per bucket of an export (`audit.buckets`): no shuffle."""
    from pyspark.sql import functions as F

    aborted, since, until = inp.aborted(spark), inp.since_ms, inp.until_ms
    # The unit needs the span of all elections first: a scan of two columns.
    elected = inp.load(spark, ("timestamp", "election_kind"), ["PartitionChange"]).where(
        F.col("election_kind").isNotNull() & in_window(ms_col("timestamp"), inp)
    )
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
        return bucket_elections(table, unit=unit, since_ms=since, until_ms=until)

    rows = run_buckets(spark, inp, per_bucket, OUTPUT_DDL).toPandas()
    removed = _removed(spark, inp).toPandas()
    # A topic's partitions are in several buckets: their counts add up.
    by_bucket = (
        rows[rows["what"] == "count"]
        .groupby(["cluster", "topic", "election_kind", "bucket_ms"], as_index=False)["elections"]
        .sum()
        .rename(columns={"bucket_ms": "bucket"})
    )
    by_bucket["bucket"] = pd.to_datetime(by_bucket["bucket"], unit="ms")
    by_bucket["elections"] = by_bucket["elections"].astype("int64")
    by_bucket = by_bucket.sort_values(["bucket", "cluster", "topic", "election_kind"])
    final = rows[rows["what"] == "final"].merge(removed, on=["cluster", "topic"], how="left")
    last = np.maximum(final["replicas_offset"], final["leader_offset"].fillna(-1))
    final = final[final["removed_at"].isna() | (final["removed_at"] < last)]
    final = final[["cluster", "topic", "partition", "leader", "replicas"]].copy()
    # The types Spark's own aggregation gives (rows of other kinds made these nullable).
    final["partition"] = final["partition"].astype("int32")
    if final["leader"].notna().all():
        final["leader"] = final["leader"].astype("int32")
    return unit, by_bucket.reset_index(drop=True), _final(final)


def _result(inp: AuditInput, unit: str, by_bucket: pd.DataFrame, final: pd.DataFrame) -> JobResult:
    res = JobResult("elections")
    kinds = (
        by_bucket.groupby("election_kind")["elections"].sum().to_dict()
        if not by_bucket.empty
        else {}
    )
    total = int(sum(kinds.values()))
    by_topic = (
        by_bucket.pivot_table(
            index=["cluster", "topic"],
            columns="election_kind",
            values="elections",
            aggfunc="sum",
            fill_value=0,
        ).reset_index()
        if not by_bucket.empty
        else pd.DataFrame(columns=["cluster", "topic"])
    )
    by_topic.columns.name = None
    kind_cols = [c for c in by_topic.columns if c not in ("cluster", "topic")]
    by_topic["total"] = by_topic[kind_cols].sum(axis=1) if kind_cols else 0
    by_topic = by_topic.sort_values(["total", "cluster", "topic"], ascending=[False, True, True])

    final["offline"] = final["leader"] == -1
    imbalanced = final[(final["leader"] != final["preferred"]) & ~final["offline"]]
    offline = final[final["offline"]]
    none = pd.MultiIndex.from_arrays([[], []], names=["cluster", "broker"])
    leaders = (
        final[~final["offline"]].groupby(["cluster", "leader"]).size().rename("leads")
        if not final.empty
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
        "imbalance": imbalanced.drop(columns=["offline"]).reset_index(drop=True),
        "leaders_by_broker": per_broker,
    }
    res.stats = {
        "elections": total,
        "by_kind": {k: int(v) for k, v in kinds.items()},
        "partitions": len(final),
        "imbalanced": len(imbalanced),
        "offline": len(offline),
        "bucket": unit,
    }
    n = len(final)
    res.summary = [
        f"elections audit of {source_text(inp)} ({window_text(inp)})",
        f"elections: {total:,} ({counts_text(res.stats['by_kind'])})",
    ]
    for row in by_topic.head(5).itertuples(index=False):
        detail = ", ".join(f"{k}={getattr(row, k)}" for k in kind_cols if getattr(row, k))
        res.summary.append(f"  {row.cluster}/{row.topic}: {row.total:,} ({detail})")
    if len(by_topic) > 5:
        res.summary.append(f"  ... {len(by_topic) - 5} more topics in elections_by_topic")
    share = f" ({100 * len(imbalanced) / n:.1f}%)" if n else ""
    res.summary.append(
        f"preferred-leader imbalance at the end: {len(imbalanced):,} of {n:,} partitions"
        f"{share} not led by replicas[0]; {len(offline):,} offline"
    )
    if not per_broker.empty:
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
        section("Partitions not led by their preferred replica", table_html(imbalanced))
    )
    return res


_LABEL = {"minute": "%m-%d %H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}
