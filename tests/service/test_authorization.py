"""Authorization over real mutual TLS against a real ControllerService: every attack of
issue 11, tried with a certificate of the cluster CA that names the wrong principal.

Each attack is refused with its Kafka code, commits nothing (the log end offset, decided
and committed, is unchanged), is counted in metactl_authorization_failures_total and
logged; the legitimate principal then does the same thing successfully. The controller
runs on a VirtualClock, so sessions never expire behind a test's back and the refusal
log's rate limit is exact.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import Inspection
from controller.core.step import LogInfoAnswers
from controller.runtime.clock import VirtualClock
from controller.runtime.service import ControllerService
from localcluster.certs import default_names, init_certs
from metactl.errors import (
    ClusterAuthorizationFailedError,
    MetactlError,
    NetworkError,
    SslAuthenticationError,
    TopicAuthorizationFailedError,
)
from protocol.admission import Peer
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
    PartitionState,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfoEntry,
)
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.tls import TlsIdentity

BROKERS = (1, 2, 3)
# Certificates of the cluster CA that may not do what each attack tries; `mallory` is a
# name the CA signed but no rule knows.
ATTACKERS = ("broker-1", "admin", "viewer", "controller", "mallory")
ELECT_ATTACKERS = ("broker-1", "viewer", "controller", "mallory")


def make_certs(d: Path) -> Path:
    """A cluster CA and certificates for controller, admin, viewer, brokers 1-4 and
    `mallory` (a name the CA signed but no rule knows)."""
    init_certs(d, [*default_names([*BROKERS, 4]), "mallory"])
    return d


@functools.cache
def client_context(certs: Path, name: str) -> ssl.SSLContext:
    return TlsIdentity.from_dir(certs, name).client_context()


@contextlib.asynccontextmanager
async def tls_service(data_dir: Path, certs: Path) -> AsyncIterator[ControllerService]:
    """A controller under mutual TLS, as `controller`, on a VirtualClock."""
    svc = ControllerService(
        data_dir,
        "127.0.0.1:0",
        config=ControllerConfig(),
        clock=VirtualClock(1_700_000_000_000),
        tls=TlsIdentity.from_dir(certs, "controller"),
    )
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def service(tmp_path: Path, certs: Path) -> AsyncIterator[ControllerService]:
    async with tls_service(tmp_path / "controller", certs) as svc:
        yield svc


class Wire:
    """Requests to one service over mutual TLS, as any principal of the test CA."""

    def __init__(self, svc: ControllerService, certs: Path) -> None:
        self.svc = svc
        self.certs = certs
        self.refused_before: set[str] = set()  # principals with a WARNING line already

    async def call(self, principal: str, body: Message) -> Message:
        """One request as `principal`, checking that the server is `controller`."""
        async with RpcClient(
            self.svc.address,
            ssl=client_context(self.certs, principal),
            expect_principal="controller",
        ) as client:
            return await client.request(body, timeout_s=10)

    def offsets(self) -> tuple[int, int]:
        """(decided, committed) log end offsets."""
        assert self.svc.store is not None
        return self.svc.controller.image.end_offset, self.svc.store.end_offset

    def failures(self, principal: str, operation: str) -> float:
        return sample(
            self.svc,
            "metactl_authorization_failures_total",
            principal=principal,
            operation=operation,
        )

    async def refused(
        self, principal: str, body: Message, error: type[MetactlError], operation: str
    ) -> None:
        """`principal` sends `body`: refused with `error`; nothing decided or committed;
        one more refusal counted; a WARNING naming principal and operation if it is the
        principal's first refusal (the virtual clock stands still, so later ones are
        held back by the rate limit)."""
        before, counted = self.offsets(), self.failures(principal, operation)
        with capture_logs() as logs, pytest.raises(error):
            await self.call(principal, body)
        assert self.offsets() == before
        assert self.failures(principal, operation) == counted + 1
        lines = [e for e in logs if e["event"] == "authorization failed"]
        if principal in self.refused_before:
            assert lines == []
        else:
            assert len(lines) == 1, lines
            line = lines[0]
            assert (line["log_level"], line["principal"], line["operation"]) == (
                "warning",
                principal,
                operation,
            )
            assert line["code"] == error.code and line["count"] == 1
            self.refused_before.add(principal)

    async def register(self, broker_id: int, *, unfence: bool = True) -> int:
        r = await self.call(
            f"broker-{broker_id}",
            RegisterBroker(
                broker_id=broker_id, incarnation_id=f"real-{broker_id}", endpoint="127.0.0.1:1"
            ),
        )
        assert isinstance(r, RegisterBrokerResponse)
        if unfence:
            assert not (await self.heartbeat(broker_id, r.broker_epoch)).is_fenced
        return r.broker_epoch

    async def heartbeat(
        self, broker_id: int, epoch: int, *, shutdown: bool = False
    ) -> BrokerHeartbeatResponse:
        hb = await self.call(
            f"broker-{broker_id}",
            BrokerHeartbeatRequest(
                broker_id=broker_id,
                broker_epoch=epoch,
                metadata_offset=self.offsets()[1],
                want_shutdown=shutdown,
            ),
        )
        assert isinstance(hb, BrokerHeartbeatResponse)
        return hb

    async def create(self, topic: CreateTopic) -> None:
        r = await self.call("admin", CreateTopicsRequest(topics=[topic]))
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r

    async def alter(self, topic: str, leader: int, isr: dict[int, int]) -> PartitionState:
        """The leader's AlterPartition of `topic`-0 to `isr` ({broker: epoch})."""
        r = await self.call(f"broker-{leader}", self.alter_request(topic, leader, isr))
        assert isinstance(r, PartitionState) and r.isr == sorted(isr)
        return r

    def alter_request(self, topic: str, leader: int, isr: dict[int, int]) -> AlterPartition:
        p = self.svc.controller.committed_image.partitions[(topic, 0)]
        return AlterPartition(
            topic=topic,
            partition=0,
            leader=leader,
            broker_epoch=isr[leader],
            partition_epoch=p.partition_epoch,
            leader_epoch=p.leader_epoch,
            isr=[IsrMember(broker_id=b, broker_epoch=e) for b, e in sorted(isr.items())],
        )

    async def cluster(self) -> dict[int, int]:
        """Brokers 1-3 registered and unfenced; `demo`: 3 partitions, RF 3, MinISR 2,
        demo-N led by broker N+1. Returns the brokers' epochs."""
        epochs = {b: await self.register(b) for b in BROKERS}
        await self.create(
            CreateTopic(name="demo", assignments=[[1, 2, 3], [2, 3, 1], [3, 1, 2]], min_isr=2)
        )
        return epochs

    def partition(self, topic: str, index: int = 0) -> tuple[int, list[int]]:
        """(leader, ISR) of a partition, committed."""
        p = self.svc.controller.committed_image.partitions[(topic, index)]
        return p.leader, sorted(p.isr)


