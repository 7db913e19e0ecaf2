"""Selections of the audit readers: ``anyOf`` conditions and the byte pre-filter.

This module owns what a selection *is*: parsing the ``anyOf`` option (`parse_any_of`) into
``(column, value)`` conditions, the `NOT_NULL` condition ("the column is set"), and the
byte strings (`_patterns`) by which a stored batch that can hold no selected record is
skipped before it is decoded.

It does not open logs or decode payloads (`audit.logread`, `audit.rows`), and it never
decides a row's fate alone: the patterns are a pre-filter only, and `audit.rows` tests
every decoded record exactly.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from audit.schema import FIELD_SOURCES, POSITIONAL, RECORD_TYPE, column_kind
from metadata_log.records import RECORD_TYPES

__all__ = [
    "NOT_NULL",
    "parse_any_of",
]


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


def _plain_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return value


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
