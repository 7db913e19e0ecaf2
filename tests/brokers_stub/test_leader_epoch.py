"""Leader epochs on ReplicaFetch (issue 30, item 3): a follower names the leader epoch its
metadata shows, and a leader refuses an older one with FENCED_LEADER_EPOCH and a newer
one with UNKNOWN_LEADER_EPOCH, as Kafka's do. The controller bumps the leader epoch when
a reassignment removes a replica and the leader stays, so the removed replica, which may
not have seen that yet, is fenced off the partition; the leader leads on in the new
epoch without losing its high watermark or its waiting acks=all batches.

Replica managers are wired in memory, as in test_replica_manager: a leader's side is
`handle_fetch` / `fetch`, metadata changes are the image and delta that replaying the
controller's records gives, time is a virtual clock. The follower tests run the real
fetch lane, whose connection is swapped for `Wire`, which hands each request to the
leader's `handle_fetch`: what the lane sends and what it gets are recorded, and every
wait is on an observable state, never a sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from brokers_stub.fetcher import FetchLane
from brokers_stub.replica_manager import ReplicaManager
from metactl.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    MetactlError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import apply
from metadata_image.state import TopicPartition
from metadata_log.records import ChangeReason, MetadataRecord, PartitionChangeRecord
from protocol.messages.data import ACKS_ALL, ACKS_LEADER, ProduceRequest
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse
from protocol.messages.unions import Message
from tests.brokers_stub.helpers import TOPIC, eventually
from tests.brokers_stub.test_lifecycle import OLD_ID, files, registrations, topic
from tests.brokers_stub.test_replica_manager import EPOCHS, TP, Clock, manager

EPOCH = 5  # the partition's leader epoch before the bump


def start(records: Sequence[MetadataRecord], *ms: ReplicaManager) -> ClusterImage:
    """Every manager sees the cluster (caught up); the image they see."""
    image, _ = apply(ClusterImage(), [*registrations(), *records])
    for m in ms:
        m.on_metadata(image, None, True)
    return image


def removal(
    image: ClusterImage, replicas: list[int], tp: TopicPartition = TP
) -> PartitionChangeRecord:
    """A reassignment that ends with `replicas` (dropping a member) while the leader stays:
    Kafka's PartitionChangeBuilder bumps the leader epoch, the leader field unchanged."""
    p = image.partitions[tp]
    return PartitionChangeRecord(
        topic=tp[0],
        partition=tp[1],
        reason=ChangeReason.REASSIGNMENT,
        partition_epoch=p.partition_epoch + 1,
        leader_epoch=p.leader_epoch + 1,
        replicas=replicas,
        isr=sorted(set(p.isr) & set(replicas)),
        adding_replicas=[],
        removing_replicas=[],
    )


def step(
    image: ClusterImage, record: MetadataRecord, *ms: ReplicaManager
) -> tuple[ClusterImage, MetadataDelta]:
    """Only `ms` see the record (the others' metadata is behind)."""
    image, delta = apply(image, [record])
    for m in ms:
        m.on_metadata(image, delta, True)
    return image, delta


def fetch_request(
    follower: ReplicaManager, epoch: int = EPOCH, max_wait_ms: int = 0
) -> ReplicaFetchRequest:
    log = follower.logs[TP]
    return ReplicaFetchRequest(
        topic=TOPIC,
        partition=0,
        follower_id=follower.broker_id,
        follower_broker_epoch=EPOCHS[follower.broker_id],
        fetch_offset=log.log_end_offset,
        last_fetched_epoch=log.last_fetched_epoch,
        max_wait_ms=max_wait_ms,
        current_leader_epoch=epoch,
    )


def fetch(leader: ReplicaManager, follower: ReplicaManager, epoch: int = EPOCH) -> None:
    req = fetch_request(follower, epoch)
    follower.apply_fetch_response(TP, req.fetch_offset, leader.handle_fetch(req))


async def produce(m: ReplicaManager, count: int, acks: int = ACKS_LEADER) -> None:
    await m.data.produce(ProduceRequest(topic=TOPIC, partition=0, acks=acks, count=count))


async def turns(condition: Callable[[], bool], n: int = 100) -> None:
    """Let the loop run until `condition()` holds (no timing involved)."""
    for _ in range(n):
        if condition():
            return
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    raise AssertionError("never happened")


# --- the leader's checks --------------------------------------------------------------------


