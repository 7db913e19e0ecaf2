"""Produce and ReadLog, driven on replica managers wired in memory (as in
test_replica_manager): fetches are direct calls, metadata changes are images handed to
`on_metadata`, time is a virtual clock. An acks=all batch is a task whose answer is
awaited as an event; "not answered" is checked once the batch waits on the high
watermark (a registered waiter), never after a sleep.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from brokers_stub.produce import ProduceWaiters, check_produce, known_isr_size
from brokers_stub.replica_manager import ReplicaManager
from metactl.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from protocol.messages.data import (
    ACKS_ALL,
    ACKS_LEADER,
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
)
from tests.brokers_stub.helpers import TOPIC, change, cluster
from tests.brokers_stub.test_replica_manager import EPOCHS, TP, Clock, fetch, manager, on_disk


def request(count: int = 10, acks: int = ACKS_ALL, **kw: object) -> ProduceRequest:
    return ProduceRequest(topic=TOPIC, partition=0, acks=acks, count=count, **kw)  # type: ignore[arg-type]


async def waiting(m: ReplicaManager, n: int = 1) -> None:
    """Let the event loop run until `n` acks=all batches wait on the high watermark (the
    produce task has appended and now awaits its waiter: no timing involved)."""
    for _ in range(100):
        if m.data.waiters.pending(TP) >= n:
            return
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    raise AssertionError(f"{n} batch(es) never started waiting")


def three(tmp_path: Path, *, isr: list[int], min_isr: int = 2, **kw: object):  # type: ignore[no-untyped-def]
    clock = Clock()
    leader = manager(tmp_path, 1, clock, **kw)
    f2, f3 = manager(tmp_path, 2, clock), manager(tmp_path, 3, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=isr, min_isr=min_isr)
    for m in (leader, f2, f3):
        m.on_metadata(image, None, True)
    return leader, f2, f3, image


async def test_acks_all_is_answered_only_once_the_hw_covers_the_batch(tmp_path: Path) -> None:
    leader, f2, f3, _ = three(tmp_path, isr=[1, 2, 3])
    task = asyncio.create_task(leader.data.produce(request(10)))
    await waiting(leader)
    assert leader.logs[TP].log_end_offset == 10  # appended at once ...
    fetch(leader, f2)  # 2 copies 0..9
    fetch(leader, f2)  # and says so
    assert f2.logs[TP].log_end_offset == 10
    # ... but 3, an ISR member, is stopped: the HW cannot move, nobody is answered.
    assert leader.logs[TP].high_watermark == 0
    assert not task.done() and leader.data.waiters.pending(TP) == 1
    fetch(leader, f3)
    fetch(leader, f3)
    resp = await task
    assert isinstance(resp, ProduceResponse)
    assert (resp.base_offset, resp.count, resp.leader_epoch, resp.high_watermark) == (0, 10, 0, 10)
    assert leader.data.waiters.pending(TP) == 0


async def test_batches_get_consecutive_offsets_and_answer_in_order(tmp_path: Path) -> None:
    leader, f2, _, _ = three(tmp_path, isr=[1, 2])
    first = asyncio.create_task(leader.data.produce(request(4)))
    await waiting(leader)
    second = asyncio.create_task(leader.data.produce(request(6)))
    await waiting(leader, 2)
    fetch(leader, f2)
    # 2 fetches from 0 and holds nothing yet; then reports 10: both commit together.
    fetch(leader, f2)
    a, b = await first, await second
    assert (a.base_offset, a.count, b.base_offset, b.count) == (0, 4, 4, 6)


async def test_not_enough_replicas_when_the_isr_is_below_min_isr(tmp_path: Path) -> None:
    leader, _, _, _ = three(tmp_path, isr=[1], min_isr=2)
    with pytest.raises(NotEnoughReplicasError) as err:
        await leader.data.produce(request(5))
    assert err.value.retriable
    assert leader.logs[TP].log_end_offset == 0  # refused before the append
    # acks=1 needs no follower: answered at once, without the HW.
    resp = await leader.data.produce(request(5, acks=ACKS_LEADER))
    assert (resp.base_offset, resp.count, resp.high_watermark) == (0, 5, 0)
    assert leader.data.waiters.pending(TP) == 0


async def test_a_pending_isr_shrink_counts_at_append(tmp_path: Path) -> None:
    leader, _, _, _ = three(tmp_path, isr=[1, 2])
    st = leader.leaders[TP]
    st.pending_partition_epoch, st.pending_isr = 1, frozenset({1})  # accepted, not yet seen
    with pytest.raises(NotEnoughReplicasError):
        await leader.data.produce(request(1))
    assert known_isr_size([1, 2, 3], None) == 3
    assert known_isr_size([1, 2], [1, 2, 3]) == 2


async def test_isr_shrinking_below_min_isr_before_commit(tmp_path: Path) -> None:
    leader, _, _, image = three(tmp_path, isr=[1, 2])
    task = asyncio.create_task(leader.data.produce(request(3)))
    await waiting(leader)
    leader.on_metadata(change(image, isr=[1]), None, True)  # 2 left: below MinISR 2
    with pytest.raises(NotEnoughReplicasAfterAppendError) as err:
        await task
    assert err.value.retriable
    assert leader.logs[TP].log_end_offset == 3  # the batch stays in the log, unacknowledged
    assert leader.data.waiters.pending(TP) == 0


async def test_isr_shrinking_but_staying_at_min_isr_lets_the_batch_commit(
    tmp_path: Path,
) -> None:
    leader, f2, _, image = three(tmp_path, isr=[1, 2, 3])
    task = asyncio.create_task(leader.data.produce(request(3)))
    await waiting(leader)
    fetch(leader, f2)
    fetch(leader, f2)
    assert not task.done()  # 3 holds it back ...
    leader.on_metadata(change(image, isr=[1, 2]), None, True)  # ... until it leaves the ISR
    assert (await task).high_watermark == 3


async def test_losing_the_leadership_before_commit(tmp_path: Path) -> None:
    leader, _, _, image = three(tmp_path, isr=[1, 2])
    task = asyncio.create_task(leader.data.produce(request(3)))
    await waiting(leader)
    leader.on_metadata(change(image, leader=2), None, True)
    with pytest.raises(NotLeaderOrFollowerError):
        await task
    with pytest.raises(NotLeaderOrFollowerError):
        await leader.data.produce(request(1))


async def test_a_new_leader_epoch_fails_the_batches_of_the_old_one(tmp_path: Path) -> None:
    leader, _, _, image = three(tmp_path, isr=[1, 2])
    task = asyncio.create_task(leader.data.produce(request(3)))
    await waiting(leader)
    away = change(image, leader=2)
    back = change(away, leader=1)  # leader again, in a newer epoch, in one image
    leader.on_metadata(back, None, True)
    with pytest.raises(NotLeaderOrFollowerError):
        await task
    resp = await leader.data.produce(request(1, acks=ACKS_LEADER))
    assert (resp.base_offset, resp.leader_epoch) == (3, back.partitions[TP].leader_epoch)


async def test_acks_all_times_out(tmp_path: Path) -> None:
    leader, _, _, _ = three(tmp_path, isr=[1, 2])
    with pytest.raises(RequestTimedOutError) as err:
        await leader.data.produce(request(2, timeout_ms=1))
    assert err.value.retriable
    assert leader.data.waiters.pending(TP) == 0


async def test_stopping_fails_waiting_batches_and_refuses_new_ones(tmp_path: Path) -> None:
    leader, _, _, _ = three(tmp_path, isr=[1, 2])
    task = asyncio.create_task(leader.data.produce(request(2)))
    await waiting(leader)
    await leader.stop()
    with pytest.raises(NotLeaderOrFollowerError):
        await task
    with pytest.raises(NotLeaderOrFollowerError):
        await leader.data.produce(request(1, acks=ACKS_LEADER))


async def test_refusals(tmp_path: Path) -> None:
    leader, f2, _, _ = three(tmp_path, isr=[1, 2], max_batch_records=100)
    with pytest.raises(NotLeaderOrFollowerError):
        await f2.data.produce(request(1, acks=ACKS_LEADER))
    with pytest.raises(UnknownTopicOrPartitionError):
        await leader.data.produce(ProduceRequest(topic="nope", partition=0, acks=1, count=1))
    with pytest.raises(UnknownTopicOrPartitionError):
        await leader.data.produce(ProduceRequest(topic=TOPIC, partition=9, acks=1, count=1))
    with pytest.raises(MessageTooLargeError) as too_large:
        await leader.data.produce(request(101))
    assert too_large.value.code == "MESSAGE_TOO_LARGE" and not too_large.value.retriable
    for bad in (request(0), request(-3), request(1, acks=0), request(1, timeout_ms=-1)):
        with pytest.raises(InvalidRequestError):
            await leader.data.produce(bad)
    assert leader.logs[TP].log_end_offset == 0
    check_produce(request(100), max_batch_records=100)  # the limit itself is fine


async def test_acks_are_not_gated_on_flush_and_flush_messages_fsyncs(tmp_path: Path) -> None:
    leader, _, _, _ = three(tmp_path, isr=[1], min_isr=1, flush_messages=5)
    resp = await leader.data.produce(request(3))  # ISR {1}: committed at once
    assert resp.high_watermark == 3
    assert on_disk(leader).flushed_offset == 0  # acknowledged from the page cache
    await leader.data.produce(request(2))
    assert on_disk(leader).flushed_offset == 5  # 5 unflushed records: fsynced


async def test_followers_flush_by_count_too(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock)
    f2 = manager(tmp_path, 2, clock, flush_messages=1)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1, 2], min_isr=2)
    for m in (leader, f2):
        m.on_metadata(image, None, True)
    await leader.data.produce(request(4, acks=ACKS_LEADER))
    fetch(leader, f2)
    assert on_disk(f2).flushed_offset == 4
    assert on_disk(leader).flushed_offset == 0


async def test_read_log_returns_the_committed_ranges(tmp_path: Path) -> None:
    leader, f2, _, image = three(tmp_path, isr=[1, 2])
    await leader.data.produce(request(5, acks=ACKS_LEADER))
    fetch(leader, f2)
    fetch(leader, f2)
    leader.on_metadata(change(change(image, leader=2), leader=1), None, True)  # epoch 2
    await leader.data.produce(request(3, acks=ACKS_LEADER))
    r = leader.data.read_log(ReadLogRequest(topic=TOPIC, partition=0))
    assert (r.high_watermark, r.log_end_offset, r.leader_epoch) == (5, 8, 2)
    assert r.leader_epochs == [(0, 0)]  # epoch 2 starts at 5: nothing committed yet
    fetch(leader, f2)
    fetch(leader, f2)
    r = leader.data.read_log(ReadLogRequest(topic=TOPIC, partition=0))
    assert (r.high_watermark, r.leader_epochs) == (8, [(0, 0), (2, 5)])
    with pytest.raises(NotLeaderOrFollowerError):
        f2.data.read_log(ReadLogRequest(topic=TOPIC, partition=0))


async def test_waiters_complete_in_offset_order_and_fail_selectively() -> None:
    w = ProduceWaiters()
    a, b, c = w.add(TP, 10, 1), w.add(TP, 5, 1), w.add(TP, 20, 1)
    assert w.complete(TP, 9, 1) == 1
    assert b.result() == 9 and not a.done()
    assert w.complete(TP, 15, 1) == 1 and a.result() == 15
    d = w.add(TP, 30, 2)
    assert w.fail(TP, lambda: NotLeaderOrFollowerError("moved"), keep_epoch=2) == 1
    assert isinstance(c.exception(), NotLeaderOrFollowerError)
    assert w.pending(TP) == 1 and not d.done()
    w.discard(TP, d)
    assert w.pending(TP) == 0 and w.partitions() == []
