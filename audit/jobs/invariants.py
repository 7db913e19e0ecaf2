"""``invariants``: replay every partition's history and flag every violation of the rules.

The rules are `audit.rules`, the checker `audit.partition_checker` (fed from decoded
records by `audit.log_checker`); every method feeds the same checker, and
the plain pass (`audit.plain`) too. Three ways to get each partition's events to it in
offset order (`pick_method`):

* ``buckets`` (a `metactl log export` with its manifest): one Spark task per bucket of
  partition records (`audit.buckets`) reads its files and every broker-, topic- and
  cluster-level event with Arrow, and feeds them in offset order to a `LogChecker`,
  exactly as the plain pass feeds it a log (`invariant_rows.feed_rows`). The export grouped each
  partition's history: no shuffle, no sort, only violations reach the JVM.
* ``logs`` (data directories): one task per core reads every log and checks the
  partitions of its hash bucket (`audit.log_checker.bucket_of`).
* ``rows`` (any input, e.g. Parquet of another layout): the partition records of one
  scan, plus the broker-, topic- and cluster-level events each partition must see,
  joined in from a cheap second scan: every unclean RegisterBroker and every
  UnregisterBroker fanned out to the partitions that have or had a replica on that broker
  (assignments, and the replicas a reassignment set), every ClearElr and RemoveTopic to
  the partitions of its topic, every eligible.leader.replicas.version FeatureLevel to
  every partition of the cluster. The union is shuffled by partition, sorted by offset
  within each Spark partition, and a ``mapInArrow`` function runs one `PartitionChecker`
  per metadata partition over the sorted stream (`invariant_rows.feed_sorted`).

The Python loops that feed the checkers from rows are `audit.invariant_rows`'s: they read
Arrow columns in bulk, and run with the garbage collector paused. Each checker also
emits one statistics row (``_checked``). Violations are reported in [since, until); the
replay always starts at the beginning.

This module owns the job's methods (what each reads, how Spark runs it) and its report.
It must not judge a record itself: the rules are the checker's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from audit.buckets import by_cluster, committed, export_root, read_bucket, read_events, run_buckets
from audit.invariant_rows import (
    OUTPUT_DDL,
    STATS_RULE,
    check_sorted,
    checker_rows,
    feed_rows,
    to_batch,
)
from audit.jobs.common import (
    JobResult,
    counts_text,
    fmt_time,
    lifecycle,
    nullable_ints,
    source_text,
    window_text,
)
from audit.lifecycle import Lifecycle
from audit.log_checker import LogChecker
from audit.logread import log_info
from audit.report import bar_chart, section, table_html
from audit.rows import paused_gc
from audit.rules import RULES, Violation
from audit.spark import AuditInput
from audit.transactions import committed_batches
from metadata_log.records import ELR_FEATURE

MAIN_COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
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
MAIN_TYPES = ("Partition", "PartitionChange", "UncleanRecovery")
SIDE_COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "partition",
    "broker",
    "clean",
    "replicas",
    "min_isr",
    "first_partition",
    "end_partition",
    "feature",
    "level",
)
SIDE_TYPES = (
    "Partition",
    "PartitionChange",
    "RegisterBroker",
    "ClearElr",
    "RemoveTopic",
    "UnregisterBroker",
    "FeatureLevel",
)
# The broker-, topic- and cluster-level events (what the bucket method reads in full).
EVENT_TYPES = ("RegisterBroker", "ClearElr", "RemoveTopic", "UnregisterBroker", "FeatureLevel")
EVENT_COLUMNS = (
    "cluster",
    "offset",
    "timestamp",
    "record_type",
    "topic",
    "broker",
    "clean",
    "min_isr",
    "first_partition",
    "end_partition",
    "feature",
    "level",
)
# Of the PartitionChange records only those that set replicas (a reassignment's): the
# byte pre-filter skips every batch without one.
SIDE_ANY_OF = ",".join(
    [f"record_type={t}" for t in SIDE_TYPES if t != "PartitionChange"] + ["replicas"]
)


# --- the rows method: any input, through Spark's shuffle --------------------------------------


def events(spark: Any, inp: AuditInput) -> tuple[Any, Any]:
    """Every event each partition's checker must see (MAIN_COLUMNS plus ``broker``), and
    the cached side input they were joined from."""
    from pyspark.sql import functions as F

    main = inp.load(spark, MAIN_COLUMNS, MAIN_TYPES)
    side = inp.load(spark, SIDE_COLUMNS, SIDE_TYPES, any_of=SIDE_ANY_OF)
    side = side.cache()
    rt = F.col("record_type")
    created = side.where(rt == "Partition").select("cluster", "topic", "partition").distinct()
    # Every broker that is or was a replica of each partition (a reassignment adds some):
    # the checker ignores a broker event of a broker that is not a replica at the time.
    replicas = (
        side.where(rt.isin("Partition", "PartitionChange") & F.col("replicas").isNotNull())
        .select("cluster", "topic", "partition", F.explode("replicas").alias("broker"))
        .distinct()
    )
    head = ["cluster", "offset", "timestamp", "record_type"]
    unclean = side.where((rt == "RegisterBroker") & ~F.col("clean")).select(*head, "broker")
    unregistered = side.where(rt == "UnregisterBroker").select(*head, "broker")
    by_broker = unclean.unionByName(unregistered).join(replicas, ["cluster", "broker"])
    by_topic = (
        side.where(rt.isin("ClearElr", "RemoveTopic"))
        .select(*head, "topic", "min_isr", "first_partition", "end_partition")
        .join(created, ["cluster", "topic"])
    )
    features = (
        side.where((rt == "FeatureLevel") & (F.col("feature") == ELR_FEATURE))
        .select(*head, "level")
        .join(created, ["cluster"])
    )
    out = main
    for fanned in (by_broker, by_topic, features):
        out = out.unionByName(fanned, allowMissingColumns=True)
    return out, side


def violations_from_rows(spark: Any, inp: AuditInput) -> tuple[Any, Any]:
    """Checker output from flat rows (any input): shuffle by partition, sort, check.

    Returns the output DataFrame and the cached side input (unpersist it when done).
    """
    evts, side = events(spark, inp)
    key = ["cluster", "topic", "partition"]
    n = int(spark.conf.get("spark.sql.shuffle.partitions"))
    out = (
        evts.repartition(n, *key)
        .sortWithinPartitions(*key, "offset")
        .mapInArrow(check_sorted, OUTPUT_DDL)
    )
    return out, side


# --- the buckets method: an export of this layout, no shuffle ----------------------------------


def check_bucket(
    root: str,
    bucket: int,
    *,
    aborted: dict[str, list[tuple[int, int]]],
    until_ms: int | None,
) -> list[tuple[Any, ...]]:
    """Checker output for one bucket of an export (`audit.buckets`): its partition records
    and every broker-, topic- and cluster-level event, merged in offset order per cluster
    and fed to a `LogChecker`, exactly as the plain pass feeds it a log."""
    parts = read_bucket(root, bucket, MAIN_COLUMNS)
    if parts is None:
        return []
    events = read_events(root, EVENT_COLUMNS, EVENT_TYPES)
    with paused_gc():
        side = by_cluster(None if events is None else committed(events, aborted, until_ms))
        out: list[tuple[Any, ...]] = []
        for name, mine in sorted(by_cluster(committed(parts, aborted, until_ms)).items()):
            lc = LogChecker(name)
            feed_rows(lc, mine, side[name].to_pylist() if name in side else [])
            for c in lc.finish():
                checker_rows(c, out)
        return out


def violations_from_buckets(spark: Any, inp: AuditInput) -> Any:
    """Checker output from an export's buckets: one task per bucket of partition records,
    which reads its own files and every broker-level event with Arrow and checks them.
    No shuffle: the export already grouped each partition's history."""
    aborted = inp.aborted(spark)
    until = inp.until_ms

    def check(root: str, bucket: int) -> pa.RecordBatch | None:
        rows = check_bucket(root, bucket, aborted=aborted, until_ms=until)
        return to_batch(rows) if rows else None

    return run_buckets(spark, inp, check, OUTPUT_DDL)