async def test_the_leader_refuses_another_leader_epoch_and_records_nothing(
    tmp_path: Path,
) -> None:
    clock = Clock()
    leader, f2, f3 = (manager(tmp_path, b, clock) for b in (1, 2, 3))
    start(topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2, leader_epoch=EPOCH), leader, f2, f3)
    await produce(leader, 4)
    for f in (f2, f3):
        fetch(leader, f)
        fetch(leader, f)
    st = leader.leaders[TP]
    assert leader.logs[TP].high_watermark == 4
    before = dict(st.followers)
    await produce(leader, 3)
    clock.now += 60_000

    with pytest.raises(FencedLeaderEpochError, match="leader epoch 4, the partition is at 5"):
        leader.handle_fetch(fetch_request(f3, EPOCH - 1))
    with pytest.raises(UnknownLeaderEpochError, match="knows only 5"):
        leader.handle_fetch(fetch_request(f3, EPOCH + 1))
    # Neither refusal moved 3's position, its caught-up time, nor the high watermark.
    assert st.followers == before
    assert leader.logs[TP].high_watermark == 4
    # A refusal copies nothing: the follower's log is as it was.
    assert f3.logs[TP].log_end_offset == 4

    with pytest.raises(InvalidRequestError, match="current_leader_epoch"):
        leader.handle_fetch(fetch_request(f3, -2))
    unnamed = fetch_request(f3, -1)  # an older follower names no epoch: unchecked
    assert unnamed.current_leader_epoch == -1
    assert leader.handle_fetch(unnamed).log_end_offset == 7
    assert leader.handle_fetch(fetch_request(f2, EPOCH)).log_end_offset == 7
    # The epoch is checked before the leadership: a follower (2) asked in an old epoch
    # also says FENCED_LEADER_EPOCH, as Kafka's does.
    with pytest.raises(FencedLeaderEpochError):
        f2.handle_fetch(fetch_request(f3, EPOCH - 1))
    with pytest.raises(NotLeaderOrFollowerError):
        f2.handle_fetch(fetch_request(f3, EPOCH))


# --- the leader leads on in the bumped epoch --------------------------------------------------


async def test_a_leader_that_stays_keeps_its_high_watermark_batches_and_followers(
    tmp_path: Path,
) -> None:
    """The reassignment [1, 2, 3] -> [1, 2] completes with 1 leading on: the batch that
    waited on 3 commits in the new epoch at once (2 holds it, 3 is gone), not
    NOT_LEADER_OR_FOLLOWER; the fetch held in the old epoch is fenced, one that named no
    epoch is answered in the new one; the next batch commits as usual."""
    clock = Clock()
    leader, f2, f3 = (manager(tmp_path, b, clock) for b in (1, 2, 3))
    image = start(
        topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2, leader_epoch=EPOCH), leader, f2, f3
    )
    await produce(leader, 4)
    for f in (f2, f3):
        fetch(leader, f)
        fetch(leader, f)
    assert leader.logs[TP].high_watermark == 4
    batch = asyncio.create_task(produce(leader, 3, ACKS_ALL))
    await turns(lambda: leader.data.waiters.pending(TP) == 1)
    fetch(leader, f2)  # 2 copies 4..6
    await leader.fetch(fetch_request(f2))  # and says so; 3 is silent: the HW stays at 4
    assert leader.logs[TP].high_watermark == 4 and not batch.done()
    st = leader.leaders[TP]
    held = asyncio.create_task(leader.fetch(fetch_request(f2, max_wait_ms=600_000)))
    held_unnamed = asyncio.create_task(leader.fetch(fetch_request(f2, -1, max_wait_ms=600_000)))
    await turns(lambda: st.parked == 2)

    image, _ = step(image, removal(image, [1, 2]), leader)
    p = image.partitions[TP]
    assert (p.leader, p.leader_epoch, sorted(p.isr)) == (1, EPOCH + 1, [1, 2])
    # At once, before any fetch of the new epoch: 2 keeps its position in this very log
    # (caught up as of now), 3 is forgotten, and the high watermark covers what 2 holds.
    log = leader.logs[TP]
    assert log.leader_epochs == [(EPOCH, 0), (EPOCH + 1, 7)]
    new = leader.leaders[TP]
    assert new.leader_epoch == EPOCH + 1 and set(new.followers) == {2}
    assert new.followers[2].fetch_offset == 7
    assert new.followers[2].last_caught_up_ms == clock.now
    assert log.high_watermark == 7

    # The batch is acknowledged, not NOT_LEADER_OR_FOLLOWER: its records are in this log.
    await turns(batch.done)
    batch.result()
    with pytest.raises(FencedLeaderEpochError):
        await held
    resp = await held_unnamed
    assert (resp.leader_epoch, resp.high_watermark) == (EPOCH + 1, 7)

    # Acks=all goes on in the new epoch: 2, now at epoch 6, commits the next batch.
    f2.on_metadata(image, None, True)
    batch = asyncio.create_task(produce(leader, 2, ACKS_ALL))
    await turns(lambda: leader.data.waiters.pending(TP) == 1)
    fetch(leader, f2, EPOCH + 1)
    fetch(leader, f2, EPOCH + 1)
    await batch
    assert log.high_watermark == 9


