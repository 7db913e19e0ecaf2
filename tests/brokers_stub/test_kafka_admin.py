"""Kafka's admin APIs over Kafka's wire against real processes, over mutual TLS: the
brokers forward them to the controller in an envelope naming the client's principal
(confluent-kafka's AdminClient), and the controller answers them on its own Kafka
listener (KIP-919). librdkafka has no `bootstrap.controllers` (nor the reassignment,
feature or quorum APIs): those are kio-framed requests of our own.

One cluster for the module (a controller with `--kafka-listen`, three brokers with theirs;
unclean recovery `manual`, so that only an operator's election recovers a partition); the
tests run in file order, the one that stops brokers last. Waiting is on observable state.
"""

from __future__ import annotations

import datetime
import io
import socket
import ssl
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    ElectionType,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from metadata_log.records import UncleanRecoveryRecord
from protocol.kafka.framing import (
    ALTER_PARTITION_REASSIGNMENTS,
    API_VERSIONS,
    CREATE_TOPICS,
    DESCRIBE_CLUSTER,
    DESCRIBE_QUORUM,
    LIST_PARTITION_REASSIGNMENTS,
    UPDATE_FEATURES,
)
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    DescribeClusterResponse,
    Envelope,
    PartitionState,
)
from protocol.tls import ADMIN, CA_CERT, VIEWER, TlsIdentity, cert_path, key_path
from tests.e2e.cluster import Cluster, Process, free_port
from tests.processes import wait_for
from tests.protocol.test_kafka_admin import build

pytestmark = pytest.mark.slow
BROKERS = (1, 2, 3)


def connect(address: str, tls: ssl.SSLContext) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return tls.wrap_socket(socket.create_connection((host, int(port)), timeout=30))


def frame(request: Any) -> bytes:
    """A request frame as a Kafka client writes it (correlation id 7)."""
    header_cls: Any = request.__header_schema__
    buf = io.BytesIO()
    header = header_cls(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=7,
        client_id="test",
    )
    entity_writer(header_cls)(buf, header)
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def read_frame(sock: socket.socket) -> bytes:
    """The next response frame's payload."""
    with sock.makefile("rb") as f:
        (size,) = struct.unpack(">i", f.read(4))
        payload: bytes = f.read(size)
    assert len(payload) == size
    return payload


class KafkaCluster(Cluster):
    """The harness's cluster, its controller with a Kafka listener too."""

    def start_controller(self) -> None:
        self.controller = Process(
            "controller",
            [sys.executable, "-m", "controller", "--data-dir", str(self.root / "controller"),
             "--listen", self.address, "--heartbeat-interval-ms", "200",
             "--session-timeout-ms", "1500", "--unclean-recovery-strategy", self.strategy,
             "--kafka-listen", f"127.0.0.1:{free_port()}", *self._security_flags()],
            self.root / "logs" / "controller.log",
        )  # fmt: skip
        self.controller.await_ready()


class Env:
    def __init__(self, cluster: KafkaCluster, kafka: dict[int, str]) -> None:
        self.cluster = cluster
        self.kafka = kafka
        assert cluster.controller is not None
        self.controller_kafka = cluster.controller.field("kafka")

    def ssl_flags(self, principal: str) -> dict[str, str]:
        certs = self.cluster.certs
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(certs / CA_CERT),
            "ssl.certificate.location": str(cert_path(certs, principal)),
            "ssl.key.location": str(key_path(certs, principal)),
            "ssl.endpoint.identification.algorithm": "none",
        }

    def admin(self, principal: str = ADMIN, broker: int = 1) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.kafka[broker], **self.ssl_flags(principal)})

    def tls(self, principal: str = ADMIN) -> ssl.SSLContext:
        return TlsIdentity.from_dir(self.cluster.certs, principal).client_context()

    def ask(self, address: str, request: Any, principal: str = ADMIN) -> Any:
        """One kio-framed request over TLS as `principal`; its response entity."""
        with connect(address, self.tls(principal)) as sock:
            sock.sendall(frame(request))
            payload = read_frame(sock)
        response_cls: Any = _response_cls(request)
        header, used = entity_reader(response_cls.__header_schema__)(payload, 0)
        assert header.correlation_id == 7
        body, _ = entity_reader(response_cls)(payload, used)
        return body

    async def partition(self, topic: str, index: int) -> PartitionState | None:
        s = await self.cluster.describe()
        return next((p for p in s.partitions if (p.topic, p.partition) == (topic, index)), None)