def sample(svc: ControllerService, name: str, **labels: str) -> float:
    assert svc.metrics is not None
    return svc.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def wire(service: ControllerService, certs: Path) -> Wire:
    return Wire(service, certs)


# --- the attacks of issue 11 ------------------------------------------------------------

CLUSTER, TOPIC = ClusterAuthorizationFailedError, TopicAuthorizationFailedError


async def test_a_heartbeat_as_another_broker_is_refused(wire: Wire) -> None:
    await wire.cluster()
    epoch = await wire.register(4, unfence=False)  # registered, fenced
    attack = BrokerHeartbeatRequest(broker_id=4, broker_epoch=epoch, metadata_offset=epoch + 1)
    before = wire.svc.sessions.last_heartbeat_ms(4)
    for attacker in ATTACKERS:
        await wire.refused(attacker, attack, CLUSTER, "heartbeat")
    # The attack would have unfenced broker 4 (an UnfenceBrokerRecord) and kept its
    # session alive: neither happened.
    assert wire.svc.controller.committed_image.brokers[4].fenced
    assert wire.svc.sessions.last_heartbeat_ms(4) == before
    assert not (await wire.heartbeat(4, epoch)).is_fenced
    assert not wire.svc.controller.committed_image.brokers[4].fenced


async def test_a_controlled_shutdown_for_another_broker_is_refused(wire: Wire) -> None:
    epochs = await wire.cluster()
    assert wire.partition("demo", 2)[0] == 3
    attack = BrokerHeartbeatRequest(
        broker_id=3, broker_epoch=epochs[3], metadata_offset=wire.offsets()[1], want_shutdown=True
    )
    for attacker in ATTACKERS:
        await wire.refused(attacker, attack, CLUSTER, "controlled_shutdown")
    assert wire.partition("demo", 2)[0] == 3
    assert not wire.svc.controller.committed_image.brokers[3].in_controlled_shutdown
    before = wire.offsets()
    assert (await wire.heartbeat(3, epochs[3], shutdown=True)).in_controlled_shutdown
    assert wire.offsets() > before
    assert wire.partition("demo", 2)[0] != 3  # leadership moved, as broker 3 asked


