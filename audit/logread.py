"""Read the SQLite metadata log without the store: stdlib sqlite3, read-only, no asyncio.

Spark executors and the export run this: each opens ``<data_dir>/metadata.log.sqlite``
with a ``file:...?mode=ro`` URI, reads whole stored batches (the table layout is
`metadata_log.sqlite_store`'s: one row per batch, ``base_offset`` the key), checks each
batch's CRC (`metadata_log.store.batch_crc`) and turns records into Arrow columns of the
audit schema.

Decoding. Payloads are decoded into *projected* record classes derived from
`metadata_log.records` at import time: the same tags, wire names, types and defaults,
holding only the fields of the selected columns (enums read as their values), every class
with the same attributes so that a column is one ``map(attrgetter(...))``. Record types
outside the selection decode nothing. Skipping fields is what makes a job's scan cheap (a
full `decode_batch` plus per-field ``getattr`` costs several times more); with
``validate`` (the export's default) each payload is also decoded with
`metadata_log.records.decode_batch`, which checks every field.

Selections (record types, ``any_of`` conditions) first skip whole batches by their bytes
(`_patterns`), then filter decoded records before any Arrow column is built.
"""

from __future__ import annotations

import enum
import functools
import gc
import sqlite3
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress
from operator import and_, attrgetter, eq, is_not, or_
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa

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
    column_kind,
)
from metactl.errors import CorruptLogError, LogError, LogSchemaError
from metadata_log.records import RECORD_TYPES, decode_batch
from metadata_log.sqlite_store import MAGIC, SCHEMA_VERSION, resolve_log_path
from metadata_log.store import batch_crc

__all__ = [
    "LogInfo",
    "RowBuilder",
    "cluster_name",
    "iter_batches",
    "log_info",
    "log_time_bounds",
    "parse_any_of",
    "read_arrow",
]

ROWS_PER_ARROW_BATCH: Final = 65_536


class _NotNull:
    """The `any_of` condition "the column is set"; pickles as a reference to NOT_NULL, so
    identity survives the trip to executors."""

    def __repr__(self) -> str:
        return "NOT_NULL"

    def __reduce__(self) -> str:
        return "NOT_NULL"


NOT_NULL: Final = _NotNull()


def parse_any_of(text: str) -> list[tuple[str, Any]]:
    """``record_type=UncleanRecovery,leader=-1,isr``: conditions of the ``anyOf`` option.

    ``column=value`` compares (ints for int columns, true/false for booleans); a bare
    column means "is set". A record is kept when any condition holds.
    """
    out: list[tuple[str, Any]] = []
    for item in text.split(","):
        part = item.strip()
        if not part:
            continue
        col, sep, raw = part.partition("=")
        col = col.strip()
        kind = column_kind(col)
        if col in POSITIONAL and (col != RECORD_TYPE or not sep):
            raise ValueError(f"anyOf: {col} cannot be tested (only record_type=TYPE)")
        if kind in ("ints", "candidates", "ts") and sep:
            raise ValueError(f"anyOf: {col} can only be tested for being set")
        if not sep:
            out.append((col, NOT_NULL))
        elif kind in ("int", "long"):
            out.append((col, int(raw)))
        elif kind == "bool":
            out.append((col, raw.strip().lower() == "true"))
        else:
            out.append((col, raw.strip()))
    return out


_FETCH_ROWS: Final = 256


# --- the file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogInfo:
    path: str  # the SQLite file
    start_offset: int
    end_offset: int  # one past the last record
    batches: int


def _connect(path: str | Path) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise LogError(f"cannot open {path} read-only: {exc}") from exc


