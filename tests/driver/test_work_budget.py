"""The work budget in the driver, on a real SQLite log: a fence of a broker with many
partitions is stepped in slices inside one transaction, and a heartbeat that arrives
meanwhile is handled between two slices (the events' order shows it: no timing); the
recovery evaluation it leaves behind is drained in Ticks of at most a budget each; a
controller closed in the middle of such a fence leaves an aborted transaction, and the
fence, submitted again, completes from the durable state."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import Inspection
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from controller.runtime.loading import load_image
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    FenceBrokerRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker, UnfenceBroker

BUDGET = 50
PARTITIONS = 1_200  # broker 1 hosts 900 of them at RF 3 on 4 brokers: 18 slices


@contextlib.asynccontextmanager
async def controller(
    path: Path, budget: int | None = BUDGET, config: ControllerConfig | None = None
) -> AsyncIterator[Controller]:
    store = await SqliteLogStore.open(path)
    ctl = await Controller.open(
        store, clock=VirtualClock(), work_budget=budget, config=config or ControllerConfig()
    )
    try:
        yield ctl
    finally:
        await ctl.close()
        await store.close()


async def start(ctl: Controller, brokers: range) -> dict[int, int]:
    epochs = {}
    for b in brokers:
        r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))
        epochs[b] = r.broker_epoch
    return epochs


async def test_a_large_fence_is_sliced_and_a_heartbeat_is_answered_between_slices(
    tmp_path: Path,
) -> None:
    async with controller(tmp_path / "whole", budget=None) as whole:
        await start(whole, range(1, 5))
        await whole.submit(CreateTopic(name="t", partitions=PARTITIONS, replication_factor=3))
        await whole.submit(FenceBroker(broker_id=1))
        expected = whole.committed_image
    async with controller(tmp_path / "sliced") as ctl:
        epochs = await start(ctl, range(1, 5))
        await ctl.submit(CreateTopic(name="t", partitions=PARTITIONS, replication_factor=3))
        start_offset = ctl.committed_image.end_offset
        order: list[str] = []
        continued = asyncio.Event()

        def listen(name: str, queued: float, took: float) -> None:
            order.append(name)
            if name == "Continue":
                continued.set()

        ctl.event_listeners.append(listen)
        fence = asyncio.create_task(ctl.submit(FenceBroker(broker_id=1)))
        await continued.wait()  # the transaction is open: its first continuation ran
        assert ctl.in_transaction
        hb = await ctl.submit(
            BrokerHeartbeatRequest(broker_id=2, broker_epoch=epochs[2], metadata_offset=0)
        )
        assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
        await fence
        # The heartbeat was handled between two slices of the fence.
        first, last = order.index("Continue"), len(order) - 1 - order[::-1].index("Continue")
        assert first < order.index("BrokerHeartbeatRequest") < last
        assert order.count("Continue") == 900 // BUDGET - 1
        # One transaction, named after the fence, and the same result as one step.
        image = ctl.committed_image
        assert image.partitions == expected.partitions
        async with await SqliteLogStore.open(tmp_path / "sliced", read_only=True) as reader:
            records = [e.record for e in await reader.read(start_offset, 100_000)]
        assert records[0] == BeginTransactionRecord(name="FenceBroker 1")
        assert isinstance(records[1], FenceBrokerRecord)
        ends = [i for i, r in enumerate(records) if isinstance(r, EndTransactionRecord)]
        assert len(ends) == 1
        assert not any(isinstance(r, BeginTransactionRecord) for r in records[1:])


async def test_recovery_evaluation_is_drained_a_budget_per_step(tmp_path: Path) -> None:
    """600 single-replica partitions on broker 1 lose their leader for good (an unclean
    restart moves broker 1 from their ELR to the LastKnownELR); once it is back, each
    needs a log inspection. They are asked for in steps of at most the budget."""
    config = ControllerConfig(default_min_insync_replicas=1)
    async with controller(tmp_path, config=config) as ctl:
        await start(ctl, range(1, 3))
        await ctl.submit(CreateTopic(name="solo", assignments=[[1]] * 600))
        await ctl.submit(FenceBroker(broker_id=1))
        r = await ctl.submit(RegisterBroker(broker_id=1, incarnation_id="again"))
        assert isinstance(r, RegisterBrokerResponse) and not r.clean
        per_step: list[int] = []
        asked: list[Inspection] = []
        ctl.inspection_sinks.append(asked.append)
        ctl.event_listeners.append(lambda name, q, t: per_step.append(len(asked) - sum(per_step)))
        await ctl.submit(UnfenceBroker(broker_id=1, broker_epoch=r.broker_epoch))
        await ctl.drain()  # drain waits for the open transaction, not for the backlog
        while not ctl.state.idle:
            await ctl.tick()
        assert len({(i.topic, i.partition) for i in asked}) == 600
        assert max(per_step) <= BUDGET
        assert sum(1 for n in per_step if n) >= 600 // BUDGET


async def test_a_fence_cut_short_is_aborted_and_done_again_from_the_log(tmp_path: Path) -> None:
    async with controller(tmp_path) as ctl:
        await start(ctl, range(1, 5))
        await ctl.submit(CreateTopic(name="t", partitions=PARTITIONS, replication_factor=3))
        before = ctl.committed_image
        continued = asyncio.Event()
        ctl.event_listeners.append(lambda name, q, t: name == "Continue" and continued.set())
        fence = asyncio.create_task(ctl.submit(FenceBroker(broker_id=1)))
        await continued.wait()
        # The controller stops in the middle (as a failover would): the transaction is
        # aborted and the fence fails with a retriable error.
    with pytest.raises(Exception) as failed:
        await fence
    assert getattr(failed.value, "retriable", False), failed.value
    store = await SqliteLogStore.open(tmp_path)
    try:
        records = [e.record for e in await store.read(before.end_offset, 100_000)]
        assert isinstance(records[0], BeginTransactionRecord)
        assert isinstance(records[-1], AbortTransactionRecord)
        image = await load_image(store)
        assert image.partitions == before.partitions and not image.brokers[1].fenced
    finally:
        await store.close()
    # Reopened, the controller fences again (the session would expire again) and does all
    # of it.
    async with controller(tmp_path) as ctl:
        await ctl.submit(FenceBroker(broker_id=1))
        image = ctl.committed_image
        assert image.brokers[1].fenced
        assert not any(1 in p.isr for p in image.partitions_of(1))


async def test_the_gc_is_paused_while_bulk_work_runs_and_back_after(tmp_path: Path) -> None:
    """Full collections over what bulk work builds grow with it (`GcPause`): the cyclic
    GC is off while a transaction is sliced or the recovery backlog drains, and on again,
    with what was built frozen, once both are over (and once the controller closes)."""
    assert gc.isenabled()
    config = ControllerConfig(default_min_insync_replicas=1)
    frozen = gc.get_freeze_count()
    # A budget of one partition: 600 slices, then 600 Ticks, most of them after the last
    # transaction's own hold on the pause ended (with its answer).
    async with controller(tmp_path, budget=1, config=config) as ctl:
        await start(ctl, range(1, 3))
        await ctl.submit(CreateTopic(name="solo", assignments=[[1]] * 600))
        # Per event: whether the GC ran, and whether a backlog was left to drain after it.
        seen: dict[str, list[tuple[bool, bool]]] = {}
        ctl.event_listeners.append(
            lambda name, q, t: seen.setdefault(name, []).append(
                (gc.isenabled(), not ctl.state.idle)
            )
        )
        await ctl.submit(FenceBroker(broker_id=1))
        r = await ctl.submit(RegisterBroker(broker_id=1, incarnation_id="again"))
        assert isinstance(r, RegisterBrokerResponse)
        await ctl.submit(UnfenceBroker(broker_id=1, broker_epoch=r.broker_epoch))
        await ctl.drain()
        while not ctl.state.idle:
            await ctl.tick()
        await ctl.drain()  # one more event, with nothing left to drain
        assert {on for on, _ in seen["Continue"]} == {False}  # slices
        draining = [on for on, more in seen["Tick"] if more]  # the backlog's Ticks
        assert len(draining) >= 600 and not any(draining)
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen  # what the bulk work built is frozen
    assert gc.isenabled()


async def test_answers_go_before_bulk_work(tmp_path: Path) -> None:
    """While the recovery backlog drains (a Tick a turn of the event loop), a commit that
    an answer waits on goes first: the drain pauses until it is durable. Each append is
    several turns between the committer and the store's thread, so without the pause
    a one-record commit waited for as many Ticks (0.4-0.6 s at 300,000 partitions)."""
    config = ControllerConfig(default_min_insync_replicas=1)
    async with controller(tmp_path, budget=1, config=config) as ctl:
        await start(ctl, range(1, 4))
        await ctl.submit(CreateTopic(name="solo", assignments=[[1]] * 600))
        await ctl.submit(FenceBroker(broker_id=1))
        r = await ctl.submit(RegisterBroker(broker_id=1, incarnation_id="again"))
        assert isinstance(r, RegisterBrokerResponse)
        order: list[str] = []
        ctl.event_listeners.append(lambda name, q, t: order.append(name))
        # Broker 1's unfence queues its 600 leaderless partitions: 600 Ticks to drain.
        await ctl.submit(UnfenceBroker(broker_id=1, broker_epoch=r.broker_epoch))
        assert not ctl.state.idle
        ticks_before = order.count("Tick")
        registered = await ctl.submit(RegisterBroker(broker_id=4, incarnation_id="new"))
        assert isinstance(registered, RegisterBrokerResponse)
        ticks_meanwhile = order.count("Tick") - ticks_before
        assert not ctl.state.idle, "the backlog was drained before the answer: too small"
        assert ticks_meanwhile <= 2, ticks_meanwhile


async def test_what_an_event_builds_is_frozen(tmp_path: Path) -> None:
    """The image's and the tracker's persistent maps are traversed whole by a full
    collection (a new root of a 1,000,000-entry map cost ~700 ms each): the driver freezes
    what an event built once it has stepped it, so no collection ever walks them."""
    async with controller(tmp_path) as ctl:
        await start(ctl, range(1, 4))
        await ctl.submit(CreateTopic(name="t", partitions=10, replication_factor=3))
        await ctl.submit(FenceBroker(broker_id=1))
        young = {id(o) for o in gc.get_objects()}
        assert id(ctl.image.partitions) not in young
        assert id(ctl.state.tracker.offline) not in young


async def test_listeners_hear_a_sliced_transaction_once_with_its_records(tmp_path: Path) -> None:
    """The parts of an open transaction wait for its end marker as encoded batches: the
    listeners then hear every part, in order, with exactly the records the log holds (a
    part's records decoded only when read)."""
    async with controller(tmp_path) as ctl:
        await start(ctl, range(1, 5))
        await ctl.submit(CreateTopic(name="t", partitions=PARTITIONS, replication_factor=3))
        begin = ctl.committed_image.end_offset
        told: list[tuple[int, list[object]]] = []
        kinds: set[type] = set()

        def listen(base: int, rs: Sequence[object], delta: object, now: int) -> None:
            kinds.add(type(rs))
            told.append((base, list(rs)))

        ctl.commit_listeners.append(listen)
        await ctl.submit(FenceBroker(broker_id=1))
        assert kinds - {list}, "no part was held encoded"
        stored = [e.record for e in await ctl.store.read(begin, 100_000)]
        assert len(told) > 2  # the slices, told at the end, part by part
        assert [base for base, _ in told] == [
            begin + sum(len(rs) for _, rs in told[:i]) for i in range(len(told))
        ]
        assert [r for _, rs in told for r in rs] == stored
        assert isinstance(stored[0], BeginTransactionRecord)
        assert isinstance(stored[-1], EndTransactionRecord)


async def test_a_heartbeat_among_held_slices_is_answered_before_the_transaction_ends(
    tmp_path: Path,
) -> None:
    """A transaction's slices are held back from the log until `SLICES_PER_APPEND` wait
    (one append for a short fence). A heartbeat that arrives after the second slice, with
    slices held, is answered inside the transaction (once the log before it is durable),
    not after its end: nothing waits on a held slice."""
    async with controller(tmp_path / "held") as ctl:
        epochs = await start(ctl, range(1, 5))
        await ctl.submit(CreateTopic(name="t", partitions=PARTITIONS, replication_factor=3))
        order: list[str] = []
        sent = asyncio.Event()
        heartbeat: list[asyncio.Future[object]] = []

        def listen(name: str, queued: float, took: float) -> None:
            order.append(name)
            if name == "Continue" and order.count("Continue") == 2 and not sent.is_set():
                request = BrokerHeartbeatRequest(
                    broker_id=2, broker_epoch=epochs[2], metadata_offset=0
                )
                heartbeat.append(asyncio.ensure_future(ctl.submit(request)))
                sent.set()

        ctl.event_listeners.append(listen)
        fence = asyncio.ensure_future(ctl.submit(FenceBroker(broker_id=1)))
        async with asyncio.timeout(30):  # a guard against a stall, not a timing
            await sent.wait()
            hb = await heartbeat[0]
            assert not fence.done()  # answered inside the transaction
            await fence
        assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
        first = order.index("Continue")
        assert first < order.index("BrokerHeartbeatRequest") < len(order) - 1
