"""Metrics of the metadata lifecycle (issue 19), scraped over HTTP from a real controller
service driven over TCP: the reassignment gauge rises when a reassignment starts and falls
when it completes or is cancelled; a deleted topic's series disappear (and come back at 0
when it is created again) and its partitions leave the health gauges; ELR clears are
counted by scope, the ELR feature level follows kafka-features, unregistered brokers are
counted. The age of the oldest reassignment is checked on virtual time, in-process."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.partition_gauges import PartitionHealth, Reassignments
from controller.runtime.service import ControllerService
from metadata_log.records import ELR_FEATURE
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.admin import PartitionState as PartitionStateMessage
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker
from tests.observability.kit import Cluster

PDL = "metactl_potential_data_loss_events_total"
REASSIGNING = "metactl_partitions_reassigning"
AGE = "metactl_oldest_reassignment_age_seconds"
REASSIGNMENTS = "metactl_reassignments_total"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(address: str) -> Samples:
    """Every sample of the service's /metrics, over HTTP: (name, labels) -> value."""

    def get() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            body: bytes = resp.read()
            return body.decode()

    text = await asyncio.to_thread(get)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def one(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def topics_labelled(samples: Samples) -> set[str]:
    return {dict(labels)["topic"] for (_, labels) in samples if "topic" in dict(labels)}


class Admin:
    """A controller service on a real SQLite log, an admin connection over TCP."""

    def __init__(self, service: ControllerService, conn: RpcClient) -> None:
        self.service, self.conn = service, conn
        self.epochs: dict[int, int] = {}

    async def scrape(self) -> Samples:
        return await scrape(self.service.metrics_address)

    async def start_brokers(self, *brokers: int) -> None:
        for b in brokers:
            r = await self.conn.request(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            self.epochs[b] = r.broker_epoch
            hb = await self.conn.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
            )
            assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced

    async def create(self, name: str, assignments: list[list[int]], **kw: object) -> str:
        r = await self.conn.request(
            CreateTopicsRequest(
                topics=[CreateTopic(name=name, assignments=assignments, min_isr=2, **kw)]  # type: ignore[arg-type]
            )
        )
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
        topic_id = r.results[0].topic_id
        assert topic_id is not None
        return topic_id

    async def reassign(self, topic: str, moves: dict[int, list[int] | None]) -> None:
        r = await self.conn.request(
            AlterPartitionReassignments(
                reassignments=[
                    Reassignment(topic=topic, partition=p, replicas=replicas)
                    for p, replicas in moves.items()
                ]
            )
        )
        assert isinstance(r, AlterPartitionReassignmentsResponse)
        assert [x.error_code for x in r.results] == [None] * len(moves), r

    async def catch_up(self, topic: str, partition: int) -> None:
        """The leader's AlterPartition: every replica of the assignment is in sync now."""
        p = self.service.controller.committed_image.partitions[(topic, partition)]
        r = await self.conn.request(
            AlterPartition(
                topic=topic,
                partition=partition,
                leader=p.leader,
                broker_epoch=self.epochs[p.leader],
                partition_epoch=p.partition_epoch,
                leader_epoch=p.leader_epoch,
                isr=[IsrMember(broker_id=b, broker_epoch=self.epochs[b]) for b in p.replicas],
            )
        )
        assert isinstance(r, PartitionStateMessage), r  # an error would have raised

    def assert_incremental_state_matches_the_image(self) -> None:
        metrics = self.service.metrics
        assert metrics is not None
        image = self.service.controller.committed_image
        assert metrics.health.counts() == PartitionHealth.scan(image)
        assert set(metrics.moving.moving) == set(image.reassigning)


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    config = ControllerConfig(broker_session_timeout_ms=600_000)
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=config, metrics="127.0.0.1:0")
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address))
    try:
        yield Admin(svc, conn)
    finally:
        await conn.close()
        await svc.stop()


