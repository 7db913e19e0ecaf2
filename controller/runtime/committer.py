"""The controller's committer: makes stepped events durable, in order, in as few batches
as fit, and publishes them.

`controller.runtime.driver` runs the committer task and owns the events; this module owns
what happens to their records: `Commit` (one event's records, response and image),
`Committer` (the appends, the committed image, the commit listeners, what the log holds
after a failure) and the pure helpers it uses: `groups` (consecutive commits that fit in
one stored batch together), `split` (a change too large for one batch, cut into
batches: only ever inside a transaction, which the core has wrapped around it) and
`transaction_open_after` (whether the durable log ends inside a transaction once an
append lands).

Transactions: a change larger than one batch is appended in several batches one after
the other; the committed image advances only at transaction boundaries; the listeners
hear about a transaction once, at its end marker; and when an append fails while part
of a transaction is durable, the reverted image makes room for an AbortTransactionRecord
that starts the next append (`Committer.abort`).

It must not decide anything about records (the core places transaction markers) nor
touch the event task's state: a failure is handed back as a `Failure`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, overload

import msgspec
import structlog

from controller.runtime.clock import Clock
from metactl.errors import LogError, MetactlError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import apply
from metadata_log.batch_format import concat_batches
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    UncleanRecoveryRecord,
    decode_batch,
    encode_batch,
    record_type,
)
from metadata_log.store import LogStore
from protocol.messages.internal import Ack
from protocol.messages.unions import ControllerResponse

_RESERVED_LOG_KEYS: Final = frozenset({"level", "event", "timestamp", "logger"})

log = structlog.get_logger("metactl.controller")

# What an event that wrote nothing answers: a response, or the coded error it was refused
# with (a refusal may say what the log holds, so it waits for durability too).
Outcome = ControllerResponse | MetactlError

__all__ = [
    "Commit",
    "CommitListener",
    "Committer",
    "Failure",
    "groups",
    "log_committed",
    "split",
    "transaction_open_after",
]

# listener(base_offset, records, delta, now_ms), once an event's records are durable (a
# transaction's: once its end marker is).
CommitListener = Callable[[int, Sequence[MetadataRecord], MetadataDelta, int], None]


class Commit:
    """One stepped event waiting for its records to be durable.

    `image_after` is the image once they are, or None when that image is not at a
    transaction boundary (a slice of a topic created in slices, or an event handled while
    such a transaction is open): `committed_image` never shows a partial transaction.
    `opens`/`closes`/`aborts` say whether the records start or end a transaction.
    """

    __slots__ = (
        "aborts",
        "barrier",
        "closes",
        "delta",
        "followers",
        "future",
        "image_after",
        "now_ms",
        "opens",
        "payload",
        "records",
        "response",
        "size",
    )

    def __init__(
        self,
        records: list[MetadataRecord],
        response: ControllerResponse,
        *,
        image_after: ClusterImage | None,
        delta: MetadataDelta,
        future: asyncio.Future[ControllerResponse] | None,
        now_ms: int,
        size: int,
        payload: bytes | None = None,
        barrier: bool = False,
    ) -> None:
        self.records = records
        self.response = response
        self.image_after = image_after
        self.delta = delta
        self.future = future
        self.now_ms = now_ms
        self.size = size  # encoded bytes of `records`
        self.payload = payload  # encode_batch(records), when the step kept it
        self.barrier = barrier  # no records: only to release `future` in order (drain)
        # Answers of events that wrote nothing, released once this commit is durable
        # (`Committer.when_durable`), before any listener is told.
        self.followers: list[tuple[asyncio.Future[ControllerResponse], Outcome]] = []
        last = type(records[-1]) if records else None
        self.opens = bool(records) and type(records[0]) is BeginTransactionRecord
        self.aborts = last is AbortTransactionRecord
        self.closes = self.aborts or last is EndTransactionRecord


def abort_commit(image: ClusterImage, reason: str, now_ms: int) -> Commit:
    """An AbortTransactionRecord written after `image` (whose end offset is the abort's)."""
    records: list[MetadataRecord] = [AbortTransactionRecord(reason=reason)]
    after, delta = apply(image, records)
    payload = encode_batch(records)
    return Commit(
        records,
        Ack(),
        image_after=after,
        delta=delta,
        future=None,
        now_ms=now_ms,
        size=len(payload),
        payload=payload,
    )


def settle(future: asyncio.Future[ControllerResponse], outcome: Outcome) -> None:
    if future.done():
        return
    if isinstance(outcome, MetactlError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Failure:
    """A failed append: the commits that failed, the error, and the image to revert to."""

    __slots__ = ("commits", "error", "image")

    def __init__(self, commits: list[Commit], error: MetactlError, image: ClusterImage) -> None:
        self.commits = commits
        self.error = error
        self.image = image


# A part of what the listeners hear: (base offset, records, delta, now_ms).
_Part = tuple[int, Sequence[MetadataRecord], MetadataDelta, int]


class _Encoded(Sequence[MetadataRecord]):
    """A held commit's records as their encoded batch, decoded only if a listener reads
    them. An open transaction's parts wait for its end marker (listeners hear a
    transaction once): a fence or unclean registration of a million partitions held a
    million record objects, about 270 MB, where the encoded batches are about 100 MB, and
    the listeners read the records of a part only when it holds an unclean recovery or a
    broker change (or every record is logged)."""

    __slots__ = ("_count", "_payload", "_records")

    def __init__(self, payload: bytes, count: int) -> None:
        self._payload = payload
        self._count = count
        self._records: list[MetadataRecord] | None = None

    def _decoded(self) -> list[MetadataRecord]:
        if self._records is None:
            self._records = decode_batch(self._payload)
        return self._records

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> MetadataRecord: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[MetadataRecord]: ...
    def __getitem__(self, i: int | slice) -> MetadataRecord | Sequence[MetadataRecord]:
        return self._decoded()[i]

    def __iter__(self) -> Iterator[MetadataRecord]:
        return iter(self._decoded())


class Committer:
    """Appends commits and publishes them; the committer task's state."""

    def __init__(
        self,
        store: LogStore,
        image: ClusterImage,
        *,
        max_batch_bytes: int,
        clock: Clock,
        commit_listeners: list[CommitListener],
        append_listeners: list[Callable[[float, int], None]],
    ) -> None:
        self.store = store
        self.max_batch_bytes = max_batch_bytes
        self.clock = clock
        self.commit_listeners = commit_listeners
        self.append_listeners = append_listeners
        self.log_every_record = False
        self.committed_image = image
        self.log_end = image.end_offset  # where the next append lands
        self.in_transaction = False  # the durable log ends inside a transaction
        self.abort: Commit | None = None  # owed to the log: the next append starts with it
        self.unpublished = 0  # commits with records queued, or appended but not yet told
        self._last: Commit | None = None  # the last commit with records not yet durable
        self.progress = asyncio.Event()  # set (and replaced) whenever commits land or fail
        # The commits of a transaction whose end marker is not durable yet: what the
        # listeners hear at its end, commit by commit.
        self._held: list[_Part] | None = None
        # Groups durable but not yet told (with their base offsets): the publisher task
        # tells them while the next appends go on, so that telling a large transaction
        # (a million partitions' changes to the listeners) delays no later append, and no
        # answer that waits only for durability.
        self._telling: deque[tuple[int, list[Commit]]] = deque()
        self._tell_wakeup = asyncio.Event()
        self._all_told = asyncio.Event()
        self._all_told.set()

    def queued(self, c: Commit) -> None:
        if c.records:
            self.unpublished += 1
            self._last = c

    def answers_waiting(self) -> bool:
        """Whether an answer waits on a commit not yet durable (an event's own response,
        or one that waits only for durability)."""
        last = self._last
        return last is not None and (bool(last.followers) or last.future is not None)

    def when_durable(
        self, future: asyncio.Future[ControllerResponse] | None, outcome: Outcome
    ) -> None:
        """Answer an event that wrote nothing (or was refused) once every record queued
        before it is durable: at once if they are, else with the last of them (failing if
        it fails). It need not wait for listeners, nor for a commit of its own."""
        if future is None or future.done():
            return
        if self._last is None:
            settle(future, outcome)
        else:
            self._last.followers.append((future, outcome))

    async def commit(self, batch: list[Commit]) -> Failure | None:
        """Append `batch` (after an abort the log is owed) group by group; each group, once
        durable, advances the committed image, releases the answers that wait only for
        durability, and goes to the publisher (`publish_loop`); on a failure, stop and say
        what failed."""
        if self.abort is not None:
            batch.insert(0, self.abort)
        pending = deque(groups(batch, self.max_batch_bytes))
        while pending:
            group = pending[0]
            try:
                await self._append(group)
            except Exception as exc:
                return self._failed([c for g in pending for c in g], exc)
            pending.popleft()
            self._durable(group)
        return None

    def _durable(self, group: list[Commit]) -> None:
        """The group is durable: advance the committed image (to its last transaction
        boundary), release the answers waiting only for durability (`when_durable`), and
        queue the group for the publisher."""
        for c in group:
            if c is self.abort:
                self.abort = None  # owed no more: it is durable
            if c.image_after is not None:
                self.committed_image = c.image_after
            if c is self._last:
                self._last = None
            for future, outcome in c.followers:
                settle(future, outcome)
        base = self.log_end - sum(len(c.records) for c in group)
        self._telling.append((base, group))
        self._all_told.clear()
        self._tell_wakeup.set()
        self.notify_progress()

    async def publish_loop(self) -> None:
        """The publisher task (the driver runs it): tells durable groups to the listeners
        and releases their responses, in order."""
        while True:
            await self._tell_wakeup.wait()
            self._tell_wakeup.clear()
            while self._telling:
                base, group = self._telling.popleft()
                await self._publish(base, group)
            self._all_told.set()

    async def told(self) -> None:
        """Wait until every durable group has been told."""
        await self._all_told.wait()

    async def _append(self, group: list[Commit]) -> None:
        """One append, or (a transaction too large for one batch) several, in order."""
        records = [r for c in group for r in c.records]
        if not records:
            return
        size = sum(c.size for c in group)
        limit = self.max_batch_bytes
        batches: Iterable[tuple[list[MetadataRecord], bytes | None]]
        if size <= limit:
            # One batch: the steps' own encodings, joined, are its payload.
            with_records = [c for c in group if c.records]
            encoded = [c.payload for c in with_records if c.payload is not None]
            whole = len(encoded) == len(with_records)
            batches = [(records, concat_batches(encoded, len(records)) if whole else None)]
        else:
            batches = split(records, limit, size)
        position = 0
        for chunk, payload in batches:
            started = time.perf_counter()
            offsets = await self.store.append(chunk, timestamp_ms=group[-1].now_ms, payload=payload)
            elapsed = time.perf_counter() - started
            if offsets.start != self.log_end:
                raise LogError(
                    f"the log assigned offset {offsets.start} where the controller expected "
                    f"{self.log_end}: another writer?"
                )
            self.log_end = offsets.stop
            self.in_transaction = transaction_open_after(
                group, position, position + len(chunk), self.in_transaction
            )
            position += len(chunk)
            for append_listener in self.append_listeners:
                append_listener(elapsed, len(chunk))

    async def _publish(self, offset: int, group: list[Commit]) -> None:
        """Tell the listeners about a durable group (records from `offset`) and release
        the responses, in order. A transaction is told at its end marker, commit by commit
        (slice by slice), yielding to the event loop between them, so that listeners doing
        work per partition (the metrics) never stall it for the whole transaction at
        once."""
        told = False
        for c in group:
            if c.records:
                if told:
                    # One commit's listeners per turn of the event loop: each is at most
                    # a work budget of records, but a group holds up to 16 of them, and
                    # each unclean recovery logs a line (about 30 us of JSON).
                    await asyncio.sleep(0)
                told = True
                self.unpublished -= 1
                parts = self._committed(offset, c)
                offset += len(c.records)
                await self._tell(parts, transaction=c.opens or (c.closes and not c.aborts))
            if c.future is not None and not c.future.done():
                c.future.set_result(c.response)
        self.notify_progress()

    def _committed(self, offset: int, c: Commit) -> list[_Part]:
        """What the listeners hear now that `c` is durable."""
        part: _Part = (offset, c.records, c.delta, c.now_ms)
        held = self._held
        if c.payload is not None and not c.closes and (c.opens or held is not None):
            # Held until the transaction's end: as its encoded batch (`_Encoded`).
            part = (offset, _Encoded(c.payload, len(c.records)), c.delta, c.now_ms)
        if c.opens and not c.closes:
            self._held = [part]
            return []
        if held is not None and not c.aborts:
            held.append(part)
            if not c.closes:
                return []
            self._held = None
            return held
        if c.aborts:
            self._held = None  # nothing of an aborted transaction is ever told
        return [part]

    async def _tell(self, parts: list[_Part], *, transaction: bool) -> None:
        for i, (base, records, delta, now_ms) in enumerate(parts):
            if i:
                await asyncio.sleep(0)  # let the event loop answer requests meanwhile
            for listener in self.commit_listeners:
                listener(base, records, delta, now_ms)
            if not transaction:
                log_committed(base, records, delta, self.log_every_record)
            else:  # per part only the unclean recoveries; one summary line at the end
                log_committed(base, records, delta, every_record=False)
        if transaction and self.log_every_record and parts:
            log_transaction(parts)

    def notify_progress(self) -> None:
        event, self.progress = self.progress, asyncio.Event()
        event.set()

    def _failed(self, failed: list[Commit], exc: Exception) -> Failure:
        error = exc if isinstance(exc, MetactlError) else LogError(f"append failed: {exc!r}")
        log.error("commit failed; reverting to the committed image", error=str(error))
        self.abort = None
        # The failed commits will never be told; those durable before them still are
        # (the publisher owns `_held`: an aborted transaction is forgotten at its abort).
        self.unpublished -= sum(1 for c in failed if c.records)
        self._last = None  # the driver fails every queued commit, and what follows them
        image = self.committed_image
        if self.in_transaction:
            # Part of a transaction is durable: the next append starts with its abort.
            image = msgspec.structs.replace(image, end_offset=self.log_end)
            self.abort = abort_commit(image, f"append failed: {error.message}", self.clock.now_ms())
            self.unpublished += 1
            assert self.abort.image_after is not None
            image = self.abort.image_after
        self.notify_progress()
        return Failure(failed, error, image)


def groups(batch: list[Commit], max_bytes: int) -> Iterator[list[Commit]]:
    """Consecutive commits whose records fit in one batch together (a commit larger than
    `max_bytes` alone: it is a transaction, `split` cuts it)."""
    group: list[Commit] = []
    size = 0
    for c in batch:
        if group and size + c.size > max_bytes:
            yield group
            group, size = [], 0
        group.append(c)
        size += c.size
    if group:
        yield group


def split(
    records: list[MetadataRecord], max_bytes: int, size: int
) -> Iterator[tuple[list[MetadataRecord], bytes]]:
    """Cut `records` (about `size` bytes encoded) into consecutive chunks that each encode
    to at most `max_bytes`, each with its encoding (the payload the store keeps). The
    chunk length starts from the average record size and shrinks where records are
    larger."""
    i, n = 0, len(records)
    per = max(1, n * max_bytes // max(size, 1) * 15 // 16)
    while i < n:
        chunk = records[i : i + per]
        encoded = encode_batch(chunk)
        if len(encoded) > max_bytes and len(chunk) > 1:
            per = max(1, len(chunk) * max_bytes // len(encoded) * 15 // 16)
            continue
        yield chunk, encoded  # a single record over the limit: the store refuses it, by name
        i += len(chunk)


def transaction_open_after(group: Sequence[Commit], lo: int, hi: int, was_open: bool) -> bool:
    """Whether the log ends inside a transaction once records [lo, hi) of `group` (indexes
    into its concatenated records) are durable, given whether it did before. Markers are
    only ever a commit's first or last record."""
    is_open = was_open
    position = 0
    for c in group:
        first, last = position, position + len(c.records) - 1
        position += len(c.records)
        if c.opens and lo <= first < hi:
            is_open = True
        if c.closes and lo <= last < hi:
            is_open = False
    return is_open


def log_transaction(parts: Sequence[_Part]) -> None:
    """One line for a committed transaction (a bulk change by construction), instead of
    one per record."""
    base, records = parts[0][0], parts[0][1]
    last_base, last_records = parts[-1][0], parts[-1][1]
    counts: dict[str, int] = {}
    for _, _, delta, _ in parts:
        for kind, n in delta.records_by_type.items():
            counts[kind] = counts.get(kind, 0) + n
    begin = records[0]
    log.info(
        "committed transaction",
        name=begin.name if isinstance(begin, BeginTransactionRecord) else "",
        offsets=f"{base}..{last_base + len(last_records) - 1}",
        records=counts,
    )


def log_committed(
    base: int,
    records: Sequence[MetadataRecord],
    delta: MetadataDelta,
    every_record: bool,
) -> None:
    """An unclean recovery always logs a WARNING; other records only when asked for, since
    formatting one line per record would dominate bulk changes (a 100k-partition topic).
    The delta says whether there is a recovery at all, so a bulk change without one is
    not scanned."""
    if not every_record and not delta.unclean_recoveries:
        return
    for i, r in enumerate(records):
        if not (every_record or isinstance(r, UncleanRecoveryRecord)):
            continue
        fields: dict[str, Any] = msgspec.to_builtins(r)
        fields.pop("v", None)
        fields.pop("type", None)
        for reserved in _RESERVED_LOG_KEYS & fields.keys():
            # structlog's own keys (a FeatureLevelRecord's `level` was overwritten by the
            # log level): the record's value is kept under another name.
            fields[f"record_{reserved}"] = fields.pop(reserved)
        if isinstance(r, UncleanRecoveryRecord):
            log.warning(
                "unclean recovery: potential data loss",
                offset=base + i,
                record=record_type(r),
                **fields,
            )
        else:
            log.info("committed", offset=base + i, record=record_type(r), **fields)
