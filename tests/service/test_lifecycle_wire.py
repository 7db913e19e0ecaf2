"""The lifecycle requests over real TCP against a real controller on a SQLite log: the
bootstrap records a new cluster gets, random topic ids, each request answered only once
durable (a restarted controller replays the same state), the reads, and named errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metactl.errors import BrokerIdNotRegisteredError, InvalidRequestError
from metadata_log.records import ELR_FEATURE, MIN_ISR_CONFIG
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeFeaturesRequest,
    DescribeFeaturesResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.broker_controller import AlterPartition, IsrMember
from protocol.messages.internal import FenceBroker
from tests.service.test_operator_cli import register

LONG = ControllerConfig(broker_session_timeout_ms=3_600_000, default_min_insync_replicas=2)


async def started(
    path: Path, config: ControllerConfig = LONG
) -> tuple[ControllerService, RpcClient]:
    svc = ControllerService(path, "127.0.0.1:0", config=config)
    await svc.start()
    host, port = parse_address(svc.address)
    return svc, await RpcClient.open(host, port)


async def create(conn: RpcClient, name: str, **kwargs: object) -> str:
    r = await conn.request(CreateTopicsRequest(topics=[CreateTopic(name=name, **kwargs)]))  # type: ignore[arg-type]
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
    topic_id = r.results[0].topic_id
    assert topic_id is not None
    return topic_id


async def test_bootstrap_and_random_ids_across_clusters(tmp_path: Path) -> None:
    ids = []
    for name in ("a", "b"):
        svc, conn = await started(tmp_path / name)
        try:
            await register(conn, 1, "i1")
            ids.append(await create(conn, "demo", replication_factor=1))
            # What the flags seeded is committed, before anything else.
            image = svc.controller.committed_image
            assert image.features[ELR_FEATURE] == 1
            assert image.cluster_configs[MIN_ISR_CONFIG] == "2"
        finally:
            await conn.close()
            await svc.stop()
    assert ids[0] != ids[1]  # the same name on two clusters: two different topics


async def test_the_log_not_the_flag_decides_after_bootstrap(tmp_path: Path) -> None:
    svc, conn = await started(tmp_path)
    await conn.close()
    await svc.stop()
    classic = ControllerConfig(eligible_leader_replicas=False, default_min_insync_replicas=3)
    svc, conn = await started(tmp_path, classic)
    try:
        r = await conn.request(DescribeFeaturesRequest())
        assert isinstance(r, DescribeFeaturesResponse)
        (elr,) = r.features
        assert (elr.name, elr.finalized, elr.effective) == (ELR_FEATURE, 1, 1)
        r2 = await conn.request(DescribeConfigsRequest(resource_type="broker", resource_name=""))
        assert isinstance(r2, DescribeConfigsResponse)
        assert (r2.configs[0].value, r2.configs[0].source) == ("2", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    finally:
        await conn.close()
        await svc.stop()


async def test_every_lifecycle_request_over_the_wire_and_after_a_restart(tmp_path: Path) -> None:
    svc, conn = await started(tmp_path)
    try:
        for b in (1, 2, 3, 4):
            await register(conn, b, f"i{b}")
        first_id = await create(conn, "t", assignments=[[1, 2, 3], [2, 3, 4]])
        r = await conn.request(
            AlterConfigs(
                resource_type="topic", resource_name="t", set_configs={MIN_ISR_CONFIG: "3"}
            )
        )
        assert r == AlterConfigsResponse(resource_type="topic", resource_name="t", cleared_topics=1)
        r = await conn.request(DescribeConfigsRequest(resource_type="topic", resource_name="t"))
        assert isinstance(r, DescribeConfigsResponse)
        assert (r.configs[0].value, r.configs[0].source) == ("3", "DYNAMIC_TOPIC_CONFIG")
        r = await conn.request(
            AlterPartitionReassignments(
                reassignments=[
                    Reassignment(topic="t", partition=0, replicas=[2, 3, 4]),
                    Reassignment(topic="t", partition=7, replicas=[1]),
                ]
            )
        )
        assert isinstance(r, AlterPartitionReassignmentsResponse)
        assert [x.error_code for x in r.results] == [None, "UNKNOWN_TOPIC_OR_PARTITION"]
        r = await conn.request(ListPartitionReassignmentsRequest())
        assert isinstance(r, ListPartitionReassignmentsResponse)
        assert [
            (x.topic, x.partition, x.adding_replicas, x.removing_replicas) for x in r.reassignments
        ] == [("t", 0, [4], [1])]
        r = await conn.request(
            CreatePartitionsRequest(topics=[CreatePartitions(topic="t", count=3)])
        )
        assert isinstance(r, CreatePartitionsResponse)
        assert r.results[0].error_code is None and len(r.results[0].assignments or []) == 1
        r = await conn.request(
            CreatePartitionsRequest(topics=[CreatePartitions(topic="t", count=2)])
        )
        assert isinstance(r, CreatePartitionsResponse)
        assert r.results[0].error_code == "INVALID_PARTITIONS"
        r = await conn.request(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
        assert r == UpdateFeatureResponse(name=ELR_FEATURE, level=0, cleared_topics=1)
        with pytest.raises(InvalidRequestError, match="is active"):
            await conn.request(UnregisterBroker(broker_id=1))
        r = await conn.request(DeleteTopicsRequest(topics=["t", "nope"]))
        assert isinstance(r, DeleteTopicsResponse)
        assert [(x.topic_id, x.error_code) for x in r.results] == [
            (first_id, None),
            (None, "UNKNOWN_TOPIC_OR_PARTITION"),
        ]
        second_id = await create(conn, "t", replication_factor=2)
        assert second_id != first_id
        before = svc.controller.committed_image
    finally:
        await conn.close()
        await svc.stop()
    # Everything acknowledged was durable: a new controller on the same log replays it.
    svc, conn = await started(tmp_path)
    try:
        after = svc.controller.committed_image
        assert after.topics["t"].topic_id == second_id
        assert after.features[ELR_FEATURE] == 0 and not after.reassigning
        assert after.topics == before.topics and after.partitions == before.partitions
        with pytest.raises(BrokerIdNotRegisteredError):
            await conn.request(UnregisterBroker(broker_id=9))
    finally:
        await conn.close()
        await svc.stop()


async def test_the_last_unclean_recovery_shows_after_a_restart(tmp_path: Path) -> None:
    """Issue 22 item 2: online describe lost a partition's recent unclean recovery once
    the controller restarted (its notes were process memory); the image now keeps each
    partition's last one, with the time it was decided."""
    svc, conn = await started(tmp_path)
    try:
        for b in (1, 2):
            await register(conn, b, f"i{b}")
        await create(conn, "t", assignments=[[1, 2]], min_isr=1)
        # Both fenced (as a session expiry does), through the core as any event.
        await svc.controller.submit(FenceBroker(broker_id=2))
        await svc.controller.submit(FenceBroker(broker_id=1))
        await register(conn, 2, "i2-again")  # a new incarnation, unclean: not in the ELR
        r = await conn.request(
            ElectLeader(topic="t", partition=0, election_type="unclean", replica=2)
        )
        assert getattr(r, "leader", None) == 2
    finally:
        await conn.close()
        await svc.stop()
    svc, conn = await started(tmp_path)
    try:
        d = await conn.request(DescribeClusterRequest(topic="t"))
        assert isinstance(d, DescribeClusterResponse)
        (p,) = d.partitions
        assert p.last_unclean_recovery is not None
        assert (p.last_unclean_recovery.chosen, p.last_unclean_recovery.strategy) == (2, "manual")
        # Outside the window asked for, it is not shown.
        d = await conn.request(DescribeClusterRequest(topic="t", recoveries_within_ms=0))
        assert isinstance(d, DescribeClusterResponse)
        assert d.partitions[0].last_unclean_recovery is None
    finally:
        await conn.close()
        await svc.stop()


