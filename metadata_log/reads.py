"""The read side of `LogStore`: reading, streaming and waiting for committed records.

`LogReads` reads committed entries by offset (`read`), streams ranges of them in bounded
memory while the next chunk is fetched (`iter_chunks`, `iter_entries`), and long-polls for
offsets not yet committed (`wait_for`). It only ever asks the backend for offsets below the
published end offset, so it can never observe a record that could still be lost, and it
checks every batch it decodes (`batch_format.decode_entries`).

The tail cache: the writer keeps the batches of its newest commits once they are durable
(`_remember`, at most `TAIL_CACHE_BATCHES` and `TAIL_CACHE_BYTES`), and a `read` that falls
wholly within them is served from there, checked as any other, without a round trip to
the medium: every metadata client tailing the log (brokers, standbys' tailers) asks for
what was just committed, each of them after every commit.

This module must not write, assign offsets or publish a new end offset (that is
`metadata_log.store`'s group commit), must not know any storage medium, and must not
interpret records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

from metactl.errors import (
    CorruptLogError,
    InvalidRequestError,
    LogClosedError,
    OffsetOutOfRangeError,
)
from metadata_log.batch_format import (
    LogEntry,
    StoredBatch,
    StoredSnapshot,
    check_batch_frame,
    check_continuity,
    decode_entries,
)
from metadata_log.store_base import LogStoreBase

__all__ = ["TAIL_CACHE_BATCHES", "TAIL_CACHE_BYTES", "LogReads"]

# The tail cache's bounds: the newest batches committed, up to this many and this many
# payload bytes (a larger batch is not kept).
TAIL_CACHE_BATCHES: Final = 64
TAIL_CACHE_BYTES: Final = 1 << 20


class LogReads(LogStoreBase):
    """Reads, streaming and long-poll waiting; `metadata_log.store.LogStore` adds the writes."""

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
        batches = self._cached(from_offset, upper)
        if batches is None:
            batches = await self._fetch_batches(from_offset, upper)
        return self._entries(batches, from_offset, upper)

    def _remember(self, batches: list[StoredBatch]) -> None:
        """Keep batches just committed (durable) in the tail cache: they follow the cached
        ones, or replace them."""
        recent = self._recent
        if recent and recent[-1].end_offset != batches[0].base_offset:
            recent.clear()
            self._recent_bytes = 0
        for b in batches:
            if len(b.payload) > TAIL_CACHE_BYTES:
                recent.clear()  # not kept: what follows it starts the cache again
                self._recent_bytes = 0
                continue
            recent.append(b)
            self._recent_bytes += len(b.payload)
        while len(recent) > TAIL_CACHE_BATCHES or self._recent_bytes > TAIL_CACHE_BYTES:
            self._recent_bytes -= len(recent.popleft().payload)

    def _cached(self, lo: int, hi: int) -> list[StoredBatch] | None:
        """The cached batches holding [lo, hi), or None unless the cache holds all of it."""
        recent = self._recent
        if not recent or lo < recent[0].base_offset or hi > recent[-1].end_offset:
            return None
        out: list[StoredBatch] = []
        for b in reversed(recent):  # a tailer reads the newest
            if b.base_offset < hi:
                out.append(b)
                if b.base_offset <= lo:
                    break
        out.reverse()
        return out

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

    async def iter_stored(self, chunk: int = 64) -> AsyncIterator[list[StoredBatch]]:
        """The stored batches (as written: offsets, timestamps, CRCs, payloads) from the
        log's start to the end offset when iteration starts, in chunks, each batch's CRC
        and framing checked. For copying a log (`metadata_log.mirror`), not for replay."""
        self._check_open()
        await self._refresh()
        async for batches in self._stored_chunks(self._start_offset, self._end_offset, chunk):
            for b in batches:
                check_batch_frame(b, self.location)
            yield batches

    async def _stored_chunks(
        self, start: int, end: int, chunk: int
    ) -> AsyncIterator[list[StoredBatch]]:
        """The stored batches in [start, end), `chunk` at a time, their offsets checked to
        follow each other from `start` to `end` (the contents are the caller's to check:
        `verify` decodes them, `iter_stored` checks CRCs and framing)."""
        expected = start
        after: int | None = None
        while expected < end:
            batches = [
                b for b in await self._scan_batches(after, chunk, expected) if b.base_offset < end
            ]
            if not batches:
                break
            expected = check_continuity(batches, expected, self.location)
            after = batches[-1].base_offset
            yield batches
        if expected != end:
            raise CorruptLogError(
                f"log ends at offset {expected} but its end offset is {end}",
                path=self.location,
                offset=expected,
            )

    async def stored_snapshot(self, offset: int) -> StoredSnapshot | None:
        """A stored snapshot as written (its CRC checked by whoever decodes it)."""
        self._check_open()
        return await self._get_snapshot(offset)

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
                    if self.closed and self._end_offset <= offset:
                        raise LogClosedError(f"metadata log {self.location} was closed")
        except TimeoutError:
            return self._end_offset > offset
        return True