async def test_reassignment_gauge_rises_while_moving_and_falls_on_completion(
    admin: Admin,
) -> None:
    a = admin
    await a.start_brokers(1, 2, 3, 4)
    await a.create("moving", [[1, 2, 3], [1, 2, 3]])
    before = await a.scrape()
    assert one(before, REASSIGNING) == 0 and one(before, AGE) == 0
    for outcome in ("started", "completed", "cancelled"):
        assert one(before, REASSIGNMENTS, outcome=outcome) == 0  # created at 0

    # Move both partitions off broker 1: broker 4 must catch up first.
    await a.reassign("moving", {0: [2, 3, 4], 1: [2, 3, 4]})
    during = await a.scrape()
    assert one(during, REASSIGNING) == 2
    assert one(during, REASSIGNMENTS, outcome="started") == 2
    assert one(during, REASSIGNMENTS, outcome="completed") == 0
    a.assert_incremental_state_matches_the_image()

    # Broker 4 is in sync for partition 0: the reassignment completes, 1 leaves.
    await a.catch_up("moving", 0)
    p0 = a.service.controller.committed_image.partitions[("moving", 0)]
    assert (p0.replicas, p0.adding, p0.removing) == ((2, 3, 4), (), ())
    assert p0.leader != 1
    after_one = await a.scrape()
    assert one(after_one, REASSIGNING) == 1
    assert one(after_one, REASSIGNMENTS, outcome="completed") == 1
    a.assert_incremental_state_matches_the_image()

    # Partition 1's is cancelled: the original replicas come back (in Kafka's order: the
    # assignment without the adding replicas, target first).
    await a.reassign("moving", {1: None})
    p1 = a.service.controller.committed_image.partitions[("moving", 1)]
    assert (set(p1.replicas), p1.adding, p1.removing) == ({1, 2, 3}, (), ())
    done = await a.scrape()
    assert one(done, REASSIGNING) == 0 and one(done, AGE) == 0
    assert one(done, REASSIGNMENTS, outcome="started") == 2
    assert one(done, REASSIGNMENTS, outcome="completed") == 1
    assert one(done, REASSIGNMENTS, outcome="cancelled") == 1
    a.assert_incremental_state_matches_the_image()


async def test_a_deleted_topic_series_disappear_and_come_back_at_0(admin: Admin) -> None:
    a = admin
    await a.start_brokers(1, 2, 3)
    first_id = await a.create("doomed", [[1, 2, 3]], recovery_strategy="proactive")
    await a.create("kept", [[1, 2, 3]])
    await a.reassign("doomed", {0: [1, 2]})  # completes at once: no replica to add
    await a.reassign("kept", {0: [3, 2, 1]})  # a reorder also completes at once
    # Both partitions under MinISR with an ELR: only broker 1 left in their ISRs.
    for b in (3, 2):
        await a.service.controller.submit(FenceBroker(broker_id=b))
    s = await a.scrape()
    assert {"doomed", "kept"} <= topics_labelled(s)
    assert one(s, PDL, topic="doomed", strategy="proactive") == 0
    assert one(s, PDL, topic="doomed", strategy="manual") == 0
    assert one(s, "metactl_under_min_isr_partitions") == 2
    assert one(s, "metactl_partitions_with_elr") == 2
    assert one(s, "metactl_topics_deleted_total") == 0

    r = await a.conn.request(DeleteTopicsRequest(topics=["doomed"]))
    assert isinstance(r, DeleteTopicsResponse) and r.results[0].error_code is None, r
    gone = await a.scrape()
    assert "doomed" not in topics_labelled(gone)
    assert one(gone, PDL, topic="kept", strategy="balanced") == 0  # the other topic stays
    assert one(gone, "metactl_topics_deleted_total") == 1
    assert one(gone, "metactl_topics") == 1 and one(gone, "metactl_partitions") == 1
    # Its partition left the health gauges with it (the delta no longer names it).
    assert one(gone, "metactl_under_min_isr_partitions") == 1
    assert one(gone, "metactl_partitions_with_elr") == 1
    a.assert_incremental_state_matches_the_image()

    # Created again: a new topic (a new id), whose series start again at 0.
    second_id = await a.create("doomed", [[1, 2, 3]])
    assert second_id != first_id
    back = await a.scrape()
    assert one(back, PDL, topic="doomed", strategy="balanced") == 0
    assert one(back, PDL, topic="doomed", strategy="proactive") is None  # the old topic's
    assert one(back, "metactl_under_min_isr_partitions") == 2
    a.assert_incremental_state_matches_the_image()


