"""The metadata log store: its API, its data types, and the semantics every backend shares.

`LogStore` owns what an append, a read or a snapshot *means*: offset assignment, group
commit, the rule that nothing is visible or acknowledged before it is durable, long-poll
waiting, snapshot bookkeeping, verification and close. Backends (`SqliteLogStore`,
`MemoryLogStore`) only move stored batches and snapshots to and from their medium through
the small set of abstract `_primitives` declared in `metadata_log.store_base`, so the two
cannot drift apart semantically.

`LogStore` is assembled in layers: `store_base.LogStoreBase` (state, lifecycle, backend
primitives), `reads.LogReads` (reading, streaming, `wait_for`), and this module (appends
and the group-commit writer, snapshots, verification). The stored format and its checks
are `metadata_log.batch_format`; the pieces of group commit that need no store are
`metadata_log.group_commit`; `metadata_log.backends.open_store` picks a backend.

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
* An append's payload is at most `max_batch_bytes` (`records.MAX_BATCH_BYTES` unless the
  backend's transactions carry less, as etcd's do); a larger one is refused with
  `InvalidRequestError` before anything is queued. Writing a larger change is the
  controller driver's job: it cuts the change into several appends inside a transaction
  (`BeginTransactionRecord` ... `EndTransactionRecord`), because only it knows where a
  change may be cut and what is durable after each append; the store stays ignorant of
  what records mean.
* Empty appends are refused with `InvalidRequestError` rather than returning an empty
  range: an empty batch would be a row with no offsets.
* Write failures: a backend raises `StorageError` when the medium refuses a commit (disk
  full); the appends of that group fail, nothing is acknowledged, and the store keeps
  working. A `FatalStorageError` (e.g. an I/O error during fsync, whose outcome is
  unknown) fails the group and every later write until the store is reopened.
* Records before the newest snapshot are deleted only by an explicit
  `delete_before_snapshot`, never implicitly.

This module must not know any storage medium (nor import a backend), and must not
interpret records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import msgspec
import structlog

from metactl.errors import (
    CorruptLogError,
    FatalStorageError,
    InvalidRequestError,
    LogSchemaError,
    OffsetOutOfRangeError,
    StorageError,
)
from metadata_log.batch_format import (
    StoredSnapshot,
    check_batch,
    snapshot_crc,
)
from metadata_log.group_commit import PendingAppend, fail_all, stored_batches
from metadata_log.reads import LogReads
from metadata_log.records import RECORD_TYPES, MetadataRecord, encode_batch

__all__ = ["LogStore", "VerifyReport"]

T = TypeVar("T")

log = structlog.get_logger("metadata_log")


_RECORD_CLASSES: Final = frozenset(RECORD_TYPES.values())
_VERIFY_CHUNK: Final = 64  # batches per scan step in verify()
VERIFY_PROGRESS_S: Final = 1.0
"""`verify_logged` logs its progress at most this often."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class VerifyReport(msgspec.Struct, frozen=True):
    """What a successful `LogStore.verify` checked."""

    location: str
    start_offset: int
    end_offset: int
    batches: int
    records: int
    payload_bytes: int
    snapshot_offsets: list[int]


class LogStore(LogReads):
    """A durable, append-only log of metadata records with snapshots.

    Use as ``async with await open_store(...) as store:`` (`metadata_log.backends`) or
    call `close()`. Not thread-safe: use from one event loop.
    """

    # --- appending -----------------------------------------------------------------------

    async def append(
        self,
        records: Sequence[MetadataRecord],
        *,
        timestamp_ms: int | None = None,
        payload: bytes | None = None,
    ) -> range:
        """Append records as one batch; return their offsets once durable.

        `timestamp_ms` defaults to wall-clock time; callers in virtual time pass theirs.
        `payload`, when given, must be `encode_batch(records)`, which the caller has at
        hand (the controller encodes each step's records to size its batch): it is
        stored as given rather than encoded a second time.
        An append that fails with `StorageError` (the medium refused its commit, or an
        earlier fatal failure stopped writes) counts in `append_failures`.
        """
        try:
            self._check_writable()
        except FatalStorageError:
            self.append_failures += 1
            raise
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
        if payload is None:
            payload = encode_batch(batch)
        if len(payload) > self.max_batch_bytes:
            raise InvalidRequestError(
                f"batch of {len(payload)} bytes exceeds the {self.max_batch_bytes}-byte limit"
            )
        future: asyncio.Future[range] = asyncio.get_running_loop().create_future()
        self._pending.append(PendingAppend(len(batch), timestamp_ms, payload, future))
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.create_task(self._run_writer(), name="log-writer")
        self._wakeup.set()
        try:
            return await future
        except StorageError:
            self.append_failures += 1
            raise

    async def _run_writer(self) -> None:
        while True:
            if not self._pending:
                if self.closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            group = [self._pending.popleft()]
            size = len(group[0].payload)
            while self._pending and size + len(self._pending[0].payload) <= self.group_commit_bytes:
                item = self._pending.popleft()
                group.append(item)
                size += len(item.payload)
            async with self._write_lock:
                await self._commit_group(group)

    async def _commit_group(self, group: list[PendingAppend]) -> None:
        if self._failure is not None:
            fail_all(group, self._failure)
            return
        batches = stored_batches(group, self._end_offset)
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
                self.write_failed.set()
            fail_all(group, exc)
            return
        except BaseException as exc:
            # Anything else leaves the medium in an unknown state: stop taking writes.
            failure = FatalStorageError(f"commit failed on {self.location}: {exc!r}")
            self._failure = failure
            self.write_failed.set()
            fail_all(group, failure)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
            return
        self.last_commit_ns = time.perf_counter_ns()
        self.commits += 1
        self._remember(batches)
        start = self._end_offset
        for item in group:
            if not item.future.done():
                item.future.set_result(range(start, start + item.count))
            start += item.count
        self._advance(offset)

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
        batches = payload_bytes = 0
        async for chunk in self._stored_chunks(start, end, _VERIFY_CHUNK):
            for stored in chunk:
                check_batch(stored, self.location)
                payload_bytes += len(stored.payload)
            batches += len(chunk)
            if progress is not None:
                progress(chunk[-1].end_offset, end)
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
        return VerifyReport(
            location=self.location,
            start_offset=start,
            end_offset=end,
            batches=batches,
            records=end - start,
            payload_bytes=payload_bytes,
            snapshot_offsets=offsets,
        )

    async def verify_logged(self) -> VerifyReport:
        """`verify()`, with a progress line about every `VERIFY_PROGRESS_S` seconds and one
        when it is done: what every backend's ``open(verify_all=True)`` runs (`controller
        serve --verify-log full`)."""
        started = last = time.monotonic()
        log.info(
            "verifying the whole metadata log",
            path=self.location,
            start_offset=self.start_offset,
            end_offset=self.end_offset,
        )

        def progress(offset: int, end: int) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= VERIFY_PROGRESS_S:
                last = now
                done = offset - self.start_offset
                total = max(1, end - self.start_offset)
                log.info(
                    "verifying the metadata log",
                    path=self.location,
                    offset=offset,
                    end_offset=end,
                    percent=round(100 * done / total, 1),
                )

        report = await self.verify(progress)
        log.info(
            "metadata log verified",
            path=self.location,
            batches=report.batches,
            records=report.records,
            snapshots=len(report.snapshot_offsets),
            seconds=round(time.monotonic() - started, 3),
        )
        return report
