"""The controller mutation quota (KIP-599) and the partitions-per-request cap, against a
real controller service over TCP on a virtual clock: throttle times are exact, a refused
request commits nothing, the client waits the throttle time out, and buckets are per
principal (per client host without TLS, per certificate principal with it)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.quota import MutationLimits
from controller.runtime.service import ControllerService
from localcluster.certs import default_names, init_certs
from metactl.errors import (
    ElectionNotNeededError,
    PolicyViolationError,
    ThrottlingQuotaExceededError,
)
from protocol.client import RetryPolicy, RpcClient
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
    PartitionState,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker
from protocol.tls import TlsIdentity
from protocol.transport import read_frame

# 100 partitions/s, a bucket of 100: exact, small numbers.
LIMITS = MutationLimits(rate=100, burst_window_s=1, max_partitions_per_request=500)
HOST = "127.0.0.1"


@contextlib.asynccontextmanager
async def running(
    data_dir: Path, limits: MutationLimits = LIMITS, tls: TlsIdentity | None = None
) -> AsyncIterator[tuple[ControllerService, VirtualClock]]:
    clock = VirtualClock(1_700_000_000_000)
    svc = ControllerService(
        data_dir,
        f"{HOST}:0",
        config=ControllerConfig(),
        clock=clock,
        mutation_limits=limits,
        tls=tls,
    )
    await svc.start()
    try:
        yield svc, clock
    finally:
        await svc.stop()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[ControllerService, VirtualClock]]:
    async with running(tmp_path) as (svc, clock):
        async with RpcClient(svc.address) as c:
            for b in (1, 2):
                await register(c, b)
        yield svc, clock


async def register(c: RpcClient, broker_id: int) -> int:
    r = await c.request(RegisterBroker(broker_id=broker_id, incarnation_id=f"i{broker_id}"))
    assert isinstance(r, RegisterBrokerResponse)
    await c.request(
        BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
        )
    )
    return r.broker_epoch


def create(*topics: tuple[str, int]) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=[CreateTopic(name=n, partitions=p, replication_factor=1) for n, p in topics]
    )


def end(svc: ControllerService) -> int:
    assert svc.store is not None
    return svc.store.end_offset


async def test_one_big_create_passes_and_the_next_is_throttled_with_nothing_committed(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, clock = service
    async with RpcClient(svc.address) as c:
        r = await c.request(create(("first", 150)))  # from a full bucket of 100: -50
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
        before = end(svc)
        with pytest.raises(ThrottlingQuotaExceededError) as e:
            await c.request(create(("second", 1)))
        assert e.value.retry_after_ms == 500  # 50 partitions at 100/s, from the wire
        assert end(svc) == before and "second" not in svc.controller.committed_image.topics
        # The client waits the throttle time out (its backoff alone would be 1 ms).
        slept: list[float] = []

        async def sleep(s: float) -> None:
            slept.append(s)
            clock.set(clock.now_ms() + round(s * 1000))

        retry = RetryPolicy(attempts=2, base_s=0.001, cap_s=0.001, sleep=sleep)
        r = await c.request(create(("second", 1)), retry=retry)
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
        assert slept == [0.5]


async def test_a_refusal_on_the_wire_carries_throttle_time_ms(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    reader, writer = await asyncio.open_connection(HOST, int(svc.address.rsplit(":", 1)[1]))
    try:
        for cid, req in ((1, create(("a", 120))), (2, create(("b", 1)))):
            writer.write(encode_frame(cid, req))
            await writer.drain()
            reply = decode_frame(await read_frame(reader))
        assert reply.body == ErrorResponse(
            code="THROTTLING_QUOTA_EXCEEDED",
            message=f"controller mutation quota of 100 partitions/s exceeded for {HOST}: "
            "retry after 200 ms",
            retriable=True,
            throttle_time_ms=200,
        )
    finally:
        writer.close()


async def test_the_cap_refuses_before_anything_is_submitted_or_charged(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    before = end(svc)
    async with RpcClient(svc.address) as c:
        with pytest.raises(PolicyViolationError) as e:
            await c.request(create(("huge", 501)))
        assert "at most 500 per request" in e.value.message
        with pytest.raises(PolicyViolationError):  # the cap counts the whole request
            await c.request(create(("x", 300), ("y", 201)))
        assert end(svc) == before and svc.quota.tokens(HOST) == 100
        r = await c.request(create(("x", 300), ("y", 200)))  # exactly the cap
        assert isinstance(r, CreateTopicsResponse)


async def test_later_topics_of_a_request_are_throttled_one_by_one(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    async with RpcClient(svc.address) as c:
        r = await c.request(create(("a", 150), ("b", 1), ("c", 1)))
    assert isinstance(r, CreateTopicsResponse)
    assert [x.error_code for x in r.results] == [
        None,
        "THROTTLING_QUOTA_EXCEEDED",
        "THROTTLING_QUOTA_EXCEEDED",
    ]
    assert "retry after 500 ms" in r.results[1].message
    assert set(svc.controller.committed_image.topics) == {"a"}


async def test_what_the_core_refuses_is_not_charged(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    async with RpcClient(svc.address) as c:
        await c.request(create(("a", 10)))
        assert svc.quota.tokens(HOST) == 90
        r = await c.request(create(("a", 50)))  # TOPIC_ALREADY_EXISTS
        assert isinstance(r, CreateTopicsResponse)
        assert r.results[0].error_code == "TOPIC_ALREADY_EXISTS"
        assert svc.quota.tokens(HOST) == 90


async def test_an_election_costs_one_and_is_throttled_like_a_create(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    ctl = svc.controller
    async with RpcClient(svc.address) as c:
        await c.request(
            CreateTopicsRequest(topics=[CreateTopic(name="t", assignments=[[1, 2]], min_isr=1)])
        )
        preferred = ElectLeader(topic="t", partition=0, election_type="preferred")
        with pytest.raises(ElectionNotNeededError):  # broker 1 leads: refused, refunded
            await c.request(preferred)
        assert svc.quota.tokens(HOST) == 99
        # Move leadership to broker 2, then bring broker 1 back into the ISR.
        await ctl.submit(FenceBroker(broker_id=1, reason="test"))
        epochs = {b.broker_id: b.epoch for b in ctl.committed_image.brokers.values()}
        await c.request(
            BrokerHeartbeatRequest(broker_id=1, broker_epoch=epochs[1], metadata_offset=end(svc))
        )
        p = ctl.committed_image.partitions[("t", 0)]
        assert p.leader == 2
        await c.request(
            AlterPartition(
                topic="t", partition=0, leader=2, broker_epoch=epochs[2],
                partition_epoch=p.partition_epoch, leader_epoch=p.leader_epoch,
                isr=[IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2)],
            )
        )  # fmt: skip
        r = await c.request(preferred)
        assert isinstance(r, PartitionState) and r.leader == 1
        assert svc.quota.tokens(HOST) == 98  # charged once, for the change
        await c.request(create(("big", 200)))  # the bucket goes to -102
        with pytest.raises(ThrottlingQuotaExceededError) as e:
            await c.request(preferred)
        assert e.value.retry_after_ms == 1020


async def test_buckets_are_per_client_host_without_tls(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, _ = service
    async with RpcClient(svc.address) as c:
        await c.request(create(("a", 150)))
        with pytest.raises(ThrottlingQuotaExceededError):
            await c.request(create(("b", 1)))
    # Another loopback address is another peer: its bucket is full.
    port = int(svc.address.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection(HOST, port, local_addr=("127.0.0.2", 0))
    try:
        writer.write(encode_frame(1, create(("c", 1))))
        await writer.drain()
        reply = decode_frame(await read_frame(reader))
        assert isinstance(reply.body, CreateTopicsResponse)
        assert reply.body.results[0].error_code is None
    finally:
        writer.close()
    assert svc.quota.tokens("127.0.0.2") == 99 and svc.quota.tokens(HOST) == -50


async def test_under_tls_the_bucket_is_the_certificates_principal(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, default_names([1]))
    admin = TlsIdentity.from_dir(certs, "admin").client_context()
    async with running(tmp_path / "data", tls=TlsIdentity.from_dir(certs, "controller")) as (
        svc,
        _,
    ):
        broker = TlsIdentity.from_dir(certs, "broker-1").client_context()
        async with RpcClient(svc.address, ssl=broker) as c:
            await register(c, 1)
        async with RpcClient(svc.address, ssl=admin) as c:
            await c.request(create(("a", 150)))
            with pytest.raises(ThrottlingQuotaExceededError) as e:
                await c.request(create(("b", 1)))
        assert "exceeded for admin" in e.value.message
        assert svc.quota.tokens("admin") == -50 and svc.quota.tokens(HOST) == 100


async def test_the_cli_waits_out_a_throttle_and_succeeds(
    service: tuple[ControllerService, VirtualClock],
) -> None:
    svc, clock = service
    async with RpcClient(svc.address) as c:
        await c.request(create(("first", 130)))  # -30: the next waits 300 ms
    throttled = asyncio.Event()
    svc.quota.listeners.append(lambda principal, ms: throttled.set())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", "topics", "create", "--controller", svc.address,
        "--insecure", "--topic", "second", "--partitions", "1", "--replication-factor", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.wait_for(throttled.wait(), 60)
    clock.set(clock.now_ms() + 300)  # the time the refusal named passes
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "Created topic second" in out.decode()
    assert svc.quota.throttled_total >= 1
    r = svc.apis.describe(DescribeClusterRequest(v=2, topic="second"))
    assert isinstance(r, DescribeClusterResponse) and len(r.partitions) == 1


async def test_the_serve_flags_reach_the_service(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "controller", "--listen", f"{HOST}:0", "--insecure"]
    bad = await asyncio.create_subprocess_exec(
        *base, "--data-dir", str(tmp_path / "bad"), "--controller-mutation-rate", "-1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await bad.communicate()
    assert bad.returncode == 2 and "INVALID_CONFIG" in err.decode()
    proc = await asyncio.create_subprocess_exec(
        *base, "--data-dir", str(tmp_path / "ok"), "--max-partitions-per-request", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        address = ready.split("listen=")[1].split()[0]
        async with RpcClient(address) as c:
            await register(c, 1)
            with pytest.raises(PolicyViolationError) as e:
                await c.request(create(("t", 6)))
            assert "at most 5 per request" in e.value.message
            r = await c.request(create(("t", 5)))
            assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    finally:
        proc.terminate()
        await proc.wait()
