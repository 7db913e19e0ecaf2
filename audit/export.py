"""``metactl log export``: the audit schema as Parquet, laid out for the audits, without Spark.

The rows are exactly what the ``metactl`` data source produces (same columns, types and
derivations; see `audit.schema`), built by `audit.export_tables`; every batch is
CRC-checked and decoded with `metadata_log.records.decode_batch` (which checks every
field) on the way. Where each goes and what the manifest says is `audit.export_layout`.

The export runs in parallel: each log is cut into offset ranges (`audit.source.plan_ranges`),
one task per range, in a pool of processes (one per core; small logs run in this
process). Each task writes its own files (`_Files`: a writer per bucket of partition
records and one for the rest, row groups sized for the readers); transactions that cross
tasks are resolved from the markers every task returns, into the manifest.

This module owns the tasks, the files they write and the manifest it writes. It must not
change a log (every reader opens it read-only).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from audit.export_layout import (
    CLUSTER_KIND,
    FORMAT_NAME,
    KIND,
    LAYOUT_VERSION,
    MANIFEST,
    PARTITION_KIND,
    PARTITION_TYPES,
)
from audit.export_tables import CHUNK_RECORDS, SCHEMA, chunk_tables
from audit.logread import iter_batches, log_info
from audit.rows import paused_gc
from audit.schema import OFFSET, RECORD_TYPE
from audit.transactions import MARKER_TYPES, aborted_ranges

# Records per export task at most (an offset range of one log; each writes a file per
# bucket), and below which a log is one task and the whole export runs in this process
# (a pool's start-up costs more than it saves).
TASK_RECORDS: Final = 25_000_000
IN_PROCESS_RECORDS: Final = 300_000
# Rows a task holds before it writes a row group (over all buckets; a bucket's row group
# is at least MIN_GROUP_ROWS unless the task ends).
BUFFER_ROWS: Final = 1_500_000
MIN_GROUP_ROWS: Final = 16_384
MAX_GROUP_ROWS: Final = 262_144
COMPRESSION: Final = "zstd"
# Low-cardinality strings are dictionary-encoded (smaller, and Spark filters on them by
# dictionary); everything else is plain + zstd, which is smaller and cheaper to write here.
_DICTIONARY: Final = (
    "cluster",
    "record_type",
    "topic",
    "reason",
    "election_kind",
    "strategy",
    "trigger",
    "resource_type",
    "config_name",
    "feature",
)


def default_buckets(records: int) -> int:
    """Buckets of partition records: a power of two, ~1.5M records each, 4 to 64."""
    want = max(1, -(-records // 1_500_000))
    n = 4
    while n < want and n < 64:
        n *= 2
    return n


def _type_of(table: pa.Table) -> str:
    return str(table.column(RECORD_TYPE)[0].as_py())


# --- one task: an offset range of one log ----------------------------------------------------


@dataclass(frozen=True)
class ExportTask:
    """Export the stored batches of one log whose base offset is in [start, end)."""

    path: str
    cluster: str
    start: int
    end: int
    out: str
    index: int
    buckets: int


@dataclass
class TaskResult:
    cluster: str
    records: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    markers: list[tuple[int, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


class _Files:
    """A task's writers: one per bucket of partition records, one for the rest."""

    def __init__(self, out: Path, task: int, buckets: int) -> None:
        self.out = out
        self.task = task
        self.buckets = buckets
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.pending: dict[str, list[pa.Table]] = {}
        self.rows: dict[str, int] = {}
        self.buffered = 0

    def _path(self, key: str) -> Path:
        if key == CLUSTER_KIND:
            return self.out / f"{KIND}={CLUSTER_KIND}" / f"part-{self.task:04d}.parquet"
        return self.out / f"{KIND}={PARTITION_KIND}" / f"part-{self.task:04d}-b{key}.parquet"

    def add(self, key: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self.pending.setdefault(key, []).append(table)
        self.rows[key] = self.rows.get(key, 0) + table.num_rows
        self.buffered += table.num_rows
        if self.rows[key] >= MAX_GROUP_ROWS:
            self._flush(key)
        if self.buffered >= BUFFER_ROWS:
            floor = max(MIN_GROUP_ROWS, BUFFER_ROWS // (2 * (self.buckets + 1)))
            for k in [k for k, n in self.rows.items() if n >= floor]:
                self._flush(k)

    def _flush(self, key: str) -> None:
        tables = self.pending.pop(key, [])
        n = self.rows.pop(key, 0)
        if not n:
            return
        self.buffered -= n
        writer = self.writers.get(key)
        if writer is None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            writer = self.writers[key] = pq.ParquetWriter(
                path, SCHEMA, compression=COMPRESSION, use_dictionary=list(_DICTIONARY)
            )
        if key != CLUSTER_KIND:
            # A bucket's records in offset order (the invariants check replays them so):
            # each table is, and they come in offset order (`audit.export_tables`).
            table = pa.concat_tables(tables)
            offsets = table.column(OFFSET).to_numpy()
            if len(offsets) > 1 and not bool((np.diff(offsets) > 0).all()):
                table = table.sort_by(OFFSET)
            writer.write_table(table, row_group_size=n)
            return
        # The rest grouped by record type (the tables come one per type and chunk): row
        # groups of a single type where sizes allow, so that type filters skip by statistics.
        tables.sort(key=_type_of)
        group: list[pa.Table] = []
        rows = 0
        for i, table in enumerate(tables):
            group.append(table)
            rows += table.num_rows
            last = i == len(tables) - 1
            if last or (rows >= MIN_GROUP_ROWS and _type_of(tables[i + 1]) != _type_of(table)):
                writer.write_table(pa.concat_tables(group), row_group_size=rows)
                group, rows = [], 0

    def close(self) -> list[str]:
        for key in list(self.pending):
            self._flush(key)
        paths = []
        for key, writer in self.writers.items():
            writer.close()
            paths.append(str(self._path(key)))
        return paths


def export_range(task: ExportTask) -> TaskResult:
    """Export the stored batches of one log whose base offset is in [start, end)."""
    with paused_gc():
        return _export_range(task)


def _export_range(task: ExportTask) -> TaskResult:
    path, cluster, buckets = task.path, task.cluster, task.buckets
    result = TaskResult(cluster)
    files = _Files(Path(task.out), task.index, buckets)
    pending: list[tuple[int, int, int, bytes]] = []
    size = 0

    def flush() -> None:
        for key, tag, table in chunk_tables(cluster, pending, path, buckets):
            result.records += table.num_rows
            if tag in MARKER_TYPES:
                result.markers.extend((o, tag) for o in table.column(OFFSET).to_pylist())
            files.add(key, table)
        first, last = min(b[2] for b in pending), max(b[2] for b in pending)
        result.first_ms = first if result.first_ms is None else min(result.first_ms, first)
        result.last_ms = last if result.last_ms is None else max(result.last_ms, last)

    for chunk in iter_batches(path, task.start, task.end):
        for batch in chunk:
            pending.append(batch)
            size += batch[1]
            if size >= CHUNK_RECORDS:
                flush()
                pending, size = [], 0
    if pending:
        flush()
    result.files = files.close()
    return result


# --- the export ----------------------------------------------------------------------------


@dataclass
class ExportReport:
    out: str
    records: int = 0
    files: int = 0
    seconds: float = 0.0
    clusters: list[str] = field(default_factory=list)
    buckets: int = 0
    workers: int = 1
    first_ms: int | None = None
    last_ms: int | None = None

    @property
    def dates(self) -> set[str]:
        """The first and last UTC dates of the records (empty for an empty log)."""
        if self.first_ms is None or self.last_ms is None:
            return set()
        return {_date(self.first_ms), _date(self.last_ms)}

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        span = (
            f"{_date(self.first_ms)} .. {_date(self.last_ms)}"
            if self.first_ms is not None and self.last_ms is not None
            else "no records"
        )
        return [
            f"exported {self.records:,} records of {', '.join(self.clusters)} to {self.out}",
            f"{self.files} Parquet file(s), partition records in {self.buckets} buckets "
            f"({span}); {self.seconds:.1f} s, {rate:,.0f} records/s on {self.workers} "
            f"process(es)",
        ]


def _date(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def export_parquet(
    data_dirs: Sequence[str],
    out: str | Path,
    *,
    clusters: Sequence[str] = (),
    overwrite: bool = False,
    validate: bool = True,
    workers: int | None = None,
    buckets: int | None = None,
    task_records: int | None = None,
) -> ExportReport:
    """Write every record of the logs in `data_dirs` to a Parquet dataset in `out`.

    `workers`: processes (default: the cores; 1 runs in this process). `buckets`: files
    of partition records per task (default from the size, `default_buckets`).
    `task_records`: cut each log into tasks of this many records (default: one task per
    process and log, of at most `TASK_RECORDS`; a small export runs in this process).
    Every batch is decoded with `decode_batch` whatever `validate` says (kept for callers).
    """
    del validate  # decoding is validating: decode_batch checks every field
    # Here, not at the top: the pool's processes import this module, and need neither
    # (nor the pyspark that `audit.source` imports).
    from audit.source import plan_ranges, resolve_sources

    started = time.perf_counter()
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not overwrite:
            raise FileExistsError(f"{target} exists and is not empty (use --overwrite)")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    sources = resolve_sources(list(data_dirs), list(clusters))
    infos = [(src, log_info(src.path)) for src in sources]
    total = sum(info.end_offset - info.start_offset for _, info in infos)
    n_buckets = buckets or default_buckets(total)
    cores = workers or os.cpu_count() or 1
    tasks: list[ExportTask] = []
    for src, info in infos:
        span = info.end_offset - info.start_offset
        if task_records is not None:
            parts = max(1, -(-span // task_records))
        elif span < IN_PROCESS_RECORDS:
            parts = 1
        else:  # a multiple of the processes (balanced rounds), at most TASK_RECORDS each
            parts = cores * -(-span // (cores * TASK_RECORDS))
        for r in plan_ranges(
            info.path, src.cluster, info.start_offset, info.end_offset, partition_count=parts
        ):
            tasks.append(
                ExportTask(r.path, r.cluster, r.start, r.end, str(target), len(tasks), n_buckets)
            )
    target.mkdir(parents=True, exist_ok=True)
    small = total < IN_PROCESS_RECORDS and task_records is None
    used = 1 if small or cores == 1 or len(tasks) < 2 else min(cores, len(tasks))
    results = _run_tasks(tasks, used)
    report = ExportReport(
        out=str(target), clusters=[s.cluster for s in sources], buckets=n_buckets, workers=used
    )
    files = [f for r in results for f in r.files]
    if not files:  # an empty log: an empty file keeps the dataset readable
        empty = target / f"{KIND}={CLUSTER_KIND}" / "part-0000.parquet"
        empty.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(SCHEMA.empty_table(), empty)
        files.append(str(empty))
    report.files = len(files)
    report.records = sum(r.records for r in results)
    stamps = [r.first_ms for r in results if r.first_ms is not None]
    report.first_ms = min(stamps) if stamps else None
    stamps = [r.last_ms for r in results if r.last_ms is not None]
    report.last_ms = max(stamps) if stamps else None
    _write_manifest(target, infos, results, n_buckets)
    report.seconds = time.perf_counter() - started
    return report


def _run_tasks(tasks: list[ExportTask], workers: int) -> list[TaskResult]:
    if workers <= 1:
        return [export_range(t) for t in tasks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: the caller may hold threads (a Spark session's) that fork would copy mid-call.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        futures = [pool.submit(export_range, t) for t in tasks]
        return [f.result() for f in futures]


def _write_manifest(
    target: Path, infos: Iterable[tuple[Any, Any]], results: list[TaskResult], buckets: int
) -> None:
    clusters: dict[str, Any] = {}
    for src, info in infos:
        mine = [r for r in results if r.cluster == src.cluster]
        firsts = [r.first_ms for r in mine if r.first_ms is not None]
        lasts = [r.last_ms for r in mine if r.last_ms is not None]
        markers = [m for r in mine for m in r.markers]
        clusters[src.cluster] = {
            "records": sum(r.records for r in mine),
            "start_offset": info.start_offset,
            "end_offset": info.end_offset,
            "first_ms": min(firsts) if firsts else None,
            "last_ms": max(lasts) if lasts else None,
            "aborted": [list(r) for r in aborted_ranges(markers)],
        }
    manifest = {
        "format": FORMAT_NAME,
        "version": LAYOUT_VERSION,
        "buckets": buckets,
        "partition_types": sorted(PARTITION_TYPES),
        "clusters": clusters,
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
