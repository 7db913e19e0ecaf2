"""The one client: reconnects, retries retriable errors with capped, jittered backoff,
fails fast on the others. Against a real FrameServer on 127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import protocol.client
from clients.controller import ask
from metactl.errors import (
    EligibleLeadersNotAvailableError,
    IneligibleReplicaError,
    NetworkError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)
from protocol.client import NO_RETRY, RetryPolicy, RpcClient, request_once
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.server import FrameServer
from tests.protocol.conftest import Scripted

EMPTY = DescribeClusterResponse(brokers=[], partitions=[], end_offset=0, committed_offset=0)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def policy(attempts: int, sleeps: Sleeps, *, base: float = 0.1, cap: float = 1.0) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, base_s=base, cap_s=cap, sleep=sleeps, random=lambda: 1.0)


async def test_retriable_errors_are_retried_until_success(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [NotLeaderOrFollowerError("moving"), EligibleLeadersNotAvailableError(), EMPTY]
    sleeps = Sleeps()
    async with RpcClient(server.address, retry=policy(5, sleeps)) as client:
        assert await client.request(DescribeClusterRequest()) == EMPTY
    assert len(handler.requests) == 3
    assert sleeps.delays == [0.1, 0.2]  # exponential, with random() = 1: the full bound


async def test_a_non_retriable_error_is_raised_after_exactly_one_attempt(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [IneligibleReplicaError("not in the ELR"), EMPTY]
    sleeps = Sleeps()
    async with RpcClient(server.address, retry=policy(5, sleeps)) as client:
        with pytest.raises(IneligibleReplicaError, match="not in the ELR"):
            await client.request(DescribeClusterRequest())
        assert len(handler.requests) == 1 and sleeps.delays == []
        assert client.connected  # a coded answer keeps the connection
        assert await client.request(DescribeClusterRequest()) == EMPTY


async def test_attempts_run_out_and_the_last_error_is_raised(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [NotLeaderOrFollowerError(str(i)) for i in range(10)]
    sleeps = Sleeps()
    with pytest.raises(NotLeaderOrFollowerError, match=r": 3$"):
        await request_once(server.address, DescribeClusterRequest(), retry=policy(4, sleeps))
    assert len(handler.requests) == 4 and len(sleeps.delays) == 3


async def test_retries_end_once_the_answer_is_no_longer_wanted(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [NotLeaderOrFollowerError(str(i)) for i in range(10)]
    sleeps = Sleeps()
    wanted = iter([True, False])
    async with RpcClient(server.address, retry=policy(10, sleeps)) as client:
        with pytest.raises(NotLeaderOrFollowerError, match=r": 1$"):
            await client.request(DescribeClusterRequest(), still_wanted=lambda: next(wanted))
    assert len(handler.requests) == 2 and len(sleeps.delays) == 2


async def test_no_retry_is_made_whose_backoff_would_end_past_the_deadline(
    server: FrameServer, handler: Scripted
) -> None:
    # Backoffs of 10, 20, 40 s (injected sleeps: no time passes); the deadline 35 s ahead
    # allows the first two, not the third (10 + 20 s and however long the requests took
    # here, which is far less than 15 s, is before it; 40 s is past it whatever happens).
    handler.script = [NotLeaderOrFollowerError(str(i)) for i in range(3)] + [EMPTY]
    sleeps = Sleeps()
    async with RpcClient(server.address, retry=policy(10, sleeps, base=10, cap=100)) as client:
        deadline = asyncio.get_running_loop().time() + 35
        with pytest.raises(NotLeaderOrFollowerError, match=r": 2$"):
            await client.request(DescribeClusterRequest(), deadline=deadline)
        assert len(handler.requests) == 3 and sleeps.delays == [10, 20]
        # Without one, the same policy retries on to the answer.
        handler.script = [NotLeaderOrFollowerError(str(i)) for i in range(3)] + [EMPTY]
        assert await client.request(DescribeClusterRequest()) == EMPTY
    assert sleeps.delays == [10, 20, 10, 20, 40]


async def test_a_slow_loop_that_wakes_past_the_deadline_raises_the_last_error(
    server: FrameServer,
) -> None:
    # A loaded machine: the backoff (0.1 s, well before the 0.2 s deadline) blocks the
    # event loop for 0.3 s. The retry is not made and a closed port stays NETWORK_EXCEPTION:
    # the CLI's deadline timer, firing as the next connection began, made it
    # REQUEST_TIMED_OUT (a clean-clone CI run's `events` failure).
    address = server.address
    await server.stop()
    slept: list[float] = []

    async def blocking_sleep(delay: float) -> None:
        slept.append(delay)
        time.sleep(0.3)  # noqa: ASYNC251 - the point: a loop that is late to wake

    retry = RetryPolicy(attempts=5, base_s=0.1, cap_s=0.1, sleep=blocking_sleep, random=lambda: 1.0)
    async with RpcClient(address) as client:
        with pytest.raises(NetworkError, match="ConnectionRefused"):
            await ask(client, DescribeClusterRequest(), 0.2, retry=retry)
    assert slept == [0.1]


async def test_an_attempt_unanswered_at_the_deadline_is_request_timed_out() -> None:
    # A listener that accepts and never answers: the attempt's own timeout (5 s) is later
    # than the deadline, which ends it with REQUEST_TIMED_OUT naming the address and time.
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        async with RpcClient(address, retry=RetryPolicy(attempts=5)) as client:
            # The time it owns, named as given (a deadline computed by the caller was
            # named as the time left at the call: "0.993 s" for a `--timeout 1`).
            with pytest.raises(
                RequestTimedOutError, match=f"no answer from {address} within 0.25 s"
            ):
                await client.request(DescribeClusterRequest(), 5.0, within_s=0.25)
    finally:
        silent.close()


async def test_backoff_is_capped_and_fully_jittered(server: FrameServer, handler: Scripted) -> None:
    handler.script = [*(NotLeaderOrFollowerError() for _ in range(7)), EMPTY]
    sleeps = Sleeps()
    async with RpcClient(server.address) as client:  # the per-call policy wins
        resp = await client.request(
            DescribeClusterRequest(), retry=policy(10, sleeps, base=0.1, cap=0.5)
        )
    assert resp == EMPTY
    assert sleeps.delays == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5]
    jitter = RetryPolicy(base_s=0.1, cap_s=0.5, random=lambda: 0.25)
    assert jitter.backoff(0) == pytest.approx(0.025) and jitter.backoff(60) == 0.125


async def test_an_unreachable_peer_is_a_retriable_network_error(
    server: FrameServer, handler: Scripted
) -> None:
    address = server.address
    await server.stop()
    sleeps = Sleeps()
    with pytest.raises(NetworkError) as e:
        await request_once(address, DescribeClusterRequest(), retry=policy(3, sleeps))
    assert e.value.retriable and len(sleeps.delays) == 2


async def test_the_client_reconnects_after_the_peer_restarts(handler: Scripted) -> None:
    handler.script = [EMPTY, EMPTY]
    first = FrameServer(handler)
    address = await first.start("127.0.0.1:0")
    client = RpcClient(address)
    try:
        assert await client.request(DescribeClusterRequest()) == EMPTY
        await first.stop()
        with pytest.raises(NetworkError):
            await client.request(DescribeClusterRequest(), timeout_s=2)
        second = FrameServer(handler)
        await second.start(address)
        try:
            assert await client.request(DescribeClusterRequest()) == EMPTY
        finally:
            await second.stop()
    finally:
        await client.close()


def test_a_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_ride_failover_retries_until_the_deadline_but_not_a_lone_dead_address() -> None:
    from metactl.errors import InvalidRequestError, NetworkError, NotControllerError
    from protocol.client import RideFailover

    quorum = RideFailover(endpoints=3)
    # NOT_CONTROLLER and network errors: far past FailoverPolicy's n + 2 attempts (the
    # caller's deadline is what ends them).
    assert quorum.should_retry(NotControllerError("no controller is active"), 50)
    assert quorum.should_retry(NetworkError("refused"), 50)
    assert not quorum.should_retry(InvalidRequestError("bad"), 0)  # not retriable
    assert not quorum.should_retry(ValueError("not ours"), 0)
    lone = RideFailover(endpoints=1)
    assert lone.should_retry(NetworkError("refused"), 2)
    assert not lone.should_retry(NetworkError("refused"), 3)  # nowhere else to go
    assert lone.should_retry(NotControllerError("a standby"), 50)


def test_endpoints_poll_the_standbys_rather_than_a_hinted_address_that_just_refused() -> None:
    """A killed active controller: its address refuses, and until its lease is gone the
    standbys still name it. Its hint is not followed while the refusal is recent (and
    rotation skips it), so the retries go to the standbys, one of which takes over; a
    hint naming another address is a redirect (`failed` is True)."""
    from metactl.errors import NotControllerError
    from protocol.client import Endpoints

    now = [0.0]
    e = Endpoints(["a:1", "b:1", "c:1"], clock=lambda: now[0])
    assert not e.failed(refused("a:1")) and e.current == "b:1"
    assert not e.failed(NotControllerError("standby", leader="a:1")) and e.current == "c:1"
    assert not e.failed(NotControllerError("standby", leader="a:1")) and e.current == "b:1"
    assert not e.failed(NotControllerError("no controller is active")) and e.current == "c:1"
    assert e.failed(NotControllerError("standby", leader="b:1")) and e.current == "b:1"
    now[0] = Endpoints.STALE_HINT_S  # the refusal is old news: the hint is followed again
    assert e.failed(NotControllerError("standby", leader="a:1")) and e.current == "a:1"
    # Every address refused lately: rotation goes on in order.
    assert not e.failed(refused("a:1")) and e.current == "b:1"
    assert not e.failed(refused("b:1")) and e.current == "c:1"
    assert not e.failed(refused("c:1")) and e.current == "a:1"


def refused(address: str) -> NetworkError:
    error = NetworkError(f"{address}: ConnectionRefusedError")
    error.refused = True
    return error


def test_endpoints_follow_a_hint_to_a_live_active_whose_connection_merely_broke() -> None:
    """The active controller closed a pooled connection (its idle timeout), or one
    exchange timed out: that is no sign it is down. The standby's hint naming it is
    followed at once (skipping it for a second made a broker's five attempts go round
    the standbys and give up with NOT_CONTROLLER, the active alive)."""
    from metactl.errors import NotControllerError
    from protocol.client import Endpoints

    e = Endpoints(["a:1", "b:1", "c:1"], clock=lambda: 0.0)
    assert not e.failed(NetworkError("a:1: EOFError")) and e.current == "b:1"
    assert e.failed(NotControllerError("standby", leader="a:1")) and e.current == "a:1"


async def test_only_a_refused_connection_is_marked_refused(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [EMPTY]
    address = server.address
    async with RpcClient(address) as client:
        await client.request(DescribeClusterRequest())  # a pooled connection
        await server.stop()  # closes it, and nothing listens any more
        with pytest.raises(NetworkError) as broken:
            await client.request(DescribeClusterRequest())
        with pytest.raises(NetworkError) as refusal:
            await client.request(DescribeClusterRequest())
    assert not broken.value.refused and refusal.value.refused


async def test_a_redirect_is_followed_at_once_but_never_twice_in_a_row() -> None:
    """NOT_CONTROLLER naming the active controller: the next try goes there without a
    backoff, and is not counted against the policy's attempts. Two addresses that name
    each other (a stale hint, say) do not make a loop without backoff: every other retry
    waits, and counts."""
    from metactl.errors import NotControllerError

    handlers = [Scripted(), Scripted(), Scripted()]
    servers = [FrameServer(h) for h in handlers]
    a, b, c = [await s.start("127.0.0.1:0") for s in servers]
    try:
        handlers[0].script = [NotControllerError("standby", leader=b) for _ in range(3)]
        handlers[1].script = [NotControllerError("standby", leader=a) for _ in range(2)]
        handlers[1].script.append(EMPTY)
        sleeps = Sleeps()
        async with RpcClient(f"{a},{b}", retry=policy(10, sleeps, base=0.1, cap=1.0)) as client:
            assert await client.request(DescribeClusterRequest()) == EMPTY
        # a -> b at once, b -> a after a backoff, a -> b at once, b -> a after one...
        # (a redirect is not counted: the backoffs grow with the other retries only)
        assert sleeps.delays == [0.0, 0.1, 0.0, 0.2, 0.0]
        assert len(handlers[0].requests) == 3 and len(handlers[1].requests) == 3
        # The last retry a policy allows, answered with a hint, still reaches the active
        # controller: a -> b (no controller active yet: a retry), b -> c (a redirect).
        handlers[0].script = [NotControllerError("no controller is active")]
        handlers[1].script = [NotControllerError("standby", leader=c)]
        handlers[2].script = [EMPTY]
        async with RpcClient(f"{a},{b},{c}", retry=policy(2, sleeps)) as client:
            assert await client.request(DescribeClusterRequest()) == EMPTY
        # A client that makes no retries makes no redirect either.
        handlers[0].script = [NotControllerError("standby", leader=c)]
        async with RpcClient(f"{a},{b},{c}", retry=policy(1, sleeps)) as client:
            with pytest.raises(NotControllerError):
                await client.request(DescribeClusterRequest())
    finally:
        for s in servers:
            await s.stop()


async def test_a_connection_that_reaches_itself_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connecting to a loopback port nothing listens on may land on the port the kernel
    picked for the client itself (TCP's simultaneous open): the client then read its own
    request back and timed out. Forced here with a real socket bound to the very port it
    connects to: NETWORK_EXCEPTION (refused) at once, as for any closed port."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]

    class BoundToTarget:
        """`socket` as `protocol.client` sees it, whose sockets are bound to `port`."""

        def socket(self, *args: int) -> socket.socket:
            s = socket.socket(*args)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            return s

        def __getattr__(self, name: str) -> object:
            return getattr(socket, name)

    monkeypatch.setattr(protocol.client, "socket", BoundToTarget())
    async with RpcClient(f"127.0.0.1:{port}", retry=NO_RETRY) as client:
        with pytest.raises(NetworkError, match="reached itself") as caught:
            await client.request(DescribeClusterRequest(), 5.0)
    assert caught.value.refused