# --- the follower: fenced, it waits for its metadata ---------------------------------------------


class Wire:
    """A fetch lane's connection, wired to the leader in memory: each request is handed to
    `leader.handle_fetch`; what was sent, refused and answered is recorded."""

    def __init__(self, leader: ReplicaManager) -> None:
        self.leader = leader
        self.sent: list[ReplicaFetchRequest] = []
        self.outcomes: list[str] = []  # for each request sent: its refusal's code, or "OK"
        self.refused: list[str] = []
        self.answered: list[ReplicaFetchResponse] = []

    async def request(self, body: Message, timeout_s: float) -> Message:
        assert isinstance(body, ReplicaFetchRequest)
        self.sent.append(body)
        try:
            resp = self.leader.handle_fetch(body)
        except MetactlError as exc:
            self.outcomes.append(exc.code)
            self.refused.append(exc.code)
            raise
        self.outcomes.append("OK")
        self.answered.append(resp)
        return resp

    def of(self, partition: int, since: int = 0) -> list[tuple[ReplicaFetchRequest, str]]:
        """The requests for `partition` from the `since`-th on, with their outcomes."""
        pairs = list(zip(self.sent, self.outcomes, strict=False))[since:]
        return [(r, o) for r, o in pairs if r.partition == partition]

    async def close(self) -> None:
        pass


def lane_of(follower: ReplicaManager, leader: ReplicaManager) -> tuple[FetchLane, Wire]:
    """Start the follower's fetching and wire its lane for orders-0 to `leader` (before
    the lane's task first runs)."""
    follower.start()
    lane = follower.fetchers[leader.broker_id].lanes[TP]
    wire = Wire(leader)
    lane.client = wire  # type: ignore[assignment]
    return lane, wire


def follower(tmp_path: Path, broker_id: int, clock: Clock) -> ReplicaManager:
    # A pause of 1 ms after an answer with nothing new: a lane that retried a fenced
    # partition instead of waiting for its metadata would do so at once.
    return manager(tmp_path, broker_id, clock, fetch_interval_ms=1)


async def test_a_removed_replica_is_fenced_never_copies_and_is_deleted(tmp_path: Path) -> None:
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    f3 = follower(tmp_path, 3, clock)
    image = start(
        topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2, leader_epoch=EPOCH), leader, f2, f3
    )
    lane, wire = lane_of(f3, leader)
    try:
        await produce(leader, 5)
        await eventually(lambda: f3.logs[TP].log_end_offset == 5, what="3 copies 0..4")
        assert {r.current_leader_epoch for r in wire.sent} == {EPOCH}

        # 3 is removed, 1 stays leader in epoch 6; 3 has not seen it yet.
        image, delta = step(image, removal(image, [1, 2]), leader, f2)
        await produce(leader, 5)
        answered = len(wire.answered)
        await eventually(
            lambda: lane.awaiting_metadata or len(wire.refused) > 1, what="3 is fenced"
        )
        # Refused once, in its old epoch, with FENCED_LEADER_EPOCH; it then waits for its
        # metadata and sends nothing more.
        assert wire.refused == ["FENCED_LEADER_EPOCH"]
        assert wire.sent[-1].current_leader_epoch == EPOCH
        assert len(wire.answered) == answered
        assert f3.logs[TP].log_end_offset == 5  # nothing copied, nothing truncated

        sent = len(wire.sent)
        f3.on_metadata(image, delta, True)  # 3 learns it was removed
        assert f3.fetchers == {} and TP not in f3.logs and files(f3) == {}
        await asyncio.wait([lane.task])  # the lane is cancelled ...
        assert len(wire.sent) == sent  # ... without another fetch
    finally:
        await f3.stop()


