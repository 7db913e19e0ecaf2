"""The foundation of `LogStore`: the state every store shares, its lifecycle, and the
contract a backend implements.

`LogStoreBase` holds the offsets, the open/closing/closed state, the group-commit queue,
the tail cache of the newest committed batches (`metadata_log.reads`) and the event that
wakes `wait_for` callers, and declares the abstract `_primitives` through which a backend
(`SqliteLogStore`, `MemoryLogStore`) moves stored batches and snapshots to and from its
medium, plus the optional hooks. `close()` lives here because it must drain the writer and
then close the medium. The operations live above it: reading, streaming and waiting in
`metadata_log.reads`, appending, group commit, snapshots and verification in
`metadata_log.store`, whose docstring states what they mean; backends subclass
`metadata_log.store.LogStore`, never this class.

This module must not implement any operation, must not know any storage medium, and must
not interpret records.
"""

from __future__ import annotations

import asyncio
import enum
from abc import ABC, abstractmethod
from collections import deque
from types import TracebackType
from typing import Self

from metactl.errors import FatalStorageError, InvalidRequestError, LogClosedError, LogError
from metadata_log.batch_format import StoredBatch, StoredSnapshot
from metadata_log.group_commit import GROUP_COMMIT_BYTES, PendingAppend
from metadata_log.records import MAX_BATCH_BYTES

__all__ = ["LogStoreBase"]


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class LogStoreBase(ABC):
    """State, lifecycle and backend primitives of a `LogStore` (see `metadata_log.store`)."""

    # What one backend transaction can carry (a backend with tighter limits, such as
    # etcd's request size, lowers them before calling __init__): an append's payload, and
    # the payload bytes of one group commit. A group commit is never larger than one
    # append may be, so neither are the batches it merges its appends into.
    max_batch_bytes: int = MAX_BATCH_BYTES
    group_commit_bytes: int = GROUP_COMMIT_BYTES

    def __init__(
        self, *, location: str, start_offset: int, end_offset: int, read_only: bool = False
    ) -> None:
        if self.group_commit_bytes > self.max_batch_bytes:
            raise ValueError(
                f"group_commit_bytes {self.group_commit_bytes} exceeds max_batch_bytes "
                f"{self.max_batch_bytes}: a merged batch could exceed what one append may hold"
            )
        self.location = location
        self.read_only = read_only
        self.commits = 0
        """Durable group commits done by this instance (one transaction and fsync each)."""
        self.last_commit_ns = 0
        """`time.perf_counter_ns()` when the latest group commit became durable."""
        self.append_failures = 0
        """Appends that failed with `StorageError` (disk full, I/O error, writes stopped)."""
        self._start_offset = start_offset
        self._end_offset = end_offset
        self._state = _State.OPEN
        self._failure: LogError | None = None
        self.write_failed = asyncio.Event()
        """Set once writes stop (`FatalStorageError`: an unknown outcome, or a writer
        fenced by a newer leadership); the owner reopens the log or steps down."""
        self._pending: deque[PendingAppend] = deque()
        self._wakeup = asyncio.Event()
        self._advanced = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._writer_task: asyncio.Task[None] | None = None
        # The newest batches this instance committed, consecutive, ending where its last
        # commit did (`metadata_log.reads`: the tail cache).
        self._recent: deque[StoredBatch] = deque()
        self._recent_bytes = 0

    @property
    def failure(self) -> LogError | None:
        """Why writes stopped (`write_failed` is set), or None."""
        return self._failure

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

    def _advance(self, end_offset: int) -> None:
        """Publish a new committed end offset and wake every `wait_for`."""
        self._end_offset = max(self._end_offset, end_offset)
        self._notify()

    def _notify(self) -> None:
        event, self._advanced = self._advanced, asyncio.Event()
        event.set()

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
