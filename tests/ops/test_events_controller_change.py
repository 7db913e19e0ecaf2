"""A failover is visible (issue 33, item 4): the feed words each term's record as one line,
"controller c3 active (term 1234); c2 lost it (dead-active detection)", however the term
before ended, and only once the record is committed whole (never from an aborted
transaction); `cluster up`'s pane says the same of its numbered controllers
(`localcluster.active`), and says who is active once it has read the log to its end."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clients.controller import INSECURE
from eventfeed.feed import Feed
from localcluster.active import ActiveWatch, active_text, numbered
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    ControllerChangeRecord,
    EndTransactionRecord,
    MetadataRecord,
)
from protocol.messages.broker_controller import (
    FetchedRecord,
    FetchMetadataResponse,
    MetadataSnapshot,
)


@dataclass(frozen=True)
class E:
    offset: int
    timestamp_ms: int
    record: MetadataRecord


def lines(records: list[MetadataRecord]) -> list[str]:
    feed = Feed()
    return [e.text for e in feed.add([E(i, 1_000 + i, r) for i, r in enumerate(records)])]


def change(reason: str = "", detail: str = "", previous: str = "c2") -> ControllerChangeRecord:
    return ControllerChangeRecord(
        node="c3",
        term=1234,
        previous_node=previous if reason else "",
        previous_term=1200 if reason else 0,
        previous_reason=reason,
        previous_by="c1" if reason != "resigned" else "",
        previous_detail=detail,
    )


@pytest.mark.parametrize(
    ("record", "line"),
    [
        (change(), "controller c3 active (term 1234)"),
        (
            change("dead-active detection"),
            "controller c3 active (term 1234); c2 lost it (dead-active detection)",
        ),
        (change("lease expired"), "controller c3 active (term 1234); c2 lost it (lease expired)"),
        (
            change("resigned", "shutting down"),
            "controller c3 active (term 1234); c2 lost it (resigned: shutting down)",
        ),
        (
            ControllerChangeRecord(node="c3", term=9, previous_node="c3", previous_term=5),
            "controller c3 active (term 9); c3 lost it (ended)",
        ),
    ],
)
def test_each_term_is_one_line(record: ControllerChangeRecord, line: str) -> None:
    assert lines([record]) == [line]


def test_a_term_inside_a_transaction_is_told_at_its_end_and_never_if_aborted() -> None:
    told = lines(
        [
            BeginTransactionRecord(name="x"),
            change("lease expired"),
            AbortTransactionRecord(reason="gone"),
            BeginTransactionRecord(name="y"),
            ControllerChangeRecord(node="c1", term=2000),
            EndTransactionRecord(),
        ]
    )
    assert told == ["controller c1 active (term 2000)"]


def test_the_pane_names_cluster_ups_controllers_by_number() -> None:
    name = numbered(lambda: {1, 2, 3})
    assert name("c2") == "controller 2"
    assert name("c7") == "controller c7"  # not one of this cluster's
    assert name("127.0.0.1:9093") == "controller 127.0.0.1:9093"
    dead = change("dead-active detection")
    assert active_text(dead, name, now=True) == (
        "controller 3 is active now (term 1234); controller 2 lost it (dead-active detection)"
    )
    assert active_text(change("resigned", "shutting down"), name, now=True).endswith(
        "controller 2 lost it (resigned: shutting down)"
    )
    assert active_text(change(), name, now=True) == "controller 3 is active now (term 1234)"
    assert active_text(dead, name, now=False) == "controller 3 is active (term 1234)"
    assert active_text(
        ControllerChangeRecord(node="c3", term=9, previous_node="c1"), name, now=True
    ).endswith("controller 1 lost it (ended)")


def test_the_pane_says_who_is_active_once_caught_up_then_each_change() -> None:
    said: list[str] = []
    watch = ActiveWatch(lambda: "127.0.0.1:1", INSECURE, numbered(lambda: {1, 2, 3}), said.append)

    def answer(records: list[MetadataRecord], first: int, end: int) -> FetchMetadataResponse:
        fetched = [FetchedRecord(first + i, 1_000, r) for i, r in enumerate(records)]
        return FetchMetadataResponse(records=fetched, end_offset=end)

    old = ControllerChangeRecord(node="c1", term=10)
    now = ControllerChangeRecord(node="c2", term=20, previous_node="c1", previous_reason="resigned")
    watch.take(answer([old], 0, 3))  # not at the end yet: nothing said
    assert said == [] and watch.offset == 1
    watch.take(answer([now, BeginTransactionRecord(name="t")], 1, 3))  # caught up
    assert said == ["controller 2 is active (term 20)"]
    dead = ControllerChangeRecord(
        node="c3", term=30, previous_node="c2", previous_reason="dead-active detection"
    )
    watch.take(answer([EndTransactionRecord(), dead], 3, 5))
    assert said[1:] == [
        "controller 3 is active now (term 30); controller 2 lost it (dead-active detection)"
    ]
    # A truncated log's snapshot (no term in it): read on from its offset.
    watch.take(FetchMetadataResponse(records=[], end_offset=90, snapshot=MetadataSnapshot(80, [])))
    assert watch.offset == 80 and len(said) == 2
    watch.take(answer([], 80, 80))
    assert watch.offset == 80 and len(said) == 2
