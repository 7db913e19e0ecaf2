"""A broker's authorization, over real mutual TLS: a real `Broker` (as `broker-1`)
registered with a real ControllerService, asked by every kind of principal.

GetReplicaLogInfo only from `controller`; ReplicaFetch only from `broker-<follower_id>`;
Produce from `admin`; ReadLog from `admin` or `viewer`. A refusal is answered with its
Kafka code, changes nothing on the broker, and is counted and logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from brokers_stub.config import BrokerConfig
from brokers_stub.metrics import BrokerCollector
from metactl.errors import (
    ClusterAuthorizationFailedError,
    MetactlError,
    TopicAuthorizationFailedError,
)
from protocol.client import RpcClient
from protocol.messages.admin import CreateTopic, DescribeClusterRequest
from protocol.messages.broker_controller import (
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    ReplicaRef,
)
from protocol.messages.data import ProduceRequest, ProduceResponse, ReadLogRequest, ReadLogResponse
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse
from protocol.messages.unions import Message
from protocol.tls import TlsIdentity
from tests.brokers_stub.helpers import Running, eventually
from tests.service.test_authorization import Wire, client_context, make_certs, tls_service

CLUSTER, TOPIC = ClusterAuthorizationFailedError, TopicAuthorizationFailedError


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def wire(tmp_path: Path, certs: Path) -> AsyncIterator[Wire]:
    async with tls_service(tmp_path / "controller", certs) as svc:
        yield Wire(svc, certs)


async def ask(endpoint: str, certs: Path, principal: str, body: Message) -> Message:
    """One request to broker 1 as `principal`, checking the server is `broker-1`."""
    async with RpcClient(
        endpoint, ssl=client_context(certs, principal), expect_principal="broker-1"
    ) as client:
        return await client.request(body, timeout_s=10)


def exported(running: Running) -> dict[tuple[str, str], float]:
    """metactl_authorization_failures_total as the broker's /metrics would show it."""
    return {
        (s.labels["principal"], s.labels["operation"]): s.value
        for family in BrokerCollector(running.broker).collect()
        if family.name == "metactl_authorization_failures"
        for s in family.samples
        if s.name == "metactl_authorization_failures_total"
    }


async def test_a_broker_answers_only_the_principals_its_rules_name(
    wire: Wire, certs: Path, tmp_path: Path
) -> None:
    epochs = {2: await wire.register(2)}
    with capture_logs() as logs:  # before the broker exists: its logger binds at start
        running = Running(
            BrokerConfig(
                broker_id=1,
                controller=wire.svc.address,
                data_dir=tmp_path / "broker-1",
                heartbeat_interval_ms=50,
                metadata_max_wait_ms=50,
                fetch_interval_ms=20,
                replica_tick_ms=20,
                flush_interval_ms=50,
                tls=TlsIdentity.from_dir(certs, "broker-1"),
            )
        )
        running.broker.refusal_log_period_s = 3600.0  # one line per principal, exactly
        try:
            ready = await running.await_ready()
            endpoint, epochs[1] = ready.group(3), int(ready.group(2))
            # The broker registered, heartbeated and fetched metadata as broker-1 through
            # the controller's authorization; once unfenced it is told to lead d-0.
            await eventually(
                lambda: 1 in wire.svc.controller.committed_image.active, what="broker 1 unfenced"
            )
            await wire.create(CreateTopic(name="d", assignments=[[1, 2]], min_isr=1))
            await eventually(
                lambda: ("d", 0) in running.broker.replicas.leaders, what="broker 1 leads d-0"
            )

            async def refused(principal: str, body: Message, error: type[MetactlError]) -> None:
                with pytest.raises(error):
                    await ask(endpoint, certs, principal, body)

            produce = ProduceRequest(topic="d", partition=0, acks=1, count=3)
            for principal in ("viewer", "broker-2", "controller", "mallory"):
                await refused(principal, produce, TOPIC)
            read = ReadLogRequest(topic="d", partition=0)
            for principal in ("broker-2", "controller", "mallory"):
                await refused(principal, read, TOPIC)
            r = await ask(endpoint, certs, "viewer", read)
            assert isinstance(r, ReadLogResponse) and r.log_end_offset == 0  # nothing appended
            p = await ask(endpoint, certs, "admin", produce)
            assert isinstance(p, ProduceResponse) and (p.base_offset, p.count) == (0, 3)
            r = await ask(endpoint, certs, "admin", read)
            assert isinstance(r, ReadLogResponse) and r.log_end_offset == 3

            info = GetReplicaLogInfoRequest(
                broker_id=1, broker_epoch=epochs[1], partitions=[ReplicaRef("d", 0)]
            )
            for principal in ("admin", "broker-2", "viewer", "mallory"):
                await refused(principal, info, CLUSTER)
            i = await ask(endpoint, certs, "controller", info)
            assert isinstance(i, GetReplicaLogInfoResponse)
            assert i.partitions[0].log_end_offset == 3

            fetch = ReplicaFetchRequest(
                topic="d",
                partition=0,
                follower_id=2,
                follower_broker_epoch=epochs[2],
                fetch_offset=0,
                last_fetched_epoch=-1,
            )
            for principal in ("broker-3", "broker-1", "admin", "controller"):
                await refused(principal, fetch, CLUSTER)
            f = await ask(endpoint, certs, "broker-2", fetch)
            assert isinstance(f, ReplicaFetchResponse) and f.log_end_offset == 3
            # A request no broker rule names is refused, and the words say what was sent
            # (they read "may not unsupported on broker 1").
            with pytest.raises(CLUSTER, match="may not send DescribeClusterRequest to broker 1"):
                await ask(endpoint, certs, "admin", DescribeClusterRequest())
        finally:
            assert await running.stop() == 0

    counts = exported(running)
    assert counts == {
        **{(p, "produce"): 1.0 for p in ("viewer", "broker-2", "controller", "mallory")},
        **{(p, "read_log"): 1.0 for p in ("broker-2", "controller", "mallory")},
        **{(p, "get_replica_log_info"): 1.0 for p in ("admin", "broker-2", "viewer", "mallory")},
        **{(p, "replica_fetch"): 1.0 for p in ("broker-3", "broker-1", "admin", "controller")},
        ("admin", "unsupported"): 1.0,
    }
    lines = [e for e in logs if e["event"] == "authorization failed"]
    assert all(e["log_level"] == "warning" and e["broker"] == 1 for e in lines)
    # One line per refused principal (its first refusal); the rest only counted.
    assert sorted(e["principal"] for e in lines) == sorted({principal for principal, _ in counts})
