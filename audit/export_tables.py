"""The records of stored batches as the Arrow tables of an export, ready to write.

Per chunk of ~65k records an export task decodes every batch (`decode_batch`, which
checks every field), then builds the partition records' columns in decode order, all
record types at once: the most common type's records each as a tuple of its fields
(`msgspec.structs.astuple`), the tuples converted to Arrow in one call as a struct whose
children are the columns, the few records of other types written into their places
(`_partition_columns`). The columns are then taken in (bucket, offset) order, so a
bucket file's tables arrive in offset order and are written without a sort. Other
records make one small table per record type (`chunk_tables`). The rows are exactly
what the ``metactl`` data source produces (same columns, types and derivations; see
`audit.schema`).

It must not write files or decide the layout (`audit.export`, `audit.export_layout`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any, Final, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from audit.export_layout import CLUSTER_KIND, PARTITION_KIND, PARTITION_TYPES, partition_buckets
from audit.rows import to_arrow
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
from metactl.errors import CorruptLogError
from metadata_log.records import RECORD_TYPES, decode_batch

# Stored batches decoded together (~65k records): one Arrow table per record type each.
CHUNK_RECORDS: Final = 65_536

_TAG_OF: Final = {cls: tag for tag, cls in RECORD_TYPES.items()}
_astuple: Final = msgspec.structs.astuple
_FIELD_COLUMNS: Final = tuple(c for c in COLUMN_NAMES if c not in POSITIONAL)
SCHEMA: Final = arrow_schema()


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
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


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


def chunk_tables(
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
    table = pa.Table.from_arrays([arrays[c] for c in COLUMN_NAMES], schema=SCHEMA)
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
