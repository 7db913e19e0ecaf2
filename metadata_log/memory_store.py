"""The in-memory backend of the metadata log, for tests and simulations.

It keeps stored batches and snapshots in a `MemoryStorage` object and gets every semantic
(offsets, group commit, visibility, waiting, snapshots, verification) from
`metadata_log.store.LogStore`, exactly as the SQLite backend does. "Reopening" is handing
the same `MemoryStorage` to a new `MemoryLogStore`. Nothing here survives the process;
this module must not pretend otherwise, and must not interpret records.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field

from metactl.errors import LogError
from metadata_log.batch_format import StoredBatch, StoredSnapshot
from metadata_log.store import LogStore

__all__ = ["MemoryLogStore", "MemoryStorage"]


@dataclass
class MemoryStorage:
    """What a memory log "persists": shared by every store opened on it."""

    batches: list[StoredBatch] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)  # base offsets of `batches`, for bisect
    snapshots: dict[int, StoredSnapshot] = field(default_factory=dict)
    start_offset: int = 0
    open_writer: bool = False

    @property
    def end_offset(self) -> int:
        return self.batches[-1].end_offset if self.batches else self.start_offset


class MemoryLogStore(LogStore):
    """A `LogStore` held in memory. Pass an existing `storage` to "reopen" it."""

    def __init__(self, storage: MemoryStorage | None = None, *, name: str = "memory") -> None:
        self.storage = storage if storage is not None else MemoryStorage()
        if self.storage.open_writer:
            raise LogError(f"metadata log {name} is already open for writing by another store")
        super().__init__(
            location=name,
            start_offset=self.storage.start_offset,
            end_offset=self.storage.end_offset,
        )
        self.storage.open_writer = True

    async def _write_batches(self, batches: list[StoredBatch]) -> None:
        # Yield as a real commit would, so appends arriving meanwhile form the next group.
        await asyncio.sleep(0)
        self.storage.batches.extend(batches)
        self.storage.bases.extend(b.base_offset for b in batches)

    def _index_of(self, offset: int) -> int:
        """Index of the batch holding `offset` (or of the first batch after it)."""
        return max(bisect.bisect_right(self.storage.bases, offset) - 1, 0)

    async def _fetch_batches(self, from_offset: int, upper: int) -> list[StoredBatch]:
        bases = self.storage.bases
        lo = self._index_of(from_offset)
        hi = bisect.bisect_left(bases, upper, lo)
        return self.storage.batches[lo:hi]

    async def _scan_batches(self, after: int | None, limit: int, near: int) -> list[StoredBatch]:
        lo = 0 if after is None else bisect.bisect_right(self.storage.bases, after)
        return self.storage.batches[lo : lo + limit]

    async def _retained_start(self, offset: int) -> int:
        batches = self.storage.batches
        if not batches:
            return self.storage.start_offset
        batch = batches[self._index_of(offset)]
        if batch.base_offset > offset:
            return self.storage.start_offset
        return batch.base_offset if batch.last_offset >= offset else batch.end_offset

    async def _delete_batches_before(self, new_start: int) -> None:
        cut = bisect.bisect_left(self.storage.bases, new_start)
        del self.storage.batches[:cut]
        del self.storage.bases[:cut]
        self.storage.start_offset = new_start

    async def _put_snapshot(self, snapshot: StoredSnapshot) -> None:
        self.storage.snapshots[snapshot.offset] = snapshot

    async def _get_snapshot(self, offset: int) -> StoredSnapshot | None:
        return self.storage.snapshots.get(offset)

    async def _snapshot_offsets(self) -> list[int]:
        return sorted(self.storage.snapshots)

    async def _close_storage(self) -> None:
        self.storage.open_writer = False
