"""The Kafka answers built from a metadata image alone (pure): the brokers' and the
controller's listeners share them.

- ApiVersions: the listener's served ranges (nothing else advertised); from v3 the
  finalized features of the image (`eligible.leader.replicas.version` among them) at the
  image's end offset as their epoch. A version above the range: v0, UNSUPPORTED_VERSION,
  and ApiVersions' own range, as Kafka answers.
- Metadata: the live brokers (registered, unfenced) that have a Kafka listener; every
  topic asked for (all of them for a null list, or an empty one at v0) with its id and
  partitions: leader, leader epoch, replicas, ISR, offline replicas (on a broker fenced
  or not registered). A leaderless partition is LEADER_NOT_AVAILABLE, a leader without
  a Kafka listener LISTENER_NOT_FOUND, a missing topic UNKNOWN_TOPIC_OR_PARTITION. Topics
  are never created (allow_auto_topic_creation is ignored).
- DescribeTopicPartitions v0 (KIP-966): the same per partition plus the
  EligibleLeaderReplicas and LastKnownElr, topics in name order, at most
  `response_partition_limit` partitions (capped at `MAX_PARTITIONS`, Kafka's
  max.request.partition.size.limit), the cursor saying where to go on.

Entities differ between versions of one API (fields come and go); `make` builds an
entity from the fields its version has, so one function serves every version.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import uuid
from collections.abc import Iterable
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState
from protocol.address import parse_address
from protocol.kafka.framing import (
    API_VERSIONS,
    DESCRIBE_TOPIC_PARTITIONS,
    METADATA,
    Request,
    Served,
)

MAX_PARTITIONS: Final = 2000  # Kafka's max.request.partition.size.limit default
NO_THROTTLE: Final = datetime.timedelta(0)
ZERO_UUID: Final = uuid.UUID(int=0)


def make(cls: Any, **values: Any) -> Any:
    """`cls(...)` with the values of the fields `cls` has (a version's entity)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def nested(response_cls: Any, name: str) -> Any:
    """An entity class of the module of `response_cls` (the same version), by its name."""
    return getattr(importlib.import_module(response_cls.__module__), name)


# --- Metadata ---------------------------------------------------------------------------


def metadata(
    request: Request, image: ClusterImage, *, controller_id: int, cluster_id: str | None
) -> Any:
    """Metadata at the request's version; `controller_id` is what clients are told (KRaft
    brokers name a live broker: clients cannot reach the controller through Metadata).
    The cluster id is "" when the broker's storage has none yet: librdkafka's
    describe_cluster() dies on a null one."""
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(METADATA, version)
    broker_cls = nested(response_cls, "MetadataResponseBroker")
    topic_cls = nested(response_cls, "MetadataResponseTopic")
    partition_cls = nested(response_cls, "MetadataResponsePartition")
    brokers = [
        make(broker_cls, node_id=b.broker_id, host=host, port=port, rack=b.rack)
        for b, (host, port) in _kafka_brokers(image)
    ]
    asked = body.topics
    if asked is None or (version == 0 and not asked):
        names: Iterable[str | None] = sorted(image.topics)
    else:
        names = [t.name for t in asked]  # by id (v10+) is not served: no name, unknown
    topics = []
    for name in names:
        topic = image.topics.get(name) if name is not None else None
        if topic is None:
            topics.append(
                make(
                    topic_cls,
                    error_code=ErrorCode.unknown_topic_or_partition,
                    name=name if name is not None else "",
                    topic_id=ZERO_UUID,
                    partitions=(),
                )
            )
            continue
        partitions = [
            make(partition_cls, **_partition_fields(p, image))
            for p in _partitions(image, topic.name, 0, topic.partitions)
        ]
        topics.append(
            make(
                topic_cls,
                error_code=ErrorCode.none,
                name=topic.name,
                topic_id=uuid.UUID(topic.topic_id),
                is_internal=False,
                partitions=tuple(partitions),
            )
        )
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        brokers=tuple(brokers),
        cluster_id=cluster_id or "",
        controller_id=controller_id,
        topics=tuple(topics),
    )


def _kafka_brokers(image: ClusterImage) -> list[tuple[Any, tuple[str, int]]]:
    """The live brokers (registered, unfenced) with a Kafka listener, by id."""
    out = []
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        if b.fenced or not b.kafka_endpoint:
            continue
        out.append((b, parse_address(b.kafka_endpoint)))
    return out


def _partitions(image: ClusterImage, topic: str, first: int, count: int) -> list[PartitionState]:
    return [p for i in range(first, count) if (p := image.partition((topic, i))) is not None]


