"""A replica's stored record batches: their index, the bytes queued for the file, and the
`.log` file that holds them.

Record bytes are sparse. Records appended by the native producer have none: the offsets
exist, nothing else. Records appended as Kafka record batches (magic 2, the Kafka
listener's Produce, and followers copying them) keep the batch bytes exactly as appended
(base offset and partition leader epoch set by the leader) in
`replicas/<topic>-<partition>.log`, an append-only file of those batches in offset
order; offsets of [0, LEO) no stored batch covers are "no-bytes" ranges. In memory a
replica with batches keeps a `BatchStore`: an index of them (each batch's `BatchHeader`
and file position) and the bytes appended since the last write; a replica without
batches has no `.log` file and no byte state at all (a broker may host a million
replicas; nothing of this is on the native path). No file handle stays open: a write
opens, writes and closes, a read (`read_chunks`) uses `os.pread` on a descriptor it
closes.

`load` rebuilds the index by reading the batch headers in the bytes the replica's state
covers (`log_bytes`): a longer file (a write past the saved state, a truncation not yet
applied) is cut at the next write; a shorter file, or a torn or corrupt batch (checked
by CRC above the flushed offset), means an OS crash kept the state but not all its
bytes, and the replica is to be cut back to the end of its last complete batch (a loss
of unflushed data, noted for `take_note`). Truncation points are batch boundaries; a
batch straddling one is dropped whole (`cut_at`).

This module owns the index, the queued bytes and the `.log` file's format, writes and
reads. It must not read or write the replica's JSON state, or choose the order of the
state's and the bytes' writes (`replica_log` does: a state on disk never names bytes
that are not there), decide when to persist or flush, or validate batches beyond the
header fields it indexes by (the Kafka listener does).
"""

from __future__ import annotations

import bisect
import contextlib
import os
from pathlib import Path
from typing import NamedTuple

import crc32c

from protocol.kafka.records import (
    CRC_START,
    HEADER_BYTES,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    read_header,
)

BYTES_SUFFIX = ".log"


class Chunk(NamedTuple):
    """A piece of a log, in offset order: `count` records from `base_offset`, and either
    the bytes of the one stored batch they are (`data`), or None (a no-bytes range)."""

    base_offset: int
    count: int  # type: ignore[assignment]  # (shadows tuple.count, which nobody needs)
    data: bytes | None


class StoredBatch(NamedTuple):
    """A stored batch: its header, and where its bytes start in the `.log` file."""

    header: BatchHeader
    pos: int


def _next_offset(entry: StoredBatch) -> int:
    return entry.header.next_offset


def bytes_path(path: Path) -> Path:
    """The `.log` file of stored batches of the replica whose state file is `path`."""
    return path.with_suffix(BYTES_SUFFIX)


def checked_header(
    name: str, batch: bytes | bytearray | memoryview, log_end_offset: int, count: int
) -> BatchHeader:
    """The header of `batch`, appended as `count` records at `log_end_offset` to the
    replica `name`: ValueError (a caller bug) unless it is one whole magic-2 batch whose
    base offset is the log end offset and whose `last_offset_delta + 1` is `count`."""
    header = read_header(batch)
    if header is None or header.size != len(batch) or header.magic != MAGIC_V2:
        raise ValueError(f"{name}: not one whole magic-2 record batch")
    if header.base_offset != log_end_offset:
        raise ValueError(
            f"{name}: batch base offset {header.base_offset} is not the log end "
            f"offset {log_end_offset}"
        )
    if header.last_offset_delta + 1 != count:
        raise ValueError(
            f"{name}: a batch of last offset delta {header.last_offset_delta} "
            f"appended as {count} records"
        )
    return header