async def test_a_registration_as_another_broker_is_refused(wire: Wire) -> None:
    epochs = await wire.cluster()
    before = dict(wire.svc.controller.committed_image.brokers)
    # Epochs are public (describe), so the forged re-registration would have been clean.
    for broker_id, previous in ((2, epochs[2]), (4, None)):
        attack = RegisterBroker(
            broker_id=broker_id,
            incarnation_id="evil",
            previous_epoch=previous,
            endpoint="127.0.0.1:6666",
        )
        for attacker in ATTACKERS:
            await wire.refused(attacker, attack, CLUSTER, "register_broker")
    # Endpoint, epoch, incarnation: unchanged, so the controller would still inspect
    # broker 2 at the endpoint broker-2 registered.
    assert dict(wire.svc.controller.committed_image.brokers) == before
    # The real broker 2 keeps its session (no STALE_BROKER_EPOCH, no
    # DUPLICATE_BROKER_REGISTRATION), and broker 4 registers itself.
    assert not (await wire.heartbeat(2, epochs[2])).is_fenced
    await wire.register(4)
    assert wire.svc.controller.committed_image.brokers[4].endpoint == "127.0.0.1:1"


async def test_alter_partition_from_anyone_but_the_leader_is_refused(wire: Wire) -> None:
    epochs = await wire.cluster()
    assert wire.partition("demo") == (1, [1, 2, 3])
    # Shrinking demo-0 below its MinISR (2), in the leader's name.
    attack = wire.alter_request("demo", 1, {1: epochs[1]})
    for attacker in ("broker-2", "broker-3", "admin", "viewer", "controller", "mallory"):
        await wire.refused(attacker, attack, CLUSTER, "alter_partition")
    assert wire.partition("demo") == (1, [1, 2, 3])
    await wire.alter("demo", 1, {1: epochs[1], 2: epochs[2]})
    assert wire.partition("demo") == (1, [1, 2])


async def test_an_unclean_election_needs_admin(wire: Wire) -> None:
    """`u-0` (replicas 3, 1; manual recovery) loses its only ISR member, broker 3, to a
    controlled shutdown: leaderless until an operator's unclean election."""
    epochs = await wire.cluster()
    await wire.create(
        CreateTopic(name="u", assignments=[[3, 1]], min_isr=1, recovery_strategy="manual")
    )
    await wire.alter("u", 3, {3: epochs[3]})
    await wire.heartbeat(3, epochs[3], shutdown=True)
    assert wire.partition("u")[0] == -1

    def data_losses() -> float:
        return sample(
            wire.svc, "metactl_potential_data_loss_events_total", topic="u", strategy="manual"
        )

    attack = ElectLeader(topic="u", partition=0, election_type="unclean", replica=1)
    for attacker in ELECT_ATTACKERS:
        await wire.refused(attacker, attack, CLUSTER, "elect_unclean")
    assert wire.partition("u")[0] == -1 and data_losses() == 0
    r = await wire.call("admin", attack)
    assert isinstance(r, PartitionState) and r.leader == 1
    assert data_losses() == 1  # an UncleanRecoveryRecord, committed


async def test_a_preferred_election_needs_admin(wire: Wire) -> None:
    """`p-0` (replicas 4, 1) is created while broker 4 is fenced, so broker 1 leads; once
    broker 4 is back in the ISR, a preferred election moves leadership to it."""
    epochs = await wire.cluster()
    epochs[4] = await wire.register(4, unfence=False)
    await wire.create(CreateTopic(name="p", assignments=[[4, 1]], min_isr=1))
    assert wire.partition("p")[0] == 1
    await wire.heartbeat(4, epochs[4])
    await wire.alter("p", 1, {1: epochs[1], 4: epochs[4]})
    attack = ElectLeader(topic="p", partition=0, election_type="preferred")
    for attacker in ELECT_ATTACKERS:
        await wire.refused(attacker, attack, CLUSTER, "elect_preferred")
    assert wire.partition("p")[0] == 1
    r = await wire.call("admin", attack)
    assert isinstance(r, PartitionState) and r.leader == 4