def log_info(data_dir_or_file: str | Path) -> LogInfo:
    """Where the log is and which offsets it holds; checks that it is a metactl log."""
    path = resolve_log_path(data_dir_or_file)
    if not path.is_file():
        raise LogError(f"no metadata log at {path}")
    conn = _connect(path)
    try:
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise LogSchemaError(f"{path} is not a metactl metadata log: {exc}") from exc
        if meta.get("magic") != MAGIC:
            raise LogSchemaError(f"{path} is not a metactl metadata log")
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise LogSchemaError(
                f"{path} has log schema version {meta.get('schema_version')!r}; "
                f"this reader knows {SCHEMA_VERSION}"
            )
        start = int(meta["start_offset"])
        row = conn.execute(
            "SELECT last_offset, (SELECT count(*) FROM batches) FROM batches "
            "ORDER BY base_offset DESC LIMIT 1"
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        return LogInfo(str(path), start, start, 0)
    return LogInfo(str(path), start, int(row[0]) + 1, int(row[1]))


def log_time_bounds(path: str | Path) -> tuple[int | None, int | None]:
    """The oldest and newest batch timestamps (ms) of a log file; None when it is empty."""
    conn = _connect(path)
    try:
        row = conn.execute("SELECT min(timestamp_ms), max(timestamp_ms) FROM batches").fetchone()
    finally:
        conn.close()
    return (row[0], row[1]) if row else (None, None)


def cluster_name(data_dir_or_file: str | Path) -> str:
    """The default cluster label of a data directory: its name (the file's directory's)."""
    path = Path(data_dir_or_file).resolve()
    if path.is_file() or path.suffix in (".sqlite", ".sqlite3", ".db"):
        path = path.parent
    return path.name


def iter_batches(
    path: str | Path, start: int, end: int
) -> Iterator[list[tuple[int, int, int, bytes]]]:
    """Stored batches whose base offset lies in [start, end), CRC-checked, in chunks.

    Yields lists of (base_offset, record_count, timestamp_ms, payload).
    """
    conn = _connect(path)
    try:
        cur = conn.execute(
            "SELECT base_offset, last_offset, record_count, timestamp_ms, crc, payload "
            "FROM batches WHERE base_offset >= ? AND base_offset < ? ORDER BY base_offset",
            (start, end),
        )
        while True:
            rows = cur.fetchmany(_FETCH_ROWS)
            if not rows:
                return
            chunk = []
            for base, last, count, ts, crc, payload in rows:
                if type(payload) is not bytes or last != base + count - 1 or count < 1:
                    raise CorruptLogError("malformed batch row", path=str(path), offset=base)
                if batch_crc(base, count, ts, payload) != crc:
                    raise CorruptLogError("batch CRC mismatch", path=str(path), offset=base)
                chunk.append((base, count, ts, payload))
            yield chunk
    except sqlite3.DatabaseError as exc:
        raise CorruptLogError(f"SQLite reports damage: {exc}", path=str(path)) from exc
    finally:
        conn.close()


# --- projected decoders ------------------------------------------------------------------


def _plain(tp: Any) -> Any:
    """The type with enums replaced by their value type (str or int)."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return str if issubclass(tp, str) else int
    args = typing.get_args(tp)
    if args and isinstance(tp, types.UnionType):
        out = _plain(args[0])
        for a in args[1:]:
            out = out | _plain(a)
        return out
    return tp


def _plain_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return value


_HIDDEN_BRC: Final = (("_fenced", "fenced"), ("_ics", "in_controlled_shutdown"))


@functools.lru_cache(maxsize=64)
def _projection(columns: tuple[str, ...], wanted: frozenset[str] | None) -> Any:
    """A msgspec decoder of ``list[union of projected record classes]``.

    Every projected class has the same attributes, in the same order: the selected field
    columns (absent ones default to None under a key no record uses), plus two hidden
    ones when ``reason`` is selected (to derive a BrokerRegistrationChange's reason).
    Record types outside `wanted` decode nothing: all their attributes are None.
    """
    field_columns = [c for c in columns if c not in POSITIONAL]
    hidden = _HIDDEN_BRC if "reason" in field_columns else ()
    classes = []
    for tag, cls in RECORD_TYPES.items():
        info = {f.name: f for f in msgspec.structs.fields(cls)}
        selected = wanted is None or tag in wanted
        fields: list[tuple[Any, ...]] = []
        for col in field_columns:
            src = FIELD_SOURCES[col].get(tag) if selected else None
            if src is None:
                fields.append((col, None, msgspec.field(name="~absent~" + col, default=None)))
                continue
            f = info[src]
            if f.default is not msgspec.NODEFAULT:
                spec = msgspec.field(name=f.encode_name, default=_plain_default(f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                spec = msgspec.field(name=f.encode_name, default_factory=f.default_factory)
            else:
                spec = msgspec.field(name=f.encode_name)
            fields.append((col, _plain(f.type), spec))
        for attr, src in hidden:
            name = src if selected and tag == "BrokerRegistrationChange" else "~absent~" + attr
            fields.append((attr, bool | None, msgspec.field(name=name, default=None)))
        classes.append(
            msgspec.defstruct(
                f"Audit{tag}",
                fields,
                tag=tag,
                tag_field="type",
                kw_only=True,
                frozen=True,
                gc=False,
            )
        )
    union: Any = classes[0]
    for c in classes[1:]:
        union = union | c
    return msgspec.msgpack.Decoder(list[union])


# --- rows --------------------------------------------------------------------------------


class RowBuilder:
    """Turns stored batches into Arrow record batches of the selected audit columns.

    `validate` also decodes every payload with `metadata_log.records.decode_batch`, so
    that fields outside the audit schema are checked too (the export does this).
    """

    def __init__(
        self,
        cluster: str,
        columns: Sequence[str] = COLUMN_NAMES,
        types: frozenset[str] | None = None,
        *,
        validate: bool = False,
        any_of: Sequence[tuple[str, Any]] = (),
        prefilter: bool = True,
    ) -> None:
        self.cluster = cluster
        self.location = ""  # the log file, for error messages (set by read_arrow)
        self.columns = tuple(columns)
        missing = [c for c, _ in any_of if c not in self.columns]
        if missing:
            raise ValueError(f"filter column(s) {missing} must be among the selected columns")
        self.any_of = tuple(any_of)
        self.types = None if types is None or types >= set(RECORD_TYPES) else types
        self.schema = arrow_schema(self.columns)
        self.validate = validate
        self._decoder = _projection(self.columns, self.types)
        self._field_columns = [c for c in self.columns if c not in POSITIONAL]
        self._tags = _tags_by_class(self._decoder)
        # When every any_of condition can only hold for a selected type, the type test is
        # redundant: unselected types decode no fields, and a None never matches.
        self._type_patterns, self._any_patterns = (
            _patterns(self.types, self.any_of) if prefilter and not validate else (None, None)
        )
        self._any_of_implies_types = (
            bool(self.any_of)
            and self.types is not None
            and all(col != RECORD_TYPE or want in self.types for col, want in self.any_of)
        )

    def decode(self, payload: bytes, count: int, base: int) -> list[Any]:
        if self.validate:
            try:
                decode_batch(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise CorruptLogError(
                    f"batch does not decode: {exc}", path=self.location, offset=base
                ) from exc
        try:
            records: list[Any] = self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptLogError(
                f"batch does not decode: {exc}", path=self.location, offset=base
            ) from exc
        if len(records) != count:
            raise CorruptLogError(
                f"batch header says {count} records, payload holds {len(records)}",
                path=self.location,
                offset=base,
            )
        return records

    def build(self, batches: Sequence[tuple[int, int, int, bytes]]) -> pa.RecordBatch:
        """One Arrow batch holding every (selected) record of `batches`, in offset order."""
        gc_was_enabled = gc.isenabled()
        gc.disable()  # millions of short-lived objects, no cycles: collections are waste
        try:
            return self._build(batches)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _build(self, batches: Sequence[tuple[int, int, int, bytes]]) -> pa.RecordBatch:
        records: list[Any] = []
        counts = np.empty(len(batches), dtype=np.int64)
        bases = np.empty(len(batches), dtype=np.int64)
        stamps = np.empty(len(batches), dtype=np.int64)
        kept = 0
        type_patterns, any_patterns = self._type_patterns, self._any_patterns
        for base, count, ts, payload in batches:
            if (type_patterns is not None and not any(p in payload for p in type_patterns)) or (
                any_patterns is not None and not any(p in payload for p in any_patterns)
            ):
                continue  # no record of this batch can be selected
            records.extend(self.decode(payload, count, base))
            counts[kept], bases[kept], stamps[kept] = count, base, ts
            kept += 1
        counts, bases, stamps = counts[:kept], bases[:kept], stamps[:kept]
        n = len(records)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        offsets = np.repeat(bases, counts) + (np.arange(n, dtype=np.int64) - starts)
        stamps_ms = np.repeat(stamps, counts)
        if self.types is not None or self.any_of:
            keep = self._selection(records)
            records = list(compress(records, keep))
            mask = np.fromiter(keep, dtype=bool, count=n)
            offsets, stamps_ms = offsets[mask], stamps_ms[mask]
        tags = list(map(self._tags.__getitem__, map(type, records)))
        return self._arrow(records, tags, offsets, stamps_ms)

    def _selection(self, records: list[Any]) -> list[bool]:
        """Which records to keep: selected type, and any `any_of` condition.

        Every step is a ``map`` over C-level callables, so the per-record cost stays in
        tens of nanoseconds (this runs for every record of a scan).
        """
        classes = list(map(type, records))
        keep: list[Any] | None = None
        if self.types is not None and not self._any_of_implies_types:
            wanted = {cls: tag in self.types for cls, tag in self._tags.items()}
            keep = list(map(wanted.__getitem__, classes))
        if self.any_of:
            hits: Any = None
            for col, want in self.any_of:
                if col == RECORD_TYPE:
                    match = {cls: tag == want for cls, tag in self._tags.items()}
                    flags: Any = map(match.__getitem__, classes)
                else:
                    values = map(attrgetter(col), records)
                    test = partial(is_not, None) if want is NOT_NULL else partial(eq, want)
                    flags = map(test, values)
                hits = flags if hits is None else map(or_, hits, flags)
            keep = list(hits) if keep is None else list(map(and_, keep, hits))
        assert keep is not None
        return keep

    def _arrow(
        self, records: list[Any], tags: list[str], offsets: Any, stamps_ms: Any
    ) -> pa.RecordBatch:
        n = len(records)
        values = {c: list(map(attrgetter(c), records)) for c in self._field_columns}
        if "reason" in values:
            values["reason"] = _brc_reasons(
                values["reason"],
                tags,
                list(map(attrgetter("_fenced"), records)),
                list(map(attrgetter("_ics"), records)),
            )
        arrays = []
        for col in self.columns:
            if col == CLUSTER:
                arrays.append(pa.array([self.cluster] * n, pa.string()))
            elif col == OFFSET:
                arrays.append(pa.array(offsets, pa.int64()))
            elif col == TIMESTAMP:
                arrays.append(_timestamps(stamps_ms))
            elif col == RECORD_TYPE:
                arrays.append(pa.array(tags, pa.string()))
            else:
                arrays.append(_to_arrow(col, values[col]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _patterns(
    types: frozenset[str] | None, any_of: Sequence[tuple[str, Any]]
) -> tuple[tuple[bytes, ...] | None, tuple[bytes, ...] | None]:
    """Byte strings, one of which every payload holding a selected record must contain.

    The log's payloads are msgspec MessagePack (`records.encode_batch`): a record is a map
    whose ``type`` tag is an encoded string, and a field that differs from its default is
    its encoded name followed by its encoded value (omitted defaults are the catch: a
    condition a default satisfies falls back to the record type's tag). So a batch with
    none of the patterns holds no selected record and is skipped undecoded: a pre-filter,
    never the filter (selected batches are decoded and tested exactly).
    """
    enc = msgspec.msgpack.encode
    type_patterns = None if types is None else tuple(enc(t) for t in sorted(types))
    if not any_of:
        return type_patterns, None
    out: list[bytes] = []
    for col, want in any_of:
        if col == RECORD_TYPE:
            out.append(enc(want))
            continue
        for tag, src in FIELD_SOURCES[col].items():
            if types is not None and tag not in types:
                continue  # projected away: always None, never selected
            f = next(f for f in msgspec.structs.fields(RECORD_TYPES[tag]) if f.name == src)
            if f.default_factory is not msgspec.NODEFAULT:
                default: Any = f.default_factory()
            elif f.default is not msgspec.NODEFAULT:
                default = _plain_default(f.default)
            else:
                default = msgspec.NODEFAULT
            if want is NOT_NULL:
                may_hold_by_default = default is not msgspec.NODEFAULT and default is not None
                out.append(enc(tag) if may_hold_by_default else enc(f.encode_name))
            elif default is not msgspec.NODEFAULT and default == want:
                out.append(enc(tag))
            else:
                out.append(enc(f.encode_name) + enc(want))
    return type_patterns, tuple(dict.fromkeys(out))


def _tags_by_class(decoder: Any) -> dict[type, str]:
    union = typing.get_args(decoder.type)[0]
    return {cls: str(cls.__struct_config__.tag) for cls in typing.get_args(union)}


def _timestamps(ms: Any) -> pa.Array:
    return pa.array(np.asarray(ms, dtype=np.int64) * 1000, pa.int64()).cast(
        pa.timestamp("us", tz="UTC")
    )


def _to_arrow(col: str, values: Sequence[Any]) -> pa.Array:
    tp = arrow_type(col)
    if col == "offline_since":
        ms = [None if v is None else v * 1000 for v in values]
        return pa.array(ms, pa.int64()).cast(tp)
    if col == "candidates":
        return pa.array(
            [
                None
                if v is None
                else [
                    {
                        "broker": c.broker_id,
                        "last_leader_epoch": c.last_leader_epoch,
                        "log_end_offset": c.log_end_offset,
                    }
                    for c in v
                ]
                for v in values
            ],
            tp,
        )
    return pa.array(values, tp)


def _brc_reasons(
    reasons: list[Any], tags: list[str], fenced: list[Any], ics: list[Any]
) -> list[Any]:
    if "BrokerRegistrationChange" not in tags:
        return reasons
    for i, tag in enumerate(tags):
        if tag == "BrokerRegistrationChange":
            if ics[i]:
                reasons[i] = "controlled_shutdown"
            elif fenced[i] is not None:
                reasons[i] = "fenced" if fenced[i] else "unfenced"
    return reasons


def read_arrow(
    path: str | Path,
    start: int,
    end: int,
    builder: RowBuilder,
    rows_per_batch: int = ROWS_PER_ARROW_BATCH,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records in stored batches with base offset in [start, end)."""
    builder.location = str(path)
    pending: list[tuple[int, int, int, bytes]] = []
    size = 0
    for chunk in iter_batches(path, start, end):
        for batch in chunk:
            pending.append(batch)
            size += batch[1]
            if size >= rows_per_batch:
                out = builder.build(pending)
                pending, size = [], 0
                if out.num_rows:
                    yield out
    if pending:
        out = builder.build(pending)
        if out.num_rows:
            yield out
