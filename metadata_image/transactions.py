"""Replay of the committed log, honouring transactions (KIP-868 metadata transactions).

A change too large for one stored batch is written as several batches between a
`BeginTransactionRecord` and an `EndTransactionRecord`. Batches become durable one at a
time, so a reader can see the log end inside a transaction (the change is still being
written, or the writer crashed), and a transaction can be abandoned with an
`AbortTransactionRecord`. Whoever rebuilds state from the committed log (the controller
at start-up, the brokers tailing it, offline tools) replays through `replay_log` or
`apply_log`, so that:

* records outside any transaction take effect one by one, as `metadata_image.replay`
  applies them;
* the records of a transaction are held back and take effect together at its end marker,
  the markers included (they advance `end_offset` like any record);
* the records of an aborted transaction never take effect: the image jumps past them to
  the offset after the abort marker;
* an open transaction stays open (held back) across calls, so records may arrive in any
  chunks (fetch responses, store reads).

`LogReplay.image` is therefore always the image at a transaction boundary, and
`LogReplay.next_offset` is where reading continues. A marker out of place (a begin
inside a transaction, an end or abort outside one) raises `ReplayError`: the controller
never writes one.

Readers that report rather than rebuild (the CLI's event lines, describe's notes) need
the same rule over entries that carry more than a record (an offset, a commit time):
`EffectiveEntries` passes on the entries that take effect, in the same order, and is
lenient where `replay_log` is strict (a begin inside a transaction is part of it, an end
or abort outside one is dropped).

Pure: no IO, and nothing here changes an image except through `metadata_image.replay`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

import msgspec

from metactl.errors import ReplayError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import apply, replay
from metadata_log.records import (
    TRANSACTION_MARKERS,
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
)

__all__ = ["EffectiveEntries", "LogReplay", "OpenTransaction", "apply_log", "replay_log"]


class OpenTransaction(msgspec.Struct, frozen=True, gc=False):
    """A transaction whose end marker has not been read yet, and what it holds so far.

    `held` are chunks of records, the begin marker first; chunks are never changed once
    held, so older `LogReplay` values stay valid.
    """

    name: str
    begin_offset: int
    held: tuple[list[MetadataRecord], ...]
    count: int  # records held, the begin marker included


class LogReplay(msgspec.Struct, frozen=True):
    """Where a reader of the committed log stands.

    `image` has every record before `image.end_offset` applied and is at a transaction
    boundary; `transaction` is the open transaction that follows it, if any.
    """

    image: ClusterImage = ClusterImage()
    transaction: OpenTransaction | None = None

    @property
    def next_offset(self) -> int:
        """The offset of the next record to read."""
        t = self.transaction
        return self.image.end_offset if t is None else t.begin_offset + t.count


def replay_log(state: LogReplay, records: Iterable[MetadataRecord]) -> LogReplay:
    """Read the next committed records (starting at `state.next_offset`)."""
    return _advance(state, records, None)


def apply_log(
    state: LogReplay, records: Iterable[MetadataRecord]
) -> tuple[LogReplay, MetadataDelta]:
    """`replay_log`, and the delta of what took effect: the records outside transactions
    and the whole of every transaction that ended (nothing of an aborted one)."""
    delta = MetadataDelta()
    return _advance(state, records, delta), delta


def _apply(
    image: ClusterImage, records: list[MetadataRecord], delta: MetadataDelta | None
) -> ClusterImage:
    if not records:
        return image
    if delta is None:
        return replay(image, records)
    image, more = apply(image, records)
    delta.update(more)
    return image


def _advance(
    state: LogReplay, records: Iterable[MetadataRecord], delta: MetadataDelta | None
) -> LogReplay:
    batch = records if isinstance(records, list) else list(records)
    image, txn = state.image, state.transaction
    start = 0  # the first record of `batch` not yet applied or held
    for i, record in enumerate(batch):
        kind = type(record)
        if kind not in TRANSACTION_MARKERS:
            continue
        if kind is BeginTransactionRecord:
            if txn is not None:
                raise ReplayError(
                    f"BeginTransaction inside transaction {txn.name!r} "
                    f"(begun at offset {txn.begin_offset})"
                )
            image = _apply(image, batch[start:i], delta)
            assert isinstance(record, BeginTransactionRecord)
            txn = OpenTransaction(record.name, image.end_offset, (), 0)
            start = i  # the begin marker is held with the transaction's records
            continue
        if txn is None:
            raise ReplayError(f"{kind.__name__} outside any transaction")
        if kind is AbortTransactionRecord:
            # Nothing of the transaction takes effect; the image moves past the abort.
            image = msgspec.structs.replace(
                image, end_offset=txn.begin_offset + txn.count + (i - start) + 1
            )
        else:
            held = [r for chunk in txn.held for r in chunk]
            held.extend(batch[start : i + 1])
            image = _apply(image, held, delta)
        txn = None
        start = i + 1
    rest = batch[start:]
    if txn is None:
        return LogReplay(_apply(image, rest, delta))
    if rest:
        txn = OpenTransaction(txn.name, txn.begin_offset, (*txn.held, rest), txn.count + len(rest))
    return LogReplay(image, txn)


class HasRecord(Protocol):
    """A committed record with whatever its reader keeps beside it (offset, time)."""

    @property
    def record(self) -> MetadataRecord: ...


E = TypeVar("E", bound=HasRecord)


class EffectiveEntries(Generic[E]):
    """Which entries of the committed log take effect, read in log order in any chunks.

    `add` returns, in log order, the entries that take effect: one outside any
    transaction at once; a transaction's entries, its markers included, all together
    when its end marker is read; none of an aborted one. An open transaction is held
    across calls, and one the log ends inside gives nothing (yet). Lenient, for readers
    that report rather than refuse: a begin marker inside a transaction is part of it,
    and an end or abort marker outside one is dropped.
    """

    def __init__(self) -> None:
        self._held: list[E] | None = None  # the open transaction, its begin marker first

    def add(self, entries: Iterable[E]) -> list[E]:
        out: list[E] = []
        held = self._held
        for e in entries:
            kind = type(e.record)
            if kind is BeginTransactionRecord and held is None:
                held = [e]
            elif kind not in TRANSACTION_MARKERS or kind is BeginTransactionRecord:
                (out if held is None else held).append(e)
            elif held is not None:  # its end or abort marker
                if kind is EndTransactionRecord:
                    out.extend(held)
                    out.append(e)
                held = None
        self._held = held
        return out
