"""One line per metadata log entry, as `metactl log dump` and `log tail` print them:
compact text (offset, commit time, type and the fields that say something) or JSON, and
the `--type` filter. Imported when those commands run (`ops.log_cmds`), with the record
types. No IO but writing the lines to the stream it is given.
"""

from __future__ import annotations

import json
from typing import TextIO

import msgspec

from eventfeed.feed import iso_ms
from metactl.errors import InvalidRequestError
from metadata_log.batch_format import LogEntry
from metadata_log.records import RECORD_TYPES, record_type, to_builtins


def format_entry(entry: LogEntry, *, as_json: bool) -> str:
    """One line for an entry: compact text, or JSON with offset, timestamp_ms and crc."""
    if as_json:
        row: dict[str, object] = {
            "offset": entry.offset,
            "timestamp_ms": entry.timestamp_ms,
            "crc": entry.crc,
        }
        row.update(to_builtins(entry.record))
        return json.dumps(row, separators=(",", ":"))
    stamp = iso_ms(entry.timestamp_ms)
    # to_builtins of the struct itself omits defaults: only the fields that say something.
    fields = msgspec.to_builtins(entry.record)
    fields.pop("type", None)
    text = " ".join(f"{key}={_compact(value)}" for key, value in fields.items())
    return f"{entry.offset:>8}  {stamp}  {record_type(entry.record):<24}  {text}".rstrip()


def _compact(value: object) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in "=\"'" for c in value):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def type_filter(types: list[str] | None) -> frozenset[str] | None:
    """--type's record types (case-insensitive, with or without `Record`); None: every
    type. INVALID_REQUEST names an unknown one and lists the known."""
    if not types:
        return None
    by_name = {name.lower(): name for name in RECORD_TYPES}
    by_name.update({f"{name.lower()}record": name for name in RECORD_TYPES})
    chosen = set()
    for item in types:
        for name in filter(None, (part.strip() for part in item.split(","))):
            if name.lower() not in by_name:
                known = ", ".join(sorted(RECORD_TYPES))
                raise InvalidRequestError(f"unknown record type {name!r} (known: {known})")
            chosen.add(by_name[name.lower()])
    return frozenset(chosen)


def print_entries(
    entries: list[LogEntry], types: frozenset[str] | None, as_json: bool, out: TextIO
) -> None:
    lines = [
        format_entry(e, as_json=as_json)
        for e in entries
        if types is None or record_type(e.record) in types
    ]
    if lines:
        out.write("\n".join(lines) + "\n")
