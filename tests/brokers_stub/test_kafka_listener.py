"""The brokers' Kafka listener (`--kafka-listen`, brokers_stub/kafka) against real Kafka
clients: Debian's `kcat` and confluent-kafka's AdminClient (librdkafka), plaintext with
--insecure and over mutual TLS with the cluster's certificates, and kio-framed requests
of our own (ApiVersions' v0 fallback, DescribeTopicPartitions' ELR, bad frames).

Real processes: a controller and three brokers (`tests/e2e/cluster.py`). Waiting is on
observable state (the listener's answers), never a timed assertion.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.api_versions.v3 import ApiVersionsRequest as ApiVersionsV3
from kio.schema.describe_topic_partitions.v0 import request as dtp_request
from kio.schema.describe_topic_partitions.v0.response import DescribeTopicPartitionsResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse

from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterResponse,
)
from protocol.tls import ADMIN, CA_CERT, cert_path, key_path
from tests.e2e.cluster import Cluster, free_port
from tests.kafka_wire import call, connect, frame, read_frame
from tests.processes import wait_for

pytestmark = pytest.mark.slow
KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat missing: run `make system`")
BROKERS = (1, 2, 3)


def start(cluster: Cluster) -> dict[int, str]:
    """Three brokers, each with a Kafka listener; their Kafka addresses by id."""
    cluster.start_controller()
    kafka = {}
    for b in BROKERS:
        p = cluster.start_broker(b, "--kafka-listen", f"127.0.0.1:{free_port()}")
        kafka[b] = p.field("kafka")
    return kafka


async def create_topic(cluster: Cluster) -> None:
    await cluster.wait_until(
        lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers), "3 brokers"
    )
    r = await cluster.request(
        CreateTopicsRequest(topics=[CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=2)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    await cluster.wait_until(lambda s: part(s).isr == [1, 2, 3], "full ISR")


def part(s: DescribeClusterResponse) -> Any:
    return next(p for p in s.partitions if p.topic == "t" and p.partition == 0)


def describe_partitions(address: str, *, limit: int = 2000, cursor: Any = None) -> Any:
    req = dtp_request.DescribeTopicPartitionsRequest(
        topics=(dtp_request.TopicRequest(name="t"),),  # type: ignore[arg-type]
        response_partition_limit=limit,  # type: ignore[arg-type]
        cursor=cursor,
    )
    return call(address, req, DescribeTopicPartitionsResponse)


def kcat_metadata(address: str, *security: str) -> dict[str, Any]:
    assert KCAT is not None
    out = subprocess.run(
        [KCAT, "-L", "-J", "-b", address, "-m", "30", *security],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    meta: dict[str, Any] = json.loads(out.stdout)
    return meta


def kcat_summary(
    meta: dict[str, Any],
) -> tuple[list[int], list[tuple[int, int, list[int], list[int]]]]:
    """(broker ids, [(partition, leader, replicas, isr)] of topic t)."""
    brokers = sorted(b["id"] for b in meta["brokers"])
    topic = next((t for t in meta["topics"] if t["topic"] == "t"), None)
    parts = (
        []
        if topic is None
        else [
            (
                p["partition"],
                p["leader"],
                [r["id"] for r in p["replicas"]],
                sorted(r["id"] for r in p["isrs"]),
            )
            for p in topic["partitions"]
        ]
    )
    return brokers, parts


def showing(address: str, expected: Any) -> Any:
    """A probe for `wait_for`: kcat's metadata once it matches `expected`, else None."""

    def probe() -> dict[str, Any] | None:
        meta = kcat_metadata(address)
        return meta if kcat_summary(meta) == expected else None

    return probe


EXPECTED = ([1, 2, 3], [(0, 1, [1, 2, 3], [1, 2, 3])])


# --- plaintext --------------------------------------------------------------------------------


@pytest.fixture
def insecure(tmp_path: Path) -> Iterator[tuple[Cluster, dict[int, str]]]:
    c = Cluster(tmp_path, tls=False)
    try:
        yield c, start(c)
    finally:
        c.stop()


@needs_kcat
async def test_kcat_admin_client_and_elr_over_plaintext(
    insecure: tuple[Cluster, dict[int, str]],
) -> None:
    cluster, kafka = insecure
    await create_topic(cluster)
    # Every broker's image catches up on its own: each listener answers the same.
    for b in BROKERS:
        meta = wait_for(f"broker {b}'s Kafka listener showing t", showing(kafka[b], EXPECTED))
        assert {x["id"]: x["name"] for x in meta["brokers"]} == kafka

    listed = AdminClient({"bootstrap.servers": kafka[2]}).list_topics(timeout=30)
    assert sorted(listed.brokers) == [1, 2, 3]
    assert f"{listed.brokers[3].host}:{listed.brokers[3].port}" == kafka[3]
    t = listed.topics["t"]
    assert t.error is None and list(t.partitions) == [0]
    p0 = t.partitions[0]
    assert (p0.leader, p0.replicas, sorted(p0.isrs)) == (1, [1, 2, 3], [1, 2, 3])

    # Metadata v12 of our own: the topic id, and a missing topic is not created.
    md = call(
        kafka[1],
        MetadataRequest(
            topics=(
                MetadataRequestTopic(topic_id=None, name="t"),  # type: ignore[arg-type]
                MetadataRequestTopic(topic_id=None, name="absent"),  # type: ignore[arg-type]
            ),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        ),
        MetadataResponse,
    )
    s = await cluster.describe()
    topic_id = next(x for x in s.topics if x.name == "t").topic_id
    assert [(x.name, x.error_code.name, str(x.topic_id)) for x in md.topics] == [
        ("t", "none", topic_id),
        ("absent", "unknown_topic_or_partition", "None"),  # kio reads the zero UUID as None
    ]
    assert all(x.name != "absent" for x in (await cluster.describe()).topics)

    # Below MinISR 2: 3 leaves the ISR, then the leader 1 is fenced; 1 stays eligible.
    cluster.kill_broker(3)
    await cluster.wait_until(lambda s: part(s).isr == [1, 2], "3 out of the ISR")
    cluster.kill_broker(1)
    await cluster.wait_until(lambda s: part(s).leader == 2 and part(s).elr == [1], "ELR [1]")
    dtp = wait_for(
        "broker 2's DescribeTopicPartitions showing the ELR",
        lambda: (r := describe_partitions(kafka[2])).topics[0].partitions[0].leader_id == 2 and r,
    )
    (topic,) = dtp.topics
    assert (topic.name, str(topic.topic_id), topic.error_code.name) == ("t", topic_id, "none")
    (p,) = topic.partitions
    assert p.isr_nodes == (2,)
    assert p.eligible_leader_replicas == (1,)
    assert p.last_known_elr == ()
    assert p.offline_replicas == (1, 3)
    assert dtp.next_cursor is None
    # kcat sees the fenced brokers gone and the new leader.
    meta = kcat_metadata(kafka[2])
    assert kcat_summary(meta) == ([2], [(0, 2, [1, 2, 3], [2])])


