"""``offline``: per partition, the intervals with no leader, and time under MinISR and on the ELR.

The partition's state is rebuilt per partition in offset order (PartitionRecord, then
each PartitionChangeRecord's changed fields; a ClearElr of its topic empties the ELR).
Each state lasts until the partition's next record, the last one until the end of the
history (--until, or the log's newest record). Everything is clipped to [since, until).

* An offline interval starts at a change that sets the leader to -1 and ends at the next
  change that sets a leader; one still open at the end is reported with ``open``.
  Durations: per partition and overall, p50, p99 (linear interpolation) and max.
* Time under MinISR: |ISR| < MinISR (the partition's effective MinISR).
* Time on the ELR: the ELR is not empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from audit.jobs.common import (
    JobResult,
    cluster_end_ms,
    fmt_ms,
    map_literal,
    ms_col,
    percentiles,
    source_text,
    window_text,
)
from audit.report import bar_chart, log_histogram, section, table_html
from audit.spark import AuditInput

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


def clear_elr_events(spark: Any, inp: AuditInput) -> Any:
    """ClearElr records, one row per partition of the topic (cheap: two record types)."""
    from pyspark.sql import functions as F

    small = inp.load(spark, DIRECTORY_COLUMNS, ["Partition", "ClearElr"])
    parts = small.where(F.col("record_type") == "Partition").select("cluster", "topic", "partition")
    clears = small.where(F.col("record_type") == "ClearElr").drop("partition")
    return clears.join(F.broadcast(parts.distinct()), ["cluster", "topic"])


def run(spark: Any, inp: AuditInput, *, top: int = 20) -> JobResult:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ends = cluster_end_ms(spark, inp)
    state = inp.load(
        spark, STATE_COLUMNS, ["Partition", "PartitionChange"], any_of="leader,isr,elr"
    )
    clears = clear_elr_events(spark, inp).withColumn("elr", F.array().cast("array<int>"))
    rows = state.unionByName(clears, allowMissingColumns=True).withColumn(
        "ts_ms", ms_col("timestamp")
    )
    key = ("cluster", "topic", "partition")
    forward = Window.partitionBy(*key).orderBy("offset")
    upto = forward.rowsBetween(Window.unboundedPreceding, 0)
    backward = (
        Window.partitionBy(*key)
        .orderBy(F.col("offset").desc())
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    end = map_literal(ends, "cluster")
    lo = F.lit(inp.since_ms if inp.since_ms is not None else -(2**62)).cast("long")
    timeline = (
        rows.withColumn("leader_now", F.last("leader", ignorenulls=True).over(upto))
        .withColumn("isr_now", F.last("isr", ignorenulls=True).over(upto))
        .withColumn("elr_now", F.last("elr", ignorenulls=True).over(upto))
        .withColumn("min_isr_now", F.last("min_isr", ignorenulls=True).over(upto))
        .withColumn("next_ms", F.coalesce(F.lead("ts_ms").over(forward), end))
        .withColumn(
            "next_leader_ms",
            F.last(F.when(F.col("leader").isNotNull(), F.col("ts_ms")), ignorenulls=True).over(
                backward
            ),
        )
        .withColumn("end_ms", end)
    )
    start = F.greatest(F.col("ts_ms"), lo)
    dur = F.greatest(F.lit(0).cast("long"), F.least(F.col("next_ms"), F.col("end_ms")) - start)
    off_end = F.coalesce(F.col("next_leader_ms"), F.col("end_ms"))
    interval = F.struct(
        F.col("ts_ms").alias("start_ms"),
        off_end.alias("end_ms"),
        F.col("next_leader_ms").isNull().alias("open"),
        F.col("offset").alias("offset"),
    )
    went_offline = (
        (F.col("leader") == -1)
        & ((off_end > lo) | (F.col("ts_ms") >= lo))
        & (F.col("ts_ms") <= F.col("end_ms"))
    )
    per_partition = (
        timeline.groupBy(*key)
        .agg(
            F.sum(F.when(F.col("leader_now") == -1, dur).otherwise(0)).alias("offline_ms"),
            F.sum(F.when(F.size("isr_now") < F.col("min_isr_now"), dur).otherwise(0)).alias(
                "under_min_isr_ms"
            ),
            F.sum(F.when(F.size("elr_now") > 0, dur).otherwise(0)).alias("elr_ms"),
            F.collect_list(F.when(went_offline, interval)).alias("intervals"),
            F.max_by("leader_now", "offset").alias("leader_at_end"),
        )
        .toPandas()
        .sort_values(list(key))
        .reset_index(drop=True)
    )
    return _result(inp, per_partition, top)


def _result(inp: AuditInput, per: pd.DataFrame, top: int) -> JobResult:
    res = JobResult("offline")
    since = inp.since_ms
    records = []
    for row in per.itertuples(index=False):
        for iv in row.intervals if row.intervals is not None else []:
            start = iv["start_ms"] if since is None else max(iv["start_ms"], since)
            records.append(
                {
                    "cluster": row.cluster,
                    "topic": row.topic,
                    "partition": row.partition,
                    "offset": iv["offset"],
                    "start": pd.Timestamp(iv["start_ms"], unit="ms", tz="UTC"),
                    "end": pd.Timestamp(iv["end_ms"], unit="ms", tz="UTC"),
                    "open": bool(iv["open"]),
                    "duration_ms": int(max(0, iv["end_ms"] - start)),
                }
            )
    intervals = pd.DataFrame.from_records(
        records,
        columns=["cluster", "topic", "partition", "offset", "start", "end", "open", "duration_ms"],
    )
    intervals["duration_ms"] = intervals["duration_ms"].astype("int64")
    per = per.drop(columns=["intervals"])
    stats_cols = ["offline_intervals", "offline_p50_ms", "offline_p99_ms", "offline_max_ms"]
    if not intervals.empty:
        grouped = intervals.groupby(["cluster", "topic", "partition"])["duration_ms"]
        agg = pd.DataFrame(
            {
                "offline_intervals": grouped.size(),
                "offline_p50_ms": grouped.quantile(0.5),
                "offline_p99_ms": grouped.quantile(0.99),
                "offline_max_ms": grouped.max(),
            }
        ).reset_index()
        per = per.merge(agg, on=["cluster", "topic", "partition"], how="left")
    else:
        for c in stats_cols:
            per[c] = np.nan
    per["offline_intervals"] = per["offline_intervals"].fillna(0).astype("int64")
    per["offline_now"] = per["leader_at_end"] == -1
    per = per[
        [
            "cluster",
            "topic",
            "partition",
            "offline_intervals",
            "offline_ms",
            "offline_p50_ms",
            "offline_p99_ms",
            "offline_max_ms",
            "under_min_isr_ms",
            "elr_ms",
            "offline_now",
        ]
    ]
    res.tables = {"offline_partitions": per, "offline_intervals": intervals}
    pct = percentiles(intervals["duration_ms"])
    touched = per[per["offline_intervals"] > 0]
    res.stats = {
        "partitions": len(per),
        "intervals": len(intervals),
        "open_intervals": int(intervals["open"].sum()) if len(intervals) else 0,
        "partitions_with_offline": len(touched),
        "offline_ms_total": int(per["offline_ms"].sum()),
        "under_min_isr_ms_total": int(per["under_min_isr_ms"].sum()),
        "elr_ms_total": int(per["elr_ms"].sum()),
        "duration_ms": pct,
    }
    s = res.stats
    res.summary = [
        f"offline audit of {source_text(inp)} ({window_text(inp)})",
        f"partitions: {s['partitions']:,}; offline at some point: {s['partitions_with_offline']:,};"
        f" offline intervals: {s['intervals']:,} ({s['open_intervals']} still open)",
        f"offline interval durations: p50 {fmt_ms(pct['p50'])}, p99 {fmt_ms(pct['p99'])}, "
        f"max {fmt_ms(pct['max'])}; total offline {fmt_ms(s['offline_ms_total'])}",
        f"time under MinISR (all partitions): {fmt_ms(s['under_min_isr_ms_total'])}; "
        f"time with a non-empty ELR: {fmt_ms(s['elr_ms_total'])}",
    ]
    worst = per.sort_values(["offline_ms", "under_min_isr_ms"], ascending=False).head(top)
    worst = worst[(worst["offline_ms"] > 0) | (worst["under_min_isr_ms"] > 0)]
    for r in worst.head(10).itertuples(index=False):
        res.summary.append(
            f"  {r.cluster}/{r.topic}-{r.partition}: offline {fmt_ms(r.offline_ms)} in "
            f"{r.offline_intervals} interval(s) (max {fmt_ms(r.offline_max_ms)}), under MinISR "
            f"{fmt_ms(r.under_min_isr_ms)}, ELR {fmt_ms(r.elr_ms)}"
            + (", offline now" if r.offline_now else "")
        )
    if len(intervals):
        res.html.append(
            section(
                "Offline interval durations",
                log_histogram(intervals["duration_ms"].tolist(), title="offline intervals"),
            )
        )
    if not worst.empty:
        labels = [f"{r.topic}-{r.partition}" for r in worst.itertuples(index=False)]
        res.html.append(
            section(
                f"Top {len(worst)} partitions by time offline",
                bar_chart(
                    labels,
                    {
                        "offline (min)": (worst["offline_ms"] / 60000).tolist(),
                        "under MinISR (min)": (worst["under_min_isr_ms"] / 60000).tolist(),
                    },
                    title="minutes offline and under MinISR (stacked)",
                    y_label="minutes",
                ),
                table_html(worst),
            )
        )
    res.html.append(section("Offline intervals", table_html(intervals)))
    return res
