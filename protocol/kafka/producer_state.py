"""The idempotent producers' state of one partition: Kafka's ProducerStateManager and
ProducerAppendInfo, simplified (no transactions). Pure: no IO, no clock.

For each producer id the partition keeps the producer's epoch and the metadata of its
last `NUM_BATCHES_TO_RETAIN` (5) batches, as Kafka does (ProducerStateEntry): a retried
batch that matches one of them is answered with the offsets it got the first time,
without a second append. The leader calls `check` before appending a client's batch and
`update` after, with the header stamped at its real base offset; a replica, or a leader
after truncation or restart, rebuilds the state from the headers of the batches in its
log (`from_batches`), as Kafka reloads it from the log (there it is origin REPLICATION:
nothing is checked).

Memory is bounded: at most `max_producers` producer ids per partition (10,000 by
default), the least recently appended dropped first. Kafka expires a producer id by time
instead (`producer.id.expiration.ms`, one day by default). A dropped producer that
appends again is unknown, and an unknown producer's batch is accepted at any sequence
(Kafka since KIP-360: the log's start may have moved past its state), so dropping loses
the duplicate detection of that producer's retries, never an append.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from metactl.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from protocol.kafka.records import NO_PRODUCER_EPOCH, BatchHeader

NUM_BATCHES_TO_RETAIN: Final = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_PRODUCERS: Final = 10_000
MAX_SEQUENCE: Final = 2**31 - 1  # a sequence wraps from here to 0


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What the partition keeps of one appended batch (Kafka's BatchMetadata)."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch was appended already: answer these offsets, with no error, and append
    nothing (Kafka's duplicate of one of the last 5 batches)."""

    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class _Producer:
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Kafka's ProducerAppendInfo.inSequence: `next_seq` follows `last_seq`."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQUENCE)


class ProducerStates:
    """The idempotent producers of one partition."""

    def __init__(self, max_producers: int = MAX_PRODUCERS) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be at least 1, not {max_producers}")
        self.max_producers = max_producers
        # Insertion order is recency: an update moves its producer to the end.
        self._producers: dict[int, _Producer] = {}

    @classmethod
    def from_batches(
        cls, headers: Iterable[BatchHeader], max_producers: int = MAX_PRODUCERS
    ) -> ProducerStates:
        """The state after the batches of a log, in offset order (stamped headers)."""
        states = cls(max_producers)
        for header in headers:
            states.update(header)
        return states

    def __len__(self) -> int:
        return len(self._producers)

    def epoch(self, producer_id: int) -> int | None:
        producer = self._producers.get(producer_id)
        return None if producer is None else producer.epoch

    def batches(self, producer_id: int) -> tuple[BatchMetadata, ...]:
        """The producer's retained batches, oldest first."""
        producer = self._producers.get(producer_id)
        return () if producer is None else tuple(producer.batches)

    def check(self, header: BatchHeader) -> Duplicate | None:
        """Before appending a client's batch: None to append it, a `Duplicate` to answer
        instead; else InvalidProducerEpochError or OutOfOrderSequenceError (Kafka's
        ProducerAppendInfo.checkProducerEpoch and checkSequence, and
        ProducerStateEntry.findDuplicateBatch). Changes nothing."""
        if not header.idempotent or header.control:
            return None
        producer = self._producers.get(header.producer_id)
        if producer is None:
            return None  # unknown (or expired): any sequence, as Kafka since KIP-360
        epoch, seq = header.producer_epoch, header.base_sequence
        if epoch < producer.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id}: epoch {epoch} is older than the "
                f"current {producer.epoch}"
            )
        if epoch != producer.epoch:
            # A new epoch starts at sequence 0, unless the current one is unknown.
            if seq != 0 and producer.epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id}: new epoch {epoch} starts at sequence "
                    f"{seq}, not 0 (current epoch {producer.epoch})"
                )
            return None
        last_seq = header.last_sequence
        for batch in producer.batches:
            if batch.first_seq == seq and batch.last_seq == last_seq:
                return Duplicate(batch.base_offset, batch.last_offset, batch.max_timestamp)
        if producer.batches:
            current = producer.batches[-1].last_seq
            if not in_sequence(current, seq):
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} epoch {epoch}: sequence {seq} does not "
                    f"follow {current}"
                )
        return None

    def update(self, header: BatchHeader) -> None:
        """After appending the batch (its header stamped with its real base offset), or
        for each batch of the log when rebuilding. Checks nothing."""
        if not header.idempotent or header.control:
            return
        producer = self._producers.pop(header.producer_id, None)
        if producer is None or producer.epoch != header.producer_epoch:
            # Kafka's ProducerStateEntry.maybeUpdateProducerEpoch: a new epoch forgets
            # the batches of the old one.
            producer = _Producer(header.producer_epoch)
        producer.batches.append(
            BatchMetadata(
                first_seq=header.base_sequence,
                last_seq=header.last_sequence,
                base_offset=header.base_offset,
                last_offset=header.last_offset,
                max_timestamp=header.max_timestamp,
            )
        )
        self._producers[header.producer_id] = producer
        if len(self._producers) > self.max_producers:
            del self._producers[next(iter(self._producers))]  # the least recently appended