@needs_kcat
async def test_bad_input_closes_the_connection_and_the_broker_serves_on(
    insecure: tuple[Cluster, dict[int, str]],
) -> None:
    cluster, kafka = insecure
    address = kafka[1]
    # ApiVersions at a version the broker does not know (the first past its range, and a far
    # one): v0, UNSUPPORTED_VERSION, its range.
    for version in (4, 99):
        with connect(address) as sock:
            sock.sendall(frame(ApiVersionsV3(client_software_name="t", client_software_version="1"),
                               correlation_id=41, version=version))  # fmt: skip
            payload = read_frame(sock)
        correlation_id, error_code, count, key, low, high = struct.unpack_from(">ihihhh", payload)
        assert (correlation_id, error_code, count, key, low, high) == (41, 35, 1, 18, 0, 3)
    # ... and at v3, the served APIs only, and the ELR feature among the finalized ones.
    from kio.schema.api_versions.v3 import ApiVersionsResponse

    av = call(address, ApiVersionsV3(client_software_name="t", client_software_version="1"),
              ApiVersionsResponse)  # fmt: skip
    advertised = {(k.api_key, k.min_version, k.max_version) for k in av.api_keys}
    assert {(3, 0, 12), (18, 0, 3), (75, 0, 0), (0, 3, 9), (1, 4, 13)} <= advertised
    assert 21 not in {key for key, _, _ in advertised}  # DeleteRecords: not served
    assert "eligible.leader.replicas.version" in {f.name for f in av.finalized_features}

    for bad in (
        b"\x00\x00\x00\x05garba",  # a header too short
        b"\xff\xff\xff\xff",  # a negative size
        struct.pack(">ihhi", 12, 3, 12, 9) + b"\x7f\xff\xff\xff",  # Metadata v12, body cut
        struct.pack(">ihhi", 10, 21, 0, 1) + b"\x00\x00",  # DeleteRecords: not served
        struct.pack(">ihhi", 10, 0, 2, 1) + b"\x00\x00",  # Produce v2: below the range
    ):
        with connect(address) as sock:
            sock.sendall(bad)
            assert read_frame(sock) == b"", bad  # closed, nothing answered
    with connect(address) as sock:  # a truncated frame: EOF mid-frame
        sock.sendall(struct.pack(">i", 100) + b"\x00\x03")
        sock.shutdown(socket.SHUT_WR)
        assert read_frame(sock) == b""
    # The broker serves the next client.
    meta = kcat_metadata(address)
    assert sorted(b["id"] for b in meta["brokers"]) == [1, 2, 3]
    log = (cluster.root / "logs" / "broker-1.log").read_text()
    assert "kafka: malformed request; closing" in log
    assert "Traceback" not in log


# --- mutual TLS -------------------------------------------------------------------------------


@needs_kcat
async def test_kcat_and_admin_client_over_mutual_tls(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        kafka = start(cluster)
        await create_topic(cluster)
        certs = cluster.certs
        ssl_flags = {
            "security.protocol": "SSL",
            "ssl.ca.location": str(certs / CA_CERT),
            "ssl.certificate.location": str(cert_path(certs, ADMIN)),
            "ssl.key.location": str(key_path(certs, ADMIN)),
            "ssl.endpoint.identification.algorithm": "none",
        }
        flags = [x for k, v in ssl_flags.items() for x in ("-X", f"{k}={v}")]
        wait_for(
            "kcat over TLS showing t",
            lambda: kcat_summary(kcat_metadata(kafka[3], *flags)) == EXPECTED,
        )
        listed = AdminClient({"bootstrap.servers": kafka[1], **ssl_flags}).list_topics(timeout=30)
        assert sorted(listed.brokers) == [1, 2, 3]
        assert listed.topics["t"].partitions[0].leader == 1
        # Without a client certificate the handshake is refused: nothing is answered.
        plain = ssl.create_default_context(cafile=str(certs / CA_CERT))
        plain.check_hostname = False
        with (
            pytest.raises((ssl.SSLError, ConnectionError, OSError)),
            connect(kafka[1], plain) as sock,
        ):
            sock.sendall(frame(ApiVersionsV3(client_software_name="t",
                                                 client_software_version="1")))  # fmt: skip
            assert read_frame(sock) == b""
            raise ConnectionError("closed")
    finally:
        cluster.stop()
