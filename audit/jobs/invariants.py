"""``invariants``: replay every partition's history and flag every violation of the rules.

The rules and the checker are in `audit.rules`. The Spark plan: the partition records
(Partition, PartitionChange, UncleanRecovery) of one scan, plus the broker-, topic- and
cluster-level events each partition must see, joined in from a cheap second scan: every
unclean RegisterBroker and every UnregisterBroker fanned out to the partitions that have
or had a replica on that broker (assignments, and the replicas a reassignment set), every
ClearElr and RemoveTopic to the partitions of its topic, every
eligible.leader.replicas.version FeatureLevel to every partition of the cluster. The
union is shuffled by partition, sorted by offset within each Spark partition, and a
``mapInArrow`` function runs one `PartitionChecker` per metadata partition over the
sorted stream (no per-group overhead, no pandas). Each checker also emits one
statistics row (``_checked``).

Violations are reported in [since, until); the replay always starts at the beginning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from audit.jobs.common import JobResult, counts_text, fmt_time, source_text, window_text
from audit.logread import log_info
from audit.report import bar_chart, section, table_html
from audit.rules import RULES, LogChecker, PartitionChecker, Violation
from audit.spark import AuditInput
from audit.transactions import committed_batches
from metadata_log.records import ELR_FEATURE

STATS_RULE = "_checked"

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
# Of the PartitionChange records only those that set replicas (a reassignment's): the
# byte pre-filter skips every batch without one.
SIDE_ANY_OF = ",".join(
    [f"record_type={t}" for t in SIDE_TYPES if t != "PartitionChange"] + ["replicas"]
)
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
    ]
)
OUTPUT_DDL = (
    "cluster string, topic string, partition int, offset long, timestamp timestamp, "
    "rule string, broker int, detail string, records long, skipped long"
)


def feed(checker: PartitionChecker, rt: str, offset: int, ts: int, row: dict[str, Any]) -> None:
    """Hand one event (a row of the audit schema, as a dict) to the partition's checker."""
    if rt == "PartitionChange":
        checker.on_change(
            offset,
            ts,
            reason=row["reason"],
            leader=row["leader"],
            isr=row["isr"],
            elr=row["elr"],
            last_known_elr=row["last_known_elr"],
            leader_epoch=row["leader_epoch"],
            partition_epoch=row["partition_epoch"],
            election=row["election_kind"],
            replicas=row["replicas"],
            adding=row["adding_replicas"],
            removing=row["removing_replicas"],
            min_isr=row["min_isr"],
        )
    elif rt == "Partition":
        checker.on_partition(
            offset,
            ts,
            isr=row["isr"] or (),
            elr=row["elr"],
            last_known_elr=row["last_known_elr"],
            leader=row["leader"],
            leader_epoch=row["leader_epoch"],
            partition_epoch=row["partition_epoch"],
            min_isr=row["min_isr"],
            replicas=row["replicas"],
            adding=row["adding_replicas"],
            removing=row["removing_replicas"],
        )
    elif rt == "UncleanRecovery":
        checker.on_recovery(offset, ts, chosen=row["chosen"])
    elif rt == "RegisterBroker":
        checker.on_unclean_registration(offset, ts, broker=row["broker"])
    elif rt == "ClearElr":
        checker.on_clear_elr(
            offset,
            ts,
            min_isr=row["min_isr"],
            first=row["first_partition"],
            end=row["end_partition"],
        )
    elif rt == "UnregisterBroker":
        checker.on_unregister(offset, ts, broker=row["broker"])
    elif rt == "RemoveTopic":
        checker.on_remove(offset, ts)
    elif rt == "FeatureLevel":
        checker.on_feature(offset, ts, level=row["level"])


_FIELDS = (
    "leader",
    "leader_epoch",
    "partition_epoch",
    "isr",
    "elr",
    "last_known_elr",
    "reason",
    "chosen",
    "min_isr",
    "broker",
    "election_kind",
    "replicas",
    "adding_replicas",
    "removing_replicas",
    "first_partition",
    "end_partition",
    "level",
)


