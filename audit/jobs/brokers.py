"""``brokers``: fences, unfences, registrations (clean and unclean), unregistrations and
flapping, per broker.

Counted in the [since, until) window. A fence is a FenceBrokerRecord (any reason: a
session timeout, an operator, or ``reregistration`` when a broker in controlled shutdown
registers again) or a BrokerRegistrationChange that sets ``fenced``. A broker *flaps*
when more than ``flap_fences`` fences fall within some ``flap_window`` (a sliding window
ending at each fence); its worst window ends at the earliest fence with the most fences
in the window before it.
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
    ms_col,
    source_text,
    window_text,
)
from audit.report import bar_chart, section, table_html
from audit.spark import AuditInput

COLUMNS = ("cluster", "offset", "timestamp", "record_type", "broker", "clean", "reason")
TYPES = (
    "RegisterBroker",
    "FenceBroker",
    "UnfenceBroker",
    "BrokerRegistrationChange",
    "UnregisterBroker",
)


def run(
    spark: Any, inp: AuditInput, *, flap_fences: int = 3, flap_window_ms: int = 600_000
) -> JobResult:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from audit.progress import step

    if flap_fences < 0 or flap_window_ms <= 0:
        raise ValueError("flap_fences must be >= 0 and the flap window positive")
    step(spark, "brokers: fences, registrations and flapping per broker")
    events = (
        inp.load(spark, COLUMNS, TYPES)
        .withColumn("ts_ms", ms_col("timestamp"))
        .where(in_window(F.col("ts_ms"), inp))
    )
    rt = F.col("record_type")
    is_fence = (rt == "FenceBroker") | (
        (rt == "BrokerRegistrationChange") & (F.col("reason") == "fenced")
    )
    is_unfence = (rt == "UnfenceBroker") | (
        (rt == "BrokerRegistrationChange") & (F.col("reason") == "unfenced")
    )
    fences = events.where(is_fence)
    recent = (
        Window.partitionBy("cluster", "broker")
        .orderBy("ts_ms")
        .rangeBetween(-(flap_window_ms - 1), 0)
    )
    # The worst window: the most fences, ending at the earliest fence that reaches that
    # many (a struct's max: deterministic, where max_by would pick any of equal counts).
    worst = F.max(F.struct(F.col("fences_in_window").alias("n"), (-F.col("ts_ms")).alias("t")))
    flap = (
        fences.withColumn("fences_in_window", F.count(F.lit(1)).over(recent))
        .groupBy("cluster", "broker")
        .agg(worst.alias("worst"))
        .select(
            "cluster",
            "broker",
            F.col("worst.n").alias("max_fences_in_window"),
            (-F.col("worst.t")).alias("worst_window_end_ms"),
        )
    )

    def n(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

    counts = events.groupBy("cluster", "broker").agg(
        n(is_fence).alias("fences"),
        n(is_unfence).alias("unfences"),
        n(rt == "RegisterBroker").alias("registrations"),
        n((rt == "RegisterBroker") & ~F.col("clean")).alias("unclean_registrations"),
        n((rt == "BrokerRegistrationChange") & (F.col("reason") == "controlled_shutdown")).alias(
            "controlled_shutdowns"
        ),
        n((rt == "FenceBroker") & (F.col("reason") == "session_timeout")).alias("session_timeouts"),
        n(rt == "UnregisterBroker").alias("unregistrations"),
        F.min(F.when(rt == "RegisterBroker", F.col("timestamp"))).alias("first_registration"),
        F.max(F.when(is_fence, F.col("timestamp"))).alias("last_fence"),
    )
    table = (
        counts.join(flap, ["cluster", "broker"], "left")
        .withColumn("max_fences_in_window", F.coalesce("max_fences_in_window", F.lit(0)))
        .withColumn("flapping", F.col("max_fences_in_window") > flap_fences)
        .toPandas()
        .sort_values(["cluster", "broker"])
        .reset_index(drop=True)
    )
    reasons = (
        fences.groupBy("reason").count().toPandas().sort_values("count", ascending=False)
        if not table.empty
        else pd.DataFrame(columns=["reason", "count"])
    )
    return _result(inp, table, reasons, flap_fences, flap_window_ms)


def _result(
    inp: AuditInput, table: pd.DataFrame, reasons: pd.DataFrame, flap_n: int, flap_ms: int
) -> JobResult:
    res = JobResult("brokers")
    table["worst_window_end"] = pd.to_datetime(table["worst_window_end_ms"], unit="ms", utc=True)
    table = table.drop(columns=["worst_window_end_ms"])
    flapping = table[table["flapping"]]
    res.tables = {"brokers": table, "flapping": flapping.reset_index(drop=True)}
    res.stats = {
        "brokers": len(table),
        "fences": int(table["fences"].sum()),
        "unfences": int(table["unfences"].sum()),
        "registrations": int(table["registrations"].sum()),
        "unclean_registrations": int(table["unclean_registrations"].sum()),
        "unregistrations": int(table["unregistrations"].sum()),
        "flapping": sorted(int(b) for b in flapping["broker"]),
        "fence_reasons": {
            str(r): int(c) for r, c in zip(reasons["reason"], reasons["count"], strict=True)
        },
    }
    s = res.stats
    res.summary = [
        f"brokers audit of {source_text(inp)} ({window_text(inp)})",
        f"brokers: {s['brokers']}; fences: {s['fences']:,} ({counts_text(s['fence_reasons'])}); "
        f"unfences: {s['unfences']:,}",
        f"registrations: {s['registrations']:,}, of which unclean: "
        f"{s['unclean_registrations']:,}; unregistrations: {s['unregistrations']:,}",
        f"flapping (> {flap_n} fences within {fmt_ms(flap_ms)}): "
        + (", ".join(str(b) for b in s["flapping"]) if s["flapping"] else "none"),
    ]
    for r in flapping.itertuples(index=False):
        end_ms = pd.Timestamp(r.worst_window_end).value // 1_000_000
        res.summary.append(
            f"  broker {r.broker} ({r.cluster}): {r.max_fences_in_window} fences in the "
            f"{fmt_ms(flap_ms)} up to {fmt_time(end_ms)}"
        )
    top = table.sort_values(["fences", "broker"], ascending=[False, True]).head(10)
    for r in top.itertuples(index=False):
        if r.fences or r.unclean_registrations:
            res.summary.append(
                f"  broker {r.broker} ({r.cluster}): {r.fences} fences, {r.unfences} unfences, "
                f"{r.registrations} registrations ({r.unclean_registrations} unclean)"
            )
    if not table.empty:
        multi = table["cluster"].nunique() > 1
        labels = [
            f"{r.cluster}/{r.broker}" if multi else str(r.broker)
            for r in table.itertuples(index=False)
        ]
        res.html.append(
            section(
                "Fences and unclean registrations per broker",
                bar_chart(
                    labels,
                    {
                        "fences": table["fences"].tolist(),
                        "unclean registrations": table["unclean_registrations"].tolist(),
                    },
                    title="fences and unclean registrations (stacked)",
                    y_label="count",
                ),
            )
        )
    res.html.append(section("Flapping brokers", table_html(flapping)))
    res.html.append(section("All brokers", table_html(table)))
    return res
