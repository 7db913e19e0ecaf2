"""Who may send the controller which request: `authorize(principal, request) -> operation`.

A principal is the common name of a peer's verified certificate (protocol/tls.py):
`controller`, `admin`, `viewer` or `broker-<id>`; any other name is unknown and may do
nothing. The rules (docs/protocol.md, "Authorization"):

| request | operation | who may send it |
| --- | --- | --- |
| BrokerRegistration | register_broker | `broker-<broker_id>` |
| BrokerHeartbeat | heartbeat | `broker-<broker_id>` |
| BrokerHeartbeat with want_shutdown | controlled_shutdown | `broker-<broker_id>` |
| AlterPartition | alter_partition | `broker-<leader>` |
| AlterPartitions | alter_partition | `broker-<leader>` of every item |
| FetchMetadata | fetch_metadata | any known principal |
| DescribeCluster | describe_cluster | any known principal |
| CreateTopics | create_topics | `admin` |
| ElectLeaders | elect_preferred, elect_unclean | `admin` |
| ElectPreferredLeaders | elect_preferred | `admin` |
| DeleteTopics | delete_topics | `admin` (TOPIC_AUTHORIZATION_FAILED) |
| CreatePartitions | create_partitions | `admin` (TOPIC_AUTHORIZATION_FAILED) |
| IncrementalAlterConfigs | alter_configs | `admin` |
| UpdateFeatures | update_features | `admin` |
| AlterPartitionReassignments | alter_reassignments | `admin` |
| UnregisterBroker | unregister_broker | `admin` |
| DescribeConfigs | describe_configs | any known principal |
| DescribeFeatures | describe_features | any known principal |
| ListPartitionReassignments | list_reassignments | any known principal |
| DescribeQuorum | describe_quorum | any known principal |
| PlanRestart | plan_restart | any known principal (a read: a plan changes nothing) |
| PlanRoll | plan_roll | any known principal |
| Envelope | envelope | any `broker-<id>`; then its inner request as if its `principal` sent it |
| anything else | unsupported | nobody |

An Envelope is a client's admin request that a broker's Kafka listener forwards (as
Kafka's brokers forward to the KRaft controller): `authorize` checks the envelope (a
broker sent it) and then its inner request against the envelope's principal, raising the
inner request's refusal (naming the client's principal); an envelope from anyone else is
CLUSTER_AUTHORIZATION_FAILED, and its inner request is not looked at.

A refusal is TOPIC_AUTHORIZATION_FAILED for creating, deleting and growing topics and
CLUSTER_AUTHORIZATION_FAILED for everything else, as Kafka names them. Deny by default:
a request type without a rule here is refused, so a request the service learns to
dispatch stays closed until someone writes its rule. A None principal (no certificate)
is unknown: the runtime calls `authorize` only when TLS is on; without TLS (`--insecure`)
authorization is off altogether.

This module decides and raises; it must not log, count, read the image or the clock, or
do any IO (the runtime does those: controller/runtime/admission.py). The
brokers' own rules (GetReplicaLogInfo, ReplicaFetch, Produce, ReadLog) live in
brokers_stub/broker.py, which may not import the controller.
"""

from __future__ import annotations

from typing import Final

from metactl.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeFeaturesRequest,
    DescribeQuorumRequest,
    ElectLeader,
    ElectPreferredLeaders,
    Envelope,
    ListPartitionReassignmentsRequest,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    BrokerHeartbeatRequest,
    FetchMetadataRequest,
    RegisterBroker,
)
from protocol.messages.plan import PlanRestartRequest, PlanRollRequest
from protocol.messages.unions import Message
from protocol.tls import ADMIN, CONTROLLER, VIEWER, broker_id_of

# Every operation name `operation_of` can return: the `operation` label of
# metactl_authorization_failures_total takes only these values.
OPERATIONS: Final = (
    "register_broker",
    "heartbeat",
    "controlled_shutdown",
    "alter_partition",
    "fetch_metadata",
    "describe_cluster",
    "create_topics",
    "elect_preferred",
    "elect_unclean",
    "delete_topics",
    "create_partitions",
    "alter_configs",
    "update_features",
    "alter_reassignments",
    "unregister_broker",
    "describe_configs",
    "describe_features",
    "list_reassignments",
    "describe_quorum",
    "envelope",
    "unsupported",
    "plan_restart",
    "plan_roll",
)

# What `authorize` raises, for an `except` clause.
AUTHORIZATION_ERRORS: Final = (ClusterAuthorizationFailedError, TopicAuthorizationFailedError)