async def test_a_follower_behind_on_metadata_waits_and_resumes_in_the_new_epoch(
    tmp_path: Path,
) -> None:
    clock = Clock()
    leader, f3 = manager(tmp_path, 1, clock), manager(tmp_path, 3, clock)
    f2 = follower(tmp_path, 2, clock)
    image = start(
        topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2, leader_epoch=EPOCH), leader, f2, f3
    )
    lane, wire = lane_of(f2, leader)
    try:
        await produce(leader, 5)
        await eventually(lambda: f2.logs[TP].log_end_offset == 5, what="2 copies 0..4")

        image, delta = step(image, removal(image, [1, 2]), leader)  # 2 is behind
        await produce(leader, 5)
        await eventually(
            lambda: lane.awaiting_metadata or len(wire.refused) > 1, what="2 is fenced"
        )
        assert wire.refused == ["FENCED_LEADER_EPOCH"]
        assert f2.logs[TP].log_end_offset == 5  # no progress, no truncation

        f2.on_metadata(image, delta, True)  # 2 catches up: fetching resumes in epoch 6
        await eventually(lambda: f2.logs[TP].log_end_offset == 10, what="2 copies 5..9")
        assert wire.sent[-1].current_leader_epoch == EPOCH + 1
        assert f2.logs[TP].leader_epochs == [(EPOCH, 0), (EPOCH + 1, 5)]
        assert wire.refused == ["FENCED_LEADER_EPOCH"]
    finally:
        await f2.stop()


async def test_a_follower_ahead_of_its_leader_retries_without_waiting_for_metadata(
    tmp_path: Path,
) -> None:
    """UNKNOWN_LEADER_EPOCH: the leader's metadata is behind, not the follower's, so the
    follower tries again after its pause (as Kafka's fetcher backs off) and gets the
    records once the leader has caught up."""
    clock = Clock()
    leader, f3 = manager(tmp_path, 1, clock), manager(tmp_path, 3, clock)
    f2 = follower(tmp_path, 2, clock)
    image = start(
        topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2, leader_epoch=EPOCH), leader, f2, f3
    )
    await produce(leader, 5)
    image, delta = step(image, removal(image, [1, 2]), f2)  # the leader is behind
    lane, wire = lane_of(f2, leader)
    try:
        await eventually(lambda: len(wire.refused) >= 2, what="2 retries")
        assert set(wire.refused) == {"UNKNOWN_LEADER_EPOCH"} and not lane.awaiting_metadata
        assert f2.logs[TP].log_end_offset == 0
        leader.on_metadata(image, delta, True)
        await eventually(lambda: f2.logs[TP].log_end_offset == 5, what="2 copies 0..4")
    finally:
        await f2.stop()


async def test_a_shared_lane_skips_only_its_fenced_partition(tmp_path: Path) -> None:
    """Beyond the long-polling lanes, partitions share one lane: a fenced one is left out
    of its rounds until the image moves, the others go on being fetched."""
    clock = Clock()
    leader, f3 = manager(tmp_path, 1, clock), manager(tmp_path, 3, clock)
    f2 = manager(tmp_path, 2, clock, fetch_interval_ms=1, replica_fetch_sessions_max=1)
    image = start(topic(OLD_ID, [1, 2, 3], [1, 2, 3], n=3, leader_epoch=EPOCH), leader, f2, f3)
    f2.start()
    fetcher = f2.fetchers[1]
    shared = fetcher.shared
    assert shared is not None and shared.partitions == [(TOPIC, 1), (TOPIC, 2)]
    wire = Wire(leader)
    for lane in (*fetcher.lanes.values(), shared):
        lane.client = wire  # type: ignore[assignment]
    try:
        p1 = (TOPIC, 1)
        image, delta = step(image, removal(image, [1, 2], p1), leader)  # 2 is behind
        await eventually(lambda: "FENCED_LEADER_EPOCH" in wire.outcomes, what="1 is fenced")
        fenced_at = wire.outcomes.index("FENCED_LEADER_EPOCH")
        assert wire.sent[fenced_at].partition == 1
        await eventually(lambda: len(wire.of(2, fenced_at)) >= 3, what="rounds go on")
        assert wire.of(1, fenced_at + 1) == []  # partition 1 is left out of them
        assert not shared.awaiting_metadata

        f2.on_metadata(image, delta, True)
        await eventually(lambda: wire.of(1, fenced_at + 1) != [], what="1 is fetched again")
        req, outcome = wire.of(1, fenced_at + 1)[0]
        assert (req.current_leader_epoch, outcome) == (EPOCH + 1, "OK")
    finally:
        await f2.stop()