def _response_cls(request: Any) -> Any:
    from kio.index import load_response_schema

    return load_response_schema(request.__api_key__, request.__version__)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    cluster = KafkaCluster(Path(tmp_path_factory.mktemp("kafka-admin")), strategy="manual")
    try:
        cluster.start_controller()
        kafka = {}
        for b in BROKERS:
            p = cluster.start_broker(b, "--kafka-listen", f"127.0.0.1:{free_port()}")
            kafka[b] = p.field("kafka")
        yield Env(cluster, kafka)
    finally:
        cluster.stop()


def part(s: DescribeClusterResponse, topic: str, index: int = 0) -> PartitionState:
    return next(p for p in s.partitions if (p.topic, p.partition) == (topic, index))


def field(s: DescribeClusterResponse, topic: str, name: str, index: int = 0) -> Any:
    """A partition's field for a `wait_until` check: None while the partition is not
    in the answer yet (a topic just created, or one page of several)."""
    found = next((p for p in s.partitions if (p.topic, p.partition) == (topic, index)), None)
    return None if found is None else getattr(found, name)


def done(futures: dict[Any, Any]) -> dict[Any, Any]:
    """Each future's result, or the KafkaError it failed with."""
    out = {}
    for key, f in futures.items():
        try:
            out[key] = f.result(timeout=60)
        except KafkaException as exc:
            out[key] = exc.args[0]
    return out


def set_min_isr(client: AdminClient, topic: str, value: str) -> dict[Any, Any]:
    entry = ConfigEntry("min.insync.replicas", value, incremental_operation=AlterConfigOpType.SET)
    return done(
        client.incremental_alter_configs(
            [ConfigResource("TOPIC", topic, incremental_configs=[entry])]
        )
    )


def elect(client: AdminClient, kind: ElectionType, topic: str, partition: int) -> str:
    """One partition's ElectLeaders outcome: NONE or the error's name."""
    try:
        results = client.elect_leaders(kind, [TopicPartition(topic, partition)]).result(60)
    except KafkaException as exc:  # the request's own error (a refused principal)
        return code(exc.args[0])
    assert [(tp.topic, tp.partition) for tp in results] == [(topic, partition)]
    return code(next(iter(results.values())))


def code(result: Any) -> str:
    """A KafkaError's name; NONE for anything else (a future's result)."""
    return str(result.name()) if isinstance(result, KafkaError) else "NONE"


