"""Automatic preferred-leader balance with real processes (issue 34, item 5): a controller
with a 1 s check interval and three brokers; broker 1 leaves (a clean stop, or a kill),
its leaderships move away, it comes back, and it leads its preferred partitions again
without anyone running `elect`: the controller's own checks move them back, as preferred
elections with the reason `leader_balance`, and the event feed says so.

The interval is set through the controller's settings layer
(METACTL_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS, which `python -m controller` reads as
it reads --leader-imbalance-check-interval-seconds); the brokers ignore it. Every wait is
on observable state (DescribeCluster), with a generous deadline; nothing is timed.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventfeed.feed import Feed
from metadata_log.records import (
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    PartitionChangeRecord,
)
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterResponse,
)
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.slow

TOPIC = "balanced"
# Each broker is the preferred replica (the first) of two partitions.
ASSIGNMENTS = [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2], [2, 1, 3], [3, 2, 1]]
PREFERRED_BY_1 = [i for i, a in enumerate(ASSIGNMENTS) if a[0] == 1]


@dataclass(frozen=True)
class Entry:
    offset: int
    timestamp_ms: int
    record: MetadataRecord


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv("METACTL_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS", "1")
    c = Cluster(tmp_path)
    c.start_controller()
    try:
        yield c
    finally:
        c.stop()


def leaders(s: DescribeClusterResponse) -> dict[int, int]:
    return {p.partition: p.leader for p in s.partitions if p.topic == TOPIC}


def isrs(s: DescribeClusterResponse) -> dict[int, list[int]]:
    return {p.partition: p.isr for p in s.partitions if p.topic == TOPIC}


def all_preferred(s: DescribeClusterResponse) -> bool:
    return leaders(s) == {i: a[0] for i, a in enumerate(ASSIGNMENTS)}


@pytest.mark.parametrize("how", ["stopped", "killed"])
async def test_a_returning_broker_leads_its_preferred_partitions_again(
    cluster: Cluster, how: str
) -> None:
    c = cluster
    for b in (1, 2, 3):
        c.start_broker(b)
    await c.wait_until(
        lambda s: {b.broker_id for b in s.brokers if not b.fenced} == {1, 2, 3}, "3 active"
    )
    r = await c.request(
        CreateTopicsRequest(topics=[CreateTopic(name=TOPIC, assignments=ASSIGNMENTS, min_isr=1)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    s = await c.wait_until(
        lambda s: len(leaders(s)) == 6 and all(len(i) == 3 for i in isrs(s).values()),
        "the topic, every ISR full",
    )
    assert all_preferred(s)
    start = s.committed_offset

    # Broker 1 goes: SIGTERM is its controlled shutdown, SIGKILL a crash (fenced once its
    # session expires, back uncleanly: out of the ISRs until it catches up).
    c.kill_broker(1, signal.SIGTERM if how == "stopped" else signal.SIGKILL)
    s = await c.wait_until(
        lambda s: 1 not in leaders(s).values() and len(leaders(s)) == 6,
        "broker 1 leads nothing",
    )
    assert all(leaders(s)[i] in (2, 3) for i in PREFERRED_BY_1)

    # It comes back, and nobody runs `elect`.
    c.start_broker(1)
    s = await c.wait_until(all_preferred, "every partition led by its preferred replica")
    assert all(1 in isrs(s)[i] for i in PREFERRED_BY_1)

    # The log says how: the controller's own preferred elections, one per partition of
    # broker 1, with the reason leader_balance.
    changes = [
        r
        for _, r in await c.records(start)
        if isinstance(r, PartitionChangeRecord) and r.leader == 1
    ]
    assert sorted(r.partition for r in changes) == PREFERRED_BY_1
    assert all(
        (r.reason, r.election) == (ChangeReason.LEADER_BALANCE, ElectionKind.PREFERRED)
        for r in changes
    )
    # And so does the feed, a line per election.
    feed = Feed()
    lines = [e.text for e in feed.add([Entry(o, 0, r) for o, r in await c.records()])]
    for i in PREFERRED_BY_1:
        assert any(
            line.startswith(f"{TOPIC}-{i} leader ")
            and line.endswith("→1 (preferred, automatic leader balance)")
            for line in lines
        ), (i, lines[-12:])
