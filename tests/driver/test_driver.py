"""The controller driver on a real SQLite log: durability before response, ordered group
commit, revert on a failed append, restart from snapshot plus log, and real-time timers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from controller.runtime.loading import load_image
from metactl.errors import StaleBrokerEpochError, StorageError
from metadata_log.records import RegisterBrokerRecord, UncleanRecoveryRecord
from metadata_log.sqlite_store import SqliteLogStore
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import RegisterBroker, RegisterBrokerResponse
from protocol.messages.internal import FenceBroker, ReplicaLogInfo, UnfenceBroker


async def _cluster(ctl: Controller, brokers: list[int]) -> None:
    for b in brokers:
        r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await SqliteLogStore.open(tmp_path)
    yield s
    await s.close()


async def test_response_only_after_records_are_durable(
    tmp_path: Path, store: SqliteLogStore
) -> None:
    ctl = await Controller.open(store, clock=VirtualClock())
    r = await ctl.submit(RegisterBroker(broker_id=7, incarnation_id="x"))
    assert isinstance(r, RegisterBrokerResponse)
    # Another reader of the same file already sees the registration the response names.
    reader = await SqliteLogStore.open(tmp_path, read_only=True)
    try:
        entries = await reader.read(r.broker_epoch, 10)
        assert isinstance(entries[0].record, RegisterBrokerRecord)
        assert entries[0].record.broker_epoch == r.broker_epoch == entries[0].offset
    finally:
        await reader.close()
    await ctl.close()


async def test_concurrent_events_commit_in_order_and_share_commits(store: SqliteLogStore) -> None:
    ctl = await Controller.open(store, clock=VirtualClock())
    before = store.commits
    responses = await asyncio.gather(
        *(ctl.submit(RegisterBroker(broker_id=i, incarnation_id=f"b{i}")) for i in range(200))
    )
    epochs = [r.broker_epoch for r in responses if isinstance(r, RegisterBrokerResponse)]
    assert epochs == list(range(200))  # submission order is offset order
    assert store.commits - before < 200  # commits were batched
    assert store.end_offset == 200
    await ctl.close()


async def test_refused_request_writes_nothing(store: SqliteLogStore) -> None:
    ctl = await Controller.open(store, clock=VirtualClock())
    await _cluster(ctl, [1])
    end = store.end_offset
    with pytest.raises(StaleBrokerEpochError):
        await ctl.submit(UnfenceBroker(broker_id=1, broker_epoch=99))
    await ctl.drain()
    assert store.end_offset == end
    await ctl.close()


async def test_failed_append_fails_the_event_and_reverts_the_image(
    tmp_path: Path, store: SqliteLogStore
) -> None:
    ctl = await Controller.open(store, clock=VirtualClock())
    await _cluster(ctl, [1, 2, 3])
    committed = ctl.image
    await store.debug_limit_pages(0)  # the disk is full
    big = CreateTopic(name="big", partitions=2000, replication_factor=3)
    with pytest.raises(StorageError) as err:
        await ctl.submit(big)
    assert err.value.code == "KAFKA_STORAGE_ERROR"
    assert ctl.image.same_state(committed)
    assert "big" not in ctl.image.topics
    # Space comes back: the controller keeps serving, and offsets stay consistent.
    await store.debug_limit_pages(None)
    await ctl.submit(big)
    assert ctl.image.end_offset == store.end_offset
    image = ctl.image
    await ctl.close()
    assert (await load_image(store)).same_state(image)


async def test_restart_from_snapshot_and_log_gives_the_same_image(tmp_path: Path) -> None:
    store = await SqliteLogStore.open(tmp_path)
    ctl = await Controller.open(store, clock=VirtualClock())
    await _cluster(ctl, [1, 2, 3])
    await ctl.submit(CreateTopic(name="orders", partitions=6, replication_factor=3, min_isr=2))
    snap_offset = await ctl.write_snapshot()
    await ctl.submit(FenceBroker(broker_id=2))
    await ctl.submit(RegisterBroker(broker_id=2, incarnation_id="again"))
    before = ctl.image
    await ctl.close()
    await store.close()

    store = await SqliteLogStore.open(tmp_path)
    try:
        assert await store.snapshot_offsets() == [snap_offset]
        ctl = await Controller.open(store, clock=VirtualClock())
        assert ctl.image.same_state(before)
        # Replaying everything from offset 0 (ignoring the snapshot) agrees as well.
        from metadata_image.image import ClusterImage
        from metadata_image.replay import replay

        records = [e.record async for e in store.iter_entries(0)]
        assert replay(ClusterImage(), records).same_state(before)
        await ctl.close()
    finally:
        await store.close()


async def _answered_proactive_recovery(ctl: Controller, store: SqliteLogStore) -> int:
    """Both replicas of t-0 fail; broker 2 restarts uncleanly, is inspected as soon as it is
    active, and answers. The proactive window is then open, with an answer to choose.
    Returns the log end before the answer (an answer writes no record of its own, so any
    record after it is the recovery, however early a short window closes)."""
    await _cluster(ctl, [1, 2])
    await ctl.submit(CreateTopic(name="t", assignments=[[1, 2]], min_isr=2))
    asked = asyncio.Queue[tuple[int, int]]()
    ctl.inspection_sinks.append(lambda i: asked.put_nowait((i.broker_id, i.broker_epoch)))
    await ctl.submit(FenceBroker(broker_id=2))
    await ctl.submit(FenceBroker(broker_id=1))
    r = await ctl.submit(RegisterBroker(broker_id=2, incarnation_id="2b"))
    assert isinstance(r, RegisterBrokerResponse)
    await ctl.submit(UnfenceBroker(broker_id=2, broker_epoch=r.broker_epoch))
    broker, epoch = await asyncio.wait_for(asked.get(), 5)
    assert broker == 2
    end = store.end_offset
    await ctl.submit(
        ReplicaLogInfo(
            broker_id=2, broker_epoch=epoch, topic="t", partition=0,
            last_leader_epoch=3, log_end_offset=40,
        )
    )  # fmt: skip
    return end


async def _recovery_committed_after(store: SqliteLogStore, end: int) -> None:
    assert await store.wait_for(end + 1, timeout=10)
    records = [e.record for e in await store.read(end, 10)]
    recovery = [r for r in records if isinstance(r, UncleanRecoveryRecord)]
    assert recovery and recovery[0].chosen == 2 and recovery[0].strategy == "proactive"


async def test_proactive_window_fires_on_the_real_clock(store: SqliteLogStore) -> None:
    config = ControllerConfig(unclean_recovery_strategy="proactive", unclean_recovery_window_ms=50)
    ctl = await Controller.open(store, config=config)
    end = await _answered_proactive_recovery(ctl, store)
    # No one ticks: the driver's own timer ends the window and commits the recovery.
    await _recovery_committed_after(store, end)
    assert ctl.image.partitions[("t", 0)].leader == 2
    await ctl.close()


async def test_proactive_window_fires_on_a_virtual_clock(store: SqliteLogStore) -> None:
    """Timers sleep on the injected clock: moving a virtual clock fires them, and until it
    moves nothing fires however much real time passes."""
    clock = VirtualClock(1_000)
    config = ControllerConfig(
        unclean_recovery_strategy="proactive", unclean_recovery_window_ms=60_000
    )
    ctl = await Controller.open(store, config=config, clock=clock)
    end = await _answered_proactive_recovery(ctl, store)
    deadline = ctl.next_deadline_ms
    assert deadline is not None and deadline > clock.now_ms()
    # The window is still open: a drain (an event through the queue) decides nothing.
    await ctl.drain()
    assert store.end_offset == end and ctl.image.partitions[("t", 0)].leader == -1
    clock.set(deadline)  # no submit, no tick: the clock alone wakes the driver
    await _recovery_committed_after(store, end)
    await ctl.close()


async def test_a_committed_records_fields_never_overwrite_the_log_lines_own(
    store: SqliteLogStore,
) -> None:
    """A FeatureLevelRecord's `level` was logged as the line's level (structlog's key), so
    the feature's level never showed: such fields are kept as `record_<name>`."""
    from structlog.testing import capture_logs

    from controller.core.lifecycle import Bootstrap

    ctl = await Controller.open(store, clock=VirtualClock())
    ctl.log_every_record = True
    with capture_logs() as logs:
        await ctl.submit(Bootstrap())
    await ctl.close()
    committed = [e for e in logs if e.get("event") == "committed"]
    feature = next(e for e in committed if e["record"] == "FeatureLevel")
    assert feature["log_level"] == "info" and feature["record_level"] == 1
    assert feature["name"] == "eligible.leader.replicas.version"