async def test_admin_client_through_the_brokers(env: Env) -> None:
    cluster = env.cluster
    await cluster.wait_until(
        lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers), "3 brokers"
    )
    admin = env.admin()
    created = done(
        admin.create_topics(
            [
                NewTopic("a", num_partitions=2, replication_factor=3),
                NewTopic(
                    "b", 1, replica_assignment=[[1, 2, 3]], config={"min.insync.replicas": "2"}
                ),
                NewTopic("u", 1, replica_assignment=[[3, 2]]),
                NewTopic("bad", num_partitions=1, replication_factor=1,
                         config={"retention.ms": "1"}),
            ],
            operation_timeout=30,
        )
    )  # fmt: skip
    assert {t: code(r) for t, r in created.items()} == {
        "a": "NONE",
        "b": "NONE",
        "u": "NONE",
        "bad": "INVALID_CONFIG",
    }
    s = await cluster.wait_until(
        lambda s: {p.topic for p in s.partitions} >= {"a", "b", "u"}, "the topics created"
    )
    assert sorted((p.partition, len(p.replicas)) for p in s.partitions if p.topic == "a") == [
        (0, 3),
        (1, 3),
    ]
    assert (part(s, "b").replicas, part(s, "b").min_isr) == ([1, 2, 3], 2)
    assert "bad" not in {t.name for t in s.topics}

    # A viewer may describe, not write: TOPIC_AUTHORIZATION_FAILED, as Kafka answers.
    viewer = env.admin(VIEWER, broker=2)
    refused = done(viewer.create_topics([NewTopic("v", num_partitions=1, replication_factor=1)]))
    assert code(refused["v"]) == "TOPIC_AUTHORIZATION_FAILED"
    refused = done(viewer.delete_topics(["a"]))
    assert code(refused["a"]) == "TOPIC_AUTHORIZATION_FAILED"
    refused = done(viewer.create_partitions([NewPartitions("a", 3)]))
    assert code(refused["a"]) == "TOPIC_AUTHORIZATION_FAILED"
    resource = ConfigResource("TOPIC", "b")
    refused = set_min_isr(viewer, "b", "1")
    assert [code(r) for r in refused.values()] == ["CLUSTER_AUTHORIZATION_FAILED"]
    described = viewer.describe_topics(TopicCollection(["a", "b"]))
    descs = {t: f.result(timeout=60) for t, f in described.items()}
    assert [len(descs["a"].partitions), [r.id for r in descs["b"].partitions[0].replicas]] == [
        2,
        [1, 2, 3],
    ]
    (configs,) = done(viewer.describe_configs([resource])).values()
    entry = configs["min.insync.replicas"]
    assert (entry.value, entry.source) == ("2", 1)  # DYNAMIC_TOPIC_CONFIG
    # librdkafka's describe_cluster (it asks Metadata), and DescribeCluster of our own.
    cluster_desc = viewer.describe_cluster().result(timeout=60)
    assert sorted(n.id for n in cluster_desc.nodes) == [1, 2, 3]
    described_cluster = env.ask(env.kafka[2], build(DESCRIBE_CLUSTER, 2), VIEWER)
    assert (described_cluster.error_code, described_cluster.controller_id) == (ErrorCode.none, 2)
    assert {b.broker_id: f"{b.host}:{b.port}" for b in described_cluster.brokers} == env.kafka

    # Grow a to 3 partitions.
    assert [code(r) for r in done(admin.create_partitions([NewPartitions("a", 3)])).values()] == [
        "NONE"
    ]
    await cluster.wait_until(
        lambda s: any(t.name == "a" and t.partitions == 3 for t in s.topics), "a: 3 partitions"
    )

    # Reassign a-0 (kio: confluent-kafka has no reassignment API), and list.
    request = build(ALTER_PARTITION_REASSIGNMENTS, 0)
    topic_cls = type(request.topics[0])
    part_cls = type(request.topics[0].partitions[0])
    request = type(request)(
        timeout=datetime.timedelta(seconds=30),
        topics=(
            topic_cls(name="a", partitions=(part_cls(partition_index=0, replicas=(3, 1, 2)),)),
        ),
    )
    r = env.ask(env.kafka[3], request)
    assert (r.error_code, r.responses[0].partitions[0].error_code) == (
        ErrorCode.none,
        ErrorCode.none,
    )
    await cluster.wait_until(lambda s: field(s, "a", "replicas") == [3, 1, 2], "a-0 reassigned")
    listed = env.ask(env.kafka[1], build(LIST_PARTITION_REASSIGNMENTS, 0), VIEWER)
    assert listed.error_code == ErrorCode.none
    assert all(
        t.name != "a" or 0 not in [p.partition_index for p in t.partitions] for t in listed.topics
    )  # fmt: skip  (completed: no longer listed)

    # UpdateFeatures forwarded: a viewer is refused, the admin's level stays as it is.
    feature = build(UPDATE_FEATURES, 1)
    assert env.ask(env.kafka[2], feature, VIEWER).results[0].error_code == (
        ErrorCode.cluster_authorization_failed
    )
    assert env.ask(env.kafka[2], feature).results[0].error_code == ErrorCode.none

    # Delete a.
    assert [code(r) for r in done(admin.delete_topics(["a"], operation_timeout=30)).values()] == [
        "NONE"
    ]
    await cluster.wait_until(lambda s: all(p.topic != "a" for p in s.partitions), "a deleted")


