"""Jobs over the buckets of a Parquet export: one Spark task per bucket, no shuffle.

A `metactl log export` (`audit.export`; its layout: `audit.export_layout`) writes the
records of partitions in buckets by a hash of (cluster, topic, partition): every record
of a partition is in the files of one bucket, in offset order. A job whose work is
sequential per partition (replaying its history: ``invariants``, ``offline``) therefore
needs no shuffle on such an export: Spark runs one task per bucket (`run_buckets`),
which reads its bucket's files and the few broker-, topic- and cluster-level rows with
Arrow (`read_bucket`, `read_events`), leaves out what the audits never read
(`committed`: aborted transactions, rows after --until), and returns only its results.
Spark schedules the tasks over its cores or cluster; the export's directory must be
readable at the same path by every executor (the same requirement as for Spark's own
reader).

`export_root` says whether an input is such an export (a local directory with the
manifest); other inputs take each job's row path (a shuffle by partition in Spark).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from audit.export_layout import CLUSTER_KIND, KIND, MANIFEST, PARTITION_KIND, bucket_file_glob
from audit.spark import AuditInput
from metactl.errors import LogDirNotFoundError

Ranges = dict[str, list[tuple[int, int]]]


def export_root(inp: AuditInput) -> str | None:
    """The directory of a Parquet export with buckets, absolute (executors run elsewhere:
    a relative path would name another directory there), else None."""
    if inp.parquet is None or inp.manifest() is None:
        return None
    url = urlsplit(inp.parquet)
    return str(Path(url.path if url.scheme == "file" else inp.parquet).resolve())


def _files(root: str, kind: str, pattern: str) -> list[str]:
    return sorted(str(p) for p in (Path(root) / f"{KIND}={kind}").glob(pattern))


def read_bucket(root: str, bucket: int, columns: Sequence[str]) -> pa.Table | None:
    """The partition records of one bucket (None when it has none)."""
    from pyarrow import dataset as ds

    files = _files(root, PARTITION_KIND, bucket_file_glob(bucket))
    if not files:
        return None
    return ds.dataset(files, format="parquet").to_table(columns=list(columns))


def read_events(root: str, columns: Sequence[str], types: Sequence[str]) -> pa.Table | None:
    """The rows of the given record types among the non-partition records (few)."""
    from pyarrow import dataset as ds

    files = _files(root, CLUSTER_KIND, "*.parquet")
    if not files:
        return None
    wanted = ds.field("record_type").isin(list(types))
    return ds.dataset(files, format="parquet").to_table(columns=list(columns), filter=wanted)


def _outside_mask(offsets: Any, spans: list[tuple[int, int]]) -> Any:
    """True where an offset lies in none of the sorted, disjoint inclusive `spans`."""
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    ends = np.array([b for _, b in spans], dtype=np.int64)
    at = np.searchsorted(starts, offsets, side="right") - 1
    inside = (at >= 0) & (offsets <= ends[np.maximum(at, 0)])
    return ~inside


def committed(table: pa.Table, aborted: Ranges, until_ms: int | None) -> pa.Table:
    """Rows before `until_ms`, outside the aborted or unfinished transactions of their
    cluster (what `AuditInput.load` leaves out, vectorised)."""
    if until_ms is not None:
        stamps = table.column("timestamp").cast(pa.int64())
        table = table.filter(pc.less(stamps, pa.scalar(until_ms * 1000)))
    if not aborted or not table.num_rows:
        return table
    clusters = table.column("cluster").to_numpy(zero_copy_only=False)
    offsets = table.column("offset").to_numpy()
    keep = np.ones(len(offsets), dtype=bool)
    for name, spans in aborted.items():
        mine = clusters == name
        if mine.any():
            keep[mine] = _outside_mask(offsets[mine], sorted(spans))
    return table.filter(pa.array(keep))


def by_cluster(table: pa.Table | None) -> dict[str, pa.Table]:
    """The table's rows per cluster, each in offset order."""
    if table is None or not table.num_rows:
        return {}
    names = pc.unique(table.column("cluster")).to_pylist()
    out = {}
    for name in names:
        mine = table if len(names) == 1 else table.filter(pc.equal(table.column("cluster"), name))
        offsets = mine.column("offset").to_numpy()
        if len(offsets) > 1 and not bool((np.diff(offsets) > 0).all()):
            mine = mine.sort_by("offset")
        out[str(name)] = mine
    return out


BucketFn = Callable[[str, int], pa.RecordBatch | None]


def run_buckets(spark: Any, inp: AuditInput, fn: BucketFn, ddl: str) -> Any:
    """A DataFrame (schema `ddl`) of ``fn(root, bucket)`` over the export's buckets, one
    Spark task per bucket. `fn` runs in executors: it must pickle (a module-level
    function, or a closure over plain values)."""
    root = export_root(inp)
    if root is None:
        raise ValueError("needs a local `metactl log export` directory with its manifest")
    buckets = int(inp.manifest().buckets)

    def tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if not (Path(root) / MANIFEST).is_file():
            # An empty bucket is no error, but an export this executor cannot see is one.
            raise LogDirNotFoundError(
                f"the Parquet export {root} is not readable from this executor: it must be "
                "at the same path on the driver and on every worker (a shared directory)"
            )
        for batch in batches:
            for bucket in batch.column("id").to_pylist():
                out = fn(root, int(bucket))
                if out is not None and out.num_rows:
                    yield out

    return spark.range(0, buckets, 1, buckets).mapInArrow(tasks, ddl)
