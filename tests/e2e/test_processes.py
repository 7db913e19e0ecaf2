"""End to end with real processes and real signals: a controller and three brokers.

Brokers are SIGKILLed (unclean), SIGTERMed (controlled shutdown) and restarted with or
without their clean-shutdown file; the controller itself is SIGKILLed under load.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from metactl.errors import NetworkError
from metadata_log.records import (
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterResponse,
    PartitionState,
)
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.start_controller()
    try:
        yield c
    finally:
        c.stop()


def part(state: DescribeClusterResponse, topic: str = "t", partition: int = 0) -> PartitionState:
    return next(p for p in state.partitions if p.topic == topic and p.partition == partition)


def broker(state: DescribeClusterResponse, broker_id: int):  # type: ignore[no-untyped-def]
    return next(b for b in state.brokers if b.broker_id == broker_id)


async def start_three(cluster: Cluster, min_isr: int = 2) -> None:
    for b in (1, 2, 3):
        cluster.start_broker(b)
    await cluster.wait_until(
        lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers), "3 active brokers"
    )
    r = await cluster.request(
        CreateTopicsRequest(
            topics=[CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=min_isr)]
        )
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    await cluster.wait_until(lambda s: part(s).isr == [1, 2, 3], "full ISR")


async def test_sigkill_leader_then_unclean_restart(cluster: Cluster) -> None:
    await start_three(cluster)
    # Make broker 1 the ELR-eligible last leader: first lose 3 (ISR stays at MinISR).
    cluster.kill_broker(3)
    await cluster.wait_until(lambda s: part(s).isr == [1, 2], "3 removed from the ISR")
    # SIGKILL the leader: fenced after the session timeout, leadership moves to 2 and,
    # with the ISR now below MinISR, 1 stays complete in the ELR (case C).
    assert cluster.kill_broker(1) == -signal.SIGKILL
    s = await cluster.wait_until(
        lambda s: broker(s, 1).fenced and part(s).leader == 2, "1 fenced, leader moved to 2"
    )
    assert part(s).isr == [2] and part(s).elr == [1]
    mark = s.committed_offset
    # Restart 1 without its clean-shutdown file: unclean registration, ELR -> LastKnownELR.
    cluster.start_broker(1)
    _, reg = await cluster.wait_for_record(
        lambda r: isinstance(r, RegisterBrokerRecord) and r.broker_id == 1, "1 re-registers", mark
    )
    assert isinstance(reg, RegisterBrokerRecord) and reg.clean is False
    assert reg.previous_epoch is None
    _, change = await cluster.wait_for_record(
        lambda r: isinstance(r, PartitionChangeRecord) and r.reason == "unclean_registration",
        "unclean exclusion",
        mark,
    )
    assert isinstance(change, PartitionChangeRecord)
    assert change.elr == [] and change.last_known_elr == [1]
    # It comes back only through the leader's AlterPartition once caught up.
    s = await cluster.wait_until(lambda s: part(s).isr == [1, 2], "1 re-added to the ISR")
    assert part(s).last_known_elr == [] and part(s).elr == []


async def test_sigterm_is_a_controlled_shutdown_and_a_clean_restart_keeps_elr(
    cluster: Cluster,
) -> None:
    await start_three(cluster)
    assert cluster.kill_broker(3, signal.SIGTERM) == 0
    await cluster.wait_until(lambda s: part(s).isr == [1, 2], "3 left the ISR")
    assert cluster.kill_broker(2, signal.SIGTERM) == 0
    s = await cluster.wait_until(lambda s: part(s).elr == [2], "2 complete in the ELR")
    assert part(s).isr == [1] and part(s).leader == 1
    assert (cluster.root / "broker-2" / "clean_shutdown").exists()
    mark = s.committed_offset
    cluster.start_broker(2)
    _, reg = await cluster.wait_for_record(
        lambda r: isinstance(r, RegisterBrokerRecord) and r.broker_id == 2, "2 re-registers", mark
    )
    assert isinstance(reg, RegisterBrokerRecord) and reg.clean is True
    assert not (cluster.root / "broker-2" / "clean_shutdown").exists()
    records = [r for _, r in await cluster.records(mark)]
    assert not any(
        isinstance(r, PartitionChangeRecord) and r.reason == "unclean_registration" for r in records
    )


async def test_worked_example_5_3_3_with_real_processes(cluster: Cluster) -> None:
    await start_three(cluster)
    # Power outage: the brokers go down uncleanly, fenced one by one.
    for b in (1, 2, 3):
        cluster.kill_broker(b)
        await cluster.wait_until(lambda s, b=b: broker(s, b).fenced, f"broker {b} fenced")
    s = await cluster.describe()
    assert part(s).leader == -1 and part(s).isr == [] and part(s).elr == [2, 3]
    mark = s.committed_offset
    for b in (1, 2, 3):
        cluster.start_broker(b)
    _, rec = await cluster.wait_for_record(
        lambda r: isinstance(r, UncleanRecoveryRecord), "balanced unclean recovery", mark
    )
    assert isinstance(rec, UncleanRecoveryRecord)
    assert rec.strategy == "balanced" and rec.potential_data_loss
    assert sorted(c.broker_id for c in rec.candidates) == [2, 3]  # the LastKnownELR
    best = max(rec.candidates, key=lambda c: (c.last_leader_epoch, c.log_end_offset))
    assert rec.chosen == best.broker_id
    s = await cluster.wait_until(lambda s: part(s).leader == rec.chosen, "recovered leader")
    assert part(s).last_known_elr == []


async def test_controller_sigkill_under_load_loses_no_acknowledged_change(cluster: Cluster) -> None:
    await start_three(cluster)
    acked: list[str] = []

    async def load() -> None:
        for i in range(10_000):
            try:
                r = await cluster.request(
                    CreateTopicsRequest(topics=[CreateTopic(name=f"load-{i}", partitions=2)])
                )
            except (OSError, TimeoutError, asyncio.IncompleteReadError, NetworkError):
                return
            assert isinstance(r, CreateTopicsResponse)
            if r.results[0].error_code is None:
                acked.append(f"load-{i}")

    task = asyncio.create_task(load())
    s = await cluster.wait_until(
        lambda s: len({p.topic for p in s.partitions}) > 20, "some topics created under load"
    )
    assert cluster.controller is not None
    cluster.controller.signal(signal.SIGKILL)
    cluster.controller.wait()
    cluster.controller.close()
    await task
    assert acked
    cluster.start_controller()
    s = await cluster.wait_until(
        lambda s: (
            all(not b.fenced for b in s.brokers) and all(p.leader != -1 for p in s.partitions)
        ),
        "brokers reconnected and every partition led",
    )
    topics = {p.topic for p in s.partitions}
    assert set(acked) <= topics
