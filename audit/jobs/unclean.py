"""``unclean-recoveries``: every potential data-loss event, and how it was decided.

One row per UncleanRecoveryRecord in the window: strategy, trigger, the candidates and
what each reported (last leader epoch, log end offset), the chosen replica, and the margin
by which it won against the best other candidate (the runner-up): the difference in last
leader epoch when they differ, else in log end offset. ``margin_kind`` says which:
``epoch``, ``offset``, ``tie`` (equal logs; assignment order decided), ``uncontested``
(no other candidate reported), or ``not_reported`` (the chosen replica reported nothing:
an operator's pick without an answer). A negative margin means the chosen replica's log
was behind the runner-up's (possible for an operator's manual election).

``time_to_recovery_ms`` is the recovery record's timestamp minus the time the partition's
leader last became -1 before it (from the log itself; a partition is a generation of its
topic, `audit.lifecycle`: ``topic_id`` says which). ``offline_since`` is what the
controller recorded as the start of the pending recovery.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from audit.jobs.common import (
    JobResult,
    counts_text,
    fmt_ms,
    fmt_time,
    in_window,
    lifecycle,
    ms_col,
    nullable_ints,
    percentiles,
    source_text,
    window_text,
    with_topic_ids,
)
from audit.lifecycle import Lifecycle
from audit.report import bar_chart, log_histogram, section, table_html
from audit.spark import AuditInput

COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "partition",
    "leader",
    "strategy",
    "chosen",
    "candidates",
    "potential_data_loss",
    "trigger",
    "offline_since",
)

# Best first: higher last leader epoch, then higher log end offset.
_BEST_FIRST = (
    "(a, b) -> CASE "
    "WHEN a.last_leader_epoch > b.last_leader_epoch THEN -1 "
    "WHEN a.last_leader_epoch < b.last_leader_epoch THEN 1 "
    "WHEN a.log_end_offset > b.log_end_offset THEN -1 "
    "WHEN a.log_end_offset < b.log_end_offset THEN 1 ELSE 0 END"
)

OUTPUT_COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "topic",
    "topic_id",
    "partition",
    "strategy",
    "trigger",
    "chosen",
    "chosen_last_leader_epoch",
    "chosen_log_end_offset",
    "runner_up",
    "runner_up_last_leader_epoch",
    "runner_up_log_end_offset",
    "margin_kind",
    "margin",
    "candidates",
    "candidates_reported",
    "potential_data_loss",
    "offline_start",
    "time_to_recovery_ms",
    "offline_since",
)


# Integer columns a recovery may leave empty (pandas' nullable Int64, not floats).
NULLABLE_INTS = (
    "chosen_last_leader_epoch",
    "chosen_log_end_offset",
    "runner_up",
    "runner_up_last_leader_epoch",
    "runner_up_log_end_offset",
    "margin",
    "time_to_recovery_ms",
)


def recoveries(spark: Any, inp: AuditInput, life: Lifecycle | None = None) -> Any:
    """The recovery rows as a Spark DataFrame (OUTPUT_COLUMNS)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    is_recovery = F.col("record_type") == "UncleanRecovery"
    events = inp.load(
        spark,
        COLUMNS,
        ["PartitionChange", "UncleanRecovery"],
        any_of="record_type=UncleanRecovery,leader=-1",
    )
    events = with_topic_ids(events, life if life is not None else lifecycle(spark, inp))
    before = (
        Window.partitionBy("cluster", "topic", "topic_id", "partition")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    went_offline = F.last(
        F.when(F.col("record_type") == "PartitionChange", F.col("timestamp")), ignorenulls=True
    ).over(before)
    rec = (
        events.withColumn("offline_start", went_offline)
        .where(is_recovery)
        .where(in_window(ms_col("timestamp"), inp))
    )
    winner = F.expr("try_element_at(filter(candidates, c -> c.broker = chosen), 1)")
    runner_up = F.expr(
        f"try_element_at(array_sort(filter(candidates, c -> c.broker != chosen), {_BEST_FIRST}), 1)"
    )
    rec = rec.withColumn("w", winner).withColumn("r", runner_up)
    w_epoch, w_leo = F.col("w.last_leader_epoch"), F.col("w.log_end_offset")
    r_epoch, r_leo = F.col("r.last_leader_epoch"), F.col("r.log_end_offset")
    kind = (
        F.when(F.col("w").isNull(), F.lit("not_reported"))
        .when(F.col("r").isNull(), F.lit("uncontested"))
        .when(w_epoch != r_epoch, F.lit("epoch"))
        .when(w_leo != r_leo, F.lit("offset"))
        .otherwise(F.lit("tie"))
    )
    margin = (
        F.when(F.col("w").isNull() | F.col("r").isNull(), F.lit(None).cast("long"))
        .when(w_epoch != r_epoch, (w_epoch - r_epoch).cast("long"))
        .otherwise(w_leo - r_leo)
    )
    return rec.select(
        "cluster",
        "offset",
        "timestamp",
        "topic",
        "topic_id",
        "partition",
        "strategy",
        "trigger",
        "chosen",
        w_epoch.alias("chosen_last_leader_epoch"),
        w_leo.alias("chosen_log_end_offset"),
        F.col("r.broker").alias("runner_up"),
        r_epoch.alias("runner_up_last_leader_epoch"),
        r_leo.alias("runner_up_log_end_offset"),
        kind.alias("margin_kind"),
        margin.alias("margin"),
        "candidates",
        F.size(F.coalesce("candidates", F.array())).alias("candidates_reported"),
        "potential_data_loss",
        "offline_start",
        (ms_col("timestamp") - ms_col("offline_start")).alias("time_to_recovery_ms"),
        "offline_since",
    )


def run(spark: Any, inp: AuditInput, *, show: int = 20) -> JobResult:
    from audit.progress import step

    step(spark, "unclean-recoveries: topics and brokers")
    life = lifecycle(spark, inp)
    step(spark, "unclean-recoveries: the recoveries and their candidates")
    # Sorted here, not by Spark: a global sort would sample, i.e. scan the log twice.
    table = recoveries(spark, inp, life).toPandas().sort_values(["cluster", "offset"])
    table = table.reset_index(drop=True)
    return _result(inp, table, show, life)


def _broker(candidate: Any) -> int:
    return int(candidate["broker"])


def describe(row: Any, life: Lifecycle | None = None) -> str:
    """One line per recovery for the terminal."""
    cands = " ".join(
        f"{c['broker']}(epoch {c['last_leader_epoch']}, LEO {c['log_end_offset']})"
        # by broker id, the order every command prints candidates in
        for c in sorted(row.candidates if row.candidates is not None else [], key=_broker)
    )
    if row.margin_kind in ("epoch", "offset"):
        won = f"won on {row.margin_kind} by {row.margin}"
        if row.margin is not None and row.margin < 0:
            won = f"chosen despite being behind on {row.margin_kind} by {-row.margin}"
    else:
        won = row.margin_kind.replace("_", " ")
    offline = "-" if pd.isna(row.time_to_recovery_ms) else fmt_ms(row.time_to_recovery_ms)
    ts = pd.Timestamp(row.timestamp).value // 1_000_000
    topic_id = getattr(row, "topic_id", "")
    name = (life or Lifecycle()).partition_label(row.cluster, row.topic, topic_id, row.partition)
    return (
        f"  {fmt_time(ts)} {row.cluster}/{name} {row.strategy} "
        f"({row.trigger}) chose {row.chosen}; candidates: {cands or 'none'}; {won}; "
        f"offline {offline} before recovery"
    )


def _result(
    inp: AuditInput, table: pd.DataFrame, show: int, life: Lifecycle | None = None
) -> JobResult:
    res = JobResult("unclean-recoveries")
    table = nullable_ints(table.copy(), NULLABLE_INTS)
    res.tables = {"unclean_recoveries": table}
    n = len(table)
    strategies = table["strategy"].value_counts().to_dict() if n else {}
    triggers = table["trigger"].value_counts().to_dict() if n else {}
    margins = table["margin_kind"].value_counts().to_dict() if n else {}
    ttr = table["time_to_recovery_ms"].dropna() if n else pd.Series(dtype=float)
    pct = percentiles(ttr)
    flagged = int(table["potential_data_loss"].fillna(False).sum()) if n else 0
    res.stats = {
        "recoveries": n,
        "by_strategy": {str(k): int(v) for k, v in strategies.items()},
        "by_trigger": {str(k): int(v) for k, v in triggers.items()},
        "by_margin_kind": {str(k): int(v) for k, v in margins.items()},
        "time_to_recovery_ms": pct,
        "flagged_potential_data_loss": flagged,
    }
    res.summary = [
        f"unclean-recoveries audit of {source_text(inp)} ({window_text(inp)})",
        f"unclean recoveries (potential data-loss events): {n:,}"
        + (f", {n - flagged} NOT flagged as potential data loss" if flagged != n else ""),
    ]
    if n:
        res.summary += [
            f"  by strategy: {counts_text(res.stats['by_strategy'])}",
            f"  by trigger: {counts_text(res.stats['by_trigger'])}",
            f"  decided on: {counts_text(res.stats['by_margin_kind'])}",
            f"  offline before recovery: p50 {fmt_ms(pct['p50'])}, p99 {fmt_ms(pct['p99'])}, "
            f"max {fmt_ms(pct['max'])}",
        ]
        res.summary += [describe(r, life) for r in table.head(show).itertuples(index=False)]
        if n > show:
            res.summary.append(f"  ... {n - show:,} more in unclean_recoveries")
        days = (
            pd.to_datetime(table["timestamp"]).dt.strftime("%Y-%m-%d").value_counts().sort_index()
        )
        by_day = pd.crosstab(
            pd.to_datetime(table["timestamp"]).dt.strftime("%Y-%m-%d"), table["strategy"]
        ).reindex(days.index, fill_value=0)
        res.html.append(
            section(
                "Unclean recoveries per day",
                bar_chart(
                    list(by_day.index),
                    {str(c): by_day[c].tolist() for c in by_day.columns},
                    title="unclean recoveries per day, by strategy",
                    y_label="recoveries",
                ),
            )
        )
        res.html.append(
            section(
                "Time offline before recovery",
                log_histogram(ttr.tolist(), title="partitions offline before recovery"),
            )
        )
    shown = table.drop(columns=["candidates"]).copy() if n else table
    if n:
        shown.insert(
            shown.columns.get_loc("chosen"),
            "candidates",
            [
                " ".join(
                    f"{c['broker']}:e{c['last_leader_epoch']}/leo{c['log_end_offset']}"
                    for c in (cands if cands is not None else [])
                )
                for cands in table["candidates"]
            ],
        )
    res.html.append(section("Events", table_html(shown)))
    return res
