"""A copy of a metadata log as a SQLite log file: the same batches at the same offsets,
with the same timestamps and CRCs, and the same snapshots.

The audits and the Parquet export read SQLite log files directly (plain `sqlite3`, on
Spark's executors too), so a log kept elsewhere, on etcd, is audited through a mirror:
`metactl log mirror --data-dir etcd://... --to DIR`, or implicitly by `log export` and the
audit commands when they are given an etcd URL. The copy is taken at the source's end
offset when it starts; it is written to a temporary file and renamed into place only
once complete, so a partial mirror never looks like a log.

This module must not interpret records, and never writes to the source.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from metactl.errors import InvalidRequestError, StorageError
from metadata_log.batch_format import StoredBatch, StoredSnapshot
from metadata_log.sqlite_format import (
    INSERT_BATCH_SQL,
    INSERT_SNAPSHOT_SQL,
    LOG_FILE_NAME,
    SET_START_OFFSET_SQL,
    batch_row,
    schema_script,
    snapshot_row,
)
from metadata_log.store import LogStore

__all__ = ["MirrorReport", "mirror_to_sqlite"]


@dataclass(frozen=True)
class MirrorReport:
    source: str
    path: str
    start_offset: int
    end_offset: int
    batches: int
    snapshots: int
    seconds: float


class _Writer:
    """The mirror file, written in one SQLite transaction per chunk, with the SQLite
    store's schema and statements (`metadata_log.sqlite_format`). Plain sqlite3 in its
    default rollback-journal mode rather than a `SqliteLogStore`, whose WAL mode would
    stay in the file's header and whose writer lock would leave a file beside it: the
    audits open the copy read-only on Spark's executors. The calls are short and run on
    the event loop's thread."""

    def __init__(self, path: Path, start_offset: int) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.executescript(schema_script(time.time_ns() // 10**6))
        self.conn.execute(SET_START_OFFSET_SQL, (start_offset,))

    def batches(self, batches: Iterable[StoredBatch]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany(INSERT_BATCH_SQL, [batch_row(b) for b in batches])
        self.conn.execute("COMMIT")

    def snapshot(self, s: StoredSnapshot) -> None:
        self.conn.execute(INSERT_SNAPSHOT_SQL, snapshot_row(s))


async def mirror_to_sqlite(source: LogStore, out_dir: str | os.PathLike[str]) -> MirrorReport:
    """Copy `source` (open, any backend) into ``out_dir/metadata.log.sqlite``; refuses an
    existing log file there."""
    started = time.perf_counter()
    target, partial = Path(out_dir) / LOG_FILE_NAME, Path(out_dir) / f"{LOG_FILE_NAME}.partial"
    writer = _create(target, partial, source.start_offset)
    batches = snapshots = 0
    end = source.start_offset
    try:
        async for chunk in source.iter_stored():
            writer.batches(chunk)
            batches += len(chunk)
            end = chunk[-1].end_offset
        for offset in await source.snapshot_offsets():
            if offset > end:
                continue  # taken after the copy's end: not part of this copy
            snap = await source.stored_snapshot(offset)
            if snap is not None:
                writer.snapshot(snap)
                snapshots += 1
        writer.conn.close()
        os.replace(partial, target)
    except BaseException as exc:
        writer.conn.close()
        _discard(partial)
        if isinstance(exc, sqlite3.Error | OSError):
            raise StorageError(f"writing the mirror {target} failed: {exc}") from exc
        raise
    return MirrorReport(
        source=source.location,
        path=str(target),
        start_offset=source.start_offset,
        end_offset=end,
        batches=batches,
        snapshots=snapshots,
        seconds=time.perf_counter() - started,
    )


def _create(target: Path, partial: Path, start_offset: int) -> _Writer:
    if target.exists():
        raise InvalidRequestError(f"{target} exists: mirror into an empty directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        return _Writer(partial, start_offset)
    except (OSError, sqlite3.Error) as exc:
        raise StorageError(f"cannot write a mirror in {target.parent}: {exc}") from exc


def _discard(partial: Path) -> None:
    partial.unlink(missing_ok=True)
