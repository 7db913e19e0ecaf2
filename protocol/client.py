"""The one reconnecting request/response client, with retries driven by `retriable`.

Used by brokers (heartbeats, metadata fetches, AlterPartition, replica fetches), by the
controller (GetReplicaLogInfo during unclean recovery) and by the CLI. One request is in
flight per client at a time. It connects lazily and drops the connection on any
transport or framing failure (and on a timeout or cancellation, after which the stream
is out of step), so the next request reconnects: the peer may be SIGKILLed and restarted
on the same address. Transport failures surface as `NetworkError` (retriable); a peer's
`ErrorResponse` surfaces as the coded error it names and keeps the connection.

With an `ssl` context (protocol/tls.py) the connection is mutual TLS; `expect_principal`
names the principal the server's certificate must carry (e.g. `broker-3` when the
controller inspects broker 3), and anything else fails with SslAuthenticationError, as does
a failed handshake. Neither is retriable: retrying cannot fix a certificate.

`address` may be one ``host:port``, a comma-separated list of them, or an `Endpoints`
(a list becomes one): the client then fails over between them, following NOT_CONTROLLER
hints to the active controller (HA controllers on etcd, docs/ha.md).

A `RetryPolicy` retries errors whose `retriable` is true with capped exponential backoff
and full jitter (a throttled request waits at least the throttle time its error names),
and raises any other error at once. The default policy makes one attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random as _random
import socket
import ssl as _ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    NetworkError,
    NotControllerError,
    RequestTimedOutError,
    SslAuthenticationError,
    ThrottlingQuotaExceededError,
    error_for_code,
)
from protocol.address import parse_address
from protocol.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame
from protocol.messages.base import ErrorResponse
from protocol.messages.unions import Message
from protocol.tls import principal_of
from protocol.transport import read_frame

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` in all (1: no retry). Before retry n (0-based) it sleeps a uniformly
    random time in [0, min(cap_s, base_s * 2**n)] ("full jitter"). `sleep` and `random`
    are injectable for tests. Over `Endpoints`, a redirect to the controller a
    NOT_CONTROLLER names is made at once and not counted, unless the previous retry was
    one too (`RpcClient.request`)."""

    attempts: int = 1
    base_s: float = 0.1
    cap_s: float = 2.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)
    random: Callable[[], float] = field(default=_random.random, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.cap_s < 0:
            raise ValueError(f"invalid retry policy {self}")

    def backoff(self, retry: int) -> float:
        """The delay before retry number `retry` (0 for the first retry)."""
        return self.random() * min(self.cap_s, self.base_s * 2.0 ** min(retry, 62))

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether to retry after attempt number `attempt` (0-based) failed with `exc`."""
        return isinstance(exc, MetactlError) and exc.retriable and attempt + 1 < self.attempts


NO_RETRY = RetryPolicy()


@dataclass(frozen=True)
class FailoverPolicy(RetryPolicy):
    """Retries only what another controller of a quorum may answer: NOT_CONTROLLER (the
    next try goes to the hinted active controller), and a network failure when there is
    another address to try. Everything else is the caller's to handle, as with one
    controller."""

    endpoints: int = 1

    @classmethod
    def over(cls, endpoints: Endpoints) -> FailoverPolicy:
        n = len(endpoints.addresses)
        return cls(attempts=n + 2, base_s=0.05, cap_s=0.25, endpoints=n)

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if attempt + 1 >= self.attempts:
            return False
        if isinstance(exc, NotControllerError):
            return True
        return isinstance(exc, NetworkError) and self.endpoints > 1


@dataclass(frozen=True)
class RideFailover(RetryPolicy):
    """A client command's retries against a controller quorum (issue 21): every retriable
    error is retried, following NOT_CONTROLLER hints to the active controller, with capped
    full-jitter backoff, until the caller's deadline (`RpcClient.request`'s `deadline`,
    the CLI's `--timeout`), so that a failover (a lease TTL plus an election, about 2 s)
    is ridden rather than reported, as Kafka's admin client honours its API timeout. One
    address that refuses connections still fails after `lone_attempts`: there is nowhere
    else to go."""

    attempts: int = 1_000_000  # in practice: until the deadline
    base_s: float = 0.1
    cap_s: float = 0.5
    endpoints: int = 1
    lone_attempts: int = 4

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if not (isinstance(exc, MetactlError) and exc.retriable):
            return False
        if isinstance(exc, NetworkError) and self.endpoints <= 1:
            return attempt + 1 < self.lone_attempts
        return attempt + 1 < self.attempts


class Endpoints:
    """Several addresses of one service, tried in turn (Kafka's bootstrap list,
    ``--bootstrap-controller h1:p1,h2:p2,h3:p3``): requests go to `current`. After a
    network failure the next address is tried; a NOT_CONTROLLER that names the active
    controller moves to it, one that does not (no controller is active yet) to the next.
    The client's `RetryPolicy` decides whether and when to try again.

    During a failover the standbys name the dead controller until its term is ended: a
    hint naming an address that refused a connection less than `STALE_HINT_S`
    ago is not followed (the next address is tried instead), and rotating skips such
    addresses while others are left, so retries poll the standbys, one of which becomes
    active, rather than bounce off the dead one. `failed` says whether it moved to a
    hinted controller not known to be down (a redirect, which the client makes at once,
    without backoff)."""

    STALE_HINT_S: Final = 1.0

    def __init__(
        self, addresses: Sequence[str], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not addresses:
            raise InvalidRequestError("no address given")
        for a in addresses:
            parse_address(a)  # a bad address is a named error now, not at the first try
        self.addresses = list(dict.fromkeys(addresses))
        self.current = self.addresses[0]
        self._clock = clock
        self._unreachable: dict[str, float] = {}  # address -> when it last failed so

    @classmethod
    def parse(cls, text: str) -> Endpoints:
        """From ``host:port[,host:port...]``."""
        return cls([a.strip() for a in text.split(",") if a.strip()])

    def __call__(self) -> str:
        return self.current

    def failed(self, exc: MetactlError) -> bool:
        """Choose the next address after `exc`; True if it is a redirect: a
        NOT_CONTROLLER hint naming another address, not known to be down."""
        now = self._clock()
        if isinstance(exc, NetworkError):
            if exc.refused:  # nothing listens there: down, not just one exchange failed
                self._unreachable[self.current] = now
        elif isinstance(exc, NotControllerError):
            self._unreachable.pop(self.current, None)  # it answered
            leader = exc.leader
            if leader and leader != self.current and not self._down(leader, now):
                self.current = leader
                return True
        else:
            return False
        i = self.addresses.index(self.current) if self.current in self.addresses else -1
        rotation = [
            self.addresses[(i + k) % len(self.addresses)] for k in range(1, len(self.addresses) + 1)
        ]
        self.current = next((a for a in rotation if not self._down(a, now)), rotation[0])
        return False

    def _down(self, address: str, now: float) -> bool:
        """Whether `address` refused a connection less than `STALE_HINT_S` ago. Other
        network errors (a pooled connection closed by the peer's idle timeout, a reset,
        an exchange that timed out) say nothing of whether it is down."""
        at = self._unreachable.get(address)
        return at is not None and now - at < self.STALE_HINT_S

    def __repr__(self) -> str:
        return f"Endpoints({','.join(self.addresses)} -> {self.current})"


class RpcClient:
    def __init__(
        self,
        address: str | Callable[[], str],
        *,
        connect_timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        retry: RetryPolicy = NO_RETRY,
        ssl: _ssl.SSLContext | None = None,
        expect_principal: str | None = None,
    ) -> None:
        if isinstance(address, str) and "," in address:
            address = Endpoints.parse(address)
        self._address = address
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self.retry = retry
        self.ssl = ssl
        self.expect_principal = expect_principal
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connected_to: str | None = None
        self._next_id = 1
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        retry: RetryPolicy = NO_RETRY,
        ssl: _ssl.SSLContext | None = None,
    ) -> RpcClient:
        """A client to HOST:PORT, connected now (so an unreachable peer fails here)."""
        client = cls(f"{host}:{port}", max_frame_bytes=max_frame_bytes, retry=retry, ssl=ssl)
        await client.connect()
        return client

    @property
    def address(self) -> str:
        return self._address() if callable(self._address) else self._address

    @property
    def target(self) -> str | Endpoints | Callable[[], str]:
        """What the client was opened on: one address, a quorum's `Endpoints`, or a
        function giving the address to use."""
        return self._address

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self) -> None:
        """Connect now unless connected; raises NetworkError if the peer is unreachable."""
        try:
            await self._connection()
        except _ssl.SSLError as exc:
            self._drop()
            raise SslAuthenticationError(f"{self.address}: TLS handshake failed: {exc}") from None
        except (OSError, TimeoutError) as exc:
            self._drop()
            raise NetworkError(f"{self.address}: {type(exc).__name__}: {exc}") from None

    async def request(
        self,
        body: Message,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        retry: RetryPolicy | None = None,
        still_wanted: Callable[[], bool] | None = None,
        deadline: float | None = None,
        within_s: float | None = None,
    ) -> Message:
        """Send `body`, return the response body; raise the peer's coded error, or
        `NetworkError` when the exchange failed (the connection is then dropped).
        `timeout_s` bounds each attempt; `retry` (default: the client's) decides retries,
        and `still_wanted`, asked after each backoff, can end them early (the last error is
        then raised). With a `deadline` (the event loop's time), or `within_s` (the
        deadline that many seconds after this call), the request owns it: an attempt still
        unanswered at the deadline is REQUEST_TIMED_OUT ("no answer from ADDRESS within
        S s", S `within_s`, or the time from this call to the deadline), and a retry whose
        backoff would end at or past it, or that a slow event loop wakes after it, is not
        made: the error it would retry is raised (a closed port stays NETWORK_EXCEPTION
        however loaded the machine is)."""
        policy = retry if retry is not None else self.retry
        loop = asyncio.get_running_loop()
        if within_s is not None:
            deadline = loop.time() + within_s
        elif deadline is not None:
            within_s = max(0.0, round(deadline - loop.time(), 3))
        attempt = 0
        redirected = False
        while True:
            try:
                return await self._attempt(body, timeout_s, deadline, within_s)
            except MetactlError as exc:
                # The next try goes elsewhere. A redirect to a hinted active controller
                # (never two in a row) is made at once and not counted against the
                # policy's attempts: a last try that reaches a standby naming the new
                # active controller does not fail the request.
                redirect = isinstance(self._address, Endpoints) and self._address.failed(exc)
                redirected = redirect and not redirected and policy.should_retry(exc, 0)
                if not redirected and not policy.should_retry(exc, attempt):
                    raise
                delay = 0.0 if redirected else policy.backoff(attempt)
                if isinstance(exc, ThrottlingQuotaExceededError):  # KIP-599: wait it out
                    delay = max(delay, exc.retry_after_ms / 1000)
                if deadline is not None and loop.time() + delay >= deadline:
                    raise
                await policy.sleep(delay)
                if still_wanted is not None and not still_wanted():
                    raise
                if deadline is not None and loop.time() >= deadline:
                    raise  # the sleep overran the deadline
                if not redirected:
                    attempt += 1

    async def _attempt(
        self, body: Message, timeout_s: float, deadline: float | None, within_s: float | None
    ) -> Message:
        """One exchange, bounded by `timeout_s` and, if given, the caller's `deadline`
        (`within_s` after the request began: what its REQUEST_TIMED_OUT names)."""
        if deadline is None:
            return await self._request_once(body, timeout_s)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._request_once(body, timeout_s)
        except TimeoutError:
            raise RequestTimedOutError(
                f"no answer from {self.address} within {within_s:g} s"
            ) from None

    async def _request_once(self, body: Message, timeout_s: float) -> Message:
        async with self._lock:
            cid = self._next_id
            self._next_id += 1
            try:
                async with asyncio.timeout(timeout_s):
                    reader, writer = await self._connection()
                    writer.write(encode_frame(cid, body))
                    await writer.drain()
                    frame = decode_frame(await read_frame(reader, self.max_frame_bytes))
            except _ssl.SSLError as exc:
                self._drop()
                raise SslAuthenticationError(f"{self.address}: TLS failed: {exc}") from None
            except (OSError, EOFError, TimeoutError, InvalidRequestError) as exc:
                self._drop()
                broken = NetworkError(f"{self.address}: {type(exc).__name__}: {exc}")
                broken.refused = isinstance(exc, ConnectionRefusedError)
                raise broken from None
            except BaseException:
                self._drop()  # cancelled mid-exchange: the stream is out of step
                raise
            if frame.correlation_id != cid:
                self._drop()
                raise NetworkError(
                    f"{self.address}: response correlation id {frame.correlation_id} "
                    f"does not match {cid}"
                )
        if isinstance(frame.body, ErrorResponse):
            err = frame.body
            error = error_for_code(err.code, err.message, err.retriable)
            if isinstance(error, ThrottlingQuotaExceededError):
                error.retry_after_ms = err.throttle_time_ms
            elif isinstance(error, NotControllerError):
                error.leader = err.leader
            raise error
        return frame.body

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        address = self.address
        if self._writer is not None and self._connected_to != address:
            self._drop()  # the peer moved (e.g. re-registered with a new endpoint)
        if self._reader is None or self._writer is None:
            host, port = parse_address(address)
            async with asyncio.timeout(self.connect_timeout):
                sock = await tcp_connect(host, port)
                try:
                    self._reader, self._writer = await asyncio.open_connection(
                        sock=sock, ssl=self.ssl, server_hostname=host if self.ssl else None
                    )
                except BaseException:
                    sock.close()
                    raise
            self._connected_to = address
            if self.ssl is not None and self.expect_principal is not None:
                got = principal_of(self._writer.get_extra_info("peercert"))
                if got != self.expect_principal:
                    self._drop()
                    raise SslAuthenticationError(
                        f"{address}: the server's certificate names {got!r}, "
                        f"not {self.expect_principal!r}"
                    )
        return self._reader, self._writer

    def _drop(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def tcp_connect(host: str, port: int) -> socket.socket:
    """A TCP connection to `host:port`, as `asyncio.open_connection` makes one (each
    address the name resolves to, in turn), that is never a connection to itself.

    Connecting to a loopback port in the ephemeral range that nothing listens on may land
    on the very port the kernel picked for the client (TCP's simultaneous open): the
    connection then succeeds, and the client reads its own request back and times out
    (seen in a test: REQUEST_TIMED_OUT where a closed port is NETWORK_EXCEPTION). Such a
    connection is refused here, as it would have been on any other local port."""
    loop = asyncio.get_running_loop()
    numeric = socket.AF_INET6 if ":" in host else socket.AF_INET
    targets: list[tuple[int, int, int, Any]]
    try:
        socket.inet_pton(numeric, host)  # an address: no resolver thread (asyncio does so)
        targets = [(numeric, socket.SOCK_STREAM, socket.IPPROTO_TCP, (host, port))]
    except OSError:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        targets = [(f, kind, proto, address) for f, kind, proto, _, address in infos]
    errors: list[OSError] = []
    for family, kind, proto, address in targets:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            if sock.getsockname() == sock.getpeername():
                raise ConnectionRefusedError(
                    errno.ECONNREFUSED,
                    f"Connect call failed {address}: it reached itself (nothing listens there)",
                )
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")


async def request_once(
    address: str,
    body: Message,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    retry: RetryPolicy = NO_RETRY,
    ssl: _ssl.SSLContext | None = None,
    expect_principal: str | None = None,
) -> Message:
    """One request (with `retry`'s retries) over a client opened and closed for it."""
    async with RpcClient(
        address,
        connect_timeout=min(5.0, timeout_s),
        retry=retry,
        ssl=ssl,
        expect_principal=expect_principal,
    ) as client:
        return await client.request(body, timeout_s)