async def test_controller_kafka_listener(env: Env) -> None:
    """KIP-919: a client of the controllers (kio-framed: librdkafka has no
    bootstrap.controllers)."""
    address = env.controller_kafka
    versions = env.ask(address, build_api_versions())
    served = {x.api_key: (x.min_version, x.max_version) for x in versions.api_keys}
    assert served[DESCRIBE_QUORUM] == (0, 2) and served[CREATE_TOPICS] == (2, 7)
    assert 3 not in served  # no Metadata: a controller is not a broker
    quorum = env.ask(address, build(DESCRIBE_QUORUM, 2), VIEWER)
    (p,) = quorum.topics[0].partitions
    assert p.error_code == ErrorCode.none and p.high_watermark > 0
    assert [f"127.0.0.1:{n.listeners[0].port}" for n in quorum.nodes] == [address]
    described = env.ask(address, build(DESCRIBE_CLUSTER, 1, endpoint_type=2), VIEWER)
    assert (described.error_code, described.endpoint_type) == (ErrorCode.none, 2)
    assert [f"{b.host}:{b.port}" for b in described.brokers] == [address]
    assert described.controller_id == described.brokers[0].broker_id
    wrong = env.ask(address, build(DESCRIBE_CLUSTER, 1, endpoint_type=1), VIEWER)
    assert wrong.error_code == ErrorCode.unsupported_endpoint_type

    create = build(CREATE_TOPICS, 7)  # topics a (3 x 2) and b (assigned), min.insync 2
    refused = env.ask(address, create, VIEWER)
    assert [t.error_code for t in refused.topics] == [ErrorCode.topic_authorization_failed] * 2
    created = env.ask(address, create)
    assert [
        (t.name, t.error_code, t.num_partitions, t.replication_factor) for t in created.topics
    ] == [
        ("a", ErrorCode.none, 3, 2),
        ("b", ErrorCode.topic_already_exists, -1, -1),  # made through a broker already
    ]  # fmt: skip
    s = await env.cluster.wait_until(lambda s: any(p.topic == "a" for p in s.partitions), "a")
    assert (part(s, "a").min_isr, len(part(s, "a").replicas)) == (2, 2)

    # A forwarded request from anyone but a broker is refused (native level).
    from metactl.errors import ClusterAuthorizationFailedError

    with pytest.raises(ClusterAuthorizationFailedError, match="only a broker may"):
        await env.cluster.request(
            Envelope(principal=ADMIN, request=CreateTopicsRequest(topics=[CreateTopic(name="z")]))
        )
    assert all(t.name != "z" for t in (await env.cluster.describe()).topics)


def build_api_versions() -> Any:
    from kio.schema.api_versions.v3 import ApiVersionsRequest

    assert ApiVersionsRequest.__api_key__ == API_VERSIONS
    return ApiVersionsRequest(client_software_name="t", client_software_version="1")


