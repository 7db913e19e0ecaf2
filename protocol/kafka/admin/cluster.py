"""Kafka's cluster-wide admin APIs in metactl's terms (pure: no IO): UpdateFeatures (one
UpdateFeature per feature), DescribeCluster (a broker's, from its image; a controller's,
KIP-919, from the quorum) and DescribeQuorum (a controller's view of the metadata
partition), with `node_number`, a controller's node id as Kafka's int32.

It must not do IO (the caller's `Call`, image and quorum answer are its inputs).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from metactl.errors import (
    InvalidRequestError,
    MetactlError,
)
from metadata_image.image import ClusterImage
from protocol.address import parse_address
from protocol.kafka import framing as k
from protocol.kafka.admin.common import (
    Call,
    coded,
    error_code,
    error_message,
    throttle_for,
)
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.messages.admin import (
    DescribeQuorumResponse,
    UpdateFeature,
)

MAX_INT32: Final = 2**31 - 1
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "not requested"
ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2  # DescribeCluster's endpoint_type (KIP-919)
METADATA_TOPIC: Final = "__cluster_metadata"  # DescribeQuorum's one partition


# --- UpdateFeatures -----------------------------------------------------------------------


async def update_features(request: Request, call: Call) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.UPDATE_FEATURES, version)
    validate_only = bool(getattr(body, "validate_only", False))
    outcome: list[tuple[str, MetactlError | None]] = []
    for f in body.feature_updates:
        # v0: allow_downgrade; v1+: SAFE_DOWNGRADE (2) or UNSAFE_DOWNGRADE (3).
        downgrade = bool(f.allow_downgrade) if version == 0 else int(f.upgrade_type) in (2, 3)
        error: MetactlError | None = None
        try:
            if int(f.max_version_level) < 0:
                raise InvalidRequestError(f"level {f.max_version_level} of {f.feature} is negative")
            if not validate_only:
                await call(
                    UpdateFeature(
                        name=f.feature,
                        level=int(f.max_version_level),
                        upgrade_type="downgrade" if downgrade else "upgrade",
                    )
                )
        except MetactlError as exc:
            error = exc
        outcome.append((f.feature, error))
    first = next((e for _, e in outcome if e is not None), None)
    if version >= 2:  # no per-feature results: the request's error is the first one
        return make(
            response_cls,
            throttle_time=throttle_for(first),
            error_code=error_code(first),
            error_message=error_message(first),
        )
    result_cls = nested(response_cls, "UpdatableFeatureResult")
    return make(
        response_cls,
        throttle_time=throttle_for(first),
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(
            result_cls(feature=name, error_code=error_code(e), error_message=error_message(e))
            for name, e in outcome
        ),
    )


# --- DescribeCluster ----------------------------------------------------------------------


def _describe_cluster(
    request: Request,
    *,
    served_type: int,
    nodes: Iterable[tuple[int, str, int, str | None, bool]],
    controller_id: int,
    cluster_id: str,
) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DESCRIBE_CLUSTER, version)
    broker_cls = nested(response_cls, "DescribeClusterBroker")
    asked = int(body.endpoint_type) if version >= 1 else ENDPOINT_BROKERS
    error: MetactlError | None = None
    listed: tuple[Any, ...] = ()
    if asked != served_type:
        error = coded(
            "UNSUPPORTED_ENDPOINT_TYPE",
            f"the request was sent to an endpoint of type {served_type}, "
            f"but it wanted an endpoint of type {asked}",
        )
    else:
        include_fenced = bool(getattr(body, "include_fenced_brokers", False))
        listed = tuple(
            make(broker_cls, broker_id=n, host=h, port=p, rack=rack, is_fenced=fenced)
            for n, h, p, rack, fenced in nodes
            if include_fenced or not fenced
        )
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=error_code(error),
        error_message=error_message(error),
        endpoint_type=served_type,
        cluster_id=cluster_id,
        controller_id=controller_id if error is None else -1,
        brokers=listed,
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def describe_cluster_brokers(
    request: Request, image: ClusterImage, *, controller_id: int, cluster_id: str = ""
) -> Any:
    """A broker's DescribeCluster (endpoint type brokers): the registered brokers with a
    Kafka listener (fenced ones only with include_fenced_brokers, v2), and as controller
    a live broker (this one), as KRaft brokers answer clients."""
    nodes = []
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        if not b.kafka_endpoint:
            continue
        host, port = parse_address(b.kafka_endpoint)
        nodes.append((b.broker_id, host, port, b.rack, b.fenced))
    return _describe_cluster(
        request,
        served_type=ENDPOINT_BROKERS,
        nodes=nodes,
        controller_id=controller_id,
        cluster_id=cluster_id,
    )


def node_number(node_id: str) -> int:
    """A controller's node id as Kafka's int32: --node-id if it is a number, else a
    stable positive number made from it (metactl's node ids are names)."""
    text = node_id.strip()
    if text.isdigit() and int(text) <= MAX_INT32:
        return int(text)
    return zlib.crc32(text.encode()) & MAX_INT32


def describe_cluster_controllers(
    request: Request, quorum: DescribeQuorumResponse, kafka_address: str
) -> Any:
    """A controller's DescribeCluster (KIP-919, endpoint type controllers): this
    controller at its Kafka listener (the others' Kafka listeners are not recorded), the
    active one as controller_id when this one is it (-1 otherwise)."""
    me = node_number(quorum.node_id)
    host, port = parse_address(kafka_address)
    return _describe_cluster(
        request,
        served_type=ENDPOINT_CONTROLLERS,
        nodes=[(me, host, port, None, False)],
        controller_id=me if quorum.role == "active" else _leader_number(quorum),
        cluster_id=quorum.cluster_id,
    )


def _leader_number(quorum: DescribeQuorumResponse) -> int:
    if quorum.leader_id is None:
        return -1
    return node_number(quorum.leader_id)


# --- DescribeQuorum -----------------------------------------------------------------------


def describe_quorum(request: Request, quorum: DescribeQuorumResponse, kafka_address: str) -> Any:
    """KRaft's answer for the metadata partition (__cluster_metadata-0) from this
    controller's view: the active controller as leader, its term as the leader epoch (0
    on SQLite), the committed log end as high watermark; the voters are the controllers
    etcd recorded (this one alone on SQLite), each's log end known only for this one."""
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DESCRIBE_QUORUM, version)
    topic_cls = nested(response_cls, "TopicData")
    partition_cls = nested(response_cls, "PartitionData")
    replica_cls = nested(response_cls, "ReplicaState")
    me = node_number(quorum.node_id)
    voters: dict[int, int] = {me: quorum.applied_offset}
    for c in quorum.controllers:
        voters.setdefault(node_number(c.node_id), -1)
    replicas = tuple(
        make(
            replica_cls,
            replica_id=n,
            replica_directory_id=None,
            log_end_offset=end,
            last_fetch_timestamp=-1,
            last_caught_up_timestamp=-1,
        )
        for n, end in sorted(voters.items())
    )
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            known = t.topic_name == METADATA_TOPIC and int(p.partition_index) == 0
            parts.append(
                make(
                    partition_cls,
                    partition_index=p.partition_index,
                    error_code=ErrorCode.none if known else ErrorCode.unknown_topic_or_partition,
                    error_message=None,
                    leader_id=_leader_number(quorum) if known else -1,
                    leader_epoch=(quorum.term or 0) if known else -1,
                    high_watermark=quorum.log_end_offset if known else -1,
                    current_voters=replicas if known else (),
                    observers=(),
                )
            )
        topics.append(topic_cls(topic_name=t.topic_name, partitions=tuple(parts)))
    nodes: tuple[Any, ...] = ()
    if version >= 2:
        node_cls = nested(response_cls, "Node")
        listener_cls = nested(response_cls, "Listener")
        host, port = parse_address(kafka_address)
        nodes = (
            node_cls(node_id=me, listeners=(listener_cls(name="KAFKA", host=host, port=port),)),
        )
    return make(
        response_cls, error_code=ErrorCode.none, error_message=None, topics=tuple(topics),
        nodes=nodes,
    )  # fmt: skip
