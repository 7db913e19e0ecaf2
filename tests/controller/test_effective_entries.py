"""`metadata_image.transactions.EffectiveEntries`: the entries of the committed log that
take effect, for readers that report (event lines, describe's notes). A transaction's
entries come out whole at its end marker, an aborted or unfinished one's never, whatever
chunks they arrive in; the same records as the strict replay (`replay_log`) applies;
and markers out of place are tolerated, not refused."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.transactions import EffectiveEntries, LogReplay, replay_log
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    RegisterBrokerRecord,
)

CONTROLLER = settings.get_profile("metactl-controller")


@dataclass(frozen=True)
class Entry:
    offset: int
    record: MetadataRecord


def reg(broker_id: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id=broker_id, incarnation_id=f"i{broker_id}", broker_epoch=0)


BEGIN, END, ABORT = (
    BeginTransactionRecord(name="t"),
    EndTransactionRecord(),
    AbortTransactionRecord(),
)


def entries(records: list[MetadataRecord]) -> list[Entry]:
    return [Entry(i, r) for i, r in enumerate(records)]


def offsets(got: list[Entry]) -> list[int]:
    return [e.offset for e in got]


def test_records_outside_transactions_pass_at_once() -> None:
    log = entries([reg(1), reg(2)])
    assert EffectiveEntries[Entry]().add(log) == log


def test_a_transaction_comes_out_whole_at_its_end_marker_markers_included() -> None:
    log = entries([reg(1), BEGIN, reg(2), reg(3), END, reg(4)])
    effective = EffectiveEntries[Entry]()
    assert offsets(effective.add(log[:3])) == [0]  # the transaction is held ...
    assert offsets(effective.add(log[3:4])) == []  # ... across calls
    assert offsets(effective.add(log[4:])) == [1, 2, 3, 4, 5]


def test_an_aborted_or_unfinished_transaction_gives_nothing() -> None:
    log = entries([BEGIN, reg(1), ABORT, reg(2), BEGIN, reg(3)])
    assert offsets(EffectiveEntries[Entry]().add(log)) == [3]


def test_markers_out_of_place_are_tolerated() -> None:
    # An end or abort outside a transaction is dropped; a begin inside one is part of it.
    log = entries([END, reg(1), ABORT, BEGIN, reg(2), BEGIN, reg(3), END])
    assert offsets(EffectiveEntries[Entry]().add(log)) == [1, 3, 4, 5, 6, 7]


# --- the property: any log, any chunking --------------------------------------------------

# None stands for a RegisterBrokerRecord (one per offset).
_records = st.lists(st.sampled_from([None, BEGIN, END, ABORT]), max_size=30)


def _log(kinds: list[MetadataRecord | None]) -> list[Entry]:
    return entries([reg(i) if r is None else r for i, r in enumerate(kinds)])


@settings(CONTROLLER)
@given(kinds=_records, cuts=st.lists(st.integers(0, 30), max_size=6))
def test_any_chunking_gives_the_same_entries(
    kinds: list[MetadataRecord | None], cuts: list[int]
) -> None:
    log = _log(kinds)
    whole = EffectiveEntries[Entry]().add(log)
    bounds = sorted({0, len(log), *(c for c in cuts if c <= len(log))})
    chunked = EffectiveEntries[Entry]()
    pieces = [chunked.add(iter(log[lo:hi])) for lo, hi in itertools.pairwise(bounds)]
    assert [e for piece in pieces for e in piece] == whole
    assert offsets(whole) == sorted(set(offsets(whole)))  # in log order, each once


@settings(CONTROLLER)
@given(kinds=_records)
def test_a_well_formed_log_gives_what_the_strict_replay_applies(
    kinds: list[MetadataRecord | None],
) -> None:
    # Keep the markers a controller could have written: no begin inside a transaction, no
    # end or abort outside one.
    log: list[Entry] = []
    open_ = False
    for e in _log(kinds):
        r = e.record
        if isinstance(r, BeginTransactionRecord):
            if open_:
                continue
            open_ = True
        elif isinstance(r, EndTransactionRecord | AbortTransactionRecord):
            if not open_:
                continue
            open_ = False
        log.append(Entry(len(log), r))
    strict = replay_log(LogReplay(), [e.record for e in log]).image
    effective = replay(ClusterImage(), [e.record for e in EffectiveEntries[Entry]().add(log)])
    assert effective.brokers == strict.brokers
