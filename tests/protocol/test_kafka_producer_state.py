"""The idempotent producers of one partition (protocol/kafka/producer_state.py): Kafka's
epoch and sequence rules, duplicates of any of the last 5 batches, the wrap of the
sequence, the rebuild from the log's headers, and the bound on producer ids."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metactl.errors import InvalidProducerEpochError, MetactlError, OutOfOrderSequenceError
from protocol.kafka.producer_state import (
    MAX_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    Duplicate,
    ProducerStates,
    in_sequence,
)
from protocol.kafka.records import (
    CONTROL_MASK,
    BatchHeader,
    null_records_batch,
    read_header,
)


def hdr(
    seq: int,
    n: int = 1,
    *,
    pid: int = 1,
    epoch: int = 0,
    offset: int = 0,
    ts: int = 1_000,
    attributes: int = 0,
) -> BatchHeader:
    """A batch header of `n` records of producer `pid`, stamped at `offset`."""
    return BatchHeader(
        base_offset=offset,
        batch_length=100,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=attributes,
        last_offset_delta=n - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        records_count=n,
    )


def append(states: ProducerStates, header: BatchHeader) -> Duplicate | None:
    """The leader's sequence: check, then (if not a duplicate) update."""
    dup = states.check(header)
    if dup is None:
        states.update(header)
    return dup


def refused(states: ProducerStates, header: BatchHeader, code: str) -> None:
    before = (states.epoch(header.producer_id), states.batches(header.producer_id))
    with pytest.raises(MetactlError) as e:
        states.check(header)
    assert e.value.code == code
    assert (states.epoch(header.producer_id), states.batches(header.producer_id)) == before


def test_non_idempotent_batches_are_never_checked_nor_kept() -> None:
    states = ProducerStates()
    plain = hdr(-1, pid=-1, epoch=-1)
    for _ in range(3):
        assert append(states, plain) is None
    assert len(states) == 0


def test_an_unknown_producer_is_accepted_at_any_sequence() -> None:
    states = ProducerStates()
    assert states.check(hdr(12_345, pid=9, epoch=3)) is None
    assert states.check(hdr(0, pid=9, epoch=0)) is None


def test_in_sequence_batches_are_appended_and_gaps_refused() -> None:
    states = ProducerStates()
    offset = 0
    for seq, n in ((0, 3), (3, 1), (4, 5)):
        assert append(states, hdr(seq, n, offset=offset)) is None
        offset += n
    assert states.batches(1)[-1] == BatchMetadata(4, 8, 4, 8, 1_000)
    refused(states, hdr(10, offset=offset), "OUT_OF_ORDER_SEQUENCE_NUMBER")  # a gap
    refused(states, hdr(8, offset=offset), "OUT_OF_ORDER_SEQUENCE_NUMBER")  # a repeat, not a dup
    refused(states, hdr(3, 2, offset=offset), "OUT_OF_ORDER_SEQUENCE_NUMBER")  # overlaps
    assert append(states, hdr(9, offset=offset)) is None


@pytest.mark.parametrize("which", range(NUM_BATCHES_TO_RETAIN))
def test_a_duplicate_of_any_of_the_last_5_batches_gets_its_offsets(which: int) -> None:
    states = ProducerStates()
    sent = []
    for i in range(7):  # 7 batches of 2 records: the last 5 are retained
        header = hdr(2 * i, 2, offset=100 + 10 * i, ts=5_000 + i)
        sent.append(header)
        assert append(states, header) is None
    retry = replace(sent[2 + which], base_offset=0)  # as the client sends it again
    original = sent[2 + which]
    assert states.check(retry) == Duplicate(
        original.base_offset, original.last_offset, 5_002 + which
    )
    assert len(states.batches(1)) == NUM_BATCHES_TO_RETAIN


