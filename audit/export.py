"""``metactl log export``: the audit schema as Parquet, laid out for the audits, without Spark.

The rows are exactly what the ``metactl`` data source produces (same columns, types and
derivations; see `audit.schema`). Every batch is CRC-checked and decoded with
`metadata_log.records.decode_batch` (which checks every field) on the way.

Layout (version 2; a Hive-style ``kind`` partition column)::

    OUT/_metactl.json                              the manifest (below)
    OUT/kind=partition/part-TTTT-bBBB.parquet      Partition, PartitionChange, UncleanRecovery
    OUT/kind=cluster/part-TTTT.parquet             every other record

* ``kind=partition`` holds the records of partitions (99% of a log), split into
  ``buckets`` files per export task by a hash of (cluster, topic, partition)
  (`partition_buckets`): a partition's whole history is in the files of one bucket, so
  the ``invariants`` job checks each bucket in a task of its own with no shuffle.
* ``kind=cluster`` holds brokers, topics, configs, features, transaction markers and
  ClearElr/RemoveTopic records: a job that wants only those (``brokers``, the marker
  scan) prunes every partition file by the directory alone.
* A bucket file holds its task's records in offset order (the order the check replays);
  in the ``kind=cluster`` files row groups hold one record type at a time where they can,
  so a filter on ``record_type`` skips row groups by their statistics.
* The manifest (JSON; Spark and pyarrow ignore files starting with ``_``) records the
  layout version, the bucket count, and per cluster its record count, offsets, time span
  and the offset ranges of aborted or unfinished transactions: the jobs read those from it
  instead of scanning for them.

The export runs in parallel: each log is cut into offset ranges (`audit.source.plan_ranges`),
one task per range, in a pool of processes (one per core; small logs run in this
process). Each task writes its own files; transactions that cross tasks are resolved
from the markers every task returns.

Per chunk of ~65k records a task decodes every batch (`decode_batch`), then builds the
partition records' columns in decode order, all record types at once: the most common
type's records each as a tuple of its fields (`msgspec.structs.astuple`), the tuples
converted to Arrow in one call as a struct whose children are the columns, the few
records of other types written into their places (`_partition_columns`). The columns are
then taken in (bucket, offset) order, so a bucket file's tables arrive in offset order
and are written without a sort. Other records make one small table per record type.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Final, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from audit.logread import iter_batches, log_info
from audit.rows import paused_gc, to_arrow
from audit.schema import (
    CLUSTER,
    COLUMN_NAMES,
    FIELD_SOURCES,
    OFFSET,
    POSITIONAL,
    RECORD_TYPE,
    TIMESTAMP,
    arrow_schema,
    arrow_type,
)
from audit.transactions import MARKER_TYPES, aborted_ranges
from metactl.errors import CorruptLogError
from metadata_log.records import RECORD_TYPES, decode_batch

KIND: Final = "kind"
PARTITION_KIND: Final = "partition"
CLUSTER_KIND: Final = "cluster"
PARTITION_TYPES: Final = frozenset({"Partition", "PartitionChange", "UncleanRecovery"})
MANIFEST: Final = "_metactl.json"
FORMAT_NAME: Final = "metactl-audit-export"
LAYOUT_VERSION: Final = 2

# Records per export task at most (an offset range of one log; each writes a file per
# bucket), and below which a log is one task and the whole export runs in this process
# (a pool's start-up costs more than it saves).
TASK_RECORDS: Final = 25_000_000
IN_PROCESS_RECORDS: Final = 300_000
# Stored batches decoded together (~65k records): one Arrow table per record type each.
CHUNK_RECORDS: Final = 65_536
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


def partition_buckets(cluster: str, topics: Any, partitions: Any, buckets: int) -> Any:
    """The bucket of each (cluster, topic, partition): crc32 of the cluster and topic,
    mixed with the partition number (a numpy int64 array). Stable across processes and
    runs; only the export computes it (readers find a bucket by its file names)."""
    if isinstance(topics, pa.ChunkedArray):
        topics = topics.combine_chunks()
    if isinstance(partitions, pa.ChunkedArray):
        partitions = partitions.combine_chunks()
    encoded = topics.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    hashes = np.array(
        [zlib.crc32(f"{cluster}\x00{name}".encode()) for name in names], dtype=np.uint64
    )
    per_row = hashes[encoded.indices.to_numpy(zero_copy_only=False)]
    part = partitions.to_numpy(zero_copy_only=False).astype(np.uint64)
    mixed = (per_row ^ ((part * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF))) * np.uint64(
        0x85EBCA6B
    )
    return ((mixed >> np.uint64(16)) % np.uint64(buckets)).astype(np.int64)


def _type_of(table: pa.Table) -> str:
    return str(table.column(RECORD_TYPE)[0].as_py())


def bucket_file_glob(bucket: int) -> str:
    return f"part-*-b{bucket:03d}.parquet"


# --- rows ----------------------------------------------------------------------------------

_TAG_OF: Final = {cls: tag for tag, cls in RECORD_TYPES.items()}
_astuple: Final = msgspec.structs.astuple
_FIELD_COLUMNS: Final = tuple(c for c in COLUMN_NAMES if c not in POSITIONAL)
_SCHEMA: Final = arrow_schema()


def _column(col: str, tag: str, records: list[Any]) -> pa.Array:
    """One column of `records` (all of record type `tag`) as Arrow."""
    tp = arrow_type(col)
    src = FIELD_SOURCES[col].get(tag)
    n = len(records)
    if tag == "BrokerRegistrationChange" and col == "reason":
        return pa.array([_brc_reason(r) for r in records], tp)
    if src is None:
        return _nulls(col, n)
    return to_arrow(col, list(map(attrgetter(src), records)))


_NULLS: dict[str, pa.Array] = {}


def _nulls(col: str, n: int) -> pa.Array:
    """A column of `n` nulls: a slice of one kept per column (arrays are immutable, and
    making one zeroes its buffers every time)."""
    have = _NULLS.get(col)
    if have is None or len(have) < n:
        have = _NULLS[col] = pa.nulls(max(n, 2 * CHUNK_RECORDS), arrow_type(col))
    return have.slice(0, n)


def _brc_reason(r: Any) -> str | None:
    if r.in_controlled_shutdown:
        return "controlled_shutdown"
    if r.fenced is not None:
        return "fenced" if r.fenced else "unfenced"
    return None


_TAGS: Final = tuple(RECORD_TYPES)
_CODE: Final = {cls: i for i, cls in enumerate(RECORD_TYPES.values())}


def _pick(items: Sequence[Any], idx: Any) -> list[Any]:
    """`items` at the (numpy) positions `idx`, at C speed."""
    if len(idx) == len(items) and (len(idx) < 2 or bool((np.diff(idx) == 1).all())):
        return list(items)
    if len(idx) == 0:
        return []
    if len(idx) == 1:
        return [items[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(items))


def _decode(
    batches: Sequence[tuple[int, int, int, bytes]], location: str
) -> tuple[list[Any], Any, Any]:
    """Every record of the stored batches, with its offset and batch timestamp (ms)."""
    records: list[Any] = []
    counts = np.empty(len(batches), dtype=np.int64)
    bases = np.empty(len(batches), dtype=np.int64)
    stamps = np.empty(len(batches), dtype=np.int64)
    for i, (base, count, ts, payload) in enumerate(batches):
        try:
            decoded = decode_batch(payload)
        except Exception as exc:  # msgspec's DecodeError / ValidationError
            raise CorruptLogError(
                f"batch does not decode: {exc}", path=location, offset=base
            ) from exc
        if len(decoded) != count:
            raise CorruptLogError(
                f"batch header says {count} records, payload holds {len(decoded)}",
                path=location,
                offset=base,
            )
        records.extend(decoded)
        counts[i], bases[i], stamps[i] = count, base, ts
    n = len(records)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    offsets = np.repeat(bases, counts) + (np.arange(n, dtype=np.int64) - starts)
    return records, offsets, np.repeat(stamps, counts)


def _table(cluster: str, tag: str, records: list[Any], offsets: Any, stamps_ms: Any) -> pa.Table:
    n = len(records)
    arrays = [
        pa.repeat(pa.scalar(cluster, pa.string()), n),
        pa.array(offsets, pa.int64()),
        _timestamps(stamps_ms),
        pa.repeat(pa.scalar(tag, pa.string()), n),
    ]
    arrays.extend(_column(col, tag, records) for col in _FIELD_COLUMNS)
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def _timestamps(stamps_ms: Any) -> pa.Array:
    return pa.array(stamps_ms * 1000, pa.int64()).cast(arrow_type(TIMESTAMP))


_IS_PARTITION: Final = np.array([tag in PARTITION_TYPES for tag in _TAGS])
_TAG_NAMES: Final = pa.array(_TAGS, pa.string())
# Per partition record type, the field behind each column (None: the column is null).
_SOURCES: Final = {
    tag: {c: FIELD_SOURCES[c].get(tag) for c in _FIELD_COLUMNS} for tag in PARTITION_TYPES
}


def _field_column(tag: str) -> dict[str, str | None]:
    """Each field of a partition record type, in order, and the column it fills (None:
    no column shows it). A field fills one column at most (`FIELD_SOURCES`)."""
    out: dict[str, str | None] = dict.fromkeys(RECORD_TYPES[tag].__struct_fields__)
    for col, src in _SOURCES[tag].items():
        if src is not None:
            if out[src] is not None:
                raise AssertionError(f"{tag}.{src} fills {out[src]} and {col}")
            out[src] = col
    return out


_FIELD_COLUMN: Final = {tag: _field_column(tag) for tag in PARTITION_TYPES}
# Columns whose values need more than pa.array (`audit.rows.to_arrow`).
_CONVERTED: Final = frozenset({"candidates", "offline_since"})


def _struct_type(tag: str) -> pa.DataType | None:
    """The Arrow struct of a record type's fields in order (its columns' types; a field
    no column shows, an int64), when one conversion of its records' field tuples gives
    every column; None when a field needs a converter of its own."""
    fields = []
    for f, col in _FIELD_COLUMN[tag].items():
        if col in _CONVERTED:
            return None
        fields.append(pa.field(f, pa.int64() if col is None else arrow_type(col)))
    return pa.struct(fields)


_STRUCT: Final = {tag: _struct_type(tag) for tag in PARTITION_TYPES}
# Per partition record type, what stands in for a record of another type in a pass over
# its records: a Struct of its fields, in its order, every one None (`_astuple` and
# attribute reads treat it as they treat a record).
_ABSENT: Final = {
    tag: msgspec.defstruct(
        f"_Absent{tag}", [(f, Any, None) for f in RECORD_TYPES[tag].__struct_fields__], gc=False
    )()
    for tag in PARTITION_TYPES
}
# A chunk whose records of other kinds are more than this share is cut down to its
# partition records first (else they ride along in the column passes, as None).
_PICK_SHARE: Final = 0.1


class _Chunk(NamedTuple):
    """Decoded records (`_decode`) with their record type codes (positions in `_TAGS`)."""

    records: list[Any]
    codes: Any  # numpy int8
    offsets: Any  # numpy int64
    stamps: Any  # numpy int64, batch timestamps in ms


def _tables(
    cluster: str, batches: Sequence[tuple[int, int, int, bytes]], location: str, buckets: int
) -> Iterator[tuple[str, str, pa.Table]]:
    """The records of stored batches as Arrow tables, with the file each goes to: a
    bucket's (``"007"``) or `CLUSTER_KIND`. Partition records make one table per bucket
    (of mixed record types, tagged `PARTITION_KIND`), the rest one per record type; offset
    order within a table."""
    records, offsets, stamps = _decode(batches, location)
    n = len(records)
    codes = np.fromiter(map(_CODE.__getitem__, map(type, records)), dtype=np.int8, count=n)
    partition = _IS_PARTITION[codes]
    others = np.flatnonzero(~partition)
    if len(others):
        kinds = codes[others]
        for code in np.unique(kinds).tolist():
            idx = others[kinds == code]
            tag = _TAGS[code]
            table = _table(cluster, tag, _pick(records, idx), offsets[idx], stamps[idx])
            yield CLUSTER_KIND, tag, table
    rows = np.flatnonzero(partition)
    if not len(rows):
        return
    if len(others) > _PICK_SHARE * n:
        chunk = _Chunk(_pick(records, rows), codes[rows], offsets[rows], stamps[rows])
        rows = np.arange(len(rows))
    else:
        chunk = _Chunk(records, codes, offsets, stamps)
    yield from _partition_tables(cluster, chunk, rows, buckets)


def _partition_tables(
    cluster: str, chunk: _Chunk, rows: Any, buckets: int
) -> Iterator[tuple[str, str, pa.Table]]:
    """The partition records of `chunk` (at positions `rows`) as one table per bucket, in
    offset order. Columns are built over the chunk's records in their order (reading
    records in the order they were decoded is cheaper), then taken in (bucket, offset)
    order, which leaves out the other records: the tables a task's file gathers come in
    offset order, no sort needed."""
    columns = _partition_columns(chunk.records, chunk.codes, rows)
    topics, partitions = columns["topic"], columns["partition"]
    assert topics is not None and partitions is not None  # every partition record has them
    if len(rows) < len(chunk.records):
        topics, partitions = topics.take(rows), partitions.take(rows)
    ids = partition_buckets(cluster, topics, partitions, buckets).astype(np.int16)
    within = np.argsort(ids, kind="stable")
    ids, order = ids[within], rows[within]
    n = len(order)
    take = pa.array(order)
    arrays = {
        CLUSTER: pa.repeat(pa.scalar(cluster, pa.string()), n),
        OFFSET: pa.array(chunk.offsets[order], pa.int64()),
        TIMESTAMP: _timestamps(chunk.stamps[order]),
        RECORD_TYPE: _TAG_NAMES.take(pa.array(chunk.codes[order])),
    }
    for col, values in columns.items():
        arrays[col] = _nulls(col, n) if values is None else values.take(take)
    table = pa.Table.from_arrays([arrays[c] for c in COLUMN_NAMES], schema=_SCHEMA)
    cuts = (np.flatnonzero(np.diff(ids)) + 1).tolist()
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        yield f"{int(ids[lo]):03d}", PARTITION_KIND, table.slice(lo, hi - lo)


def _partition_columns(records: list[Any], codes: Any, rows: Any) -> dict[str, pa.Array | None]:
    """Each field column of the partition records at `rows` (other positions null), in
    the order of `records`; None for a column that is null throughout.

    The records of the most common type are read in one pass (each record's fields as a
    tuple, converted as one Arrow struct array whose children are the columns; else one
    pass per column), a stand-in with every field None in the place of every other
    record; the few records of other types are written into their positions first. A
    column the common type lacks is built from the others alone and spread to their
    positions with an Arrow take. (A pass per column costs ~20 ns a record and column, a
    struct of tuples about half, and the Python objects of a chunk are read in the order
    they were made: in any other order the passes cost more than taking the columns.)"""
    n = len(records)
    common = _TAGS[int(np.bincount(codes[rows]).argmax())]
    rare = np.flatnonzero(codes != _CODE[RECORD_TYPES[common]])
    groups: list[tuple[str, list[int], list[Any]]] = []
    absent = _ABSENT[common]
    if len(rare):
        records = list(records)
        rare_codes = codes[rare]
        for code in np.unique(rare_codes).tolist():
            positions = rare[rare_codes == code].tolist()
            if _IS_PARTITION[code]:
                groups.append((_TAGS[code], positions, [records[p] for p in positions]))
            for p in positions:
                records[p] = absent
    columns: dict[str, pa.Array | None] = {}
    if _STRUCT[common] is not None:
        try:
            columns = _struct_columns(common, records, groups)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            # A value the struct cannot hold (a field no column shows, beyond int64):
            # the passes per column, which fail only where the columns would.
            columns = {}
    if not columns:
        columns = _field_columns(common, records, groups)
    for col in _FIELD_COLUMNS:
        if col in columns:
            continue
        spread: list[int] = []
        compact: list[Any] = []
        for tag, positions, recs in groups:
            other = _SOURCES[tag][col]
            if other is not None:
                spread.extend(positions)
                compact.extend(map(attrgetter(other), recs))
        if not spread:
            columns[col] = None
            continue
        at = np.full(n, -1, dtype=np.int64)
        at[spread] = np.arange(len(spread), dtype=np.int64)
        columns[col] = to_arrow(col, compact).take(pa.array(at, mask=at < 0))
    return columns


def _struct_columns(
    common: str, records: list[Any], groups: list[tuple[str, list[int], list[Any]]]
) -> dict[str, pa.Array | None]:
    """The columns of the `common` type's fields, in one conversion (`_STRUCT`)."""
    fields = _FIELD_COLUMN[common]
    tuples = list(map(_astuple, records))
    for tag, positions, recs in groups:
        sources = _SOURCES[tag]
        get = [
            attrgetter(src) if col is not None and (src := sources[col]) is not None else _none
            for col in fields.values()
        ]
        for p, r in zip(positions, recs, strict=True):
            tuples[p] = tuple([g(r) for g in get])
    children = pa.array(tuples, _STRUCT[common]).flatten()
    return {
        col: values if values.null_count < len(values) else None
        for col, values in zip(fields.values(), children, strict=True)
        if col is not None
    }