class BatchStore:
    """A replica's stored batches: the index, and what of their bytes the file holds.

    The file's bytes [0, `written`) are the index's batches that were written; the
    index's others are `pending` (their bytes, in order, to go at `written`). The file
    is `file_size` long: longer than `written` after a truncation (or a load that found
    more), which the next write cuts. `saved_bytes` and `durable_bytes` are the
    `log_bytes` of the state last written and of the state last written durably (at
    load: the most any state found covers): `.log` bytes they cover below their end are
    never overwritten while they may be the state a crash leaves.
    """

    __slots__ = (
        "dirty",
        "durable_bytes",
        "end",
        "file_size",
        "index",
        "note",
        "pending",
        "saved_bytes",
        "written",
    )

    def __init__(self) -> None:
        self.index: list[StoredBatch] = []
        self.end = 0  # log_bytes: where the last stored batch ends
        self.written = 0
        self.pending: list[bytes] = []
        self.file_size = 0
        self.dirty = False  # written or cut since the last fsync
        self.saved_bytes = 0
        self.durable_bytes = 0
        self.note: str | None = None  # what `load` had to repair (`take_note`)

    def add(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> None:
        """Index `batch` (of `header`, see `checked_header`) and queue its bytes."""
        self.index.append(StoredBatch(header, self.end))
        self.pending.append(bytes(batch))
        self.end += len(batch)

    def headers(self) -> list[BatchHeader]:
        return [e.header for e in self.index]

    def take_note(self) -> str | None:
        """What `load` had to repair (once), or None."""
        note, self.note = self.note, None
        return note

    def cut(self, pos: int) -> None:
        """Forget every byte at or after `pos` (a batch boundary)."""
        self.end = pos
        if pos <= self.written:
            self.written = pos
            self.pending.clear()
            return
        at = self.written
        for i, data in enumerate(self.pending):
            if at >= pos:
                del self.pending[i:]
                return
            at += len(data)

    def cut_at(self, offset: int) -> int:
        """Drop the stored batches at and after `offset`; the offset the log may keep
        (`offset`, or the base of a batch straddling it: dropped whole)."""
        if not self.index:
            return offset
        i = bisect.bisect_right(self.index, offset, key=_next_offset)
        if i == len(self.index):
            return offset
        first = self.index[i]
        del self.index[i:]
        self.cut(first.pos)
        return min(offset, first.header.base_offset)

    def written_offset(self) -> int:
        """Where the batches already in the file end, in offsets (the base offset of the
        first pending batch; there must be one)."""
        return self.index[len(self.index) - len(self.pending)].header.base_offset

    def forgettable(self) -> bool:
        """True when every batch is gone, from the file and from every state on disk:
        the replica then keeps no byte state (its state files no longer name
        `log_bytes`)."""
        empty = self.end == 0 and self.file_size == 0 and self.note is None
        return empty and self.saved_bytes == 0 and self.durable_bytes == 0


# --- the `.log` file ---------------------------------------------------------------


def sync_bytes(path: Path, b: BatchStore) -> None:
    """fsync the `.log` file if it was written or cut since the last fsync."""
    if b.dirty and b.file_size:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    b.dirty = False


def write_bytes(path: Path, b: BatchStore, *, sync: bool) -> None:
    """Cut the `.log` file to `written` and append the pending batches (fsync if `sync`).
    A file left with no bytes is deleted."""
    if not b.pending and b.written == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        b.file_size = 0
        b.dirty = False
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if b.file_size > b.written:
            os.ftruncate(fd, b.written)
        b.file_size = b.written
        if b.pending:
            view = memoryview(b.pending[0] if len(b.pending) == 1 else b"".join(b.pending))
            at = b.written
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
            b.pending.clear()
            b.written = b.file_size = at
        b.dirty = True
        if sync:
            os.fsync(fd)
            b.dirty = False
    finally:
        os.close(fd)


def read_chunks(
    b: BatchStore | None, path: Path, from_offset: int, end_offset: int, max_bytes: int
) -> list[Chunk]:
    """The chunks of [`from_offset`, `end_offset`) (a non-empty range within the LEO;
    see `replica_log.read_chunks`), the stored batches' bytes read from `path` (the
    `.log` file) and the pending ones."""
    if b is None or not b.index:
        return [Chunk(from_offset, end_offset - from_offset, None)]
    index = b.index
    i = bisect.bisect_right(index, from_offset, key=_next_offset)
    at = from_offset
    total = 0
    plan: list[tuple[int, int, int]] = []  # (base offset, count, index entry or -1)
    while at < end_offset:
        if i < len(index) and index[i].header.base_offset <= at:
            h = index[i].header
            if plan and total + h.size > max_bytes:
                break
            plan.append((h.base_offset, h.last_offset_delta + 1, i))
            total += h.size
            at = h.next_offset
            i += 1
        else:
            stop = min(index[i].header.base_offset if i < len(index) else end_offset, end_offset)
            plan.append((at, stop - at, -1))
            at = stop
    stored = [j for _, _, j in plan if j >= 0]
    if not stored:
        return [Chunk(base, count, None) for base, count, _ in plan]
    start = index[stored[0]].pos
    stop = index[stored[-1]].pos + index[stored[-1]].header.size
    raw = _read_range(path, b, start, stop)
    if len(stored) == 1:  # one batch: its bytes as read, not copied again
        return [Chunk(base, count, None if j < 0 else raw) for base, count, j in plan]
    view = memoryview(raw)
    return [
        Chunk(
            base,
            count,
            None
            if j < 0
            else bytes(view[index[j].pos - start : index[j].pos - start + index[j].header.size]),
        )
        for base, count, j in plan
    ]


def _read_range(path: Path, b: BatchStore, start: int, stop: int) -> bytes:
    """The stored batches' bytes [start, stop): from the file, and the pending ones."""
    parts: list[bytes] = []
    if start < b.written:
        want = min(stop, b.written) - start
        fd = os.open(path, os.O_RDONLY)
        try:
            got = os.pread(fd, want, start)
            while len(got) < want:
                more = os.pread(fd, want - len(got), start + len(got))
                if not more:
                    raise OSError(f"{path.name} is shorter than its index ({start + len(got)})")
                got += more
        finally:
            os.close(fd)
        parts.append(got)
    at = b.written
    for data in b.pending:
        if at >= stop:
            break
        if at + len(data) > start:
            parts.append(data[max(0, start - at) : stop - at])
        at += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def load(
    path: Path,
    log_bytes: int | None,
    covered: int,
    *,
    log_end_offset: int,
    flushed_offset: int,
) -> tuple[BatchStore | None, int | None]:
    """The store of the `.log` file `path` for a state that covers `log_bytes` of it
    (None if it names none: the file, if any, is then not trusted and cut at the next
    write; `covered`: the most any state found covers), and the offset the replica must
    be cut back to (None: nothing was lost). The scan stops at the first header that is
    not a whole batch following the previous one within the LEO, or, above the flushed
    offset (an OS crash may have torn it), at a CRC mismatch: the log is then to be cut
    back to the end of the last complete batch."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = None
    if size is None and not log_bytes:
        return None, None
    b = BatchStore()
    b.file_size = size or 0
    b.saved_bytes = b.durable_bytes = covered
    if not log_bytes:
        return b, None
    limit = min(log_bytes, b.file_size)
    pos = 0
    kept = 0  # where the last complete batch ends, in offsets
    if limit:
        fd = os.open(path, os.O_RDONLY)
        try:
            while pos < limit:
                h = read_header(os.pread(fd, HEADER_BYTES, pos))
                if (
                    h is None
                    or h.magic != MAGIC_V2
                    or h.batch_length < HEADER_BYTES - LOG_OVERHEAD
                    or h.last_offset_delta < 0
                    or pos + h.size > limit
                    or h.base_offset < kept
                    or h.next_offset > log_end_offset
                ):
                    break
                if h.next_offset > flushed_offset:
                    whole = os.pread(fd, h.size, pos)
                    if crc32c.crc32c(whole[CRC_START:]) != h.crc:
                        break
                b.index.append(StoredBatch(h, pos))
                pos += h.size
                kept = h.next_offset
        finally:
            os.close(fd)
    b.written = b.end = pos
    if pos >= log_bytes:
        return b, None
    b.note = (
        f"{path.name} holds {b.file_size} bytes, {pos} of them complete batches, of the "
        f"{log_bytes} the state covers: log end offset {log_end_offset} cut back to {kept}"
    )
    return b, kept