async def test_elr_clears_by_scope_feature_level_and_unregistrations(admin: Admin) -> None:
    a = admin
    await a.start_brokers(1, 2, 3, 4)
    await a.create("t1", [[1, 2, 3]])
    await a.create("t2", [[1, 2, 3]])
    s = await a.scrape()
    assert one(s, "metactl_feature_level", feature=ELR_FEATURE) == 1
    for scope in ("topic", "cluster", "feature"):
        assert one(s, "metactl_elr_clears_total", scope=scope) == 0
    for b in (3, 2):
        await a.service.controller.submit(FenceBroker(broker_id=b))
    assert one(await a.scrape(), "metactl_partitions_with_elr") == 2

    # A topic's min.insync.replicas: that topic's ELR is cleared (KIP-966). Set to the
    # value it has (2, from the create), nothing is written and nothing cleared.
    for value, clears, with_elr in (("2", 0, 2), ("3", 1, 1), ("3", 1, 1)):
        r = await a.conn.request(
            AlterConfigs(
                resource_type="topic",
                resource_name="t1",
                set_configs={"min.insync.replicas": value},
            )
        )
        assert isinstance(r, AlterConfigsResponse)
        s = await a.scrape()
        assert one(s, "metactl_elr_clears_total", scope="topic") == clears
        assert one(s, "metactl_partitions_with_elr") == with_elr
    # The cluster default, to the same value: every topic's (one operation).
    r = await a.conn.request(
        AlterConfigs(
            resource_type="broker", resource_name="", set_configs={"min.insync.replicas": "2"}
        )
    )
    assert isinstance(r, AlterConfigsResponse)
    s = await a.scrape()
    assert one(s, "metactl_elr_clears_total", scope="cluster") == 1
    assert one(s, "metactl_elr_clears_total", scope="topic") == 1
    assert one(s, "metactl_partitions_with_elr") == 0

    # An ELR feature downgrade clears too; the upgrade clears nothing.
    down = await a.conn.request(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
    assert isinstance(down, UpdateFeatureResponse)
    s = await a.scrape()
    assert one(s, "metactl_feature_level", feature=ELR_FEATURE) == 0
    assert one(s, "metactl_elr_clears_total", scope="feature") == 1
    up = await a.conn.request(UpdateFeature(name=ELR_FEATURE, level=1))
    assert isinstance(up, UpdateFeatureResponse)
    s = await a.scrape()
    assert one(s, "metactl_feature_level", feature=ELR_FEATURE) == 1
    assert one(s, "metactl_elr_clears_total", scope="feature") == 1

    # Broker 4 (no replicas) stops and is fenced, then unregistered.
    await a.service.controller.submit(FenceBroker(broker_id=4))
    assert one(await a.scrape(), "metactl_brokers", state="fenced") == 3
    await a.conn.request(UnregisterBroker(broker_id=4))
    s = await a.scrape()
    assert one(s, "metactl_brokers_unregistered_total") == 1
    assert one(s, "metactl_brokers", state="fenced") == 2
    a.assert_incremental_state_matches_the_image()


async def test_oldest_reassignment_age_on_virtual_time(tmp_path: Path) -> None:
    """The age of the oldest reassignment in progress: it grows with the clock, stays
    with the oldest while a newer one completes, and is 0 once none is left."""
    c = await Cluster.open(tmp_path)
    try:
        await c.start_brokers(1, 2, 3, 4)
        await c.create_topic("m", [[1, 2, 3], [1, 2, 3]], min_isr=2)
        clock = c.ctl.clock
        assert isinstance(clock, VirtualClock)
        clock.set(10_000)
        await c.submit(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="m", partition=0, replicas=[2, 3, 4])]
            )
        )
        clock.set(70_000)
        assert c.value(AGE) == 60
        await c.submit(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="m", partition=1, replicas=[2, 3, 4])]
            )
        )
        clock.set(100_000)
        assert c.value(AGE) == 90 and c.value(REASSIGNING) == 2
        await c.submit(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="m", partition=0, replicas=None)]
            )
        )
        assert c.value(AGE) == 30  # partition 1's, started at 70 s
        assert c.value(REASSIGNMENTS, outcome="cancelled") == 1
        await c.submit(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="m", partition=1, replicas=None)]
            )
        )
        assert c.value(AGE) == 0 and c.value(REASSIGNING) == 0
    finally:
        await c.close()


def test_reassignments_tracker_outcomes() -> None:
    """`Reassignments.update` on its own: start, re-read, complete, and a deleted one."""
    from metadata_image.state import PartitionState

    def state(replicas: tuple[int, ...], adding: tuple[int, ...] = (), removing=()):  # type: ignore[no-untyped-def]
        return PartitionState(
            topic="t",
            partition=0,
            tp=("t", 0),
            replicas=replicas,
            isr=frozenset(replicas),
            adding=adding,
            removing=removing,
        )

    r = Reassignments()
    assert r.update(("t", 0), state((1, 2)), 0) is None
    assert r.update(("t", 0), state((2, 3, 1), (3,), (1,)), 5) == "started"
    assert r.update(("t", 0), state((2, 3, 1), (3,), (1,)), 9) is None  # still moving
    assert r.age_seconds(2005) == 2.0
    assert r.update(("t", 0), state((2, 3)), 10) == "completed"
    assert r.update(("t", 1), state((4, 1), (4,)), 11) == "started"
    assert r.update(("t", 1), None, 12) is None and not r.moving  # deleted
    assert r.age_seconds(99) == 0.0
