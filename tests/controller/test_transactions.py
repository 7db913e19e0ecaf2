"""Replay of the committed log with transactions (`metadata_image.transactions`): nothing
of a transaction takes effect before its end marker, nothing of an aborted one ever does,
whatever chunks the records arrive in; and the plain replay treats markers as no-ops."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metactl.errors import ReplayError
from metadata_image.image import ClusterImage
from metadata_image.replay import apply, replay
from metadata_image.transactions import LogReplay, apply_log, replay_log
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    decode_batch,
    encode_batch,
)

CONTROLLER = settings.get_profile("metactl-controller")


def reg(broker_id: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id=broker_id, incarnation_id=f"i{broker_id}", broker_epoch=0)


def brokers(state: LogReplay | ClusterImage) -> set[int]:
    image = state.image if isinstance(state, LogReplay) else state
    return set(image.brokers)


def test_markers_round_trip_and_replay_as_no_ops() -> None:
    markers: list[MetadataRecord] = [
        BeginTransactionRecord(name="FenceBroker 1"),
        EndTransactionRecord(),
        AbortTransactionRecord(reason="crash"),
    ]
    assert decode_batch(encode_batch(markers)) == markers
    image = replay(ClusterImage(), [reg(1), *markers])
    assert image.end_offset == 4 and brokers(image) == {1}


def test_a_log_without_markers_replays_as_the_plain_replay() -> None:
    records: list[MetadataRecord] = [reg(1), reg(2)]
    state, delta = apply_log(LogReplay(), records)
    assert state.transaction is None
    assert state.image.same_state(replay(ClusterImage(), records))
    assert delta.brokers == {1, 2} and state.next_offset == 2


def test_a_transaction_takes_effect_only_at_its_end_marker() -> None:
    state, delta = apply_log(LogReplay(), [reg(1), BeginTransactionRecord(name="t"), reg(2)])
    # The record before the transaction took effect; the transaction's are held.
    assert brokers(state) == {1} and delta.brokers == {1}
    assert state.image.end_offset == 1 and state.next_offset == 3
    assert state.transaction is not None
    assert state.transaction.begin_offset == 1 and state.transaction.name == "t"
    state, delta = apply_log(state, [reg(3)])
    assert brokers(state) == {1} and delta.empty and state.next_offset == 4
    state, delta = apply_log(state, [reg(4), EndTransactionRecord(), reg(5)])
    assert state.transaction is None
    assert brokers(state) == {1, 2, 3, 4, 5}
    assert delta.brokers == {2, 3, 4, 5}
    assert delta.records_by_type["BeginTransaction"] == 1
    assert delta.records_by_type["EndTransaction"] == 1
    assert state.image.end_offset == state.next_offset == 7


def test_an_aborted_transaction_never_takes_effect() -> None:
    state = replay_log(LogReplay(), [reg(1), BeginTransactionRecord(name="t"), reg(2)])
    state, delta = apply_log(state, [reg(3), AbortTransactionRecord(reason="x"), reg(4)])
    assert state.transaction is None
    assert brokers(state) == {1, 4} and delta.brokers == {4}
    assert state.image.end_offset == 6  # past the abort marker and what follows it
    # Begin and abort in one chunk.
    state = replay_log(
        LogReplay(), [BeginTransactionRecord(), reg(1), AbortTransactionRecord(), reg(2)]
    )
    assert brokers(state) == {2} and state.image.end_offset == 4


def test_a_log_that_ends_inside_a_transaction_keeps_it_out_of_the_image() -> None:
    state = replay_log(LogReplay(), [reg(1), BeginTransactionRecord(name="t"), reg(2), reg(3)])
    assert brokers(state) == {1} and state.image.end_offset == 1
    assert state.transaction is not None and state.transaction.count == 3
    # An empty chunk changes nothing.
    assert replay_log(state, []) == state


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([BeginTransactionRecord(name="a"), BeginTransactionRecord(name="b")], "inside"),
        ([EndTransactionRecord()], "outside"),
        ([reg(1), AbortTransactionRecord()], "outside"),
    ],
)
def test_a_misplaced_marker_is_refused(records: list[MetadataRecord], message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        replay_log(LogReplay(), records)


# --- the property: any log, any chunking --------------------------------------------------

# A log is a list of units: a plain record, or a transaction of n records that ends
# ("end"), is aborted ("abort") or, as the last unit only, is still open ("open").
_unit = st.one_of(
    st.just(("plain", 1)),
    st.tuples(st.sampled_from(["end", "abort"]), st.integers(0, 4)),
)


@st.composite
def _logs(draw: st.DrawFn) -> tuple[list[MetadataRecord], list[tuple[str, int]]]:
    units = draw(st.lists(_unit, max_size=8))
    if draw(st.booleans()):
        units.append(("open", draw(st.integers(0, 4))))
    records: list[MetadataRecord] = []
    ids = iter(range(1000))
    for kind, n in units:
        if kind == "plain":
            records.append(reg(next(ids)))
            continue
        records.append(BeginTransactionRecord(name=kind))
        records.extend(reg(next(ids)) for _ in range(n))
        if kind == "end":
            records.append(EndTransactionRecord())
        elif kind == "abort":
            records.append(AbortTransactionRecord())
    return records, units


def _effective(records: list[MetadataRecord], upto: int) -> tuple[set[int], int]:
    """What a reader of records[:upto] must show: brokers of plain records and of ended
    transactions, and the offset of its boundary (the image's end offset)."""
    shown: set[int] = set()
    held: list[int] | None = None
    boundary = 0
    for offset, r in enumerate(records[:upto]):
        if isinstance(r, BeginTransactionRecord):
            held = []
        elif isinstance(r, EndTransactionRecord):
            assert held is not None
            shown.update(held)
            held = None
        elif isinstance(r, AbortTransactionRecord):
            held = None
        elif held is not None:
            assert isinstance(r, RegisterBrokerRecord)
            held.append(r.broker_id)
        else:
            assert isinstance(r, RegisterBrokerRecord)
            shown.add(r.broker_id)
        if held is None:
            boundary = offset + 1
    return shown, boundary


@settings(CONTROLLER)
@given(log=_logs(), cuts=st.lists(st.integers(0, 40), max_size=6))
def test_any_chunking_shows_exactly_the_finished_transactions(
    log: tuple[list[MetadataRecord], list[tuple[str, int]]], cuts: list[int]
) -> None:
    records, _ = log
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    state = LogReplay()
    shown_by_deltas: set[int] = set()
    for lo, hi in itertools.pairwise(bounds):
        state, delta = apply_log(state, records[lo:hi])
        shown_by_deltas |= delta.brokers
        expected, boundary = _effective(records, hi)
        assert brokers(state) == expected
        assert state.image.end_offset == boundary
        assert state.next_offset == hi
        assert (state.transaction is None) == (boundary == hi)
    assert shown_by_deltas == brokers(state)
    # The image is the plain replay of the log without its unfinished and aborted parts.
    assert replay_log(LogReplay(), records).image.brokers == state.image.brokers


def test_apply_log_delta_matches_the_plain_apply_of_a_finished_transaction() -> None:
    records: list[MetadataRecord] = [
        BeginTransactionRecord(name="t"),
        reg(1),
        reg(2),
        EndTransactionRecord(),
    ]
    image, expected = apply(ClusterImage(), records)
    state, delta = apply_log(LogReplay(), records)
    assert state.image.same_state(image)
    assert delta.brokers == expected.brokers
    assert delta.records_by_type == expected.records_by_type
