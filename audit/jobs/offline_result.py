"""The ``offline`` job's report: its intervals classified, its tables, summary and charts.

Every path of the job (`audit.jobs.offline`: buckets, logs, rows) and the plain pass
(`audit.plain`) hand `_result` the same per-partition measures, with each partition's
intervals as its history left them: closed by a leader, or without one at the end of
the partition's history. `classify` says how each of the latter ended (`ENDED`), from
the input's `audit.lifecycle.Lifecycle`: the topic was deleted, the cluster was stopped
cleanly, or the interval is still open; and which intervals are outages (the module
documentation of `audit.jobs.offline` states the rule; audit/README.md too).

It must not compute measures from records (the paths do), nor run Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pandas as pd

from audit.jobs.common import (
    JobResult,
    fmt_ms,
    fmt_time,
    nullable_ints,
    percentiles,
    source_text,
    window_text,
)
from audit.lifecycle import Lifecycle
from audit.report import bar_chart, log_histogram, section, table_html
from audit.spark import AuditInput

# How an interval ended: a leader was elected; the topic was deleted; it began in the
# cluster's final clean shutdown; still open at the end of the history.
LEADER: Final = "leader"
DELETED: Final = "topic_deleted"
STOPPED: Final = "stopped"
OPEN: Final = "open"
ENDED: Final = (LEADER, DELETED, STOPPED, OPEN)

PARTITION = ["cluster", "topic", "topic_id", "partition"]
INTERVAL_COLUMNS = [
    *PARTITION,
    "offset",
    "start",
    "end",
    "ended",
    "open",
    "outage",
    "duration_ms",
]
CHART_TITLE = "minutes offline, and under MinISR while led (stacked: offline or under MinISR)"


def chart_series(offline_ms: Any, under_min_isr_led_ms: Any) -> dict[str, Sequence[float]]:
    """The report's stacked bars, in minutes: time offline, and time under MinISR with a
    leader. Offline time is mostly under MinISR too (an empty ISR), so stacking the time
    under MinISR itself counted it twice (issue 22: 0.78 min shown for 0.52); these two
    never overlap, and a bar is the time the partition was offline or under MinISR."""
    return {
        "offline (min)": [ms / 60_000 for ms in offline_ms],
        "under MinISR, led (min)": [ms / 60_000 for ms in under_min_isr_led_ms],
    }


def classify(
    cluster: str, topic_id: str, offset: int, *, closed: bool, duration_ms: int, life: Lifecycle
) -> tuple[str, bool]:
    """(how the interval ended, whether it is an outage)."""
    if closed:
        return LEADER, duration_ms > 0
    if topic_id and (cluster, topic_id) in life.removed:
        return DELETED, duration_ms > 0
    stop = life.stops.get(cluster)
    if stop is not None and offset >= stop.offset:
        return STOPPED, False
    return OPEN, True


def _intervals(per: pd.DataFrame, since: int | None, life: Lifecycle) -> pd.DataFrame:
    records = []
    for row in per.itertuples(index=False):
        for iv in row.intervals if row.intervals is not None else []:
            start = iv["start_ms"] if since is None else max(iv["start_ms"], since)
            duration = int(max(0, iv["end_ms"] - start))
            ended, outage = classify(
                row.cluster,
                row.topic_id,
                iv["offset"],
                closed=not iv["open"],
                duration_ms=duration,
                life=life,
            )
            records.append(
                {
                    "cluster": row.cluster,
                    "topic": row.topic,
                    "topic_id": row.topic_id,
                    "partition": row.partition,
                    "offset": iv["offset"],
                    "start": pd.Timestamp(iv["start_ms"], unit="ms", tz="UTC"),
                    "end": pd.Timestamp(iv["end_ms"], unit="ms", tz="UTC"),
                    "ended": ended,
                    "open": ended == OPEN,
                    "outage": outage,
                    "duration_ms": duration,
                }
            )
    intervals = pd.DataFrame.from_records(records, columns=INTERVAL_COLUMNS)
    intervals["duration_ms"] = intervals["duration_ms"].astype("int64")
    for col in ("open", "outage"):
        intervals[col] = intervals[col].astype(bool)
    return intervals


def _per_partition(per: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """The per-partition table: outages counted and measured, stopped time taken out."""
    per = per.drop(columns=["intervals"])
    outages = intervals[intervals["outage"]]
    grouped = outages.groupby(PARTITION)["duration_ms"]
    agg = pd.DataFrame(
        {
            "offline_intervals": grouped.size(),
            "offline_p50_ms": grouped.quantile(0.5),
            "offline_p99_ms": grouped.quantile(0.99),
            "offline_max_ms": grouped.max(),
        }
    ).reset_index()
    stopped = intervals[intervals["ended"] == STOPPED]
    took = stopped.groupby(PARTITION)["duration_ms"].sum().rename("stopped_ms").reset_index()
    still = intervals[intervals["ended"] == OPEN].groupby(PARTITION).size().rename("open_n")
    per = per.merge(agg, on=PARTITION, how="left").merge(took, on=PARTITION, how="left")
    per = per.merge(still.reset_index(), on=PARTITION, how="left")
    per["offline_intervals"] = per["offline_intervals"].fillna(0).astype("int64")
    per["offline_ms"] = (per["offline_ms"] - per["stopped_ms"].fillna(0)).astype("int64")
    per["offline_now"] = per["open_n"].fillna(0) > 0
    per["offline_at_stop"] = per["stopped_ms"].notna()
    for col in ("offline_p50_ms", "offline_p99_ms"):
        per[col] = per[col].astype(float)
    return nullable_ints(per, ["offline_max_ms"])


def _result(
    inp: AuditInput, per: pd.DataFrame, top: int, life: Lifecycle | None = None
) -> JobResult:
    life = life if life is not None else Lifecycle()
    res = JobResult("offline")
    if "topic_id" not in per.columns:  # a per-partition table of a single generation each
        per = per.assign(topic_id="")
    intervals = _intervals(per, inp.since_ms, life)
    per = _per_partition(per, intervals)
    led_under = per["under_min_isr_led_ms"]  # the chart's; not a column of the table
    per = per[
        [
            *PARTITION,
            "offline_intervals",
            "offline_ms",
            "offline_p50_ms",
            "offline_p99_ms",
            "offline_max_ms",
            "under_min_isr_ms",
            "elr_ms",
            "offline_now",
            "offline_at_stop",
        ]
    ]
    res.tables = {"offline_partitions": per, "offline_intervals": intervals}
    outages = intervals[intervals["outage"]]
    ended = intervals["ended"]
    pct = percentiles(outages["duration_ms"])
    touched = per[per["offline_intervals"] > 0]
    stops = {c: life.stops[c] for c in sorted(set(per["cluster"]) & set(life.stops))}
    res.stats = {
        "partitions": len(per),
        "intervals": len(outages),
        "open_intervals": int((ended == OPEN).sum()),
        "stopped_intervals": int((ended == STOPPED).sum()),
        "instant_intervals": int(((ended != STOPPED) & ~intervals["outage"]).sum()),
        "partitions_with_offline": len(touched),
        "offline_ms_total": int(per["offline_ms"].sum()),
        "under_min_isr_ms_total": int(per["under_min_isr_ms"].sum()),
        "elr_ms_total": int(per["elr_ms"].sum()),
        "duration_ms": pct,
        "stopped_at_ms": {c: stop.ts_ms for c, stop in stops.items()},
    }
    s = res.stats
    res.summary = [
        f"offline audit of {source_text(inp)} ({window_text(inp)})",
        f"partitions: {s['partitions']:,}; offline at some point: {s['partitions_with_offline']:,};"
        f" offline intervals: {s['intervals']:,} ({s['open_intervals']} still open)",
    ]
    for cluster, stop in stops.items():
        n = int(((intervals["cluster"] == cluster) & (ended == STOPPED)).sum())
        res.summary.append(
            f"  {cluster} was stopped cleanly at {fmt_time(stop.ts_ms)} (a controlled shutdown "
            f"of every broker): {n:,} partition(s) lost their leader in the shutdown, "
            "not counted as offline"
        )
    if s["instant_intervals"]:
        res.summary.append(
            f"  {s['instant_intervals']:,} interval(s) of 0 ms (a leader again within the "
            "millisecond) not counted as offline"
        )
    res.summary += [
        f"offline interval durations: p50 {fmt_ms(pct['p50'])}, p99 {fmt_ms(pct['p99'])}, "
        f"max {fmt_ms(pct['max'])}; total offline {fmt_ms(s['offline_ms_total'])}",
        f"time under MinISR (all partitions): {fmt_ms(s['under_min_isr_ms_total'])}; "
        f"time with a non-empty ELR: {fmt_ms(s['elr_ms_total'])}",
    ]
    worst = per.sort_values(["offline_ms", "under_min_isr_ms"], ascending=False).head(top)
    worst = worst[
        (worst["offline_ms"] > 0) | (worst["under_min_isr_ms"] > 0) | worst["offline_now"]
    ]
    for r in worst.head(10).itertuples(index=False):
        name = life.partition_label(r.cluster, r.topic, r.topic_id, r.partition)
        res.summary.append(
            f"  {r.cluster}/{name}: offline {fmt_ms(r.offline_ms)} in "
            f"{r.offline_intervals} interval(s) (max {fmt_ms(_or_none(r.offline_max_ms))}), "
            f"under MinISR {fmt_ms(r.under_min_isr_ms)}, ELR {fmt_ms(r.elr_ms)}"
            + (", offline now" if r.offline_now else "")
        )
    if len(outages):
        res.html.append(
            section(
                "Offline interval durations",
                log_histogram(outages["duration_ms"].tolist(), title="offline intervals"),
            )
        )
    if not worst.empty:
        labels = [
            life.partition_label(r.cluster, r.topic, r.topic_id, r.partition)
            for r in worst.itertuples(index=False)
        ]
        res.html.append(
            section(
                f"Top {len(worst)} partitions by time offline",
                bar_chart(
                    labels,
                    chart_series(worst["offline_ms"], led_under.loc[worst.index]),
                    title=CHART_TITLE,
                    y_label="minutes",
                ),
                table_html(worst),
            )
        )
    res.html.append(section("Offline intervals", table_html(intervals)))
    return res


def _or_none(value: Any) -> Any:
    return (
        None
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        else value
    )
