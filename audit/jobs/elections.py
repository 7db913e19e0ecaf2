"""``elections``: leader elections per topic and kind over time, and preferred-leader imbalance.

An election is a PartitionChange that names a newly elected leader (its
``election_kind``: isr, elr, unclean_recovery, preferred, manual). Elections are counted
in the [since, until) window, per time bucket (minute, hour or day, chosen from the span
unless given). Imbalance is measured at the end (until, or the end of the log): a
partition whose leader is not its first assigned replica (replicas[0], as the last
Partition record or reassignment left them); offline partitions (no leader) are counted
apart, and partitions of a topic deleted after their last record are not counted at all
(a topic created again under the name counts from its new partitions' records).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

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
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if bucket is not None and bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}")
    rows = (
        inp.load(spark, COLUMNS, ["Partition", "PartitionChange"], any_of="leader,replicas")
        .withColumn("ts_ms", ms_col("timestamp"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
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
        removed = (
            inp.load(spark, ("cluster", "offset", "topic"), ["RemoveTopic"])
            .groupBy("cluster", "topic")
            .agg(F.max("offset").alias("removed_at"))
        )
        final = (
            rows.groupBy("cluster", "topic", "partition")
            .agg(
                F.max("offset").alias("last_offset"),
                F.max_by("leader", F.when(F.col("leader").isNotNull(), F.col("offset"))).alias(
                    "leader"
                ),
                F.max_by("replicas", F.when(F.col("replicas").isNotNull(), F.col("offset"))).alias(
                    "replicas"
                ),
            )
            .where(F.col("replicas").isNotNull())
            .join(F.broadcast(removed), ["cluster", "topic"], "left")
            .where(F.col("removed_at").isNull() | (F.col("removed_at") < F.col("last_offset")))
            .drop("removed_at", "last_offset")
            .withColumn("preferred", F.element_at("replicas", 1))
            .toPandas()
            .sort_values(["cluster", "topic", "partition"])
            .reset_index(drop=True)
        )
    finally:
        rows.unpersist()
    return _result(inp, unit, by_bucket, final)


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
    leaders = (
        final[~final["offline"]].groupby(["cluster", "leader"]).size().rename("leads")
        if not final.empty
        else pd.Series(dtype="int64", name="leads")
    )
    preferred = final.groupby(["cluster", "preferred"]).size().rename("preferred_for")
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
