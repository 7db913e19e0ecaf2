"""One partition replica: its leader-epoch history and offsets, and its state file.

A replica holds what the replication protocol reasons about: the leader-epoch history
`[(epoch, start_offset), …]` (Kafka's leader-epoch checkpoint), the log end offset (LEO),
the high watermark (HW) and the flushed offset (everything below it survived the last
fsync). The file `replicas/<topic>-<partition>.json` is rewritten through the page cache on
every change (`save`) and fsynced by `flush`; `remove` deletes it.

Records appended as Kafka record batches keep their bytes in the replica's `.log` file,
whose index, queued bytes and format are `replica_bytes`' (a replica without batches has
neither). `save` and `flush` write the queued batch bytes to the `.log` file before the
JSON state, and `flush` fsyncs the `.log` before writing the state durably. The state
records how many bytes of the `.log` it covers (`log_bytes`; absent: none, as in a file
written before bytes were stored, whose `.log`, if any, is then not trusted). `load`
has the index rebuilt from those bytes; a state whose bytes an OS crash lost is cut back
to the end of its last complete batch (a loss of unflushed data, reported by
`take_load_note`): records whose bytes were lost are never presented as no-bytes native
records. Truncation (`truncate_to`, `lose_unflushed`, `copy_from_leader` to a shorter
log) drops the stored batches at and after the offset and cuts the file at the next
write (a batch straddling the offset is dropped whole and the LEO set to its base).

Two names keep a replica's state, so that a cheap write never puts its fsynced state at
risk. `flush` writes the state durably under both `<name>.json` and `<name>.json.flushed`
(one file, two links). `save` then replaces `<name>.json` through the page cache by an
unlink and a rename (`storage.write_through_cache`: renaming over the old file cost a
broker 0.4 ms per change), which an OS crash may leave empty; `<name>.json.flushed`
keeps the last fsynced state meanwhile. Every write carries a sequence number (`seq`),
and `load_all` takes, of what it finds for a replica (the two names and a temporary file
a crash left), the complete state with the highest one. A file written before `seq`
existed counts as 0. Bytes of the `.log` file a state on disk may still cover are never
overwritten: before new batches are written where a truncation cut the file, a state
covering only the bytes before the cut is written first (durably if the fsynced state
covered more), so whichever state a crash leaves describes the bytes it finds.

A replica also records the id of the topic it belongs to (as Kafka's partition.metadata):
a topic deleted and created again under the same name has a new id, and the replica
manager never takes a replica of another id for the topic's (it deletes it). A file
written before topic ids were recorded has none (`topic_id` "").

This module owns that state, the pure operations on an epoch history, the state file's
format, and the order in which a replica's state and bytes are written. It must not make
replication decisions (leader or follower: see `replication.py`), talk to the network,
read or write the `.log` file itself (`replica_bytes`), or decide when to persist or
flush.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokers_stub import replica_bytes as rb
from brokers_stub.replica_bytes import BatchStore, Chunk, bytes_path, checked_header
from brokers_stub.storage import (
    TMP_SUFFIX,
    read_through_cache,
    tmp_path,
    write_durable,
    write_through_cache,
)
from protocol.kafka.records import BatchHeader

__all__ = [
    "NO_EPOCH",
    "EpochEntry",
    "History",
    "ReplicaLog",
    "assign_epoch",
    "common_prefix",
    "end_offset_for_epoch",
    "epoch_at",
    "flush",
    "last_written_epoch",
    "latest_epoch",
    "load",
    "load_all",
    "read_chunks",
    "remove",
    "replica_files",
    "replica_path",
    "save",
    "truncate_history_to",
]

EpochEntry = tuple[int, int]  # (leader epoch, start offset)
History = list[EpochEntry]

NO_EPOCH = -1


# --- pure operations on an epoch history ---------------------------------------------


def epoch_at(history: Sequence[EpochEntry], offset: int) -> int | None:
    """The leader epoch of the record at `offset` (None: before the first entry)."""
    found: int | None = None
    for epoch, start in history:
        if start > offset:
            break
        found = epoch
    return found


def last_written_epoch(history: Sequence[EpochEntry], leo: int) -> int:
    """The epoch of the last record in the log (NO_EPOCH for an empty log)."""
    if leo <= 0:
        return NO_EPOCH
    epoch = epoch_at(history, leo - 1)
    return NO_EPOCH if epoch is None else epoch


def latest_epoch(history: Sequence[EpochEntry]) -> int:
    """The newest epoch in the history, written or not (NO_EPOCH if empty)."""
    return history[-1][0] if history else NO_EPOCH


def assign_epoch(history: Sequence[EpochEntry], epoch: int, start: int) -> History:
    """Kafka's LeaderEpochFileCache.assign: record that `epoch` starts at `start`.

    No change if the newest entry already is `epoch` at or before `start`. Otherwise
    entries that would break monotonicity (epoch >= `epoch` or start >= `start`) go.
    """
    if history and history[-1][0] == epoch and history[-1][1] <= start:
        return list(history)
    kept = [(e, s) for e, s in history if e < epoch and s < start]
    kept.append((epoch, start))
    return kept


def truncate_history_to(history: Sequence[EpochEntry], offset: int) -> History:
    """The history of a log truncated to `offset` records: entries starting at or after
    `offset` describe records that are gone (Kafka's truncateFromEnd)."""
    return [(e, s) for e, s in history if s < offset]


def end_offset_for_epoch(history: Sequence[EpochEntry], leo: int, epoch: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch answer: (the largest epoch <= `epoch` in the history,
    the offset where it ends, i.e. the next entry's start or the LEO for the newest).

    When every epoch in the history is newer than `epoch`, (NO_EPOCH, first start offset).
    """
    for i in range(len(history) - 1, -1, -1):
        e, _ = history[i]
        if e <= epoch:
            end = history[i + 1][1] if i + 1 < len(history) else leo
            return e, min(end, leo)
    return NO_EPOCH, (min(history[0][1], leo) if history else 0)


def common_prefix(a: Sequence[EpochEntry], a_leo: int, b: Sequence[EpochEntry], b_leo: int) -> int:
    """How many leading records two logs agree on, judged by their epoch histories.

    Epochs are constant between entry starts, so comparing at every start below the
    shorter LEO (and at 0) finds the first offset whose epochs differ.
    """
    limit = min(a_leo, b_leo)
    points = sorted({0, *(s for _, s in a), *(s for _, s in b)})
    for p in points:
        if p >= limit:
            break
        if epoch_at(a, p) != epoch_at(b, p):
            return p
    return limit


# --- the replica state ---------------------------------------------------------------


@dataclass
class ReplicaLog:
    topic: str
    partition: int
    leader_epochs: History = field(default_factory=list)
    log_end_offset: int = 0
    high_watermark: int = 0
    flushed_offset: int = 0
    topic_id: str = ""  # the topic's id when the replica was created ("": not recorded)
    # How many times the state was written (the file's version, not part of the state).
    seq: int = field(default=0, compare=False)
    # The stored batches (None: there are none, and no `.log` file is known).
    _bytes: BatchStore | None = field(default=None, compare=False, repr=False, init=False)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def last_leader_epoch(self) -> int:
        """What GetReplicaLogInfo reports: the newest epoch in the history, or -1."""
        return latest_epoch(self.leader_epochs)

    @property
    def last_fetched_epoch(self) -> int:
        """What a follower sends when it fetches: the epoch of its last record, or -1."""
        return last_written_epoch(self.leader_epochs, self.log_end_offset)

    # --- changes (pure state; the caller persists) ------------------------------------

    def assign_epoch(self, epoch: int) -> bool:
        """The leader starts `epoch` at its LEO. True if the history changed."""
        new = assign_epoch(self.leader_epochs, epoch, self.log_end_offset)
        if new == self.leader_epochs:
            return False
        self.leader_epochs = new
        return True

    def append(self, count: int, batch: bytes | bytearray | memoryview | None = None) -> None:
        """Append `count` records: without bytes (the native producer), or as the Kafka
        record batch `batch`, whose base offset must be the LEO and whose
        `last_offset_delta + 1` must be `count` (ValueError otherwise: a caller bug). The
        bytes are queued for the next `save` or `flush`."""
        if batch is None:
            self.log_end_offset += count
            return
        header = checked_header(self.name, batch, self.log_end_offset, count)
        if self._bytes is None:
            self._bytes = BatchStore()
        self._bytes.add(header, batch)
        self.log_end_offset += count

    def batches(self) -> list[BatchHeader]:
        """The headers of the stored batches, in offset order (real base offsets)."""
        return [] if self._bytes is None else self._bytes.headers()

    @property
    def log_bytes(self) -> int:
        """The bytes of the stored batches (the length of the `.log` file they make)."""
        return 0 if self._bytes is None else self._bytes.end

    def take_load_note(self) -> str | None:
        """What `load` had to repair in the stored batches (once), or None."""
        return None if self._bytes is None else self._bytes.take_note()

    def _cut_batches(self, offset: int) -> int:
        """Drop the stored batches at and after `offset`; the offset the log may keep
        (`offset`, or the base of a batch straddling it: dropped whole)."""
        return offset if self._bytes is None else self._bytes.cut_at(offset)

    def truncate_to(self, offset: int) -> bool:
        """Drop every record at or above `offset` (and the stored batches: one straddling
        `offset` goes whole, the LEO then is its base). True if anything changed."""
        if offset >= self.log_end_offset:
            return False
        offset = self._cut_batches(max(0, offset))
        self.log_end_offset = offset
        self.leader_epochs = truncate_history_to(self.leader_epochs, offset)
        self.high_watermark = min(self.high_watermark, offset)
        self.flushed_offset = min(self.flushed_offset, offset)
        return True

    def lose_unflushed(self) -> bool:
        """Simulate a lossy unclean shutdown: the page cache is gone, only what was fsynced
        remains. Epoch entries that start above the flushed offset are dropped."""
        f = self.flushed_offset = self._cut_batches(self.flushed_offset)
        epochs = [(e, s) for e, s in self.leader_epochs if s <= f]
        changed = self.log_end_offset != f or epochs != self.leader_epochs
        self.log_end_offset = f
        self.leader_epochs = epochs
        self.high_watermark = min(self.high_watermark, f)
        return changed

    def copy_from_leader(self, leader_epochs: Sequence[EpochEntry], leader_leo: int) -> bool:
        """After a non-diverging fetch the follower's log equals the leader's prefix and
        copies the rest: same LEO, same epoch history. True if anything changed. Records
        copied this way have no bytes (the follower appends the batches it is sent
        first, `append`, and then copies up to its own LEO)."""
        if leader_leo < self.log_end_offset:
            leader_leo = self._cut_batches(leader_leo)
            self.flushed_offset = min(self.flushed_offset, leader_leo)
        new_epochs = [(int(e), int(s)) for e, s in leader_epochs if s <= leader_leo]
        changed = new_epochs != self.leader_epochs or leader_leo != self.log_end_offset
        self.leader_epochs = new_epochs
        self.log_end_offset = leader_leo
        self.high_watermark = min(self.high_watermark, leader_leo)
        return changed

    def advance_high_watermark(self, hw: int) -> bool:
        hw = min(hw, self.log_end_offset)
        if hw <= self.high_watermark:
            return False
        self.high_watermark = hw
        return True

    # --- the file -----------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "leader_epochs": [[e, s] for e, s in self.leader_epochs],
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "flushed_offset": self.flushed_offset,
            "seq": self.seq,
        }
        if self._bytes is not None:
            doc["log_bytes"] = self._bytes.end
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> ReplicaLog:
        """The state in `doc` (its `log_bytes` is `load`'s business: the stored batches
        are read from the `.log` file)."""
        if not isinstance(doc, dict):
            raise ValueError("a replica file holds a JSON object")
        epochs = [(int(e), int(s)) for e, s in doc.get("leader_epochs", [])]
        leo = int(doc["log_end_offset"])
        log = cls(
            topic=str(doc["topic"]),
            partition=int(doc["partition"]),
            leader_epochs=epochs,
            log_end_offset=leo,
            high_watermark=min(int(doc.get("high_watermark", 0)), leo),
            flushed_offset=min(int(doc.get("flushed_offset", 0)), leo),
            topic_id=str(doc.get("topic_id", "")),
            seq=int(doc.get("seq", 0)),
        )
        if leo < 0 or any(s < 0 for _, s in epochs):
            raise ValueError("negative offsets")
        return log


FLUSHED_SUFFIX = ".flushed"


def replica_path(replicas_dir: Path, topic: str, partition: int) -> Path:
    return replicas_dir / f"{topic}-{partition}.json"


def flushed_path(path: Path) -> Path:
    """The second name of a replica's file that keeps its last fsynced state."""
    return path.with_name(path.name + FLUSHED_SUFFIX)


def _encode(log: ReplicaLog) -> bytes:
    log.seq += 1
    return json.dumps(log.to_json(), separators=(",", ":")).encode()


def _write_state(log: ReplicaLog, path: Path, *, durable: bool) -> None:
    if durable:
        log.flushed_offset = log.log_end_offset
        write_durable(path, _encode(log), twin=flushed_path(path))
    else:
        write_through_cache(path, _encode(log))
    b = log._bytes
    if b is not None:
        b.saved_bytes = b.end
        if durable:
            b.durable_bytes = b.end


def _write_prefix_state(log: ReplicaLog, b: BatchStore, path: Path, *, durable: bool) -> None:
    """Write the state of the log without its pending batches (it covers the `.log`
    file's `written` bytes, all of them already in the file)."""
    leo = b.written_offset()
    if durable:  # the bytes below `written` are fsynced (they were below `durable_bytes`)
        log.flushed_offset = max(log.flushed_offset, leo)
    log.seq += 1
    doc = log.to_json()
    doc.update(
        leader_epochs=[[e, s] for e, s in truncate_history_to(log.leader_epochs, leo)],
        log_end_offset=leo,
        high_watermark=min(log.high_watermark, leo),
        flushed_offset=min(log.flushed_offset, leo),
        log_bytes=b.written,
    )
    data = json.dumps(doc, separators=(",", ":")).encode()
    if durable:
        write_durable(path, data, twin=flushed_path(path))
        b.durable_bytes = b.written
    else:
        write_through_cache(path, data)
    b.saved_bytes = b.written


def _persist(log: ReplicaLog, replicas_dir: Path, *, durable: bool) -> None:
    path = replica_path(replicas_dir, log.topic, log.partition)
    b = log._bytes
    if b is None:  # no stored batches: the state alone, as before batches were stored
        if durable:
            log.flushed_offset = log.log_end_offset
            write_durable(path, _encode(log), twin=flushed_path(path))
        else:
            write_through_cache(path, _encode(log))
        return
    data = bytes_path(path)
    changes_file = bool(b.pending) or b.file_size > b.written
    if changes_file and b.written < max(b.saved_bytes, b.durable_bytes):
        # A state on disk covers bytes past `written`, which are about to be cut or
        # overwritten: first a state that covers only the bytes before (durably if the
        # durable state covers more), and its bytes durable before it if it is.
        sync = durable or b.written < b.durable_bytes
        if sync:
            rb.sync_bytes(data, b)
        if not b.pending:  # the state is that one: written first, then the file cut
            _write_state(log, path, durable=sync)
            rb.write_bytes(data, b, sync=False)
            if b.forgettable():
                log._bytes = None
            return
        _write_prefix_state(log, b, path, durable=sync)
    if changes_file:
        rb.write_bytes(data, b, sync=durable)
    elif durable:
        rb.sync_bytes(data, b)
    _write_state(log, path, durable=durable)
    if b.forgettable():
        log._bytes = None


def save(log: ReplicaLog, replicas_dir: Path) -> None:
    """Write through the page cache (no fsync): survives a process crash only. Queued
    batch bytes go to the `.log` file first."""
    _persist(log, replicas_dir, durable=False)


def flush(log: ReplicaLog, replicas_dir: Path) -> None:
    """fsync the whole replica: from now on `flushed_offset` == LEO survives an OS crash.
    The `.log` file is written and fsynced before the state."""
    _persist(log, replicas_dir, durable=True)


def read_chunks(
    log: ReplicaLog, replicas_dir: Path, from_offset: int, end_offset: int, max_bytes: int
) -> list[Chunk]:
    """The log from the chunk holding `from_offset` up to `end_offset` (exclusive, capped
    at the LEO), contiguous: stored batches whole (one starting before `from_offset`
    too) with their bytes, and no-bytes ranges (data None, split anywhere, counting no
    bytes). Stops before the batches' bytes would exceed `max_bytes`, but the first chunk
    is always returned (Kafka's rule: the first batch even if larger). A batch starting
    below `end_offset` is returned whole (the ends callers pass, the LEO and the high
    watermark, are batch boundaries; `read(tp, base, base + 1, 1)` reads one batch)."""
    if from_offset < 0:
        raise ValueError(f"from_offset must be >= 0, got {from_offset}")
    end_offset = min(end_offset, log.log_end_offset)
    if from_offset >= end_offset:
        return []
    path = bytes_path(replica_path(replicas_dir, log.topic, log.partition))
    return rb.read_chunks(log._bytes, path, from_offset, end_offset, max_bytes)


def remove(replicas_dir: Path, topic: str, partition: int) -> bool:
    """Delete a replica's files, its `.log` too (through the page cache: the caller
    fsyncs the directory once for a batch). True if there was one. A deletion lost to an
    OS crash brings the file back, and its topic id then tells it apart from a topic
    created again."""
    path = replica_path(replicas_dir, topic, partition)
    found = False
    names = (
        path,
        flushed_path(path),
        tmp_path(path),
        tmp_path(flushed_path(path)),
        bytes_path(path),
    )
    for name in names:
        try:
            name.unlink()
        except FileNotFoundError:
            continue
        found = found or not name.name.startswith(".")
    return found


def replica_files(replicas_dir: Path) -> list[Path]:
    """The `<name>.json` path of every replica the directory holds a file of (under
    either name, or only as the temporary file a crash left). A `.log` file alone is no
    replica."""
    names: set[str] = set()
    for entry in replicas_dir.iterdir():
        name = entry.name
        if name.startswith(".") and name.endswith(".json" + TMP_SUFFIX):
            name = name[1 : -len(TMP_SUFFIX)]  # a save cut short between unlink and rename
        elif name.endswith(".json" + FLUSHED_SUFFIX):
            name = name[: -len(FLUSHED_SUFFIX)]
        if name.endswith(".json") and not name.startswith("."):
            names.add(name)
    return [replicas_dir / name for name in sorted(names)]


def _log_bytes(doc: dict[str, Any]) -> int | None:
    value = doc.get("log_bytes")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"log_bytes must be an integer >= 0, got {value!r}")
    return value


def load(path: Path) -> ReplicaLog:
    """The newest complete state of the replica whose file is `path`, with the index of
    its stored batches (see the module's docstring); ValueError naming what is wrong if
    there is none."""
    best: ReplicaLog | None = None
    best_bytes: int | None = None
    covered = 0  # the most `.log` bytes any state found covers
    errors: list[str] = []
    found = read_through_cache(path)
    with contextlib.suppress(FileNotFoundError):  # written whole, only by `flush`
        found.append(flushed_path(path).read_bytes())
    for data in found:
        try:
            doc = json.loads(data)
            log = ReplicaLog.from_json(doc)
            log_bytes = _log_bytes(doc)
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(str(exc) or type(exc).__name__)
            continue
        covered = max(covered, log_bytes or 0)
        if best is None or log.seq > best.seq:
            best, best_bytes = log, log_bytes
    if best is None:
        raise ValueError("; ".join(errors) or "no file")
    best._bytes, cut = rb.load(
        bytes_path(path),
        best_bytes,
        covered,
        log_end_offset=best.log_end_offset,
        flushed_offset=best.flushed_offset,
    )
    if cut is not None:
        best.truncate_to(cut)
    return best


def load_all(replicas_dir: Path) -> tuple[list[ReplicaLog], list[str]]:
    """Every replica file in the directory, and a problem description per bad file."""
    logs: list[ReplicaLog] = []
    problems: list[str] = []
    if not replicas_dir.is_dir():
        return logs, problems
    for path in replica_files(replicas_dir):
        try:
            logs.append(load(path))
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
    return logs, problems