def check_sorted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: rows sorted by (cluster, topic, partition, offset)."""
    checker: PartitionChecker | None = None
    out: list[tuple[Any, ...]] = []
    for batch in batches:
        n = batch.num_rows

        def col(name: str, batch: pa.RecordBatch = batch, n: int = n) -> list[Any]:
            i = batch.schema.get_field_index(name)
            return [None] * n if i < 0 else batch.column(i).to_pylist()

        ts_ms = batch.column("timestamp").cast(pa.int64()).to_pylist()
        rows = zip(
            col("cluster"),
            col("topic"),
            col("partition"),
            col("offset"),
            ts_ms,
            col("record_type"),
            *(col(f) for f in _FIELDS),
            strict=True,
        )
        for cluster, topic, part, offset, ts, rt, *values in rows:
            if (
                checker is None
                or part != checker.partition
                or topic != checker.topic
                or cluster != checker.cluster
            ):
                if checker is not None:
                    _finish(checker, out)
                checker = PartitionChecker(cluster, topic, part)
            feed(checker, rt, offset, ts // 1000, dict(zip(_FIELDS, values, strict=True)))
        if len(out) >= 10_000:
            yield _to_batch(out)
            out = []
    if checker is not None:
        _finish(checker, out)
    if out:
        yield _to_batch(out)


def _finish(checker: PartitionChecker, out: list[tuple[Any, ...]]) -> None:
    for v in checker.finish():
        out.append((*v[:4], v.timestamp_ms * 1000, v.rule, v.broker, v.detail, None, None))
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
        )
    )


def _to_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = []
    for field, values in zip(OUTPUT_ARROW, columns, strict=True):
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_ARROW)


def events(spark: Any, inp: AuditInput) -> tuple[Any, Any]:
    """Every event each partition's checker must see (MAIN_COLUMNS plus ``broker``), and
    the cached side input they were joined from."""
    from pyspark.sql import functions as F

    main = inp.load(spark, MAIN_COLUMNS, ["Partition", "PartitionChange", "UncleanRecovery"])
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


def violations_from_logs(spark: Any, inp: AuditInput, buckets: int | None = None) -> Any:
    """Checker output straight from data directories: no shuffle, no per-record rows.

    A DataFrame of `buckets` work items (default: one per core), one per Spark partition;
    each task reads every log with the data source's reader (`audit.logread`), decodes
    every batch with `records.decode_batch` and checks the partitions of its bucket
    (`audit.rules.bucket_of`). Only violations and statistics reach the JVM. Shipping
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
                    for base, ts, records in stored:
                        lc.feed(base, ts, records)
                    for c in lc.finish():
                        _finish(c, out)
        if out:
            yield _to_batch(out)

    return spark.range(0, k, 1, k).mapInArrow(check, OUTPUT_DDL)


def run(spark: Any, inp: AuditInput, *, show: int = 20, method: str = "auto") -> JobResult:
    """`method`: ``logs`` (data directories only), ``rows`` (any input) or ``auto``."""
    if method not in ("auto", "logs", "rows"):
        raise ValueError("method must be auto, logs or rows")
    if method == "logs" or (method == "auto" and inp.data_dirs):
        rows = violations_from_logs(spark, inp).toPandas()
    else:
        out, side = violations_from_rows(spark, inp)
        try:
            rows = out.toPandas()
        finally:
            side.unpersist()
    return _result(inp, rows, show)


def _result(inp: AuditInput, rows: pd.DataFrame, show: int) -> JobResult:
    res = JobResult("invariants")
    stats = rows[rows["rule"] == STATS_RULE]
    found = rows[rows["rule"] != STATS_RULE].drop(columns=["records", "skipped"])
    if inp.since_ms is not None:
        when = pd.to_datetime(found["timestamp"], utc=True)
        found = found[when >= pd.Timestamp(inp.since_ms, unit="ms", tz="UTC")]
    found = found.sort_values(["cluster", "offset", "topic", "partition", "rule"]).reset_index(
        drop=True
    )
    by_rule = found["rule"].value_counts().to_dict()
    res.tables = {"violations": found}
    res.stats = {
        "partitions": len(stats),
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
        res.summary.append(
            f"  {fmt_time(ts)} offset {r.offset} {r.cluster}/{r.topic}-{r.partition}: "
            f"{r.rule}: {r.detail}"
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