def _partition_fields(p: PartitionState, image: ClusterImage) -> dict[str, Any]:
    """The fields Metadata and DescribeTopicPartitions share, Kafka's errors included."""
    leader_state = image.brokers.get(p.leader) if p.leader >= 0 else None
    if leader_state is None:
        error, leader = ErrorCode.leader_not_available, -1
    elif not leader_state.kafka_endpoint:
        error, leader = ErrorCode.listener_not_found, -1
    else:
        error, leader = ErrorCode.none, p.leader
    offline = [r for r in p.replicas if (b := image.brokers.get(r)) is None or b.fenced]
    return {
        "error_code": error,
        "partition_index": p.partition,
        "leader_id": leader,
        "leader_epoch": p.leader_epoch,
        "replica_nodes": tuple(p.replicas),
        "isr_nodes": tuple(sorted(p.isr)),
        "offline_replicas": tuple(offline),
        "eligible_leader_replicas": tuple(sorted(p.elr)),
        "last_known_elr": tuple(sorted(p.last_known_elr)),
    }


# --- ApiVersions ------------------------------------------------------------------------


def api_versions(version: int, image: ClusterImage, served: Served) -> Any:
    response_cls: Any = load_response_schema(API_VERSIONS, version)
    key_cls = nested(response_cls, "ApiVersion")
    keys = tuple(
        make(key_cls, api_key=k, min_version=low, max_version=high)
        for k, (low, high) in sorted(served.items())
    )
    features: dict[str, Any] = {}
    if version >= 3:
        feature_cls = nested(response_cls, "FinalizedFeatureKey")
        features = {
            "finalized_features_epoch": image.end_offset,
            "finalized_features": tuple(
                make(feature_cls, name=n, max_version_level=lv, min_version_level=lv)
                for n, lv in sorted(image.features.items())
            ),
        }
    return make(
        response_cls,
        error_code=ErrorCode.none,
        api_keys=keys,
        throttle_time=NO_THROTTLE,
        **features,
    )


def api_versions_unsupported(served: Served) -> Any:
    """Kafka's answer to ApiVersions at a version it does not know: v0, UNSUPPORTED_VERSION,
    and ApiVersions' own range, so that the client retries at a version both know."""
    response_cls: Any = load_response_schema(API_VERSIONS, 0)
    key_cls = nested(response_cls, "ApiVersion")
    low, high = served[API_VERSIONS]
    return response_cls(
        error_code=ErrorCode.unsupported_version,
        api_keys=(key_cls(api_key=API_VERSIONS, min_version=low, max_version=high),),
    )


# --- DescribeTopicPartitions ------------------------------------------------------------


def describe_topic_partitions(body: Any, image: ClusterImage) -> Any:
    response_cls: Any = load_response_schema(DESCRIBE_TOPIC_PARTITIONS, 0)
    topic_cls = nested(response_cls, "DescribeTopicPartitionsResponseTopic")
    partition_cls = nested(response_cls, "DescribeTopicPartitionsResponsePartition")
    cursor_cls = nested(response_cls, "Cursor")
    limit = max(1, min(int(body.response_partition_limit), MAX_PARTITIONS))
    names = sorted({t.name for t in body.topics}) if body.topics else sorted(image.topics)
    start_name, start_partition = (
        (body.cursor.topic_name, int(body.cursor.partition_index))
        if body.cursor is not None
        else (None, 0)
    )
    remaining = limit
    topics = []
    next_cursor = None
    for name in names:
        if start_name is not None and name < start_name:
            continue
        first = max(0, start_partition) if name == start_name else 0
        topic = image.topics.get(name)
        if topic is None:
            topics.append(
                topic_cls(
                    error_code=ErrorCode.unknown_topic_or_partition,
                    name=name,
                    topic_id=ZERO_UUID,
                    partitions=(),
                )
            )
            continue
        if remaining == 0:
            next_cursor = cursor_cls(topic_name=name, partition_index=first)
            break
        partitions = []
        for p in _partitions(image, name, first, topic.partitions):
            if remaining == 0:
                next_cursor = cursor_cls(topic_name=name, partition_index=p.partition)
                break
            partitions.append(make(partition_cls, **_partition_fields(p, image)))
            remaining -= 1
        topics.append(
            topic_cls(
                error_code=ErrorCode.none,
                name=name,
                topic_id=uuid.UUID(topic.topic_id),
                partitions=tuple(partitions),
            )
        )
        if next_cursor is not None:
            break
    return response_cls(throttle_time=NO_THROTTLE, topics=tuple(topics), next_cursor=next_cursor)