def _field_columns(
    common: str, records: list[Any], groups: list[tuple[str, list[int], list[Any]]]
) -> dict[str, pa.Array | None]:
    """The columns of the `common` type's fields, one pass over the records each."""
    columns: dict[str, pa.Array | None] = {}
    for col, src in _SOURCES[common].items():
        if src is None:
            continue
        values = list(map(attrgetter(src), records))
        for tag, positions, recs in groups:
            other = _SOURCES[tag][col]
            get = attrgetter(other) if other is not None else _none
            for p, r in zip(positions, recs, strict=True):
                values[p] = get(r)
        columns[col] = to_arrow(col, values)
    return columns


def _none(_record: Any) -> None:
    return None


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
                path, _SCHEMA, compression=COMPRESSION, use_dictionary=list(_DICTIONARY)
            )
        if key != CLUSTER_KIND:
            # A bucket's records in offset order (the invariants check replays them so):
            # each table is, and they come in offset order (`_partition_tables`).
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
        for key, tag, table in _tables(cluster, pending, path, buckets):
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
        pq.write_table(_SCHEMA.empty_table(), empty)
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


@dataclass(frozen=True)
class Manifest:
    """What an export's `MANIFEST` says (see the module documentation)."""

    buckets: int
    clusters: dict[str, dict[str, Any]]

    def aborted(self) -> dict[str, list[tuple[int, int]]]:
        found = {c: [(int(a), int(b)) for a, b in v["aborted"]] for c, v in self.clusters.items()}
        return {c: r for c, r in found.items() if r}

    def last_ms(self) -> dict[str, int]:
        return {c: int(v["last_ms"]) for c, v in self.clusters.items() if v["last_ms"] is not None}


def read_manifest(path: str) -> Manifest | None:
    """The manifest of a (local) export of this layout; None for anything else (an older
    export, a URL, another producer): readers then scan for what it would have said."""
    from urllib.parse import urlsplit

    url = urlsplit(path)
    if url.scheme not in ("", "file"):
        return None
    local = Path(url.path) if url.scheme == "file" else Path(path)
    try:
        data = json.loads((local / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if data.get("format") != FORMAT_NAME or data.get("version") != LAYOUT_VERSION:
        return None
    return Manifest(buckets=int(data["buckets"]), clusters=dict(data["clusters"]))
