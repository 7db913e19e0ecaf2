"""Read-only admin answers from a committed image: DescribeConfigs, DescribeFeatures and
ListPartitionReassignments (kafka-configs --describe, kafka-features describe,
kafka-reassign-partitions --list / --verify).

Owns only the shaping of those answers. Must not decide anything (the core does), read
an uncommitted image (the service passes the committed one: nothing is shown before it
is durable), or do IO.
"""

from __future__ import annotations

from controller.core.config import ControllerConfig
from controller.core.lifecycle import SUPPORTED_FEATURES
from metactl.errors import InvalidRequestError, UnknownTopicOrPartitionError
from metadata_image.image import ClusterImage
from metadata_log.records import BROKER_RESOURCE, ELR_FEATURE, MIN_ISR_CONFIG, TOPIC_RESOURCE
from protocol.messages import (
    ConfigEntry,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeFeaturesResponse,
    FeatureLevel,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
)


def describe_configs(
    image: ClusterImage, req: DescribeConfigsRequest, config: ControllerConfig
) -> DescribeConfigsResponse:
    """min.insync.replicas of a topic (its own, else the cluster default it inherits) or
    of the cluster default, with where the value comes from, as Kafka names sources."""
    # The cluster default: the dynamic one, else the controller's static setting.
    cluster = image.cluster_configs.get(MIN_ISR_CONFIG)
    if cluster is not None:
        value, source = cluster, "DYNAMIC_DEFAULT_BROKER_CONFIG"
    else:
        value, source = str(config.default_min_insync_replicas), "STATIC_BROKER_CONFIG"
    if req.resource_type == TOPIC_RESOURCE:
        t = image.topics.get(req.resource_name)
        if t is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {req.resource_name[:255]}")
        if t.min_isr is not None:  # the topic's own
            value, source = str(t.min_isr), "DYNAMIC_TOPIC_CONFIG"
    elif req.resource_type != BROKER_RESOURCE or req.resource_name != "":
        raise InvalidRequestError(
            "configs are kept for topics and for the cluster default (--entity-default) only"
        )
    entry = ConfigEntry(name=MIN_ISR_CONFIG, value=value, source=source)
    return DescribeConfigsResponse(
        resource_type=req.resource_type, resource_name=req.resource_name, configs=[entry]
    )


def describe_features(image: ClusterImage, config: ControllerConfig) -> DescribeFeaturesResponse:
    out = []
    for name, (low, high) in sorted(SUPPORTED_FEATURES.items()):
        finalized = image.features.get(name)
        effective = finalized
        if effective is None and name == ELR_FEATURE:
            effective = 1 if config.eligible_leader_replicas else 0
        out.append(
            FeatureLevel(
                name=name,
                min_version=low,
                max_version=high,
                finalized=finalized,
                effective=effective or 0,
            )
        )
    return DescribeFeaturesResponse(features=out)


def list_reassignments(
    image: ClusterImage, req: ListPartitionReassignmentsRequest
) -> ListPartitionReassignmentsResponse:
    """The partitions being reassigned (of `req.topics`, if given), in name order."""
    wanted = None if req.topics is None else frozenset(req.topics)
    out = []
    for tp in sorted(image.reassigning):
        if wanted is not None and tp[0] not in wanted:
            continue
        p = image.partitions[tp]
        out.append(
            OngoingReassignment(
                topic=p.topic,
                partition=p.partition,
                replicas=list(p.replicas),
                adding_replicas=list(p.adding),
                removing_replicas=list(p.removing),
            )
        )
    return ListPartitionReassignmentsResponse(reassignments=out)
