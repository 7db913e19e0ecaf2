"""Read the SQLite metadata log without the store: stdlib sqlite3, read-only, no asyncio.

Spark executors and the export run this: each opens ``<data_dir>/metadata.log.sqlite``
with a ``file:...?mode=ro`` URI and reads whole stored batches (the table layout is
`metadata_log.sqlite_store`'s: one row per batch, ``base_offset`` the key), checking each
batch's CRC (`metadata_log.batch_format.batch_crc`). This module owns the file: where a log is
(`log_info`, `cluster_name`), its time bounds, and its stored batches (`iter_batches`).

It does not decode payloads or build rows (`audit.rows` turns batches into Arrow columns
of the audit schema; `audit.selection` parses filters), and it never writes: every
connection is read-only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metactl.errors import CorruptLogError, LogError, LogSchemaError
from metadata_log.batch_format import batch_crc
from metadata_log.sqlite_format import MAGIC, SCHEMA_VERSION, resolve_log_path

__all__ = [
    "LogInfo",
    "cluster_name",
    "iter_batches",
    "log_info",
    "log_time_bounds",
]

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
