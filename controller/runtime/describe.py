"""Turning an image into the wire's describe shapes (used online by the service and
offline by the CLI). Pure: no IO, and nothing here decides anything."""

from __future__ import annotations

from collections.abc import Callable

from metadata_image.image import BrokerState, ClusterImage, TopicPartition
from metadata_image.image import PartitionState as ImagePartition
from metadata_log.records import LeaderRecoveryState
from protocol.messages import BrokerDescription, DescribeClusterResponse, PartitionState


def partition_state(p: ImagePartition, recovery_pending: list[int] | None = None) -> PartitionState:
    return PartitionState(
        topic=p.topic,
        partition=p.partition,
        replicas=list(p.replicas),
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        isr=sorted(p.isr),
        elr=sorted(p.elr),
        last_known_elr=sorted(p.last_known_elr),
        recovering=p.recovery_state is LeaderRecoveryState.RECOVERING,
        recovery_pending=recovery_pending,
        min_isr=p.min_isr,
    )


def broker_description(b: BrokerState, last_heartbeat_age_ms: int | None) -> BrokerDescription:
    return BrokerDescription(
        broker_id=b.broker_id,
        epoch=b.epoch,
        fenced=b.fenced,
        controlled_shutdown=b.in_controlled_shutdown,
        last_registration_clean=b.last_registration_clean,
        last_heartbeat_age_ms=last_heartbeat_age_ms,
        endpoint=b.endpoint,
        rack=b.rack,
    )


def describe_image(
    image: ClusterImage,
    *,
    topic: str | None = None,
    end_offset: int,
    committed_offset: int,
    recovery_pending: Callable[[TopicPartition], list[int] | None] = lambda tp: None,
    heartbeat_age_ms: Callable[[int], int | None] = lambda broker_id: None,
) -> DescribeClusterResponse:
    return DescribeClusterResponse(
        brokers=[
            broker_description(b, heartbeat_age_ms(b.broker_id))
            for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
        ],
        partitions=[
            partition_state(image.partitions[tp], recovery_pending(tp))
            for tp in sorted(image.partitions.keys())
            if topic is None or tp[0] == topic
        ],
        end_offset=end_offset,
        committed_offset=committed_offset,
    )
