"""The unions: `Message`, every message that travels on the wire (requests and responses
in one union, so that one decoder serves both ends: the controller also sends
GetReplicaLogInfo to brokers), and `ControllerRequest`/`ControllerResponse`, what the
controller's event step decides over and answers. A message's module says who sends it;
this one says what may be decoded.

Data only: no IO, no rules.
"""

from __future__ import annotations

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
    DeleteTopic,
    DeleteTopicResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeFeaturesRequest,
    DescribeFeaturesResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    Envelope,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    PartitionState,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.base import (
    ErrorResponse,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.data import (
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
    ReadLogResponse,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopicResponse,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)
from protocol.messages.plan import (
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)
from protocol.messages.replication import (
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)

# --- unions -------------------------------------------------------------------------------

# What the controller's event step decides over, and what it answers.
ControllerRequest = (
    RegisterBroker
    | BrokerHeartbeatRequest
    | FenceBroker
    | UnfenceBroker
    | ControlledShutdown
    | AlterPartition
    | AlterPartitions
    | CreateTopic
    | ElectLeader
    | ReplicaLogInfo
    | DeleteTopic
    | CreatePartitions
    | AlterConfigs
    | UpdateFeature
    | AlterPartitionReassignments
    | UnregisterBroker
)

ControllerResponse = (
    Ack
    | RegisterBrokerResponse
    | BrokerHeartbeatResponse
    | ControlledShutdownResponse
    | PartitionView
    | AlterPartitionsResponse
    | CreateTopicResponse
    | DeleteTopicResponse
    | AlterConfigsResponse
    | UpdateFeatureResponse
    | AlterPartitionReassignmentsResponse
    | ElectPreferredLeadersResponse
)

# What travels on the wire. Requests and responses share one union so one decoder serves
# both ends (the controller also *sends* GetReplicaLogInfo to brokers).
Message = (
    RegisterBroker
    | RegisterBrokerResponse
    | BrokerHeartbeatRequest
    | BrokerHeartbeatResponse
    | AlterPartition
    | PartitionState
    | AlterPartitions
    | AlterPartitionsResponse
    | FetchMetadataRequest
    | FetchMetadataResponse
    | CreateTopicsRequest
    | CreateTopicsResponse
    | ElectLeader
    | DescribeClusterRequest
    | DescribeClusterResponse
    | GetReplicaLogInfoRequest
    | GetReplicaLogInfoResponse
    | ReplicaFetchRequest
    | ReplicaFetchResponse
    | ProduceRequest
    | ProduceResponse
    | ReadLogRequest
    | ReadLogResponse
    | ErrorResponse
    | DeleteTopicsRequest
    | DeleteTopicsResponse
    | CreatePartitionsRequest
    | CreatePartitionsResponse
    | AlterConfigs
    | AlterConfigsResponse
    | DescribeConfigsRequest
    | DescribeConfigsResponse
    | UpdateFeature
    | UpdateFeatureResponse
    | DescribeFeaturesRequest
    | DescribeFeaturesResponse
    | AlterPartitionReassignments
    | AlterPartitionReassignmentsResponse
    | ListPartitionReassignmentsRequest
    | ListPartitionReassignmentsResponse
    | UnregisterBroker
    | Ack
    | ElectPreferredLeaders
    | ElectPreferredLeadersResponse
    | DescribeQuorumRequest
    | DescribeQuorumResponse
    | Envelope
    | PlanRestartRequest
    | PlanRestartResponse
    | PlanRollRequest
    | PlanRollResponse
)