async def test_creating_topics_needs_admin(wire: Wire) -> None:
    await wire.cluster()
    attack = CreateTopicsRequest(topics=[CreateTopic(name="evil", partitions=1)])
    for attacker in ("broker-1", "viewer", "controller", "mallory"):
        await wire.refused(attacker, attack, TOPIC, "create_topics")
    assert "evil" not in wire.svc.controller.committed_image.topics
    await wire.create(CreateTopic(name="evil", partitions=1))
    assert "evil" in wire.svc.controller.committed_image.topics


# --- reads, the inspection endpoint, the log, no certificate --------------------------------


async def test_describe_and_metadata_fetches_need_a_known_principal(wire: Wire) -> None:
    await wire.cluster()
    await wire.refused("mallory", DescribeClusterRequest(), CLUSTER, "describe_cluster")
    await wire.refused("mallory", FetchMetadataRequest(from_offset=0), CLUSTER, "fetch_metadata")
    for reader in ("viewer", "admin", "controller", "broker-2"):
        d = await wire.call(reader, DescribeClusterRequest())
        assert isinstance(d, DescribeClusterResponse) and len(d.partitions) == 3
        f = await wire.call(reader, FetchMetadataRequest(from_offset=0, max_wait_ms=0))
        assert isinstance(f, FetchMetadataResponse) and f.end_offset == wire.offsets()[1]


