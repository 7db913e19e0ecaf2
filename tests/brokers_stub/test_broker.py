"""The broker process end to end against a scripted fake controller (no controller service).

Each test runs a `Broker` in this event loop with fast timers, waits on what it can
observe (the READY line, requests the fake received, files), and stops it the way
SIGTERM does.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Literal

import pytest

from brokers_stub.broker import Broker
from brokers_stub.config import BrokerConfig
from brokers_stub.replica_log import load_all
from metactl.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    StaleBrokerEpochError,
)
from metadata_log.records import PartitionRecord, TopicRecord
from protocol.client import RpcClient
from protocol.messages.broker_controller import (
    AlterPartitions,
    BrokerHeartbeatRequest,
    FetchMetadataRequest,
    RegisterBroker,
)
from protocol.messages.data import ProduceRequest, ProduceResponse
from tests.brokers_stub.fake_controller import FakeController
from tests.brokers_stub.helpers import TOPIC, Running, broker_config, eventually


def heartbeats(c: FakeController) -> list[BrokerHeartbeatRequest]:
    return [r for r in c.requests if isinstance(r, BrokerHeartbeatRequest)]


def registrations(c: FakeController) -> list[RegisterBroker]:
    return [r for r in c.requests if isinstance(r, RegisterBroker)]


async def test_clean_restart_cycle(controller: FakeController, tmp_path: Path) -> None:
    (tmp_path / "clean_shutdown").write_text(json.dumps({"broker_epoch": 5}))
    run = Running(broker_config(controller, tmp_path))
    m = await run.await_ready()
    (reg,) = registrations(controller)
    assert reg.previous_epoch == 5
    assert not (tmp_path / "clean_shutdown").exists()  # taken before registering
    assert (int(m[1]), int(m[2]), m[3]) == (1, 0, reg.endpoint)
    assert reg.endpoint == run.broker.server.address
    # It asks to be unfenced once its metadata is past its own registration.
    await eventually(
        lambda: any(not h.want_fence and h.metadata_offset > 0 for h in heartbeats(controller)),
        what="a heartbeat asking to be unfenced",
    )
    await eventually(lambda: not run.broker.is_fenced, what="unfenced")
    await eventually((tmp_path / "metadata_offset").exists, what="metadata_offset written")

    assert await run.stop() == 0
    assert any(h.want_shutdown for h in heartbeats(controller))
    assert json.loads((tmp_path / "clean_shutdown").read_text()) == {"broker_epoch": 0}

    again = Running(broker_config(controller, tmp_path))
    await again.await_ready()
    assert registrations(controller)[-1].previous_epoch == 0
    assert registrations(controller)[-1].incarnation_id != reg.incarnation_id
    assert await again.stop() == 0


async def test_no_clean_shutdown_file_registers_unclean(
    controller: FakeController, tmp_path: Path
) -> None:
    run = Running(broker_config(controller, tmp_path))
    await run.await_ready()
    assert registrations(controller)[0].previous_epoch is None
    assert await run.stop() == 0


async def test_duplicate_registration_is_retried(
    controller: FakeController, tmp_path: Path
) -> None:
    controller.registration_errors = [
        DuplicateBrokerRegistrationError("old session active"),
        DuplicateBrokerRegistrationError("old session active"),
    ]
    run = Running(broker_config(controller, tmp_path))
    await run.await_ready()
    assert len(registrations(controller)) == 3
    assert await run.stop() == 0


async def test_stop_before_registering_keeps_the_clean_proof(
    controller: FakeController, tmp_path: Path
) -> None:
    (tmp_path / "clean_shutdown").write_text(json.dumps({"broker_epoch": 9}))
    controller.registration_errors = [DuplicateBrokerRegistrationError()] * 1000
    run = Running(broker_config(controller, tmp_path))
    await eventually(lambda: len(registrations(controller)) >= 2, what="registration attempts")
    assert await run.stop() == 0
    assert run.stdout.getvalue() == ""  # never READY
    assert json.loads((tmp_path / "clean_shutdown").read_text()) == {"broker_epoch": 9}


@pytest.mark.parametrize("error", [StaleBrokerEpochError, BrokerIdNotRegisteredError])
async def test_refused_heartbeat_reregisters_with_the_current_epoch(
    controller: FakeController, tmp_path: Path, error: type[Exception]
) -> None:
    run = Running(broker_config(controller, tmp_path))
    await run.await_ready()
    first = registrations(controller)[0]
    await eventually(lambda: len(heartbeats(controller)) >= 1)
    controller.heartbeat_errors = [error("refused")]  # type: ignore[list-item]
    await eventually(lambda: len(registrations(controller)) == 2, what="a re-registration")
    second = registrations(controller)[1]
    assert second.previous_epoch == 0
    assert second.incarnation_id == first.incarnation_id
    await eventually(lambda: run.broker.epoch is not None and run.broker.epoch > 0)
    new_epoch = run.broker.epoch
    await eventually(lambda: heartbeats(controller)[-1].broker_epoch == new_epoch)
    assert await run.stop() == 0
    assert json.loads((tmp_path / "clean_shutdown").read_text()) == {"broker_epoch": new_epoch}


async def test_survives_a_controller_restart_on_the_same_address(
    controller: FakeController, tmp_path: Path
) -> None:
    run = Running(broker_config(controller, tmp_path))
    await run.await_ready()
    port = int(controller.address.rsplit(":", 1)[1])
    await controller.stop()
    records = controller.records
    restarted = FakeController()
    restarted.records = records  # same durable log, new process
    await restarted.start(port)
    try:
        await eventually(lambda: len(heartbeats(restarted)) >= 2, what="heartbeats resume")
        await eventually(lambda: len(restarted.of(FetchMetadataRequest)) >= 1)
        assert {h.broker_epoch for h in heartbeats(restarted)} == {0}  # same epoch
        assert registrations(restarted) == []
        assert await run.stop() == 0
    finally:
        await restarted.stop()


async def test_stops_when_the_controller_stays_unreachable(
    controller: FakeController, tmp_path: Path
) -> None:
    run = Running(broker_config(controller, tmp_path, session_timeout_ms=300))
    await run.await_ready()
    await controller.stop()
    assert await run.stop() == 0
    assert json.loads((tmp_path / "clean_shutdown").read_text()) == {"broker_epoch": 0}


async def test_leads_takes_produce_and_flushes_everything_at_shutdown(
    controller: FakeController, tmp_path: Path
) -> None:
    controller.append(TopicRecord(name=TOPIC, topic_id="t", partitions=1, min_isr=1))
    run = Running(broker_config(controller, tmp_path, flush_interval_ms=60_000))
    m = await run.await_ready()
    controller.append(
        PartitionRecord(topic=TOPIC, partition=0, replicas=[1], isr=[1], leader=1, leader_epoch=3)
    )
    await eventually(lambda: (TOPIC, 0) in run.broker.replicas.leaders, what="leadership")
    async with RpcClient(m[3]) as client:
        resp = await client.request(ProduceRequest(topic=TOPIC, partition=0, count=7))
    assert isinstance(resp, ProduceResponse)
    assert (resp.base_offset, resp.count, resp.leader_epoch) == (0, 7, 3)
    assert resp.high_watermark == 7  # ISR {1}, min ISR 1: committed at once
    (log,), _ = load_all(tmp_path / "replicas")
    assert log.flushed_offset == 0  # answered from the page cache: acks do not wait for fsync
    assert await run.stop() == 0
    (log,), _ = load_all(tmp_path / "replicas")
    assert log.leader_epochs == [(3, 0)]
    assert log.flushed_offset == log.log_end_offset == 7
    assert log.high_watermark == log.log_end_offset  # ISR {1}, min ISR 1
    assert controller.of(AlterPartitions) == []  # nothing to change


class _WatchedEvent(asyncio.Event):
    """An Event that says when someone starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.waiting.set()  # no await between this and the wait below
        return await super().wait()


async def test_a_cancellation_coinciding_with_a_wakeup_is_not_lost(tmp_path: Path) -> None:
    """The heartbeat task waits on a timer-or-event; cancelling it just as the event fires
    must still cancel it (asyncio.wait_for on 3.11 loses that cancellation, and a broker
    then hung in its shutdown)."""
    broker = Broker(BrokerConfig(broker_id=1, controller="127.0.0.1:1", data_dir=tmp_path))
    event = _WatchedEvent()
    task = asyncio.create_task(broker._wait_or_stop(60, event))
    await event.waiting.wait()  # it is now inside event.wait(), under its timeout
    assert not task.done()
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
