"""Group commit's building blocks: pending appends, how a group becomes stored batches,
and how its callers learn that it failed.

`LogStore` (`metadata_log.store`) owns the writer loop that takes pending appends off its
queue, hands them to the backend as one transaction and resolves their futures; this module
holds the pieces of that loop that need no store: `PendingAppend`, `stored_batches`
(assigning offsets and merging same-timestamp appends into batches of at most
`MERGED_BATCH_RECORDS` records) and `fail_all`. It must not touch a store, a queue or a
medium, must not decide when a group commits, and must not interpret records.
"""

from __future__ import annotations

import asyncio
from typing import Final

from metactl.errors import LogError
from metadata_log.batch_format import StoredBatch, batch_crc, concat_batches

__all__ = [
    "GROUP_COMMIT_BYTES",
    "MERGED_BATCH_RECORDS",
    "PendingAppend",
    "fail_all",
    "stored_batches",
]

MERGED_BATCH_RECORDS: Final = 1024
"""Appends of one group commit are merged into stored batches up to this many records."""

GROUP_COMMIT_BYTES: Final = 16 * 1024 * 1024
"""A group commit takes pending appends up to this many payload bytes (at least one),
unless the backend sets a lower `group_commit_bytes`."""


class PendingAppend:
    """One `append` waiting for its group commit: its encoded records and its caller's future."""

    __slots__ = ("count", "future", "payload", "timestamp_ms")

    def __init__(
        self, count: int, timestamp_ms: int, payload: bytes, future: asyncio.Future[range]
    ) -> None:
        self.count = count
        self.timestamp_ms = timestamp_ms
        self.payload = payload
        self.future = future


def stored_batches(group: list[PendingAppend], offset: int) -> list[StoredBatch]:
    """Assign offsets to a group commit and cut it into stored batches.

    Consecutive appends with the same timestamp become one stored batch of at most
    `MERGED_BATCH_RECORDS` records: the group is one transaction anyway, and fewer, larger
    batches replay much faster (see sqlite_store). The cap keeps a read that starts inside
    a batch from decoding a huge one. A merged batch is no larger than its group (bar a
    byte of array header), which is no larger than one append may be (`LogStoreBase`).
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
        payload = concat_batches([item.payload for item in group[i:j]], count)
        crc = batch_crc(offset, count, timestamp_ms, payload)
        batches.append(StoredBatch(offset, count, timestamp_ms, crc, payload))
        offset += count
        i = j
    return batches


def fail_all(group: list[PendingAppend], exc: LogError) -> None:
    """Fail every append of `group` that is still waiting with (a copy of) `exc`."""
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
