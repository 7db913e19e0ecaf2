"""The SQLite log file's format: its name, header, schema and queries, and how its rows
and errors map to the store's types.

File format (schema version 1)::

    meta(key TEXT PRIMARY KEY, value)      -- magic, schema_version, start_offset, created_ms,
                                           -- cluster_id (written by the controller's first
                                           -- start: metadata_log.identity_check)
    batches(base_offset INTEGER PRIMARY KEY, last_offset, record_count, timestamp_ms,
            crc, payload BLOB)             -- payload = records.encode_batch(...)
    snapshots(snap_offset INTEGER PRIMARY KEY, timestamp_ms, crc, payload BLOB)

``base_offset`` is the rowid, so the batch holding any offset is one b-tree seek away
(``max(base_offset) WHERE base_offset <= ?``).

Plain `sqlite3` only: the audits' stdlib readers import this module without asyncio.
It must not open connections, hold state or interpret records.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Final

from metactl.errors import CorruptLogError, LogError, LogSchemaError, StorageError
from metadata_log.batch_format import StoredBatch, StoredSnapshot

LOG_FILE_NAME: Final = "metadata.log.sqlite"
MAGIC: Final = "metactl-metadata-log"
SCHEMA_VERSION: Final = 1
FOLLOWER_POLL_INTERVAL: Final = 0.05
BUSY_TIMEOUT_MS: Final = 5000

SCHEMA_SQL: Final = """
BEGIN IMMEDIATE;
CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value NOT NULL) WITHOUT ROWID;
CREATE TABLE batches (
    base_offset INTEGER PRIMARY KEY,
    last_offset INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE snapshots (
    snap_offset INTEGER PRIMARY KEY,
    timestamp_ms INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    payload BLOB NOT NULL
);
INSERT INTO meta (key, value) VALUES
    ('magic', '{magic}'),
    ('schema_version', {version}),
    ('start_offset', 0),
    ('created_ms', {created_ms});
COMMIT;
"""

TABLES_SQL: Final = "SELECT name FROM sqlite_master WHERE type = 'table'"
COLUMNS: Final = "base_offset, last_offset, record_count, timestamp_ms, crc, payload"
INSERT_BATCH_SQL: Final = f"INSERT INTO batches ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
INSERT_SNAPSHOT_SQL: Final = (
    "INSERT OR REPLACE INTO snapshots (snap_offset, timestamp_ms, crc, payload) VALUES (?, ?, ?, ?)"
)
SET_START_OFFSET_SQL: Final = "UPDATE meta SET value = ? WHERE key = 'start_offset'"
FETCH_BATCHES_SQL: Final = (
    f"SELECT {COLUMNS} FROM batches WHERE base_offset >= "
    "coalesce((SELECT max(base_offset) FROM batches WHERE base_offset <= ?1), ?1) "
    "AND base_offset < ?2 ORDER BY base_offset"
)
SCAN_BATCHES_SQL: Final = (
    f"SELECT {COLUMNS} FROM batches WHERE base_offset > ? ORDER BY base_offset LIMIT ?"
)
TAIL_BATCHES_SQL: Final = (
    f"SELECT {COLUMNS} FROM batches WHERE base_offset < ? ORDER BY base_offset DESC LIMIT ?"
)
BOUNDS_SQL: Final = (
    "SELECT (SELECT value FROM meta WHERE key = 'start_offset'), "
    "(SELECT last_offset FROM batches ORDER BY base_offset DESC LIMIT 1)"
)
# Errors after which SQLite has rolled the statement back and nothing of the commit landed.
RECOVERABLE_WRITE_ERRORS: Final = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
)


def resolve_log_path(data_dir_or_file: str | os.PathLike[str]) -> Path:
    """The log file for a data directory, or the file itself if given one.

    A path that does not exist is a directory unless it ends in .sqlite, .sqlite3 or .db.
    """
    path = Path(data_dir_or_file)
    if path.is_dir():
        return path / LOG_FILE_NAME
    if path.exists() or path.suffix in (".sqlite", ".sqlite3", ".db"):
        return path
    return path / LOG_FILE_NAME


def error_code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def wrap_sqlite_error(
    exc: sqlite3.Error, location: str, *, offset: int | None = None, opening: bool = False
) -> LogError:
    code = error_code(exc)
    if code == sqlite3.SQLITE_NOTADB and opening:
        return LogSchemaError(f"{location} is not a metactl metadata log: {exc}")
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return CorruptLogError(f"SQLite reports damage: {exc}", path=location, offset=offset)
    if code == sqlite3.SQLITE_FULL:
        return StorageError(f"disk full writing {location}: {exc}")
    return StorageError(f"SQLite error on {location}: {exc}")


def schema_script(created_ms: int) -> str:
    """The script that creates a new log's tables and header (one transaction)."""
    return SCHEMA_SQL.format(magic=MAGIC, version=SCHEMA_VERSION, created_ms=created_ms)


def batch_row(b: StoredBatch) -> tuple[int, int, int, int, int, bytes]:
    """The parameters of `INSERT_BATCH_SQL` for a stored batch."""
    return (b.base_offset, b.last_offset, b.count, b.timestamp_ms, b.crc, b.payload)


def snapshot_row(s: StoredSnapshot) -> tuple[int, int, int, bytes]:
    """The parameters of `INSERT_SNAPSHOT_SQL` for a stored snapshot."""
    return (s.offset, s.timestamp_ms, s.crc, s.payload)


def batch_from_row(row: Any, location: str) -> StoredBatch:
    base, last, count, timestamp_ms, crc, payload = row
    if type(payload) is not bytes or last != base + count - 1:
        raise CorruptLogError("malformed batch row", path=location, offset=base)
    return StoredBatch(base, count, timestamp_ms, crc, payload)
