"""The controller's authorization rules (controller/core/authz.py): every request against
every kind of principal, the broker-speaks-for-itself rule over arbitrary ids, and
deny-by-default for every message type without a rule."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.authz import (
    AUTHORIZATION_ERRORS,
    OPERATIONS,
    authorize,
    is_known,
    operation_of,
)
from metactl.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    CreatePartitions,
    CreatePartitionsRequest,
    CreateTopic,
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
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    BrokerHeartbeatRequest,
    FetchMetadataRequest,
    GetReplicaLogInfoRequest,
    IsrMember,
    RegisterBroker,
    ReplicaRef,
)
from protocol.messages.data import ProduceRequest, ReadLogRequest
from protocol.messages.plan import PlanRestartRequest, PlanRollRequest
from protocol.messages.replication import ReplicaFetchRequest
from protocol.messages.unions import Message
from protocol.tls import MAX_BROKER_ID

CONTROLLER_P, ADMIN_P, VIEWER_P = "controller", "admin", "viewer"
B1, B2, B3 = "broker-1", "broker-2", "broker-3"
UNKNOWN = ("mallory", "broker-01", "broker--1", f"broker-{MAX_BROKER_ID + 1}", "Admin", "", None)
KNOWN = (CONTROLLER_P, ADMIN_P, VIEWER_P, B1, B2, B3)
EVERYONE = (*KNOWN, *UNKNOWN)

REGISTER_2 = RegisterBroker(broker_id=2, incarnation_id="i", endpoint="127.0.0.1:1")
HEARTBEAT_2 = BrokerHeartbeatRequest(broker_id=2, broker_epoch=5, metadata_offset=6)
SHUTDOWN_3 = BrokerHeartbeatRequest(
    broker_id=3, broker_epoch=7, metadata_offset=8, want_shutdown=True
)
ALTER_LED_BY_1 = AlterPartition(
    topic="demo",
    partition=0,
    leader=1,
    broker_epoch=3,
    partition_epoch=0,
    isr=[IsrMember(broker_id=1, broker_epoch=3)],
)
BATCH_LED_BY_1 = AlterPartitions(
    items=[ALTER_LED_BY_1, msgspec.structs.replace(ALTER_LED_BY_1, partition=1)]
)
# One item of another leader's refuses the whole request, however many are broker 1's.
BATCH_MIXED = AlterPartitions(
    items=[ALTER_LED_BY_1, msgspec.structs.replace(ALTER_LED_BY_1, partition=1, leader=2)]
)
FETCH = FetchMetadataRequest(from_offset=0)
DESCRIBE = DescribeClusterRequest()
CREATE = CreateTopicsRequest(topics=[CreateTopic(name="t", partitions=1)])
ELECT_PREFERRED = ElectLeader(topic="demo", partition=2, election_type="preferred")
ELECT_UNCLEAN = ElectLeader(topic="demo", partition=0, election_type="unclean", replica=2)
DELETE = DeleteTopicsRequest(topics=["t"])
GROW = CreatePartitionsRequest(topics=[CreatePartitions(topic="t", count=3)])
ALTER_CONFIGS = AlterConfigs(
    resource_type="topic", resource_name="t", set_configs={"min.insync.replicas": "2"}
)
FEATURE = UpdateFeature(name="eligible.leader.replicas.version", level=0)
REASSIGN = AlterPartitionReassignments(
    reassignments=[Reassignment(topic="t", partition=0, replicas=[2])]
)
UNREGISTER = UnregisterBroker(broker_id=2)
ELECT_ALL = ElectPreferredLeaders()
NOT_FOR_THE_CONTROLLER: tuple[Message, ...] = (
    GetReplicaLogInfoRequest(broker_id=1, broker_epoch=1, partitions=[ReplicaRef("demo", 0)]),
    ReplicaFetchRequest(
        topic="demo",
        partition=0,
        follower_id=2,
        follower_broker_epoch=1,
        fetch_offset=0,
        last_fetched_epoch=-1,
    ),
    ProduceRequest(topic="demo", partition=0),
    ReadLogRequest(topic="demo", partition=0),
    ErrorResponse(code="X"),
)

# request -> (operation, the principals allowed, the error everyone else gets)
RULES: list[tuple[Message, str, frozenset[str], type[Exception]]] = [
    (REGISTER_2, "register_broker", frozenset({B2}), ClusterAuthorizationFailedError),
    (HEARTBEAT_2, "heartbeat", frozenset({B2}), ClusterAuthorizationFailedError),
    (SHUTDOWN_3, "controlled_shutdown", frozenset({B3}), ClusterAuthorizationFailedError),
    (ALTER_LED_BY_1, "alter_partition", frozenset({B1}), ClusterAuthorizationFailedError),
    (BATCH_LED_BY_1, "alter_partition", frozenset({B1}), ClusterAuthorizationFailedError),
    (BATCH_MIXED, "alter_partition", frozenset(), ClusterAuthorizationFailedError),
    # Even an empty batch is a broker's request.
    (
        AlterPartitions(items=[]),
        "alter_partition",
        frozenset({B1, B2, B3}),
        ClusterAuthorizationFailedError,
    ),
    (FETCH, "fetch_metadata", frozenset(KNOWN), ClusterAuthorizationFailedError),
    (DESCRIBE, "describe_cluster", frozenset(KNOWN), ClusterAuthorizationFailedError),
    (CREATE, "create_topics", frozenset({ADMIN_P}), TopicAuthorizationFailedError),
    (ELECT_PREFERRED, "elect_preferred", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (ELECT_UNCLEAN, "elect_unclean", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (DELETE, "delete_topics", frozenset({ADMIN_P}), TopicAuthorizationFailedError),
    (GROW, "create_partitions", frozenset({ADMIN_P}), TopicAuthorizationFailedError),
    (ALTER_CONFIGS, "alter_configs", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (FEATURE, "update_features", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (REASSIGN, "alter_reassignments", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    # An admin unregisters broker 2, never broker-2 itself (nor any broker).
    (UNREGISTER, "unregister_broker", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (ELECT_ALL, "elect_preferred", frozenset({ADMIN_P}), ClusterAuthorizationFailedError),
    (
        DescribeConfigsRequest(resource_type="topic", resource_name="t"),
        "describe_configs",
        frozenset(KNOWN),
        ClusterAuthorizationFailedError,
    ),
    (
        DescribeFeaturesRequest(),
        "describe_features",
        frozenset(KNOWN),
        ClusterAuthorizationFailedError,
    ),
    (
        ListPartitionReassignmentsRequest(),
        "list_reassignments",
        frozenset(KNOWN),
        ClusterAuthorizationFailedError,
    ),
    (
        DescribeQuorumRequest(etcd_members=True),
        "describe_quorum",
        frozenset(KNOWN),
        ClusterAuthorizationFailedError,
    ),
    # The maintenance pre-flight: reads, like describe's.
    (
        PlanRestartRequest(broker_id=1),
        "plan_restart",
        frozenset(KNOWN),
        ClusterAuthorizationFailedError,
    ),
    (PlanRollRequest(), "plan_roll", frozenset(KNOWN), ClusterAuthorizationFailedError),
    # A client's request forwarded by a broker (Kafka's Envelope): brokers only.
    (
        Envelope(principal=ADMIN_P, request=CREATE),
        "envelope",
        frozenset({B1, B2, B3}),
        ClusterAuthorizationFailedError,
    ),
    *[
        (m, "unsupported", frozenset(), ClusterAuthorizationFailedError)
        for m in NOT_FOR_THE_CONTROLLER
    ],
]


@pytest.mark.parametrize("principal", EVERYONE)
@pytest.mark.parametrize(
    ("request_", "operation", "allowed", "error"),
    RULES,
    ids=[f"{op}-{type(m).__name__}" for m, op, _, _ in RULES],
)
def test_every_request_against_every_principal(
    principal: str | None,
    request_: Message,
    operation: str,
    allowed: frozenset[str],
    error: type[Exception],
) -> None:
    assert operation_of(request_) == operation
    if principal in allowed:
        assert authorize(principal, request_) == operation
        return
    with pytest.raises(error) as refused:
        authorize(principal, request_)
    assert isinstance(refused.value, AUTHORIZATION_ERRORS)
    # The message names who was refused and what for (what the WARNING line repeats).
    text = str(refused.value)
    assert (repr(principal) if principal is not None else "no principal") in text
    assert operation in text or type(request_).__name__ in text


def test_a_broker_refused_for_another_id_is_told_which_id_it_speaks_for() -> None:
    with pytest.raises(ClusterAuthorizationFailedError, match="only for broker 1, not for 2"):
        authorize(B1, HEARTBEAT_2)
    with pytest.raises(ClusterAuthorizationFailedError, match="only broker-2 may"):
        authorize(ADMIN_P, REGISTER_2)


@settings(max_examples=200, deadline=None)
@given(
    own=st.integers(0, MAX_BROKER_ID),
    target=st.integers(-(2**31), 2**31),
    kind=st.sampled_from(["register", "heartbeat", "shutdown", "alter"]),
)
def test_a_broker_speaks_only_for_its_own_id(own: int, target: int, kind: str) -> None:
    request: Message
    if kind == "register":
        request = RegisterBroker(broker_id=target, incarnation_id="i")
    elif kind == "alter":
        request = AlterPartition(
            topic="t", partition=0, leader=target, broker_epoch=0, partition_epoch=0, isr=[]
        )
    else:
        request = BrokerHeartbeatRequest(
            broker_id=target, broker_epoch=0, metadata_offset=0, want_shutdown=kind == "shutdown"
        )
    principal = f"broker-{own}"
    if own == target:
        assert authorize(principal, request) == operation_of(request)
    else:
        with pytest.raises(ClusterAuthorizationFailedError):
            authorize(principal, request)


def test_the_rules_cover_every_operation() -> None:
    """OPERATIONS (the metric's label values) is exactly what the rules name."""
    assert {op for _, op, _, _ in RULES} == set(OPERATIONS)
    assert len(OPERATIONS) == len(set(OPERATIONS))


def test_known_principals() -> None:
    assert all(is_known(p) for p in KNOWN)
    assert is_known("broker-0") and is_known(f"broker-{MAX_BROKER_ID}")
    assert not any(is_known(p) for p in UNKNOWN)


@pytest.mark.parametrize("broker", (B1, B2))
def test_an_envelope_is_authorized_as_its_clients_request(broker: str) -> None:
    """The broker may forward; the inner request is then its client's to be allowed."""
    assert authorize(broker, Envelope(principal=VIEWER_P, request=DESCRIBE)) == "envelope"
    with pytest.raises(TopicAuthorizationFailedError, match="'viewer' may not create_topics"):
        authorize(broker, Envelope(principal=VIEWER_P, request=CREATE))
    with pytest.raises(ClusterAuthorizationFailedError, match="'viewer' may not elect_unclean"):
        authorize(broker, Envelope(principal=VIEWER_P, request=ELECT_UNCLEAN))
    with pytest.raises(ClusterAuthorizationFailedError, match="no principal is unknown"):
        authorize(broker, Envelope(principal=None, request=DESCRIBE))
    # A broker cannot lend itself its own broker rights through a client: an inner
    # request is one of the admin ones only, and a broker principal is no admin.
    with pytest.raises(TopicAuthorizationFailedError, match=f"{broker!r} may not create_topics"):
        authorize(broker, Envelope(principal=broker, request=CREATE))