# --- the logs method: data directories, no rows at all --------------------------------------


def violations_from_logs(spark: Any, inp: AuditInput, buckets: int | None = None) -> Any:
    """Checker output straight from data directories: no shuffle, no per-record rows.

    A DataFrame of `buckets` work items (default: one per core), one per Spark partition;
    each task reads every log with the data source's reader (`audit.logread`), decodes
    every batch with `records.decode_batch` and checks the partitions of its bucket
    (`audit.log_checker.bucket_of`). Only violations and statistics reach the JVM. Shipping
    every record through the JVM to group it costs more than checking it (see the module
    documentation of `bench/spark_audit.py`).
    """
    from audit.source import resolve_sources

    k = buckets or max(1, int(spark.sparkContext.defaultParallelism))
    sources = [
        (log_info(src.path).path, src.cluster)
        for src in resolve_sources(list(inp.data_dirs), list(inp.clusters))
    ]
    until = inp.until_ms

    def check(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: list[tuple[Any, ...]] = []
        for batch in batches:
            for bucket in batch.column("id").to_pylist():
                for path, cluster in sources:
                    info = log_info(path)
                    lc = LogChecker(cluster, int(bucket), k)
                    stored = committed_batches(path, info.start_offset, info.end_offset, until)
                    with paused_gc():
                        for base, ts, records in stored:
                            lc.feed(base, ts, records)
                    for c in lc.finish():
                        checker_rows(c, out)
        if out:
            yield to_batch(out)

    return spark.range(0, k, 1, k).mapInArrow(check, OUTPUT_DDL)


METHODS = ("auto", "logs", "rows", "buckets")


def pick_method(inp: AuditInput, method: str = "auto") -> str:
    """``auto``: logs for data directories, buckets for an export with a manifest, else
    rows. An explicit method that cannot read the input is INVALID_CONFIG's ValueError."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    if method == "auto":
        if inp.data_dirs:
            return "logs"
        return "buckets" if export_root(inp) is not None else "rows"
    if method == "logs" and not inp.data_dirs:
        raise ValueError("--method logs reads data directories (--data-dir)")
    if method == "buckets" and export_root(inp) is None:
        raise ValueError(
            "--method buckets reads a local `metactl log export` directory of this version "
            "(--parquet, with its _metactl.json)"
        )
    return method


def run(spark: Any, inp: AuditInput, *, show: int = 20, method: str = "auto") -> JobResult:
    """`method`: ``logs`` (data directories), ``buckets`` (an export of this layout),
    ``rows`` (any input) or ``auto`` (see `pick_method`)."""
    from audit.progress import step

    chosen = pick_method(inp, method)
    step(spark, "invariants: topics and brokers")
    life = lifecycle(spark, inp)
    replay = f"invariants: each partition's history replayed ({chosen})"
    if chosen == "logs":
        step(spark, replay)
        rows = violations_from_logs(spark, inp).toPandas()
    elif chosen == "buckets":
        step(spark, replay)
        rows = violations_from_buckets(spark, inp).toPandas()
    else:
        step(spark, "invariants: the events each partition must see")
        out, side = violations_from_rows(spark, inp)
        try:
            step(spark, replay)
            rows = out.toPandas()
        finally:
            side.unpersist()
    return _result(inp, rows, show, life)


def _result(
    inp: AuditInput, rows: pd.DataFrame, show: int, life: Lifecycle | None = None
) -> JobResult:
    life = life if life is not None else Lifecycle()
    res = JobResult("invariants")
    stats = rows[rows["rule"] == STATS_RULE]
    found = rows[rows["rule"] != STATS_RULE].drop(columns=["records", "skipped", "generations"])
    # The statistics rows left these nullable: floats in pandas. Integers stay integers.
    found = nullable_ints(found.copy(), ["offset", "broker"])
    found.insert(
        found.columns.get_loc("partition"),
        "topic_id",
        pd.Series(
            life.topic_ids(found["cluster"], found["topic"], found["offset"]).to_pylist(),
            index=found.index,
            dtype=object,
        ),
    )
    if inp.since_ms is not None:
        when = pd.to_datetime(found["timestamp"], utc=True)
        found = found[when >= pd.Timestamp(inp.since_ms, unit="ms", tz="UTC")]
    found = found.sort_values(["cluster", "offset", "topic", "partition", "rule"]).reset_index(
        drop=True
    )
    by_rule = found["rule"].value_counts().to_dict()
    res.tables = {"violations": found}
    res.stats = {
        "partitions": int(stats["generations"].sum()),
        "records": int(stats["records"].sum()),
        "skipped": int(stats["skipped"].sum()),
        "violations": len(found),
        "by_rule": {str(k): int(v) for k, v in by_rule.items()},
    }
    s = res.stats
    res.exit_status = 1 if len(found) else 0
    res.summary = [
        f"invariants audit of {source_text(inp)} ({window_text(inp)})",
        f"replayed {s['records']:,} partition events over {s['partitions']:,} partitions"
        + (
            f" ({s['skipped']:,} events before their partition's creation skipped)"
            if s["skipped"]
            else ""
        ),
        f"violations: {s['violations']:,}"
        + (f" ({counts_text(s['by_rule'])})" if len(found) else ""),
    ]
    for rule, text in RULES.items():
        res.summary.append(f"  {by_rule.get(rule, 0):>8,}  {rule}: {text}")
    for r in found.head(show).itertuples(index=False):
        ts = pd.Timestamp(r.timestamp).value // 1_000_000
        name = life.partition_label(r.cluster, r.topic, r.topic_id, r.partition)
        res.summary.append(
            f"  {fmt_time(ts)} offset {r.offset} {r.cluster}/{name}: {r.rule}: {r.detail}"
        )
    if len(found) > show:
        res.summary.append(f"  ... {len(found) - show:,} more in violations")
    if len(found):
        res.html.append(
            section(
                "Violations per rule",
                bar_chart(
                    list(by_rule),
                    {"violations": list(by_rule.values())},
                    title="violations per rule",
                    y_label="violations",
                    width=800,
                ),
            )
        )
    res.html.append(section("Violations", table_html(found)))
    return res


def violation_rows(found: list[Violation]) -> list[tuple[Any, ...]]:
    """Violations as comparable tuples (cluster, topic, partition, offset, rule, broker)."""
    return sorted((v.cluster, v.topic, v.partition, v.offset, v.rule, v.broker) for v in found)
