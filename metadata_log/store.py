"""The metadata log store: its API, its data types, and the semantics every backend shares.

`LogStore` owns what an append, a read or a snapshot *means*: offset assignment, group
commit, the rule that nothing is visible or acknowledged before it is durable, long-poll
waiting, snapshot bookkeeping, verification and close. Backends (`SqliteLogStore`,
`MemoryLogStore`) only move stored batches and snapshots to and from their medium through
the small set of abstract `_primitives` below, so the two cannot drift apart semantically.

Model (after Kafka's record batches):

* Records are stored in *batches*: records encoded together with `records.encode_batch`,
  a base offset, a record count, a timestamp and a CRC. The record at index ``i`` of a
  batch has offset ``base_offset + i``. Offsets are contiguous from the log's first offset
  (0 for a new log), with no gaps and no overlaps. An append becomes one batch, except
  that consecutive appends of one group commit that carry the same timestamp are stored
  as a single batch of up to `MERGED_BATCH_RECORDS` records (they commit atomically
  together anyway; larger batches replay faster). So batch boundaries are a storage
  detail: an append's records are always contiguous and commit all-or-nothing, but may
  share a batch (and CRC) with others.
* CRC scope: CRC-32 (zlib) over the batch header (base offset, record count, timestamp)
  followed by the payload; every `LogEntry` carries the CRC of the batch it came from.
  Snapshots carry a CRC over (offset, timestamp, payload). Every read checks the CRC.
* Group commit: `append` enqueues the encoded batch and awaits a future. One writer task
  per store drains the queue and hands everything pending (up to `GROUP_COMMIT_BYTES`) to
  the backend as one durable transaction (one fsync). Only after the backend returns does
  the writer advance `end_offset`, resolve the futures and wake `wait_for` callers, so a
  reader can never observe an offset that could still be lost.
* Offsets are assigned in the order `append` was *called* (the call enqueues before its
  first suspension point), so concurrent appenders get contiguous ranges in call order.
* A cancelled `append` is not withdrawn: its batch may still be committed.
* Empty appends are refused with `InvalidRequestError` rather than returning an empty
  range: an empty batch would be a row with no offsets.
* Write failures: a backend raises `StorageError` when the medium refuses a commit (disk
  full); the appends of that group fail, nothing is acknowledged, and the store keeps
  working. A `FatalStorageError` (e.g. an I/O error during fsync, whose outcome is
  unknown) fails the group and every later write until the store is reopened.
* Records before the newest snapshot are deleted only by an explicit
  `delete_before_snapshot`, never implicitly.

This module must not know any storage medium, and must not interpret records.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import struct
import time
import zlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from itertools import repeat
from types import TracebackType
from typing import Final, Self, TypeVar

import msgspec
import structlog

from metactl.errors import (
    CorruptLogError,
    FatalStorageError,
    InvalidRequestError,
    LogClosedError,
    LogError,
    LogSchemaError,
    OffsetOutOfRangeError,
    StorageError,
)
from metadata_log.records import RECORD_TYPES, MetadataRecord, decode_batch, encode_batch

__all__ = [
    "GROUP_COMMIT_BYTES",
    "MAX_BATCH_BYTES",
    "MERGED_BATCH_RECORDS",
    "LogEntry",
    "LogStore",
    "StoredBatch",
    "StoredSnapshot",
    "VerifyReport",
    "batch_crc",
    "check_batch",
    "check_continuity",
    "concat_batches",
    "decode_entries",
    "open_store",
    "snapshot_crc",
]

T = TypeVar("T")

log = structlog.get_logger("metadata_log")

MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
"""Largest encoded payload a single append may produce."""

GROUP_COMMIT_BYTES: Final = 16 * 1024 * 1024
"""A group commit takes pending appends up to this many payload bytes (at least one)."""

MERGED_BATCH_RECORDS: Final = 1024
"""Appends of one group commit are merged into stored batches up to this many records."""

_BATCH_HEADER: Final = struct.Struct(">qiq")  # base_offset, record_count, timestamp_ms
_SNAPSHOT_HEADER: Final = struct.Struct(">qq")  # offset, timestamp_ms
_RECORD_CLASSES: Final = frozenset(RECORD_TYPES.values())
_VERIFY_CHUNK: Final = 64  # batches per scan step in verify()


def batch_crc(base_offset: int, count: int, timestamp_ms: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_BATCH_HEADER.pack(base_offset, count, timestamp_ms)))


def snapshot_crc(offset: int, timestamp_ms: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_SNAPSHOT_HEADER.pack(offset, timestamp_ms)))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogEntry(msgspec.Struct, frozen=True, gc=False):
    """One committed record and where it sits in the log.

    Not tracked by the cycle collector (``gc=False``): it cannot form cycles, and replaying
    millions of entries would otherwise trigger collections that cost more than decoding.
    """

    offset: int
    timestamp_ms: int
    crc: int  # CRC of the stored batch holding this record
    record: MetadataRecord


class StoredBatch(msgspec.Struct, frozen=True, gc=False):
    """A batch as a backend stores it: the unit of atomicity, CRC and storage."""

    base_offset: int
    count: int
    timestamp_ms: int
    crc: int
    payload: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


class StoredSnapshot(msgspec.Struct, frozen=True, gc=False):
    offset: int
    timestamp_ms: int
    crc: int
    payload: bytes


class VerifyReport(msgspec.Struct, frozen=True):
    """What a successful `LogStore.verify` checked."""

    location: str
    start_offset: int
    end_offset: int
    batches: int
    records: int
    payload_bytes: int
    snapshot_offsets: list[int]


def check_batch(batch: StoredBatch, location: str) -> list[MetadataRecord]:
    """Check one stored batch's CRC and decodability; return its records."""
    if batch.count < 1:
        raise CorruptLogError(
            f"batch holds {batch.count} records", path=location, offset=batch.base_offset
        )
    if batch_crc(batch.base_offset, batch.count, batch.timestamp_ms, batch.payload) != batch.crc:
        raise CorruptLogError("batch CRC mismatch", path=location, offset=batch.base_offset)
    try:
        records = decode_batch(batch.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptLogError(
            f"batch does not decode: {exc}", path=location, offset=batch.base_offset
        ) from exc
    if len(records) != batch.count:
        raise CorruptLogError(
            f"batch header says {batch.count} records, payload holds {len(records)}",
            path=location,
            offset=batch.base_offset,
        )
    return records


def check_continuity(batches: Sequence[StoredBatch], expected: int, location: str) -> int:
    """Check that `batches` start at `expected` and follow each other without gaps or overlaps.

    Returns the offset after the last batch.
    """
    for batch in batches:
        if batch.base_offset != expected:
            kind = "gap" if batch.base_offset > expected else "overlap"
            raise CorruptLogError(
                f"offset {kind}: expected a batch at {expected}, found one at {batch.base_offset}",
                path=location,
                offset=min(expected, batch.base_offset),
            )
        expected = batch.end_offset
    return expected


def decode_entries(
    batches: Sequence[StoredBatch], lo: int, hi: int, location: str
) -> list[LogEntry]:
    """Check and decode contiguous `batches` into the entries with offsets in [lo, hi).

    This is the replay hot path: per batch it does the checks of `check_continuity` and
    `check_batch` inline, falling back to them only to build the error.
    """
    out: list[LogEntry] = []
    append = out.append
    pack = _BATCH_HEADER.pack
    crc32 = zlib.crc32
    expected = batches[0].base_offset if batches else lo
    for stored in batches:
        base = stored.base_offset
        count = stored.count
        timestamp_ms = stored.timestamp_ms
        crc = stored.crc
        payload = stored.payload
        if base != expected:
            check_continuity([stored], expected, location)
        if count < 1 or crc32(payload, crc32(pack(base, count, timestamp_ms))) != crc:
            check_batch(stored, location)
        expected = base + count
        try:
            records = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            records = check_batch(stored, location)
        if len(records) != count:
            check_batch(stored, location)
        if count == 1:
            if lo <= base < hi:
                append(LogEntry(base, timestamp_ms, crc, records[0]))
            continue
        first = lo - base if lo > base else 0
        last = hi - base if hi - base < count else count
        if first < last:
            n = last - first
            out.extend(
                map(
                    LogEntry,
                    range(base + first, base + last),
                    repeat(timestamp_ms, n),
                    repeat(crc, n),
                    records if n == count else records[first:last],
                )
            )
    return out


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class _PendingAppend:
    __slots__ = ("count", "future", "payload", "timestamp_ms")

    def __init__(
        self, count: int, timestamp_ms: int, payload: bytes, future: asyncio.Future[range]
    ) -> None:
        self.count = count
        self.timestamp_ms = timestamp_ms
        self.payload = payload
        self.future = future


class LogStore(ABC):
    """A durable, append-only log of metadata records with snapshots.

    Use as ``async with await open_store(...) as store:`` or call `close()`.
    Not thread-safe: use from one event loop.
    """

    def __init__(
        self, *, location: str, start_offset: int, end_offset: int, read_only: bool = False
    ) -> None:
        self.location = location
        self.read_only = read_only
        self.commits = 0
        """Durable group commits done by this instance (one transaction and fsync each)."""
        self.last_commit_ns = 0
        """`time.perf_counter_ns()` when the latest group commit became durable."""
        self._start_offset = start_offset
        self._end_offset = end_offset
        self._state = _State.OPEN
        self._failure: LogError | None = None
        self._pending: deque[_PendingAppend] = deque()
        self._wakeup = asyncio.Event()
        self._advanced = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._writer_task: asyncio.Task[None] | None = None

    # --- offsets -------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """One past the last committed offset."""
        return self._end_offset

    @property
    def start_offset(self) -> int:
        """The earliest retained offset (0 until records are deleted before a snapshot)."""
        return self._start_offset

    @property
    def closed(self) -> bool:
        return self._state is not _State.OPEN

    # --- appending -----------------------------------------------------------------------

    async def append(
        self, records: Sequence[MetadataRecord], *, timestamp_ms: int | None = None
    ) -> range:
        """Append records as one batch; return their offsets once durable.

        `timestamp_ms` defaults to wall-clock time; callers in virtual time pass theirs.
        """
        self._check_writable()
        batch = records if isinstance(records, list) else list(records)
        if not batch:
            raise InvalidRequestError("append needs at least one record")
        if not set(map(type, batch)) <= _RECORD_CLASSES:
            bad = next(r for r in batch if type(r) not in _RECORD_CLASSES)
            raise InvalidRequestError(f"not a metadata record: {type(bad).__name__}")
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        elif timestamp_ms < 0:
            raise InvalidRequestError(f"negative timestamp {timestamp_ms}")
        payload = encode_batch(batch)
        if len(payload) > MAX_BATCH_BYTES:
            raise InvalidRequestError(
                f"batch of {len(payload)} bytes exceeds the {MAX_BATCH_BYTES}-byte limit"
            )
        future: asyncio.Future[range] = asyncio.get_running_loop().create_future()
        self._pending.append(_PendingAppend(len(batch), timestamp_ms, payload, future))
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.create_task(self._run_writer(), name="log-writer")
        self._wakeup.set()
        return await future

    async def _run_writer(self) -> None:
        while True:
            if not self._pending:
                if self._state is not _State.OPEN:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            group = [self._pending.popleft()]
            size = len(group[0].payload)
            while self._pending and size + len(self._pending[0].payload) <= GROUP_COMMIT_BYTES:
                item = self._pending.popleft()
                group.append(item)
                size += len(item.payload)
            async with self._write_lock:
                await self._commit_group(group)

    async def _commit_group(self, group: list[_PendingAppend]) -> None:
        if self._failure is not None:
            _fail_all(group, self._failure)
            return
        batches = _stored_batches(group, self._end_offset)
        offset = batches[-1].end_offset
        try:
            await self._write_batches(batches)
        except StorageError as exc:
            log.warning(
                "log commit failed",
                location=self.location,
                offsets=f"{self._end_offset}..{offset - 1}",
                error=str(exc),
                fatal=isinstance(exc, FatalStorageError),
            )
            if isinstance(exc, FatalStorageError):
                self._failure = exc
            _fail_all(group, exc)
            return
        except BaseException as exc:
            # Anything else leaves the medium in an unknown state: stop taking writes.
            failure = FatalStorageError(f"commit failed on {self.location}: {exc!r}")
            self._failure = failure
            _fail_all(group, failure)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
            return
        self.last_commit_ns = time.perf_counter_ns()
        self.commits += 1
        start = self._end_offset
        for item in group:
            if not item.future.done():
                item.future.set_result(range(start, start + item.count))
            start += item.count
        self._advance(offset)

    def _advance(self, end_offset: int) -> None:
        """Publish a new committed end offset and wake every `wait_for`."""
        self._end_offset = max(self._end_offset, end_offset)
        self._notify()

    def _notify(self) -> None:
        event, self._advanced = self._advanced, asyncio.Event()
        event.set()

    # --- reading -------------------------------------------------------------------------

    async def read(self, from_offset: int, max_records: int = 1000) -> list[LogEntry]:
        """Up to `max_records` committed entries starting at `from_offset`.

        Returns [] at the end of the log; raises OffsetOutOfRangeError before the log start
        (load a snapshot instead) or past the end.
        """
        self._check_open()
        if max_records < 1:
            raise InvalidRequestError(f"max_records must be positive, got {max_records}")
        await self._refresh()
        end = self._end_offset
        self._check_range(from_offset, end)
        if from_offset == end:
            return []
        upper = min(end, from_offset + max_records)
        batches = await self._fetch_batches(from_offset, upper)
        return self._entries(batches, from_offset, upper)

    async def iter_chunks(
        self, from_offset: int = 0, to_offset: int | None = None, batch: int = 2000
    ) -> AsyncIterator[list[LogEntry]]:
        """Stream entries in [from_offset, to_offset) as lists in bounded memory.

        `to_offset` defaults to the end offset when iteration starts. Each list holds about
        `batch` entries (whole stored batches, so up to one stored batch more).
        """
        self._check_open()
        if batch < 1:
            raise InvalidRequestError(f"batch must be positive, got {batch}")
        await self._refresh()
        end = self._end_offset
        stop = end if to_offset is None else to_offset
        if stop > end:
            raise OffsetOutOfRangeError(
                f"to_offset {stop} is past the end of the log ({end}) in {self.location}"
            )
        if stop < from_offset:
            raise InvalidRequestError(f"to_offset {stop} is before from_offset {from_offset}")
        self._check_range(from_offset, end)
        position = from_offset
        # Fetch the next chunk while this one is decoded: SQLite steps on its own thread
        # without the GIL, so replay uses both cores.
        fetching = self._prefetch(position, stop, batch)
        try:
            while fetching is not None:
                batches = await fetching
                upper = min(stop, batches[-1].end_offset) if batches else stop
                fetching = self._prefetch(upper, stop, batch)
                entries = self._entries(batches, position, upper)
                position = upper
                yield entries
        finally:
            if fetching is not None:
                fetching.cancel()
                with contextlib.suppress(BaseException):
                    await fetching

    def _prefetch(
        self, position: int, stop: int, batch: int
    ) -> asyncio.Task[list[StoredBatch]] | None:
        if position >= stop:
            return None
        self._check_open()
        self._check_range(position, stop)
        return asyncio.create_task(self._fetch_batches(position, min(stop, position + batch)))

    async def iter_entries(
        self, from_offset: int = 0, to_offset: int | None = None, batch: int = 2000
    ) -> AsyncIterator[LogEntry]:
        """Stream entries one at a time in bounded memory (see `iter_chunks`)."""
        async for chunk in self.iter_chunks(from_offset, to_offset, batch):
            for entry in chunk:
                yield entry

    def _check_range(self, offset: int, end: int) -> None:
        if offset < self._start_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is before the start of the log ({self._start_offset}) in "
                f"{self.location}: those records were deleted after a snapshot; load the "
                f"snapshot and read from its offset"
            )
        if offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the end of the log ({end}) in {self.location}"
            )

    def _entries(self, batches: list[StoredBatch], lo: int, hi: int) -> list[LogEntry]:
        """Decode `batches` (which must cover [lo, hi) contiguously) into entries."""
        if not batches or not batches[0].base_offset <= lo < batches[0].end_offset:
            if lo < self._start_offset:  # deleted while we were reading
                self._check_range(lo, hi)
            raise CorruptLogError("committed offset not found", path=self.location, offset=lo)
        out = decode_entries(batches, lo, hi, self.location)
        if batches[-1].end_offset < hi:
            raise CorruptLogError(
                "committed offset not found", path=self.location, offset=batches[-1].end_offset
            )
        return out

    async def wait_for(self, offset: int, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until the record at `offset` is committed (end_offset > offset).

        Returns False if `timeout` seconds pass first; raises LogClosedError if the store
        is closed while waiting.
        """
        if self._end_offset > offset:
            return True
        self._check_open()
        try:
            async with asyncio.timeout(timeout):
                while self._end_offset <= offset:
                    event = self._advanced
                    self._on_wait()
                    await event.wait()
                    if self._state is not _State.OPEN and self._end_offset <= offset:
                        raise LogClosedError(f"metadata log {self.location} was closed")
        except TimeoutError:
            return self._end_offset > offset
        return True

    # --- snapshots -----------------------------------------------------------------------

    async def write_snapshot(self, offset: int, state: object) -> None:
        """Store `state`, the result of applying every record before `offset`."""
        self._check_writable()
        if not self._start_offset <= offset <= self._end_offset:
            raise OffsetOutOfRangeError(
                f"snapshot offset {offset} is outside the log [{self._start_offset}, "
                f"{self._end_offset}] of {self.location}"
            )
        try:
            payload = msgspec.msgpack.encode(state)
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidRequestError(f"snapshot state is not encodable: {exc}") from exc
        timestamp_ms = _now_ms()
        snapshot = StoredSnapshot(
            offset, timestamp_ms, snapshot_crc(offset, timestamp_ms, payload), payload
        )
        async with self._write_lock:
            self._check_writable()
            await self._put_snapshot(snapshot)

    async def load_snapshot(self, type_: type[T]) -> tuple[int, T] | None:
        """The newest snapshot as (offset, state), or None if there is none."""
        self._check_open()
        offsets = await self._snapshot_offsets()
        if not offsets:
            return None
        snapshot = await self._get_snapshot(offsets[-1])
        if snapshot is None:
            raise CorruptLogError("snapshot vanished", path=self.location, offset=offsets[-1])
        self._check_snapshot(snapshot)
        try:
            state = msgspec.msgpack.decode(snapshot.payload, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise LogSchemaError(
                f"snapshot at offset {snapshot.offset} in {self.location} does not decode as "
                f"{type_.__name__}: {exc}"
            ) from exc
        return snapshot.offset, state

    async def snapshot_offsets(self) -> list[int]:
        """Offsets of all stored snapshots, ascending."""
        self._check_open()
        return await self._snapshot_offsets()

    async def delete_before_snapshot(self, offset: int | None = None) -> int:
        """Delete stored batches that lie wholly before `offset` (default: the newest snapshot).

        Refuses unless a snapshot exists at or after `offset`. Returns the number of
        records deleted. Never called implicitly.
        """
        self._check_writable()
        async with self._write_lock:
            self._check_writable()
            offsets = await self._snapshot_offsets()
            if offset is None:
                if not offsets:
                    raise InvalidRequestError(
                        f"no snapshot in {self.location}: refusing to delete log records"
                    )
                offset = offsets[-1]
            elif not any(o >= offset for o in offsets):
                raise InvalidRequestError(
                    f"no snapshot at or after offset {offset} in {self.location}: refusing to "
                    f"delete log records"
                )
            old_start = self._start_offset
            new_start = await self._retained_start(offset)
            if new_start <= old_start:
                return 0
            # Refuse new reads of the doomed range before the rows go.
            self._start_offset = new_start
            try:
                await self._delete_batches_before(new_start)
            except BaseException:
                self._start_offset = old_start
                raise
            log.info(
                "deleted log records before snapshot",
                location=self.location,
                snapshot_offset=offset,
                start_offset=new_start,
                records=new_start - old_start,
            )
            return new_start - old_start

    def _check_snapshot(self, snapshot: StoredSnapshot) -> None:
        expected = snapshot_crc(snapshot.offset, snapshot.timestamp_ms, snapshot.payload)
        if expected != snapshot.crc:
            raise CorruptLogError(
                "snapshot CRC mismatch", path=self.location, offset=snapshot.offset
            )

    # --- verification --------------------------------------------------------------------

    async def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every batch (CRC, decodability, continuity) and every snapshot.

        Raises CorruptLogError naming the first bad offset; `progress(offset, end)` is
        called after each scanned chunk.
        """
        self._check_open()
        await self._refresh()
        start, end = self._start_offset, self._end_offset
        expected = start
        batches = payload_bytes = 0
        try:
            after: int | None = None
            while expected < end:
                chunk = await self._scan_batches(after, _VERIFY_CHUNK, expected)
                chunk = [b for b in chunk if b.base_offset < end]
                if not chunk:
                    break
                for stored in chunk:
                    expected = check_continuity([stored], expected, self.location)
                    check_batch(stored, self.location)
                    payload_bytes += len(stored.payload)
                batches += len(chunk)
                after = chunk[-1].base_offset
                if progress is not None:
                    progress(expected, end)
            if expected != end:
                raise CorruptLogError(
                    f"log ends at offset {expected} but its end offset is {end}",
                    path=self.location,
                    offset=expected,
                )
            offsets = await self._snapshot_offsets()
            for snapshot_offset in offsets:
                snapshot = await self._get_snapshot(snapshot_offset)
                if snapshot is None:
                    continue
                self._check_snapshot(snapshot)
                if snapshot.offset > end:
                    raise CorruptLogError(
                        f"snapshot lies past the end of the log ({end})",
                        path=self.location,
                        offset=snapshot.offset,
                    )
            if start > 0 and not any(o >= start for o in offsets):
                raise CorruptLogError(
                    "records before the log start were deleted but no snapshot covers them",
                    path=self.location,
                    offset=start,
                )
            await self._verify_storage()
        except CorruptLogError as exc:
            log.warning("metadata log is corrupt", location=self.location, error=str(exc))
            raise
        return VerifyReport(
            location=self.location,
            start_offset=start,
            end_offset=end,
            batches=batches,
            records=end - start,
            payload_bytes=payload_bytes,
            snapshot_offsets=offsets,
        )

    # --- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Finish the appends already submitted, then close. Idempotent."""
        if self._state is not _State.OPEN:
            while self._state is _State.CLOSING:
                await self._advanced.wait()
            return
        self._state = _State.CLOSING
        try:
            if self._writer_task is not None:
                self._wakeup.set()
                await self._writer_task
        finally:
            try:
                await self._close_storage()
            finally:
                self._state = _State.CLOSED
                self._notify()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise LogClosedError(f"metadata log {self.location} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise InvalidRequestError(f"metadata log {self.location} is open read-only")
        if self._failure is not None:
            raise FatalStorageError(
                f"metadata log {self.location} stopped taking writes after an earlier failure "
                f"({self._failure.message}); reopen it"
            )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.location} [{self._start_offset}, "
            f"{self._end_offset}) {self._state.value}>"
        )

    # --- backend primitives --------------------------------------------------------------

    @abstractmethod
    async def _write_batches(self, batches: list[StoredBatch]) -> None:
        """Store `batches` durably in one transaction; return only once they survive a crash.

        On failure store none of them and raise StorageError (or FatalStorageError).
        """

    @abstractmethod
    async def _fetch_batches(self, from_offset: int, upper: int) -> list[StoredBatch]:
        """The stored batches overlapping [from_offset, upper), ascending."""

    @abstractmethod
    async def _scan_batches(self, after: int | None, limit: int, near: int) -> list[StoredBatch]:
        """Up to `limit` batches with base offset > `after` (all if None), ascending.

        `near` is the offset the caller expects next, for error messages.
        """

    @abstractmethod
    async def _retained_start(self, offset: int) -> int:
        """The base offset of the first batch not wholly before `offset` (or `offset`)."""

    @abstractmethod
    async def _delete_batches_before(self, new_start: int) -> None:
        """Durably delete batches with base offset < new_start and record the new start."""

    @abstractmethod
    async def _put_snapshot(self, snapshot: StoredSnapshot) -> None:
        """Store a snapshot durably, replacing one at the same offset."""

    @abstractmethod
    async def _get_snapshot(self, offset: int) -> StoredSnapshot | None: ...

    @abstractmethod
    async def _snapshot_offsets(self) -> list[int]: ...

    @abstractmethod
    async def _close_storage(self) -> None: ...

    async def _refresh(self) -> None:
        """Pick up commits made by another process (read-only followers only)."""
        return

    def _on_wait(self) -> None:
        """Called when a `wait_for` starts waiting (followers make sure they poll)."""
        return

    async def _verify_storage(self) -> None:
        """Backend-level consistency checks run at the end of `verify`."""
        return


def _stored_batches(group: list[_PendingAppend], offset: int) -> list[StoredBatch]:
    """Assign offsets to a group commit and cut it into stored batches.

    Consecutive appends with the same timestamp become one stored batch of at most
    `MERGED_BATCH_RECORDS` records: the group is one transaction anyway, and fewer, larger
    batches replay much faster (see sqlite_store). The cap keeps a read that starts inside
    a batch from decoding a huge one.
    """
    batches: list[StoredBatch] = []
    i = 0
    while i < len(group):
        timestamp_ms = group[i].timestamp_ms
        count = group[i].count
        j = i + 1
        while (
            j < len(group)
            and group[j].timestamp_ms == timestamp_ms
            and count + group[j].count <= MERGED_BATCH_RECORDS
        ):
            count += group[j].count
            j += 1
        if j == i + 1:
            payload = group[i].payload
        else:
            payload = concat_batches([item.payload for item in group[i:j]], count)
        crc = batch_crc(offset, count, timestamp_ms, payload)
        batches.append(StoredBatch(offset, count, timestamp_ms, crc, payload))
        offset += count
        i = j
    return batches


def concat_batches(payloads: Sequence[bytes], count: int) -> bytes:
    """Join payloads of `records.encode_batch` into one, as if the records were encoded together.

    A payload is a MessagePack array: a header giving its length, then the elements. The
    merged payload is a header for `count` elements followed by every payload's elements.
    """
    parts: list[bytes | memoryview] = [_msgpack_array_header(count)]
    for payload in payloads:
        head = payload[0]
        if head & 0xF0 == 0x90:  # fixarray
            skip = 1
        elif head == 0xDC:  # array 16
            skip = 3
        elif head == 0xDD:  # array 32
            skip = 5
        else:
            raise ValueError(f"not a MessagePack array (first byte {head:#x})")
        parts.append(memoryview(payload)[skip:])
    return b"".join(parts)


def _msgpack_array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _fail_all(group: list[_PendingAppend], exc: LogError) -> None:
    for item in group:
        if not item.future.done():
            item.future.set_exception(_copy_error(exc))


def _copy_error(exc: LogError) -> LogError:
    """A fresh instance per caller, so tracebacks do not pile up on one shared object."""
    try:
        error = type(exc)(exc.message)
    except TypeError:  # a subclass with another signature: share the original
        return exc
    error.__cause__ = exc.__cause__
    return error


async def open_store(path_or_url: str | os.PathLike[str]) -> LogStore:
    """Open a log by path or URL: ``memory:``, ``sqlite:///abs/path``, or a data dir/file."""
    target = os.fspath(path_or_url)
    if target in ("memory:", "memory://"):
        from metadata_log.memory_store import MemoryLogStore

        return MemoryLogStore()
    from metadata_log.sqlite_store import SqliteLogStore

    if target.startswith("sqlite://"):
        target = target.removeprefix("sqlite://")
    elif target.startswith("sqlite:"):
        target = target.removeprefix("sqlite:")
    if not target:
        raise InvalidRequestError(f"no path in log URL {os.fspath(path_or_url)!r}")
    return await SqliteLogStore.open(target)