def operation_of(request: Message) -> str:
    """The operation a request asks for (one of OPERATIONS), whoever sends it."""
    match request:
        case RegisterBroker():
            return "register_broker"
        case BrokerHeartbeatRequest(want_shutdown=True):
            return "controlled_shutdown"
        case BrokerHeartbeatRequest():
            return "heartbeat"
        case AlterPartition() | AlterPartitions():
            return "alter_partition"
        case FetchMetadataRequest():
            return "fetch_metadata"
        case DescribeClusterRequest():
            return "describe_cluster"
        case CreateTopicsRequest():
            return "create_topics"
        case ElectLeader(election_type="preferred"):
            return "elect_preferred"
        case ElectLeader():
            return "elect_unclean"
        case ElectPreferredLeaders():
            return "elect_preferred"
        case DeleteTopicsRequest():
            return "delete_topics"
        case CreatePartitionsRequest():
            return "create_partitions"
        case AlterConfigs():
            return "alter_configs"
        case UpdateFeature():
            return "update_features"
        case AlterPartitionReassignments():
            return "alter_reassignments"
        case UnregisterBroker():
            return "unregister_broker"
        case DescribeConfigsRequest():
            return "describe_configs"
        case DescribeFeaturesRequest():
            return "describe_features"
        case ListPartitionReassignmentsRequest():
            return "list_reassignments"
        case DescribeQuorumRequest():
            return "describe_quorum"
        case Envelope():
            return "envelope"
        case PlanRestartRequest():
            return "plan_restart"
        case PlanRollRequest():
            return "plan_roll"
    return "unsupported"


def is_known(principal: str | None) -> bool:
    """Whether the principal is one the cluster issues: controller, admin, viewer or a
    broker-<id> with a valid id."""
    return principal in (CONTROLLER, ADMIN, VIEWER) or broker_id_of(principal) is not None


def authorize(principal: str | None, request: Message) -> str:
    """The operation `request` performs, if `principal` may perform it; otherwise raise
    TopicAuthorizationFailedError (creating topics) or ClusterAuthorizationFailedError
    (everything else), naming the principal and the operation."""
    operation = operation_of(request)
    who = "no principal" if principal is None else f"principal {principal!r}"
    match request:
        case Envelope():
            if broker_id_of(principal) is None:
                raise ClusterAuthorizationFailedError(
                    f"{who} may not forward a request (envelope): only a broker may"
                )
            authorize(request.principal, request.request)
        case RegisterBroker() | BrokerHeartbeatRequest():
            _require_broker(principal, request.broker_id, operation, who)
        case AlterPartition():
            _require_broker(principal, request.leader, operation, who)
        case AlterPartitions():
            if broker_id_of(principal) is None:  # even with no items: brokers only
                raise ClusterAuthorizationFailedError(
                    f"{who} may not {operation}: only a broker may"
                )
            for item in request.items:  # a broker speaks for the partitions it leads
                _require_broker(principal, item.leader, operation, who)
        case (
            FetchMetadataRequest()
            | DescribeClusterRequest()
            | DescribeConfigsRequest()
            | DescribeFeaturesRequest()
            | ListPartitionReassignmentsRequest()
            | DescribeQuorumRequest()
            | PlanRestartRequest()
            | PlanRollRequest()
        ):
            if not is_known(principal):
                raise ClusterAuthorizationFailedError(f"{who} is unknown: may not {operation}")
        case CreateTopicsRequest() | DeleteTopicsRequest() | CreatePartitionsRequest():
            if principal != ADMIN:
                raise TopicAuthorizationFailedError(f"{who} may not {operation}: needs {ADMIN!r}")
        case ElectLeader():
            if principal != ADMIN:
                raise ClusterAuthorizationFailedError(
                    f"{who} may not {operation} ({request.topic}-{request.partition}): "
                    f"needs {ADMIN!r}"
                )
        case (
            AlterConfigs()
            | UpdateFeature()
            | AlterPartitionReassignments()
            | UnregisterBroker()
            | ElectPreferredLeaders()
        ):
            if principal != ADMIN:
                raise ClusterAuthorizationFailedError(f"{who} may not {operation}: needs {ADMIN!r}")
        case _:
            raise ClusterAuthorizationFailedError(
                f"{who} may not send {type(request).__name__} to the controller"
            )
    return operation


def _require_broker(principal: str | None, broker_id: int, operation: str, who: str) -> None:
    """A broker speaks only for its own id."""
    own = broker_id_of(principal)
    if own is None:
        raise ClusterAuthorizationFailedError(
            f"{who} may not {operation}: only broker-{broker_id} may"
        )
    if own != broker_id:
        raise ClusterAuthorizationFailedError(
            f"{who} may {operation} only for broker {own}, not for {broker_id}"
        )