async def test_elr_cleared_and_elections_over_kafkas_wire(env: Env) -> None:
    """Last: it stops brokers. b (min.insync 2) falls under MinISR: the ELR shows in
    DescribeTopicPartitions, and IncrementalAlterConfigs min.insync.replicas clears it
    (KIP-966's ClearElr). u loses every ISR member: an UNCLEAN ElectLeaders elects the
    live replica (an unclean recovery, as `metactl elect`); a partition led away from
    its first replica goes back with a PREFERRED one."""
    cluster = env.cluster
    admin = env.admin(broker=1)
    cluster.kill_broker(2)
    await cluster.wait_until(
        lambda s: field(s, "b", "isr") == [1, 3] and field(s, "u", "isr") == [3],
        "2 out of the ISRs",
    )
    cluster.kill_broker(3)
    s = await cluster.wait_until(
        lambda s: field(s, "b", "elr") == [3] and field(s, "u", "leader") == -1,
        "b's ELR, u leaderless",
    )
    assert part(s, "b").isr == [1]
    dtp = wait_for(
        "broker 1's DescribeTopicPartitions showing b's ELR",
        lambda: (r := describe_partitions_of(env, "b")).topics[0].partitions[0]
        .eligible_leader_replicas == (3,) and r,
    )  # fmt: skip
    assert dtp.topics[0].partitions[0].isr_nodes == (1,)
    altered = set_min_isr(admin, "b", "1")
    assert [code(r) for r in altered.values()] == ["NONE"]
    s = await cluster.wait_until(lambda s: field(s, "b", "elr") == [], "b's ELR cleared")
    assert (part(s, "b").last_known_elr, part(s, "b").min_isr) == ([], 1)

    # u: ISR [3] (fenced), 2 comes back out of the ISR: manual strategy, no recovery.
    kafka2 = env.kafka[2]
    cluster.start_broker(2, "--kafka-listen", kafka2)
    await cluster.wait_until(
        lambda s: any(b.broker_id == 2 and not b.fenced for b in s.brokers), "broker 2 back"
    )
    s = await cluster.describe()
    assert part(s, "u").leader == -1
    end = len(await cluster.records())
    assert elect(admin, ElectionType.UNCLEAN, "u", 0) == "NONE"
    s = await cluster.wait_until(lambda s: field(s, "u", "leader") == 2, "u led by 2")
    _, record = await cluster.wait_for_record(
        lambda r: isinstance(r, UncleanRecoveryRecord) and r.topic == "u", "u's unclean recovery",
        from_offset=end,
    )  # fmt: skip
    assert isinstance(record, UncleanRecoveryRecord)
    assert (record.chosen, record.trigger, record.potential_data_loss) == (2, "operator", True)
    # A viewer may not elect.
    assert elect(env.admin(VIEWER), ElectionType.PREFERRED, "b", 0) == (
        "CLUSTER_AUTHORIZATION_FAILED"
    )

    # b is led by its first replica, 1: no election needed.
    assert elect(admin, ElectionType.PREFERRED, "b", 0) == "ELECTION_NOT_NEEDED"
    # u's first replica is 3 (fenced): PREFERRED_LEADER_NOT_AVAILABLE.
    assert elect(admin, ElectionType.PREFERRED, "u", 0) == "PREFERRED_LEADER_NOT_AVAILABLE"
    # Broker 3 back and in u's ISR: PREFERRED moves u-0 to 3.
    cluster.start_broker(3, "--kafka-listen", env.kafka[3])
    await cluster.wait_until(lambda s: 3 in field(s, "u", "isr"), "3 back in u's ISR")
    assert elect(admin, ElectionType.PREFERRED, "u", 0) == "NONE"
    await cluster.wait_until(lambda s: field(s, "u", "leader") == 3, "u led by its preferred 3")


def describe_partitions_of(env: Env, topic: str) -> Any:
    from kio.schema.describe_topic_partitions.v0 import request as dtp
    from kio.schema.describe_topic_partitions.v0.response import DescribeTopicPartitionsResponse

    req = dtp.DescribeTopicPartitionsRequest(
        topics=(dtp.TopicRequest(name=topic),),  # type: ignore[arg-type]
        response_partition_limit=100,  # type: ignore[arg-type]
        cursor=None,
    )
    assert DescribeTopicPartitionsResponse is _response_cls(req)
    return env.ask(env.kafka[1], req)
