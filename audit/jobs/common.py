"""What every audit job shares: its result, time windows, the input's topic generations
and final shutdowns (`lifecycle`, `with_topic_ids`), and small Spark and pandas helpers.

It must not hold a job's own logic (each job module does), nor import pyspark at module
level (``metactl --help`` and the missing-PySpark message must not need it)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from audit.lifecycle import COLUMNS as LIFECYCLE_COLUMNS
from audit.lifecycle import TYPES as LIFECYCLE_TYPES
from audit.lifecycle import UNKNOWN_ID, Lifecycle, LifecycleTracker
from audit.logread import log_info, log_time_bounds
from audit.spark import AuditInput


@dataclass
class JobResult:
    """Tables to write, lines for the terminal, HTML sections and the headline numbers."""

    job: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    html: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    exit_status: int = 0


def ms_col(col: str) -> Any:
    """A timestamp column as epoch milliseconds (long)."""
    from pyspark.sql import functions as F

    return F.unix_millis(F.col(col))


def cluster_end_ms(spark: Any, inp: AuditInput) -> dict[str, int]:
    """When each cluster's known history ends: its newest record's time, capped at --until
    (from the logs' bounds, an export's manifest, or a scan of the export)."""
    from pyspark.sql import functions as F

    if inp.data_dirs:
        from audit.source import resolve_sources

        ends = {
            src.cluster: log_time_bounds(log_info(src.path).path)[1]
            for src in resolve_sources(list(inp.data_dirs), list(inp.clusters))
        }
    elif inp.manifest() is not None:
        ends = inp.manifest().last_ms()
    else:
        rows = (
            inp.load(spark, ["cluster", "timestamp"])
            .groupBy("cluster")
            .agg(F.max(ms_col("timestamp")).alias("end"))
            .collect()
        )
        ends = {r["cluster"]: r["end"] for r in rows}
    out: dict[str, int] = {}
    for cluster, end in ends.items():
        if end is None:
            continue
        out[cluster] = int(end) if inp.until_ms is None else min(int(end), inp.until_ms)
    return out


def lifecycle(spark: Any, inp: AuditInput) -> Lifecycle:
    """The input's topic generations, deleted topics and final shutdowns
    (`audit.lifecycle`), from its topic and broker records up to --until; read once per
    input (`audit all`'s jobs share it). Data directories are read here, on the driver
    (a byte pre-filter skips every stored batch without such a record); an export's
    ``kind=cluster`` files with Arrow; other Parquet through Spark."""
    found = inp.cache.get("lifecycle")
    if found is None:
        tracker = LifecycleTracker()
        for table in _lifecycle_tables(spark, inp):
            tracker.feed_table(table)
        found = inp.cache["lifecycle"] = tracker.result()
    return found


def _lifecycle_tables(spark: Any, inp: AuditInput) -> list[pa.Table]:
    from audit.buckets import committed, export_root, read_events

    if inp.data_dirs:
        from audit.source import resolve_sources

        return [
            log_lifecycle_rows(log_info(src.path).path, src.cluster, inp.until_ms)
            for src in resolve_sources(list(inp.data_dirs), list(inp.clusters))
        ]
    root = export_root(inp)
    if root is not None:
        table = read_events(root, LIFECYCLE_COLUMNS, LIFECYCLE_TYPES)
        return [] if table is None else [committed(table, inp.aborted(spark), inp.until_ms)]
    return [inp.load(spark, LIFECYCLE_COLUMNS, LIFECYCLE_TYPES).toArrow()]


def log_lifecycle_rows(path: str, cluster: str, until_ms: int | None) -> pa.Table:
    """One log's topic and broker records (`audit.lifecycle.COLUMNS`), committed and
    before `until_ms`, read in this process."""
    from audit.buckets import committed
    from audit.rows import RowBuilder, read_arrow
    from audit.transactions import MARKER_TYPES, aborted_ranges

    builder = RowBuilder(cluster, LIFECYCLE_COLUMNS, frozenset((*LIFECYCLE_TYPES, *MARKER_TYPES)))
    info = log_info(path)
    batches = list(read_arrow(info.path, info.start_offset, info.end_offset, builder))
    table = pa.Table.from_batches(batches, schema=builder.schema)
    rt = table.column("record_type")
    is_marker = pc.is_in(rt, pa.array(MARKER_TYPES))
    markers = table.filter(is_marker)
    ranges = aborted_ranges(
        zip(
            markers.column("offset").to_pylist(),
            markers.column("record_type").to_pylist(),
            strict=True,
        )
    )
    kept = table.filter(pc.invert(is_marker))
    return committed(kept, {cluster: ranges} if ranges else {}, until_ms)


def with_topic_ids(df: Any, life: Lifecycle) -> Any:
    """`df` (``cluster``, ``topic`` and ``offset`` columns) with each row's ``topic_id``:
    the generation of its topic name at its offset (a broadcast range join on the few
    generations; `audit.lifecycle.UNKNOWN_ID` where none is known)."""
    from pyspark.sql import functions as F

    spans = life.spans()
    if not spans:
        return df.withColumn("topic_id", F.lit(UNKNOWN_ID))
    gens = df.sparkSession.createDataFrame(
        spans, "g_cluster string, g_topic string, g_id string, g_lo long, g_hi long"
    )
    cond = (
        (F.col("cluster") == F.col("g_cluster"))
        & (F.col("topic") == F.col("g_topic"))
        & (F.col("offset") >= F.col("g_lo"))
        & (F.col("offset") < F.col("g_hi"))
    )
    return (
        df.join(F.broadcast(gens), cond, "left")
        .withColumn("topic_id", F.coalesce(F.col("g_id"), F.lit(UNKNOWN_ID)))
        .drop("g_cluster", "g_topic", "g_id", "g_lo", "g_hi")
    )


def nullable_ints(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Integer columns that may hold nulls as pandas' nullable ``Int64`` (a null turns a
    plain int column into floats: ``runner_up 3.0`` in a report, issue 34), in place."""
    for col in columns:
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    return df


def map_literal(values: dict[str, int], key_col: str, default: int | None = None) -> Any:
    """`values[key_col]` as a Spark column (a literal map lookup)."""
    from pyspark.sql import functions as F

    if not values:
        return F.lit(default).cast("long")
    pairs: list[Any] = []
    for k, v in values.items():
        pairs.extend([F.lit(k), F.lit(int(v)).cast("long")])
    looked_up = F.element_at(F.create_map(*pairs), F.col(key_col))
    return looked_up if default is None else F.coalesce(looked_up, F.lit(default).cast("long"))


def in_window(ts_ms_col: Any, inp: AuditInput) -> Any:
    """A condition: the millisecond column lies in [since, until)."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    if inp.since_ms is not None:
        cond = cond & (ts_ms_col >= F.lit(inp.since_ms))
    if inp.until_ms is not None:
        cond = cond & (ts_ms_col < F.lit(inp.until_ms))
    return cond


def fmt_ms(ms: float | int | None) -> str:
    """A duration for people: 0 ms, 850 ms, 12.5 s, 3.2 min, 1.5 h, 2.1 d."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "-"
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def fmt_time(ms: int | float | None) -> str:
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def window_text(inp: AuditInput) -> str:
    if inp.since_ms is None and inp.until_ms is None:
        return "the whole log"
    since = fmt_time(inp.since_ms) if inp.since_ms is not None else "the start"
    until = fmt_time(inp.until_ms) if inp.until_ms is not None else "the end"
    return f"{since} .. {until}"


def source_text(inp: AuditInput) -> str:
    """What the audit read, for its summary: a local path absolute, so that the same input
    reads the same whatever the directory the command ran in (a URL as given)."""
    if inp.data_dirs:
        return ", ".join(inp.data_dirs)
    where = str(inp.parquet)
    if "://" not in where:
        where = os.path.abspath(where)
    return f"Parquet {where}"


def percentiles(values: Sequence[float] | pd.Series) -> dict[str, float | None]:
    """p50, p99 and max (linear interpolation); None for no values."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
    }


def counts_text(counts: dict[str, int]) -> str:
    if not counts:
        return "none"
    return ", ".join(
        f"{k}={v:,}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )
