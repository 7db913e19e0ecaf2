"""The admin APIs' translation between Kafka's wire (kio) and metactl's admin messages
(`protocol.kafka.admin`), pure: every served API at its lowest and highest version is
framed, decoded as a listener decodes it, answered over a scripted `call`, and its
response written and read back with kio; then the rules of the translation one by one
(Kafka's request rules, validate_only, UNCLEAN's replica, error codes)."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from metactl.errors import (
    ClusterAuthorizationFailedError,
    ElectionNotNeededError,
    MetactlError,
    NotControllerError,
    TopicAuthorizationFailedError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.kafka import admin
from protocol.kafka import framing as k
from protocol.kafka.framing import Request, decode_request, encode_response
from protocol.kafka.metadata import make, nested
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    ConfigEntry,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeCursor,
    DescribeQuorumResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
    PartitionState,
    ReassignmentResult,
    RegisteredController,
    TopicResult,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.unions import Message

MIN_ISR = "min.insync.replicas"
T_ID = uuid.UUID("6c3f3b0e-0000-4000-8000-000000000001")
TIMEOUT = datetime.timedelta(seconds=30)


def image() -> ClusterImage:
    """Brokers 1-3 (3 fenced, all with a Kafka listener); t: 2 partitions, t-0 led by 2
    (preferred 1), t-1 leaderless with ISR [] and ELR [3] (3 fenced) and live replica 2."""
    records: list[MetadataRecord] = []
    for b in (1, 2, 3):
        records += [
            RegisterBrokerRecord(
                broker_id=b, incarnation_id=f"i{b}", broker_epoch=b,
                kafka_endpoint=f"127.0.0.1:{19091 + b}", rack=f"r{b}",
            ),
            UnfenceBrokerRecord(broker_id=b, broker_epoch=b),
        ]  # fmt: skip
    records += [
        TopicRecord(name="t", topic_id=str(T_ID), partitions=2, min_isr=1),
        PartitionRecord(topic="t", partition=0, replicas=[1, 2, 3], isr=[1, 2, 3], leader=2),
        PartitionRecord(topic="t", partition=1, replicas=[3, 2], isr=[], elr=[3], leader=-1),
        FenceBrokerRecord(broker_id=3, broker_epoch=3),
    ]
    return replay(ClusterImage(), records)


class Script:
    """A scripted `call`: every native message sent, and canned answers."""

    def __init__(self, fail: MetactlError | None = None) -> None:
        self.sent: list[Any] = []
        self.fail = fail
        self.refuse: dict[tuple[str, int], MetactlError] = {}

    async def __call__(self, body: Message) -> Message:
        self.sent.append(body)
        if self.fail is not None:
            raise self.fail
        match body:
            case CreateTopicsRequest():
                return CreateTopicsResponse(
                    results=[
                        CreateTopicResult(
                            name=s.name, topic_id=str(T_ID), assignments=[[1, 2], [2, 3], [3, 1]]
                        )
                        for s in body.topics
                    ]
                )
            case DeleteTopicsRequest():
                return DeleteTopicsResponse(
                    results=[TopicResult(name=n, topic_id=str(T_ID)) for n in body.topics]
                )
            case CreatePartitionsRequest():
                return CreatePartitionsResponse(
                    results=[CreateTopicResult(name=s.topic) for s in body.topics]
                )
            case DescribeConfigsRequest():
                return DescribeConfigsResponse(
                    resource_type=body.resource_type,
                    resource_name=body.resource_name,
                    configs=[ConfigEntry(name=MIN_ISR, value="2", source="DYNAMIC_TOPIC_CONFIG")],
                )
            case AlterConfigs():
                return AlterConfigsResponse(
                    resource_type=body.resource_type, resource_name=body.resource_name
                )
            case ElectLeader():
                refused = self.refuse.get((body.topic, body.partition))
                if refused is not None:
                    raise refused
                return PartitionState(
                    topic=body.topic, partition=body.partition, replicas=[1, 2], leader=1,
                    leader_epoch=1, partition_epoch=1, isr=[1, 2],
                )  # fmt: skip
            case ElectPreferredLeaders():
                return ElectPreferredLeadersResponse(elected=len(body.partitions or []))
            case AlterPartitionReassignments():
                return AlterPartitionReassignmentsResponse(
                    results=[
                        ReassignmentResult(topic=r.topic, partition=r.partition)
                        for r in body.reassignments
                    ]
                )
            case ListPartitionReassignmentsRequest():
                if body.cursor is None:  # two pages
                    return ListPartitionReassignmentsResponse(
                        reassignments=[ongoing("t", 0)],
                        next_cursor=DescribeCursor(topic="t", partition=1),
                    )
                return ListPartitionReassignmentsResponse(reassignments=[ongoing("t", 1)])
            case UpdateFeature():
                return UpdateFeatureResponse(name=body.name, level=body.level)
        raise AssertionError(f"unexpected {body}")


def ongoing(topic: str, partition: int) -> OngoingReassignment:
    return OngoingReassignment(
        topic=topic, partition=partition, replicas=[1, 2, 3], adding_replicas=[3],
        removing_replicas=[1],
    )  # fmt: skip


QUORUM = DescribeQuorumResponse(
    cluster_id="c1",
    node_id="1",
    address="127.0.0.1:9093",
    role="active",
    backend="etcd",
    log="etcd://x/y",
    applied_offset=42,
    log_end_offset=42,
    leader_id="1",
    term=7,
    controllers=[
        RegisteredController(node_id="1", address="a:1"),
        RegisteredController(node_id="2", address="a:2"),
    ],
)


# --- building, framing and reading -------------------------------------------------------


def build(api_key: int, version: int, **over: Any) -> Any:
    """A request of `api_key` at `version`, with every field its version has."""
    cls: Any = load_request_schema(api_key, version)

    def n(name: str) -> Any:
        return nested(cls, name)

    match api_key:
        case k.CREATE_TOPICS:
            fields = {
                "topics": (
                    make(
                        n("CreatableTopic"), name="a", num_partitions=3, replication_factor=2,
                        assignments=(), configs=(
                            n("CreatableTopicConfig")(name="min.insync.replicas", value="2"),
                        ),
                    ),
                    make(
                        n("CreatableTopic"), name="b", num_partitions=-1, replication_factor=-1,
                        assignments=tuple(
                            n("CreatableReplicaAssignment")(partition_index=i, broker_ids=ids)
                            for i, ids in enumerate([(1, 2), (2, 3), (3, 1)])
                        ),
                        configs=(),
                    ),
                ),
                "timeout": TIMEOUT,
                "validate_only": False,
            }  # fmt: skip
        case k.DELETE_TOPICS:
            fields = {
                "topic_names": ("t",),
                "topics": (
                    n("DeleteTopicState")(name="t", topic_id=None) if version >= 6 else None,
                ),
                "timeout": TIMEOUT,
            }
        case k.CREATE_PARTITIONS:
            fields = {
                "topics": (
                    n("CreatePartitionsTopic")(
                        name="t",
                        count=3,
                        assignments=(n("CreatePartitionsAssignment")(broker_ids=(1, 2)),),
                    ),
                ),
                "timeout": TIMEOUT,
                "validate_only": False,
            }
        case k.DESCRIBE_CONFIGS:
            fields = {
                "resources": (
                    n("DescribeConfigsResource")(
                        resource_type=2, resource_name="t", configuration_keys=None
                    ),
                    n("DescribeConfigsResource")(
                        resource_type=4, resource_name="1", configuration_keys=("x",)
                    ),
                ),
                "include_synonyms": True,
                "include_documentation": False,
            }
        case k.INCREMENTAL_ALTER_CONFIGS:
            fields = {
                "resources": (
                    n("AlterConfigsResource")(
                        resource_type=2,
                        resource_name="t",
                        configs=(
                            n("AlterableConfig")(
                                name="min.insync.replicas", config_operation=0, value="2"
                            ),
                        ),
                    ),
                ),
                "validate_only": False,
            }
        case k.ELECT_LEADERS:
            fields = {
                "election_type": 0,
                "topic_partitions": (n("TopicPartitions")(topic="t", partitions=(0,)),),
                "timeout": TIMEOUT,
            }
        case k.ALTER_PARTITION_REASSIGNMENTS:
            fields = {
                "timeout": TIMEOUT,
                "allow_replication_factor_change": True,
                "topics": (
                    n("ReassignableTopic")(
                        name="t",
                        partitions=(
                            n("ReassignablePartition")(partition_index=0, replicas=(2, 3, 1)),
                            n("ReassignablePartition")(partition_index=1, replicas=None),
                        ),
                    ),
                ),
            }
        case k.LIST_PARTITION_REASSIGNMENTS:
            fields = {"timeout": TIMEOUT, "topics": None}
        case k.UPDATE_FEATURES:
            fields = {
                "timeout": TIMEOUT,
                "feature_updates": (
                    make(
                        n("FeatureUpdateKey"),
                        feature="eligible.leader.replicas.version",
                        max_version_level=1,
                        allow_downgrade=False,
                        upgrade_type=1,
                    ),
                ),
                "validate_only": False,
            }
        case k.DESCRIBE_CLUSTER:
            fields = {
                "include_cluster_authorized_operations": False,
                "endpoint_type": 1,
                "include_fenced_brokers": True,
            }
        case k.DESCRIBE_QUORUM:
            fields = {
                "topics": (
                    n("TopicData")(
                        topic_name="__cluster_metadata",
                        partitions=(n("PartitionData")(partition_index=0),),
                    ),
                )
            }
        case _:
            raise AssertionError(api_key)
    return make(cls, **{**fields, **over})


def wire(body: Any, version: int) -> Request:
    """`body` framed as a client frames it, then decoded as the listener decodes it."""
    header_cls: Any = body.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=body.__api_key__,
            request_api_version=version,
            correlation_id=9,
            client_id="test",
        ),
    )
    entity_writer(type(body))(buf, body)
    decoded = decode_request(buf.getvalue(), admin.CONTROLLER_SERVED)
    assert isinstance(decoded, Request), decoded
    return decoded


def read_back(response: Any) -> Any:
    """`response` written as the listener writes it, and read as a client reads it."""
    frame = encode_response(9, response)
    payload = frame[4:]
    assert struct.unpack(">i", frame[:4])[0] == len(payload)
    header, used = entity_reader(response.__header_schema__)(payload, 0)
    assert header.correlation_id == 9
    body, end = entity_reader(type(response))(payload, used)
    assert used + end == len(payload)  # nothing left over
    return body


async def answer(request: Request, call: Script, img: ClusterImage | None = None) -> Any:
    img = img if img is not None else image()
    if request.api_key == k.DESCRIBE_CLUSTER:
        if request.api_version >= 1 and request.body.endpoint_type == 2:
            return admin.describe_cluster_controllers(request, QUORUM, "127.0.0.1:19192")
        return admin.describe_cluster_brokers(request, img, controller_id=1)
    if request.api_key == k.DESCRIBE_QUORUM:
        return admin.describe_quorum(request, QUORUM, "127.0.0.1:19192")
    return await admin.answer_admin(request, call, img)


def run(request: Request, call: Script | None = None, img: ClusterImage | None = None) -> Any:
    return read_back(asyncio.run(answer(request, call or Script(), img)))


EDGES = sorted(
    {(key, v) for key, (low, high) in admin.CONTROLLER_SERVED.items() for v in (low, high)}
    - {(k.API_VERSIONS, 0), (k.API_VERSIONS, 3)}
)


# --- every API at its edges ---------------------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), EDGES)
def test_every_served_version_round_trips_and_answers(api_key: int, version: int) -> None:
    call = Script()
    r = run(wire(build(api_key, version), version), call)

    def codes(items: Any) -> list[str]:
        return [x.error_code.name for x in items]

    match api_key:
        case k.CREATE_TOPICS:
            assert codes(r.topics) == ["none", "none"]
            (sent,) = call.sent
            assert isinstance(sent, CreateTopicsRequest)
            a, b = sent.topics
            assert (a.partitions, a.replication_factor, a.min_isr, a.assignments) == (3, 2, 2, None)
            assert (b.partitions, b.replication_factor, b.assignments) == (
                None, None, [[1, 2], [2, 3], [3, 1]],
            )  # fmt: skip
            if version >= 5:
                assert [(t.num_partitions, t.replication_factor) for t in r.topics] == [(3, 2)] * 2
                assert [c.name for c in r.topics[0].configs] == ["min.insync.replicas"]
            if version >= 7:
                assert r.topics[0].topic_id == T_ID
        case k.DELETE_TOPICS:
            assert codes(r.responses) == ["none"]
            assert call.sent == [DeleteTopicsRequest(topics=["t"])]
            if version >= 6:
                assert r.responses[0].topic_id == T_ID
        case k.CREATE_PARTITIONS:
            assert codes(r.results) == ["none"]
            (sent,) = call.sent
            assert isinstance(sent, CreatePartitionsRequest)
            assert (sent.topics[0].count, sent.topics[0].assignments) == (3, [[1, 2]])
        case k.DESCRIBE_CONFIGS:
            assert codes(r.results) == ["none", "none"]
            assert [(c.name, c.value, c.config_source) for c in r.results[0].configs] == [
                ("min.insync.replicas", "2", 1)
            ]
            assert r.results[1].configs == ()  # asked for key "x" only
            # A broker id's configs are the cluster default's.
            assert [(m.resource_type, m.resource_name) for m in call.sent] == [
                ("topic", "t"),
                ("broker", ""),
            ]
            assert len(r.results[0].configs[0].synonyms) == 1
        case k.INCREMENTAL_ALTER_CONFIGS:
            assert codes(r.responses) == ["none"]
            assert call.sent == [
                AlterConfigs(
                    resource_type="topic",
                    resource_name="t",
                    set_configs={"min.insync.replicas": "2"},
                )
            ]
        case k.ELECT_LEADERS:
            assert [(t.topic, codes(t.partition_result)) for t in r.replica_election_results] == [
                ("t", ["none"])
            ]
            assert call.sent == [ElectLeader(topic="t", partition=0, election_type="preferred")]
        case k.ALTER_PARTITION_REASSIGNMENTS:
            assert r.error_code == ErrorCode.none
            assert [codes(t.partitions) for t in r.responses] == [["none", "none"]]
            (sent,) = call.sent
            assert isinstance(sent, AlterPartitionReassignments)
            assert [(x.partition, x.replicas) for x in sent.reassignments] == [
                (0, [2, 3, 1]),
                (1, None),
            ]
        case k.LIST_PARTITION_REASSIGNMENTS:
            assert r.error_code == ErrorCode.none
            assert [
                (t.name, [(p.partition_index, p.adding_replicas) for p in t.partitions])
                for t in r.topics
            ] == [("t", [(0, (3,)), (1, (3,))])]
            assert len(call.sent) == 2  # both pages
        case k.UPDATE_FEATURES:
            assert r.error_code == ErrorCode.none
            assert call.sent == [UpdateFeature(name="eligible.leader.replicas.version", level=1)]
            if version < 2:
                assert codes(r.results) == ["none"]
        case k.DESCRIBE_CLUSTER:
            assert r.error_code == ErrorCode.none
            ids = [b.broker_id for b in r.brokers]
            # Fenced broker 3 only with include_fenced_brokers (v2).
            assert ids == ([1, 2, 3] if version >= 2 else [1, 2])
            assert (r.controller_id, r.brokers[0].host, r.brokers[0].port) == (
                1,
                "127.0.0.1",
                19092,
            )
        case k.DESCRIBE_QUORUM:
            (p,) = r.topics[0].partitions
            assert (p.error_code, p.leader_id, p.leader_epoch, p.high_watermark) == (
                ErrorCode.none, 1, 7, 42,
            )  # fmt: skip
            assert [(v.replica_id, v.log_end_offset) for v in p.current_voters] == [
                (1, 42),
                (2, -1),
            ]
            if version >= 2:
                assert [(n.node_id, n.listeners[0].port) for n in r.nodes] == [(1, 19192)]
        case _:
            raise AssertionError(api_key)


# --- the rules, one by one ------------------------------------------------------------------


def test_create_topics_kafka_rules_and_validate_only() -> None:
    cls: Any = load_request_schema(k.CREATE_TOPICS, 7)
    topic, assignment, config = (
        nested(cls, "CreatableTopic"),
        nested(cls, "CreatableReplicaAssignment"),
        nested(cls, "CreatableTopicConfig"),
    )
    both = topic(
        name="both", num_partitions=1, replication_factor=1,
        assignments=(assignment(partition_index=0, broker_ids=(1,)),), configs=(),
    )  # fmt: skip
    gap = topic(
        name="gap", num_partitions=-1, replication_factor=-1,
        assignments=(assignment(partition_index=1, broker_ids=(1,)),), configs=(),
    )  # fmt: skip
    unknown = topic(
        name="cfg", num_partitions=1, replication_factor=1, assignments=(),
        configs=(config(name="retention.ms", value="1"),),
    )  # fmt: skip
    dup = topic(name="dup", num_partitions=1, replication_factor=1, assignments=(), configs=())
    exists = topic(name="t", num_partitions=1, replication_factor=1, assignments=(), configs=())
    too_many = topic(name="rf", num_partitions=1, replication_factor=4, assignments=(), configs=())
    ok = topic(name="ok", num_partitions=1, replication_factor=3, assignments=(), configs=())
    body = build(k.CREATE_TOPICS, 7, topics=(both, gap, unknown, dup, dup, exists, too_many, ok))
    call = Script()
    r = run(wire(body, 7), call)
    assert [(t.name, t.error_code.name) for t in r.topics] == [
        ("both", "invalid_request"),
        ("gap", "invalid_replica_assignment"),
        ("cfg", "invalid_config"),
        ("dup", "invalid_request"),
        ("dup", "invalid_request"),
        ("t", "none"),  # not validate_only: the controller answers
        ("rf", "none"),
        ("ok", "none"),
    ]
    assert "retention.ms" in (r.topics[2].error_message or "")
    (sent,) = call.sent
    assert [s.name for s in sent.topics] == ["t", "rf", "ok"]
    # validate_only: nothing is sent; what the image tells is checked (metactl has no dry run).
    call = Script()
    r = run(
        wire(build(k.CREATE_TOPICS, 7, topics=(exists, too_many, ok), validate_only=True), 7), call
    )
    assert [t.error_code.name for t in r.topics] == [
        "topic_already_exists",
        "invalid_replication_factor",
        "none",
    ]
    assert call.sent == []


def test_a_whole_request_refusal_is_every_items_error() -> None:
    refused = Script(fail=TopicAuthorizationFailedError("principal 'viewer' may not create_topics"))
    r = run(wire(build(k.CREATE_TOPICS, 4), 4), refused)
    assert [t.error_code.name for t in r.topics] == ["topic_authorization_failed"] * 2
    assert "viewer" in (r.topics[0].error_message or "")
    r = run(wire(build(k.ALTER_PARTITION_REASSIGNMENTS, 0), 0),
            Script(fail=ClusterAuthorizationFailedError("no")))  # fmt: skip
    assert r.error_code == ErrorCode.cluster_authorization_failed
    standby = Script(fail=NotControllerError("a standby", leader=None))
    r = run(wire(build(k.INCREMENTAL_ALTER_CONFIGS, 1), 1), standby)
    assert r.responses[0].error_code == ErrorCode.not_controller
    r = run(wire(build(k.ELECT_LEADERS, 2), 2), Script(fail=ClusterAuthorizationFailedError("no")))
    assert r.error_code == ErrorCode.cluster_authorization_failed
    assert r.replica_election_results[0].partition_result[0].error_code.name == (
        "cluster_authorization_failed"
    )


def test_unclean_election_names_a_live_replica_and_not_needed_is_answered_locally() -> None:
    cls: Any = load_request_schema(k.ELECT_LEADERS, 2)
    tps = nested(cls, "TopicPartitions")
    body = build(
        k.ELECT_LEADERS, 2, election_type=1,
        topic_partitions=(tps(topic="t", partitions=(0, 1)), tps(topic="nope", partitions=(0,))),
    )  # fmt: skip
    call = Script()
    r = run(wire(body, 2), call)
    results = {
        (t.topic, p.partition_id): p.error_code.name
        for t in r.replica_election_results
        for p in t.partition_result
    }
    # t-0 has a leader: ELECTION_NOT_NEEDED without asking. t-1: its ELR member 3 is
    # fenced, so the first live replica, 2 (an unclean election, as `metactl elect`).
    assert results == {("t", 0): "election_not_needed", ("t", 1): "none", ("nope", 0): "none"}
    assert call.sent == [
        ElectLeader(topic="t", partition=1, election_type="unclean", replica=2),
        ElectLeader(topic="nope", partition=0, election_type="unclean", replica=None),
    ]


def test_preferred_election_of_every_partition_elects_those_not_led_by_their_first() -> None:
    call = Script()
    call.refuse[("t", 0)] = ElectionNotNeededError("x")
    r = run(wire(build(k.ELECT_LEADERS, 1, topic_partitions=None), 1), call)
    (sent,) = call.sent
    assert isinstance(sent, ElectPreferredLeaders)
    # t-0 is led by 2 (preferred 1); t-1 has no leader (preferred 3): both are asked.
    assert [(x.topic, x.partition) for x in sent.partitions or []] == [("t", 0), ("t", 1)]
    assert [(t.topic, [p.partition_id for p in t.partition_result]) for t in
            r.replica_election_results] == [("t", [0, 1])]  # fmt: skip


def test_incremental_alter_configs_operations() -> None:
    cls: Any = load_request_schema(k.INCREMENTAL_ALTER_CONFIGS, 1)
    res, cfg = nested(cls, "AlterConfigsResource"), nested(cls, "AlterableConfig")
    body = build(
        k.INCREMENTAL_ALTER_CONFIGS, 1,
        resources=(
            res(resource_type=2, resource_name="t",
                configs=(cfg(name="min.insync.replicas", config_operation=1, value=None),)),
            res(resource_type=4, resource_name="",
                configs=(cfg(name="min.insync.replicas", config_operation=0, value="2"),)),
            res(resource_type=2, resource_name="u",
                configs=(cfg(name="min.insync.replicas", config_operation=2, value="1"),)),
            res(resource_type=8, resource_name="x", configs=()),
        ),
    )  # fmt: skip
    call = Script()
    r = run(wire(body, 1), call)
    assert [x.error_code.name for x in r.responses] == [
        "none",
        "none",
        "invalid_config",
        "invalid_request",
    ]
    assert call.sent == [
        AlterConfigs(resource_type="topic", resource_name="t", delete_configs=[MIN_ISR]),
        AlterConfigs(resource_type="broker", resource_name="", set_configs={MIN_ISR: "2"}),
    ]
    # validate_only checks the keys and values and sends nothing.
    call = Script()
    bad = res(
        resource_type=2,
        resource_name="t",
        configs=(cfg(name=MIN_ISR, config_operation=0, value="zero"),),
    )
    r = run(
        wire(build(k.INCREMENTAL_ALTER_CONFIGS, 1, resources=(bad,), validate_only=True), 1), call
    )
    assert r.responses[0].error_code == ErrorCode.invalid_config
    assert call.sent == []


def test_reassignment_that_changes_the_replication_factor_needs_v1s_permission() -> None:
    call = Script()
    body = build(k.ALTER_PARTITION_REASSIGNMENTS, 1, allow_replication_factor_change=False)
    r = run(wire(body, 1), call)
    # t-0 keeps 3 replicas; t-1's cancellation has none to count.
    assert [p.error_code.name for p in r.responses[0].partitions] == ["none", "none"]
    cls: Any = load_request_schema(k.ALTER_PARTITION_REASSIGNMENTS, 1)
    topic, part = nested(cls, "ReassignableTopic"), nested(cls, "ReassignablePartition")
    grow = (topic(name="t", partitions=(part(partition_index=0, replicas=(1, 2)),)),)
    call = Script()
    r = run(wire(build(k.ALTER_PARTITION_REASSIGNMENTS, 1, topics=grow,
                       allow_replication_factor_change=False), 1), call)  # fmt: skip
    assert r.responses[0].partitions[0].error_code == ErrorCode.invalid_replication_factor
    assert call.sent == []


def test_delete_by_topic_id_and_describe_cluster_endpoint_types() -> None:
    cls: Any = load_request_schema(k.DELETE_TOPICS, 6)
    state = nested(cls, "DeleteTopicState")
    body = build(k.DELETE_TOPICS, 6, topics=(state(name=None, topic_id=T_ID),
                                            state(name=None, topic_id=uuid.uuid4())))  # fmt: skip
    call = Script()
    r = run(wire(body, 6), call)
    assert [(x.name, x.error_code.name) for x in r.responses] == [
        ("t", "none"),
        (None, "unknown_topic_id"),
    ]
    assert call.sent == [DeleteTopicsRequest(topics=["t"])]
    # A broker answers endpoint type 1 only; a controller 2 only (KIP-919).
    to_controllers = wire(build(k.DESCRIBE_CLUSTER, 1, endpoint_type=2), 1)
    to_brokers = wire(build(k.DESCRIBE_CLUSTER, 1, endpoint_type=1), 1)
    wrong = read_back(admin.describe_cluster_brokers(to_controllers, image(), controller_id=1))
    assert (wrong.error_code, wrong.endpoint_type, wrong.brokers) == (
        ErrorCode.unsupported_endpoint_type, 1, (),
    )  # fmt: skip
    wrong = read_back(admin.describe_cluster_controllers(to_brokers, QUORUM, "127.0.0.1:19192"))
    assert wrong.error_code == ErrorCode.unsupported_endpoint_type
    ours = read_back(admin.describe_cluster_controllers(to_controllers, QUORUM, "127.0.0.1:19192"))
    assert (ours.error_code, ours.endpoint_type, ours.cluster_id, ours.controller_id) == (
        ErrorCode.none, 2, "c1", 1,
    )  # fmt: skip
    assert [(b.broker_id, b.host, b.port) for b in ours.brokers] == [(1, "127.0.0.1", 19192)]


def test_error_codes_are_kafkas_names_or_the_nearest() -> None:
    assert admin.error_code("TOPIC_AUTHORIZATION_FAILED") == ErrorCode.topic_authorization_failed
    assert admin.error_code("INVALID_TOPIC_EXCEPTION") == ErrorCode.invalid_topic_exception
    assert admin.error_code("LOG_CLOSED") == ErrorCode.not_controller
    assert admin.error_code("UNKNOWN_RECOVERY_POLICY") == ErrorCode.invalid_config
    assert admin.error_code("SOMETHING_NEW") == ErrorCode.unknown_server_error
    assert admin.error_code(None) == ErrorCode.none
    assert admin.node_number("3") == 3
    assert admin.node_number("127.0.0.1:9093") == admin.node_number("127.0.0.1:9093") > 0
