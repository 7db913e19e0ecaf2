"""Audit rows: stored batches decoded into Arrow record batches of the audit schema.

This module owns decoding and row building. Payloads are decoded into *projected* record
classes derived from `metadata_log.records` at import time: the same tags, wire names,
types and defaults, holding only the fields of the selected columns (enums read as their
values), every class with the same attributes so that a column is one
``map(attrgetter(...))``. Record types outside the selection decode nothing. Skipping
fields is what makes a job's scan cheap (a full `decode_batch` plus per-field ``getattr``
costs several times more); with ``validate`` (the export's default) each payload is also
decoded with `metadata_log.records.decode_batch`, which checks every field.

Selections (record types, ``any_of`` conditions, see `audit.selection`) first skip whole
batches by their bytes, then filter decoded records before any Arrow column is built.

It does not open or check the log file itself: stored, CRC-checked batches come from
`audit.logread.iter_batches`. Spark executors and the export run this.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import types
import typing
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import compress
from operator import and_, attrgetter, eq, is_not, or_
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa

from audit.logread import iter_batches
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
from audit.selection import NOT_NULL, _patterns, _plain_default
from metactl.errors import CorruptLogError
from metadata_log.records import RECORD_TYPES, decode_batch

__all__ = [
    "RowBuilder",
    "paused_gc",
    "read_arrow",
]

ROWS_PER_ARROW_BATCH: Final = 65_536


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the block (restored after it): a pass over a
    log makes millions of short-lived objects with no cycles (decoded records, their
    lists, the checkers' sets), and collections triggered by their count only waste time
    (about half of a plain decode). Reference counting still frees them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
        with paused_gc():
            return self._build(batches)

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
                arrays.append(to_arrow(col, values[col]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _tags_by_class(decoder: Any) -> dict[type, str]:
    union = typing.get_args(decoder.type)[0]
    return {cls: str(cls.__struct_config__.tag) for cls in typing.get_args(union)}


def _timestamps(ms: Any) -> pa.Array:
    return pa.array(np.asarray(ms, dtype=np.int64) * 1000, pa.int64()).cast(
        pa.timestamp("us", tz="UTC")
    )


def to_arrow(col: str, values: Sequence[Any]) -> pa.Array:
    """One column's Python values (record fields) as Arrow of the schema's type: the data
    source's rows and `log export`'s files share it."""
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