class LogInfoServer:
    """A broker-like listener under some certificate, recording what it is asked."""

    def __init__(
        self,
        certs: Path,
        name: str,
        broker_id: int,
        partitions: list[ReplicaLogInfoEntry] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.epoch = -1
        self.partitions = partitions or []
        self.asked: list[tuple[Message, str | None]] = []
        tls = TlsIdentity.from_dir(certs, name)
        self.server = FrameServer(self.handle, ssl=tls.server_context())

    async def handle(self, body: Message, peer: Peer) -> Message:
        self.asked.append((body, peer.principal))
        return GetReplicaLogInfoResponse(
            broker_id=self.broker_id, broker_epoch=self.epoch, partitions=self.partitions
        )


async def test_the_controller_inspects_only_an_endpoint_that_proves_the_broker_id(
    wire: Wire,
) -> None:
    """Broker 1 registers an endpoint answered by a broker-2 certificate: the controller's
    GetReplicaLogInfo never reaches it. Broker 4's own endpoint is asked, as `controller`.
    (`Inspections.inspect` is what an unclean recovery's inspection runs.)"""
    impostor = LogInfoServer(wire.certs, "broker-2", broker_id=1)
    real = LogInfoServer(wire.certs, "broker-4", broker_id=4)
    for s in (impostor, real):
        await s.server.start("127.0.0.1:0")
    try:
        epochs: dict[int, int] = {}
        for broker_id, server in ((1, impostor), (4, real)):
            r = await wire.call(
                f"broker-{broker_id}",
                RegisterBroker(
                    broker_id=broker_id, incarnation_id="i", endpoint=server.server.address
                ),
            )
            assert isinstance(r, RegisterBrokerResponse)
            epochs[broker_id] = server.epoch = r.broker_epoch
            assert not (await wire.heartbeat(broker_id, r.broker_epoch)).is_fenced
        with capture_logs() as logs:
            for broker_id in (1, 4):
                await wire.svc.inspections.inspect(
                    Inspection(
                        broker_id=broker_id, broker_epoch=epochs[broker_id], topic="t", partition=0
                    )
                )
        assert impostor.asked == []
        [failed] = [e for e in logs if e["event"] == "replica log info failed; giving up"]
        assert failed["broker"] == 1 and SslAuthenticationError.code in failed["error"]
        assert [(type(m).__name__, p) for m, p in real.asked] == [
            ("GetReplicaLogInfoRequest", "controller")
        ]
        assert isinstance(real.asked[0][0], GetReplicaLogInfoRequest)
        assert real.asked[0][0].broker_id == 4
    finally:
        for s in (impostor, real):
            await s.server.stop()


async def test_an_inspection_answer_counts_only_for_the_broker_and_partition_asked(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broker 4's own endpoint (a genuine broker-4 certificate) answers the inspection of
    broker 4 in broker 2's name, then for a partition it was not asked about, with a log
    end that would win any balanced recovery: neither answer reaches the core. Answering
    for itself and the partition asked, it does."""
    epochs = await wire.cluster()
    liar = LogInfoServer(wire.certs, "broker-4", broker_id=2)
    await liar.server.start("127.0.0.1:0")
    try:
        r = await wire.call(
            "broker-4",
            RegisterBroker(broker_id=4, incarnation_id="i", endpoint=liar.server.address),
        )
        assert isinstance(r, RegisterBrokerResponse)
        assert not (await wire.heartbeat(4, r.broker_epoch)).is_fenced
        liar.epoch = epochs[2]  # epochs are public (describe): broker 2's current one
        submitted: list[Message] = []
        submit = wire.svc.controller.submit

        async def recording(request: Any) -> Any:
            submitted.append(request)
            return await submit(request)

        monkeypatch.setattr(wire.svc.controller, "submit", recording)

        def entry(topic: str) -> ReplicaLogInfoEntry:
            return ReplicaLogInfoEntry(
                topic=topic, partition=0, last_leader_epoch=9, log_end_offset=10**9
            )

        insp = Inspection(broker_id=4, broker_epoch=r.broker_epoch, topic="demo", partition=0)
        liar.partitions = [entry("demo")]
        with capture_logs() as logs:
            await wire.svc.inspections.inspect(insp)
            liar.broker_id, liar.epoch = 4, r.broker_epoch
            liar.partitions = [entry("other")]
            await wire.svc.inspections.inspect(insp)
        assert len(liar.asked) == 2
        assert submitted == []
        events = [e["event"] for e in logs]
        assert "replica log info refused: the answer names another broker" in events
        assert "replica log info refused: a partition that was not asked" in events
        # The planted lie is what the check stops: the honest answer goes through.
        liar.partitions = [entry("demo")]
        await wire.svc.inspections.inspect(insp)
        assert [type(m) for m in submitted] == [LogInfoAnswers]
        assert isinstance(submitted[0], LogInfoAnswers)
        assert [(a.broker_id, a.topic) for a in submitted[0].answers] == [(4, "demo")]
    finally:
        await liar.server.stop()


async def test_a_flood_of_refusals_is_counted_in_full_and_logged_once_a_second(
    wire: Wire,
) -> None:
    clock = wire.svc.clock
    assert isinstance(clock, VirtualClock)
    attack = CreateTopicsRequest(topics=[CreateTopic(name="evil", partitions=1)])
    before = wire.offsets()
    with capture_logs() as logs:
        async with RpcClient(
            wire.svc.address,
            ssl=client_context(wire.certs, "mallory"),
            expect_principal="controller",
        ) as c:
            for _ in range(50):
                with pytest.raises(TopicAuthorizationFailedError):
                    await c.request(attack)
            with pytest.raises(TopicAuthorizationFailedError):  # a line of its own
                await wire.call("viewer", attack)
            clock.set(clock.now_ms() + 999)
            with pytest.raises(TopicAuthorizationFailedError):
                await c.request(attack)
            clock.set(clock.now_ms() + 1)
            with pytest.raises(TopicAuthorizationFailedError):
                await c.request(attack)
    lines = [(e["principal"], e["count"]) for e in logs if e["event"] == "authorization failed"]
    # Mallory's first refusal; viewer's; a second later, one line for the refusal then
    # and the 50 held back (49 at the start, 1 at +999 ms).
    assert lines == [("mallory", 1), ("viewer", 1), ("mallory", 51)]
    assert wire.failures("mallory", "create_topics") == 52
    assert wire.offsets() == before


async def test_a_client_without_a_certificate_gets_nothing(wire: Wire) -> None:
    """The issue's attacker had nothing but a TCP connection: no handshake, no request."""
    epochs = await wire.cluster()
    before = wire.offsets()
    attack = BrokerHeartbeatRequest(
        broker_id=3, broker_epoch=epochs[3], metadata_offset=before[1], want_shutdown=True
    )
    with pytest.raises(NetworkError):
        async with RpcClient(wire.svc.address) as plain:
            await plain.request(attack, timeout_s=10)
    assert wire.offsets() == before
    assert not wire.svc.controller.committed_image.brokers[3].in_controlled_shutdown