def test_a_batch_older_than_the_last_5_is_out_of_order() -> None:
    states = ProducerStates()
    for i in range(6):
        append(states, hdr(i, offset=i))
    refused(states, hdr(0), "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert states.check(hdr(1)) == Duplicate(1, 1, 1_000)


def test_a_duplicate_needs_the_same_first_and_last_sequence() -> None:
    states = ProducerStates()
    append(states, hdr(0, 3))
    assert states.check(hdr(0, 3)) == Duplicate(0, 2, 1_000)
    refused(states, hdr(0, 2), "OUT_OF_ORDER_SEQUENCE_NUMBER")
    refused(states, hdr(1, 2), "OUT_OF_ORDER_SEQUENCE_NUMBER")


def test_an_older_epoch_is_an_invalid_producer_epoch() -> None:
    states = ProducerStates()
    append(states, hdr(0, epoch=5))
    refused(states, hdr(1, epoch=4), "INVALID_PRODUCER_EPOCH")
    with pytest.raises(InvalidProducerEpochError):
        states.check(hdr(0, epoch=4))  # even what was a duplicate under that epoch


def test_a_new_epoch_starts_at_sequence_0_and_forgets_the_old_batches() -> None:
    states = ProducerStates()
    append(states, hdr(0, 3, epoch=1))
    refused(states, hdr(3, epoch=2), "OUT_OF_ORDER_SEQUENCE_NUMBER")
    with pytest.raises(OutOfOrderSequenceError):
        states.check(hdr(1, epoch=2))
    assert append(states, hdr(0, 2, epoch=2, offset=3)) is None
    assert states.epoch(1) == 2
    assert states.batches(1) == (BatchMetadata(0, 1, 3, 4, 1_000),)
    refused(states, hdr(0, 3, epoch=1), "INVALID_PRODUCER_EPOCH")  # the old epoch's retry


def test_the_sequence_wraps_from_max_to_0() -> None:
    states = ProducerStates()
    append(states, hdr(MAX_SEQUENCE - 1, 2))  # last sequence: 2**31 - 1
    assert states.batches(1)[-1].last_seq == MAX_SEQUENCE
    refused(states, hdr(1), "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert append(states, hdr(0, offset=2)) is None


def test_a_batch_spanning_the_wrap_and_its_duplicate() -> None:
    states = ProducerStates()
    spanning = hdr(MAX_SEQUENCE - 1, 4, offset=10)  # sequences max-1, max, 0, 1
    assert spanning.last_sequence == 1
    append(states, spanning)
    assert states.check(replace(spanning, base_offset=0)) == Duplicate(10, 13, 1_000)
    refused(states, hdr(3), "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert append(states, hdr(2, offset=14)) is None


def test_in_sequence() -> None:
    assert in_sequence(-1, 0) and in_sequence(4, 5) and in_sequence(MAX_SEQUENCE, 0)
    assert not in_sequence(4, 4) and not in_sequence(4, 6) and not in_sequence(MAX_SEQUENCE, 1)


def test_check_changes_nothing() -> None:
    states = ProducerStates()
    append(states, hdr(0, 2))
    before = (states.epoch(1), states.batches(1), len(states))
    for header in (hdr(2), hdr(0, 2), hdr(0, epoch=1), hdr(5, pid=2)):
        states.check(header)
    assert (states.epoch(1), states.batches(1), len(states)) == before


def test_control_batches_are_neither_checked_nor_kept() -> None:
    states = ProducerStates()
    append(states, hdr(0, epoch=3))
    marker = hdr(-1, epoch=1, attributes=CONTROL_MASK)
    assert states.check(marker) is None
    states.update(marker)
    assert states.epoch(1) == 3


def test_from_batches_rebuilds_the_state_of_the_log() -> None:
    log = [
        hdr(0, 2, pid=1, offset=0),
        read_header(null_records_batch(2, 3, 0, 0)),  # metactl's native writes: no producer
        hdr(0, 1, pid=2, epoch=4, offset=5),
        hdr(2, 3, pid=1, offset=6),
        hdr(0, 1, pid=1, epoch=1, offset=9),
        hdr(1, 1, pid=2, epoch=4, offset=10),
    ]
    headers = [h for h in log if h is not None]
    live = ProducerStates()
    for h in headers:
        assert append(live, h) is None
    rebuilt = ProducerStates.from_batches(headers)
    for pid in (1, 2):
        assert rebuilt.epoch(pid) == live.epoch(pid)
        assert rebuilt.batches(pid) == live.batches(pid)
    assert rebuilt.batches(1) == (BatchMetadata(0, 0, 9, 9, 1_000),)  # epoch 1 only
    assert rebuilt.check(hdr(1, pid=2, epoch=4)) == Duplicate(10, 10, 1_000)


def test_producer_ids_are_bounded_least_recently_appended_first() -> None:
    states = ProducerStates(max_producers=3)
    for pid in (1, 2, 3):
        append(states, hdr(0, pid=pid))
    append(states, hdr(1, pid=1))  # 1 is now the most recent
    append(states, hdr(0, pid=4))  # drops 2
    assert len(states) == 3
    assert states.epoch(2) is None and states.epoch(1) == 0
    # A dropped producer is unknown again: any sequence goes, its retries are not caught.
    assert states.check(hdr(7, pid=2)) is None
    assert states.check(hdr(0, pid=2)) is None
    with pytest.raises(ValueError):
        ProducerStates(max_producers=0)


# --- against a model -------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("METACTL_HYPOTHESIS_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(-2, 6), st.integers(1, 3)),
        max_size=40,
    )
)
def test_a_well_behaved_producer_with_retries_never_duplicates(
    steps: list[tuple[int, int, int, int]],
) -> None:
    """Producers send in order, retrying any of their last 5 batches at random (`back`):
    every retry is a Duplicate with the first offsets, nothing is refused, and the log
    holds each batch once."""
    states = ProducerStates()
    next_seq = dict.fromkeys((1, 2, 3), 0)
    sent: dict[int, list[BatchHeader]] = {pid: [] for pid in (1, 2, 3)}
    end = 0
    for pid, _epoch, back, n in steps:
        history = sent[pid][-NUM_BATCHES_TO_RETAIN:]
        if 0 < back <= len(history):
            original = history[-back]
            dup = states.check(replace(original, base_offset=0))
            assert dup == Duplicate(original.base_offset, original.last_offset, 1_000)
            continue
        header = hdr(next_seq[pid], n, pid=pid, offset=end)
        assert append(states, header) is None
        sent[pid].append(header)
        next_seq[pid] = (next_seq[pid] + n) % (MAX_SEQUENCE + 1)
        end += n
    assert end == sum(h.records_count for hs in sent.values() for h in hs)