async def test_a_bulk_preferred_election_in_pieces_over_the_wire(tmp_path: Path) -> None:
    """ElectPreferredLeaders of every partition: the service cuts it into work-budget
    pieces, each its own event and commit, and sums their answers."""
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=LONG, work_budget=3)
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address))
    try:
        for b in (1, 2):
            await register(conn, b, f"i{b}")
        await create(conn, "t", assignments=[[1, 2]] * 5 + [[2, 1]] * 2, min_isr=1)
        await svc.controller.submit(FenceBroker(broker_id=1))
        await register(conn, 1, "i1-again")  # back, not in the ISRs yet
        before = svc.controller.committed_image.end_offset
        r = await conn.request(ElectPreferredLeaders())
        assert isinstance(r, ElectPreferredLeadersResponse)
        assert (r.elected, r.not_needed, r.not_available) == (0, 2, 5)
        assert svc.controller.committed_image.end_offset == before  # nothing to write
        # Back in the ISRs (as their leader would report it): every one moves back.
        image = svc.controller.committed_image
        for i in range(5):
            p = image.partitions[("t", i)]
            await svc.controller.submit(
                AlterPartition(
                    topic="t",
                    partition=i,
                    leader=2,
                    broker_epoch=image.brokers[2].epoch,
                    partition_epoch=p.partition_epoch,
                    isr=[
                        IsrMember(broker_id=b, broker_epoch=image.brokers[b].epoch) for b in (1, 2)
                    ],
                )
            )
        r = await conn.request(ElectPreferredLeaders())
        assert isinstance(r, ElectPreferredLeadersResponse)
        assert (r.elected, r.not_needed, r.not_available, r.failures) == (5, 2, 0, [])
        leaders = [svc.controller.committed_image.partitions[("t", i)].leader for i in range(7)]
        assert leaders == [1] * 5 + [2] * 2
    finally:
        await conn.close()
        await svc.stop()
