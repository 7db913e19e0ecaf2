"""Kafka's admin APIs in metactl's terms (pure: no IO): which versions are served, the
translation of a kio request into metactl's own admin messages, and of their answers (or
a `MetactlError`) back into the kio response at the request's version, with Kafka's
error codes (metactl's codes are Kafka's names) and messages.

`answer_admin(request, call, image)` answers one admin request: `call` sends one native
message and returns its answer or raises the error it was refused with (the broker's
forwarder: over its controller client, in an envelope naming the client's principal; the
controller's own Kafka listener: in-process, admitted as the native path admits), and
`image` is the asker's metadata image (the broker's, or the controller's committed one),
read for what Kafka's request leaves to the server: the replica of an UNCLEAN election,
the partitions of an election of all of them, validate_only's checks, topic ids.

| API | key | versions | native message |
| --- | --- | --- | --- |
| CreateTopics | 19 | 2-7 | CreateTopicsRequest |
| DeleteTopics | 20 | 1-6 | DeleteTopicsRequest |
| CreatePartitions | 37 | 0-3 | CreatePartitionsRequest |
| DescribeConfigs | 32 | 1-4 | DescribeConfigsRequest, one per resource |
| IncrementalAlterConfigs | 44 | 0-1 | AlterConfigs, one per resource |
| ElectLeaders | 43 | 0-2 | ElectLeader per partition; ElectPreferredLeaders for all |
| AlterPartitionReassignments | 45 | 0-1 | AlterPartitionReassignments |
| ListPartitionReassignments | 46 | 0 | ListPartitionReassignmentsRequest v2, every page |
| UpdateFeatures | 57 | 0-2 | UpdateFeature, one per feature |
| DescribeCluster | 60 | 0-2 | none: the image (brokers) or the quorum (controllers) |
| DescribeQuorum | 55 | 0-2 | DescribeQuorumRequest (controllers only) |

The versions are every one kio 0.6.5 has (Kafka 4's ranges, after KIP-896 removed the
oldest): librdkafka 2.x and the Java client negotiate within them. docs/kafka.md, "Admin
over Kafka's protocol", has every difference from Kafka.

The package: `topics` (CreateTopics, DeleteTopics, CreatePartitions), `configs`
(DescribeConfigs, IncrementalAlterConfigs), `replicas` (ElectLeaders, the partition
reassignments), `cluster` (UpdateFeatures, DescribeCluster, DescribeQuorum), `common`
(the version tables, the error mapping, the native call). This module dispatches a
forwarded request to its translation; it and they must not do IO (`call` does) or decide
what the controller decides.
"""

from __future__ import annotations

from typing import Any

from metadata_image.image import ClusterImage
from protocol.kafka import framing as k
from protocol.kafka.admin.cluster import (
    describe_cluster_brokers,
    describe_cluster_controllers,
    describe_quorum,
    node_number,
    update_features,
)
from protocol.kafka.admin.common import (
    ADMIN_SERVED,
    CONTROLLER_SERVED,
    FORWARDED,
    Call,
    error_code,
)
from protocol.kafka.admin.configs import describe_configs, incremental_alter_configs
from protocol.kafka.admin.replicas import (
    alter_reassignments,
    elect_leaders,
    list_reassignments,
)
from protocol.kafka.admin.topics import create_partitions, create_topics, delete_topics
from protocol.kafka.framing import Request

__all__ = [
    "ADMIN_SERVED",
    "CONTROLLER_SERVED",
    "FORWARDED",
    "Call",
    "answer_admin",
    "describe_cluster_brokers",
    "describe_cluster_controllers",
    "describe_quorum",
    "error_code",
    "node_number",
]


async def answer_admin(request: Request, call: Call, image: ClusterImage | None) -> Any:
    """The kio response to one forwarded admin API (`FORWARDED`) at the request's version."""
    match request.api_key:
        case k.CREATE_TOPICS:
            return await create_topics(request, call, image)
        case k.DELETE_TOPICS:
            return await delete_topics(request, call, image)
        case k.CREATE_PARTITIONS:
            return await create_partitions(request, call, image)
        case k.DESCRIBE_CONFIGS:
            return await describe_configs(request, call)
        case k.INCREMENTAL_ALTER_CONFIGS:
            return await incremental_alter_configs(request, call, image)
        case k.ELECT_LEADERS:
            return await elect_leaders(request, call, image)
        case k.ALTER_PARTITION_REASSIGNMENTS:
            return await alter_reassignments(request, call, image)
        case k.LIST_PARTITION_REASSIGNMENTS:
            return await list_reassignments(request, call)
        case k.UPDATE_FEATURES:
            return await update_features(request, call)
    raise AssertionError(f"api_key {request.api_key} is not an admin API")
