"""The one server loop: frames in, one handler call per request, frames out.

Used by the controller service and by brokers. `FrameServer` accepts connections, reads
frames, decodes them with the codec, awaits `handler(message)` and writes its answer
under the request's correlation id; one connection carries one request at a time,
answered in order. It never crashes on bad input or a failing handler:

- the handler raises a `MetactlError`: the answer is an `ErrorResponse` with its code;
- the handler raises anything else: UNKNOWN_SERVER_ERROR, logged with its traceback;
- an undecodable frame: INVALID_REQUEST with correlation id 0 (frame boundaries are
  intact, so the connection keeps serving); a message version the codec refuses:
  UNSUPPORTED_VERSION under the frame's correlation id;
- an oversized frame: MESSAGE_TOO_LARGE, then the connection is closed (the stream
  cannot be resynchronised); a truncated frame (EOF mid-frame) closes it, logged.

Every connection is bounded (`ServerLimits`, each a flag of the processes that serve).
Under TLS a connection lives in one of two pools that never compete:

- *pending*: accepted, not yet authenticated. At most `max_pending_handshakes` in all and
  `max_pending_handshakes_per_address` per remote address. A new connection is always
  admitted: when its address's share or the whole pool is full, the server makes room
  by dropping the oldest pending connection of that address (of the address holding the
  most, when the pool is full), preferring one that has not sent a byte, though only once
  it has had a chance to (`MIN_SILENT_AGE_S` and a turn of the loop; meanwhile accepting
  pauses); else the handshake stalled longest on its client (`MIN_STALL_MS` at least);
  else one waiting for a handshake slot; else the oldest. A pending connection costs a
  socket and a timer until its first bytes arrive (one that never speaks never allocates
  TLS state); TLS starts only once a ClientHello's first byte is there, at most
  `max_handshakes_in_progress` at once (each holds about 270 KB): one more starts when
  one ends, or in place of one stalled on its client, never of one the server has not
  answered yet; meanwhile it waits, the addresses taking turns, the newest first within
  one. The handshake must finish within `handshake_timeout_s` of the accept. Its memory
  is freed when it ends (`_unlink`, `_Trim`);
- *parked*: a dropped pending connection is not closed but parked (at most
  `max_parked_handshakes`, else the oldest parked is closed): its TLS state is freed,
  and its socket is held open, reading and sending nothing, until its handshake deadline
  (plus up to as much again, so that a crowd accepted at once does not return at once),
  then reset. Closed at once, it would hand a flood that reopens whatever is closed a
  fresh try: the flood's rate would be the server's own drops, each a new ClientHello to
  answer, and a real client would wait among them. Parked, each flood connection comes
  back once per deadline. So a flood of stalled connects or of stalled ClientHellos
  cannot keep a real client out, even one on the flood's address, and one address cannot
  take another's place. A parked connection costs a descriptor (the caps are lowered to
  fit the descriptor limit, parking first);
- *established*: authenticated. At most `max_connections_per_peer` per principal, and
  `max_connections` in all for clients (admin, viewer, ...). The cluster's own sessions
  (principals `controller` and `broker-<id>`) have slots of their own outside
  `max_connections`, as Kafka exempts its inter-broker listener from max.connections, so
  that a crowd of clients cannot keep brokers out. One connection over a cap is closed,
  never one already serving.

Without TLS (`--insecure`) there is nothing to authenticate: a connection is established
at accept and counted per address, within `max_connections` and
`max_connections_per_peer`; one over is closed at once.

More bounds on every established connection:

- `idle_timeout_s` without a request closes a connection; once a frame's first byte has
  arrived, the whole frame must arrive within `frame_deadline_s` (slowloris);
- requests in flight per connection: one. The loop reads the next frame only after
  answering the previous one, as Kafka's broker mutes a channel until its response is
  sent, so a pipelining client fills its own socket buffer, not the server's memory;
- the caps are lowered, with a WARNING, to fit the process's file-descriptor limit;
- accept() failures (e.g. out of file descriptors) pause accepting for a second.

Every per-connection log line (refusals, dropped handshakes, failed handshakes, bad and
oversized frames, accept failures, ...) is rate-limited: one line per period per kind
and peer, with the count it stands for, and the held-back count told one period later
even if nothing else happens (`_RateLimitedLog`).

With an `ssl` context (protocol/tls.py) every connection is mutual TLS and the handler
learns the peer's principal from its certificate; without one the principal is None.

This module owns sockets for incoming requests. What to answer, and whether a principal
may ask it, is the handler's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import functools
import itertools
import os
import random
import resource
import socket
import ssl
import struct
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    ListenError,
    MetactlError,
    UnsupportedVersionError,
)
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_BYTES,
    decode_frame,
    encode_frame,
    frame_length,
    parse_address,
)
from protocol.messages import ErrorResponse, Message, error_response
from protocol.tls import is_cluster_principal, principal_of


@dataclass(frozen=True)
class Peer:
    """Who sent a request: the remote address, and the principal its verified certificate
    names (None without TLS)."""

    address: str
    principal: str | None = None

    @property
    def name(self) -> str:
        """The principal, or the address when there is none (for limits and logs)."""
        return self.principal if self.principal is not None else self.address.rsplit(":", 1)[0]


Handler = Callable[[Message, Peer], Awaitable[Message]]


class Logger(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...
    def exception(self, event: str, **kw: Any) -> Any: ...


DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 200
DEFAULT_MAX_PENDING_HANDSHAKES: Final = 1024
DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS: Final = 256
DEFAULT_MAX_HANDSHAKES_IN_PROGRESS: Final = 64
DEFAULT_MAX_PARKED_HANDSHAKES: Final = 8192
DEFAULT_IDLE_TIMEOUT_S: Final = 600.0  # Kafka's connections.max.idle.ms
DEFAULT_FRAME_DEADLINE_S: Final = 30.0
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
CLOSE_WAIT_S: Final = 1.0
# An established TLS connection being closed waits this long for the peer's close_notify
# (asyncio's default is 30 s, holding the connection's buffers all along).
SSL_SHUTDOWN_TIMEOUT_S: Final = 2.0
FD_RESERVE: Final = 64  # descriptors kept for the log, outgoing clients and listeners
CLUSTER_FD_RESERVE: Final = 256  # at most this many kept for the cluster's own sessions
LISTEN_BACKLOG: Final = 1024
ACCEPTS_PER_WAKEUP: Final = 128  # then other callbacks (handshakes, requests) run
ACCEPT_PAUSE_S: Final = 1.0  # as asyncio's own server, after EMFILE and the like
# A pending connection that has not spoken is not dropped to make room before this age
# (nor in the accept wakeup that admitted it): a client's ClientHello follows its connect.
MIN_SILENT_AGE_S: Final = 0.005
# A full pool's handshakes are looked at, oldest first, this many at a time for one that
# stalls (two syscalls each).
STALL_SCAN: Final = 8
# A handshake the server answered counts as stalled on its client (a victim to make room)
# only once its client has been silent this long: a real client's reply may take a while
# on a loaded machine (Linux's TCP_INFO reads in jiffies, 4 ms at HZ=250).
MIN_STALL_MS: Final = 100
# While spoken connections wait for a handshake slot, the running handshakes are looked at
# this often for one stalled on its client.
PUMP_S: Final = 0.01
# struct tcp_info (linux/tcp.h): tcpi_last_data_sent, tcpi_last_ack_sent and
# tcpi_last_data_recv (ms ago) are u32s at byte 44, tcpi_bytes_acked a u64 at byte 120
# (Linux 4.1 and later; an older kernel's shorter struct reads as "no answer").
_TCP_INFO: Final = getattr(socket, "TCP_INFO", -1)
_TCP_INFO_BYTES: Final = 136
TLS_HANDSHAKE_RECORD: Final = 0x16  # the first byte of every TLS ClientHello
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# glibc keeps freed memory in its heap; after this many TLS states are freed the server
# asks it to give the free pages back (`_Trim`).
TRIM_AFTER_TLS_RELEASES: Final = 16
TRIM_INTERVAL_S: Final = 1.0


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    frame_deadline_s: float = DEFAULT_FRAME_DEADLINE_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    max_pending_handshakes_per_address: int = DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS
    max_handshakes_in_progress: int = DEFAULT_MAX_HANDSHAKES_IN_PROGRESS
    # Dropped pending connections held open (nothing read or sent) until their handshake
    # deadline rather than closed; 0: every drop closes at once.
    max_parked_handshakes: int = DEFAULT_MAX_PARKED_HANDSHAKES

    def __post_init__(self) -> None:
        counts = (
            self.max_connections,
            self.max_connections_per_peer,
            self.max_pending_handshakes,
            self.max_pending_handshakes_per_address,
            self.max_handshakes_in_progress,
        )
        if (
            min(counts) < 1
            or self.max_parked_handshakes < 0
            or (min(self.idle_timeout_s, self.frame_deadline_s, self.handshake_timeout_s) <= 0)
        ):
            raise ValueError(f"invalid server limits {self}")


@dataclass
class ServerStats:
    """Counters a metrics module reads (the server itself exports nothing)."""

    open_connections: int = 0  # established, clients' and the cluster's
    cluster_connections: int = 0  # established by `controller` and `broker-<id>`
    pending_handshakes: int = 0  # accepted under TLS, not yet authenticated
    accepted_total: int = 0
    # Connections whose TLS handshake began (a ClientHello arrived), so that TLS state
    # was allocated; a pending connection that never speaks never counts here.
    handshakes_started_total: int = 0
    # reason -> count. Established pool: "max_connections", "max_connections_per_peer",
    # "idle_timeout", "frame_deadline", "oversized_frame", "truncated_frame". Pending
    # pool, dropped to make room: "max_pending_handshakes",
    # "max_pending_handshakes_per_address", "max_handshakes_in_progress"; and
    # "handshake_timeout", "handshake_failed", "not_tls" (its first byte opens no TLS
    # handshake), "no_handshake" (closed before speaking), "no_principal".
    # "accept_error": accept() failed. A connection dropped from the pending pool counts
    # once, under its reason, whether it is closed at once or parked (closed later).
    closed_total: Counter[str] = field(default_factory=Counter)
    bad_frames_total: int = 0
    parked_handshakes: int = 0  # dropped pending connections held open now (`_park`)
    parked_total: int = 0  # dropped pending connections parked rather than closed
    parked_closed_early_total: int = 0  # parked ones closed before their deadline for room


@dataclass(eq=False)
class _Line:
    """One rate-limited line's state: when it was last written, what it holds back."""

    level: str
    written: float
    held: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None


class _RateLimitedLog:
    """At most one line a period per event and peer (the `peer` field), with the count it
    stands for. What is held back is still told: a summary line (`count` of the held-back
    ones, the latest fields) follows one period after a line, even if nothing more
    happens; a line quiet for a period is forgotten. At most `peers_per_event` peers of
    one event have lines of their own at once; further peers share one line, marked
    `other_peers=True`, so that a flood from many addresses still writes a bounded number
    of lines, and the table stays small."""

    def __init__(self, log: Logger, period_s: float = 1.0, peers_per_event: int = 8) -> None:
        self.log = log
        self.period_s = period_s
        self.peers_per_event = peers_per_event
        self._lines: dict[tuple[str, str | None, bool], _Line] = {}
        self._peers: Counter[str] = Counter()  # event -> peers with a line of their own

    def warning(self, event: str, **kw: Any) -> None:
        self._log("warning", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._log("info", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        """The first line carries the traceback; a summary is an ERROR with the count."""
        self._log("exception", event, kw)

    def _log(self, level: str, event: str, kw: dict[str, Any]) -> None:
        peer = kw.get("peer")
        key: tuple[str, str | None, bool] = (event, peer, False)
        line = self._lines.get(key)
        if line is None and peer is not None and self._peers[event] >= self.peers_per_event:
            key = (event, None, True)
            line = self._lines.get(key)
            kw = {**kw, "other_peers": True}
        now = time.monotonic()
        if line is not None and now - line.written < self.period_s:
            line.held += 1
            line.fields = kw
            return
        count = 1
        if line is None:
            if peer is not None and not key[2]:
                self._peers[event] += 1
        else:  # its period is over and no timer told what it held (no running loop)
            count += line.held
            if line.timer is not None:
                line.timer.cancel()
        line = self._lines[key] = _Line(level, now)
        getattr(self.log, level)(event, count=count, **kw)
        self._schedule(key, line)

    def _schedule(self, key: tuple[str, str | None, bool], line: _Line) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the next line tells
            line.timer = asyncio.get_running_loop().call_later(self.period_s, self._tick, key)

    def _tick(self, key: tuple[str, str | None, bool]) -> None:
        line = self._lines.get(key)
        if line is None:
            return
        line.timer = None
        if line.held:
            level = "error" if line.level == "exception" else line.level
            getattr(self.log, level)(key[0], count=line.held, **line.fields)
            line.held, line.written = 0, time.monotonic()
            self._schedule(key, line)
            return
        del self._lines[key]
        if key[1] is not None:
            self._peers[key[0]] -= 1
            if self._peers[key[0]] <= 0:
                del self._peers[key[0]]


class _Trim:
    """glibc's malloc keeps what Python frees (a TLS connection's 256 KiB read buffer and
    OpenSSL's state) in its heap, so a process's RSS stays near its peak after a burst of
    handshakes: measured, 300 failed handshakes took a server from 40 to 120 MB; once they
    were freed it stayed at 56 MB, and 46 MB after `malloc_trim(0)`, which gives whole
    free pages back to the system (0.1 ms on a 500 MB heap). It runs at most once per
    `TRIM_INTERVAL_S`, after `TRIM_AFTER_TLS_RELEASES` TLS connections have ended, and
    never where there is no glibc."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._released = 0
        self._scheduled: asyncio.TimerHandle | None = None
        self._last = 0.0
        self.calls = 0

    def released(self) -> None:
        """One TLS connection's state was freed."""
        if self._trim is None:
            return
        self._released += 1
        if self._released < TRIM_AFTER_TLS_RELEASES or self._scheduled is not None:
            return
        delay = max(0.0, self._last + TRIM_INTERVAL_S - time.monotonic())
        with contextlib.suppress(RuntimeError):
            self._scheduled = asyncio.get_running_loop().call_later(delay, self._run)

    def _run(self) -> None:
        self._scheduled = None
        self._released = 0
        self._last = time.monotonic()
        if self._trim is not None:
            self.calls += 1
            self._trim(0)

    def cancel(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, from the symbols the process already has; None elsewhere."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


@dataclass(eq=False)
class _Pending:
    """An accepted TLS connection not yet authenticated: only its socket until its first
    bytes arrive, then the task doing its handshake."""

    sock: socket.socket
    host: str  # the remote address without its port: the per-address key
    address: str  # HOST:PORT, for the Peer
    accepted: float  # loop time
    wakeup: int  # the accept wakeup that admitted it (`FrameServer._wakeups`)
    deadline: float  # loop time by which the handshake must be done
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None  # set once it spoke: the handshake runs
    heard: bool = False  # its first byte was seen (a TLS record): it waits or handshakes

    @property
    def spoke(self) -> bool:
        return self.task is not None


@dataclass(eq=False)
class _Parked:
    """A dropped pending connection held open until its deadline (`FrameServer._park`):
    its socket and the timer that closes it."""

    sock: socket.socket
    timer: asyncio.TimerHandle | None = None


class FrameServer:
    def __init__(
        self,
        handler: Handler,
        *,
        log: Logger | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ssl: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.handler = handler
        self.log: Logger = log if log is not None else structlog.get_logger("metactl.protocol")
        self.max_frame_bytes = max_frame_bytes
        self.ssl = ssl
        self.limits = limits if limits is not None else ServerLimits()
        self.stats = ServerStats()
        self.address = ""
        self._listeners: list[socket.socket] = []
        self._bound: list[socket.socket] = []  # closed, kept bound (`close(keep_bound=True)`)
        self._paused: set[socket.socket] = set()
        self._deferred: dict[socket.socket, tuple[socket.socket, str]] = {}
        self._wakeups = 0
        self._resume: dict[socket.socket, asyncio.TimerHandle] = {}
        self._connections: set[asyncio.Task[Any]] = set()
        # Established connections: per principal (per address without TLS), and clients.
        self._per_peer: Counter[str] = Counter()
        self._clients = 0
        # Accepted TLS connections not yet authenticated, and those of them whose
        # handshake runs (TLS state allocated).
        self._pending = _Pool()
        self._handshaking = _Pool()
        # Spoken pending connections waiting for a handshake slot: per address, oldest
        # first; the addresses in the order of their turns.
        self._waiting: dict[str, dict[_Pending, None]] = {}
        self._pump_handle: asyncio.TimerHandle | None = None
        # Dropped pending connections held open until their deadline, oldest first.
        self._parked: dict[_Parked, None] = {}
        self._throttled = _RateLimitedLog(self.log)
        self._trim = _Trim()

    # --- listening ------------------------------------------------------------------------

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        host, port = parse_address(listen)
        self._clamp_to_descriptor_limit()
        loop = asyncio.get_running_loop()
        try:
            self._listeners = await _bind(loop, host, port)
        except OSError as exc:
            reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
            raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
        for lsock in self._listeners:
            loop.add_reader(lsock.fileno(), self._accept, lsock)
        sock = self._listeners[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

    def _clamp_to_descriptor_limit(self) -> None:
        """Keep the caps below the process's file-descriptor limit, with room for the log,
        clients and listeners and for the cluster's own sessions, so a flood meets the
        server's own caps (closed and counted) rather than EMFILE at accept()."""
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (OSError, ValueError):  # pragma: no cover - every POSIX has it
            return
        if soft == resource.RLIM_INFINITY:
            return
        room = max(2, soft - FD_RESERVE)
        budget = max(2, room - min(room // 4, CLUSTER_FD_RESERVE))
        limits = self.limits
        held = limits.max_connections + limits.max_pending_handshakes
        if held + limits.max_parked_handshakes <= budget:
            return
        if held <= budget:  # parking (the cheapest to give up) takes what is left
            self.log.info(
                "max parked handshakes lowered to fit the file-descriptor limit",
                configured=limits.max_parked_handshakes,
                effective=budget - held,
                nofile=soft,
            )
            self.limits = dataclasses.replace(limits, max_parked_handshakes=budget - held)
            return
        pending = max(1, min(limits.max_pending_handshakes, budget // 4))
        connections = max(1, min(limits.max_connections, budget - pending))
        self.log.warning(
            "max connections lowered to fit the file-descriptor limit",
            configured=limits.max_connections,
            effective=connections,
            pending_configured=limits.max_pending_handshakes,
            pending_effective=pending,
            nofile=soft,
        )
        self.limits = dataclasses.replace(
            limits,
            max_connections=connections,
            max_connections_per_peer=min(connections, limits.max_connections_per_peer),
            max_pending_handshakes=pending,
            max_pending_handshakes_per_address=min(
                pending, limits.max_pending_handshakes_per_address
            ),
            max_handshakes_in_progress=min(pending, limits.max_handshakes_in_progress),
            max_parked_handshakes=0,
        )

    def _accept(self, lsock: socket.socket) -> None:
        """The listener is readable (or a pause ended): accept a batch, each connection
        admitted or refused at once. Under TLS, when making room would drop a connection
        that has not yet had a chance to speak (`_Pool.victim`), the new one waits, and
        accepting pauses until it can be admitted, so that a burst of connects cannot
        cycle an address's share within one wakeup of the loop."""
        self._wakeups += 1
        for _ in range(ACCEPTS_PER_WAKEUP):
            deferred = self._deferred.pop(lsock, None)
            if deferred is not None:
                sock, address = deferred
            else:
                try:
                    sock, peername = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except ConnectionAbortedError:
                    continue
                except OSError as exc:
                    self._accept_failed(lsock, exc)
                    return
                sock.setblocking(False)
                self.stats.accepted_total += 1
                address = _format_address(peername)
            if self.ssl is None:
                self._admit_plain(sock, Peer(address))
                continue
            wait = self._admit_pending(sock, address.rsplit(":", 1)[0], address)
            if wait is not None:
                self._deferred[lsock] = (sock, address)
                self._pause(lsock, wait)
                return

    def _pause(self, lsock: socket.socket, delay: float) -> None:
        """Stop accepting on `lsock` for `delay` seconds; then accept again (the
        deferred connection first, even if no new one is waiting)."""
        if lsock in self._paused:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(lsock.fileno())
        self._paused.add(lsock)

        def resume() -> None:
            self._paused.discard(lsock)
            self._resume.pop(lsock, None)
            if lsock in self._listeners:
                loop.add_reader(lsock.fileno(), self._accept, lsock)
                self._accept(lsock)

        self._resume[lsock] = loop.call_later(delay, resume)

    def _accept_failed(self, lsock: socket.socket, exc: OSError) -> None:
        """accept() failed: out of descriptors or memory pauses accepting for a second (as
        asyncio's own server does), logged at most once a second with a count."""
        self.stats.closed_total["accept_error"] += 1
        self._throttled.warning("accept failed; pausing accepts", error=repr(exc))
        if exc.errno in _RESOURCE_ERRNOS:
            self._pause(lsock, ACCEPT_PAUSE_S)

    def close(self, *, keep_bound: bool = False) -> None:
        """Stop accepting new connections (open ones keep serving until `stop`). With
        `keep_bound` the listening sockets stay bound, accepting nothing, until
        `release_listeners`: a connect to the port still succeeds (in the kernel's
        backlog) instead of being refused, so a standby watching this active controller
        (`controller.runtime.dead_active`) does not take a graceful stop for a death
        while the log drains and the leadership is resigned."""
        listeners, self._listeners = self._listeners, []
        with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to unregister
            loop = asyncio.get_running_loop()
            for lsock in listeners:
                if lsock not in self._paused:
                    loop.remove_reader(lsock.fileno())
        for handle in self._resume.values():
            handle.cancel()
        self._resume.clear()
        self._paused.clear()
        for lsock in listeners:
            if keep_bound:
                self._bound.append(lsock)
            else:
                lsock.close()
        for sock, _ in self._deferred.values():
            sock.close()
        self._deferred.clear()

    def release_listeners(self) -> None:
        """Close the listening sockets `close(keep_bound=True)` kept (connections waiting
        in their backlog are reset)."""
        bound, self._bound = self._bound, []
        for lsock in bound:
            lsock.close()

    async def stop(self, *, keep_bound: bool = False) -> None:
        """Stop accepting, end every open connection, and wait for their tasks (the
        listening sockets stay bound with `keep_bound`: see `close`)."""
        self.close(keep_bound=keep_bound)
        for p in list(self._pending):
            self._drop_pending(p)
        for parked in list(self._parked):
            self._unpark(parked)
        if self._pump_handle is not None:
            self._pump_handle.cancel()
            self._pump_handle = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._trim.cancel()

    # --- established connections --------------------------------------------------------

    def _refuse(self, key: str, cluster: bool) -> str | None:
        """None if one more established connection under `key` fits, else the limit it
        breaks. The cluster's own sessions are not counted against `max_connections`."""
        if not cluster and self._clients >= self.limits.max_connections:
            return "max_connections"
        if self._per_peer[key] >= self.limits.max_connections_per_peer:
            return "max_connections_per_peer"
        return None

    def _take(self, key: str, cluster: bool) -> None:
        self.stats.open_connections += 1
        self._per_peer[key] += 1
        if cluster:
            self.stats.cluster_connections += 1
        else:
            self._clients += 1

    def _release(self, key: str, cluster: bool) -> None:
        """One established connection fewer under `key`; a key with none left is
        forgotten, so that the table holds only peers with open connections."""
        self.stats.open_connections -= 1
        if cluster:
            self.stats.cluster_connections -= 1
        else:
            self._clients -= 1
        self._per_peer[key] -= 1
        if self._per_peer[key] <= 0:
            del self._per_peer[key]

    def _admit_plain(self, sock: socket.socket, peer: Peer) -> None:
        """Without TLS a connection is established at accept, counted per address."""
        key = peer.name
        refused = self._refuse(key, cluster=False)
        if refused is not None:
            self.stats.closed_total[refused] += 1
            self._throttled.warning(f"connection refused: {refused}", peer=key)
            sock.close()  # a FIN: the client reads EOF, as from any full server
            return
        self._take(key, cluster=False)
        self._spawn(self._serve_plain(sock, peer), sock)

    async def _serve_plain(self, sock: socket.socket, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        try:
            reader, writer = await _streams(loop, sock, None)
        except (OSError, asyncio.CancelledError):
            self._release(peer.name, cluster=False)
            _abort(sock)
            return
        await self._serve(reader, writer, peer, cluster=False)

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Peer,
        *,
        cluster: bool,
    ) -> None:
        """Serve an established connection (its slot already taken) until it ends."""
        try:
            await self._serve_frames(reader, writer, peer)
        except (ConnectionError, OSError):
            pass  # the peer went away mid-answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        except Exception:  # never let one connection take the listener down
            self._throttled.exception("connection failed", peer=peer.name)
        finally:
            self._release(peer.name, cluster)
            await _close(writer)

    def _spawn(self, coro: Coroutine[Any, Any, None], sock: socket.socket) -> asyncio.Task[None]:
        """A connection's task. One cancelled before it first ran (dropped, or the server
        stopping) never reached its own cleanup: its socket is closed here."""
        task = asyncio.get_running_loop().create_task(coro)
        self._connections.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._connections.discard(t)
            if t.cancelled():
                _abort(sock)

        task.add_done_callback(done)
        return task

    # --- pending connections (TLS) --------------------------------------------------------

    def _admit_pending(self, sock: socket.socket, host: str, address: str) -> float | None:
        """Admit a new TLS connection to the pending pool, first dropping the oldest
        pending connection of its address when the address's share is full, then that of
        the address holding the most when the pool is full (`_Pool.victim`). None once
        admitted; or, admitting nothing, how long to wait until the connection to drop
        has had its chance to speak."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        now = loop.time()
        victims: list[tuple[_Pending, str]] = []
        if self._pending.count(host) >= limits.max_pending_handshakes_per_address:
            victims.append((self._pending.victim(host), "max_pending_handshakes_per_address"))
        if len(self._pending) - len(victims) >= limits.max_pending_handshakes:
            busiest = self._pending.victim()
            if not victims or busiest is not victims[0][0]:
                victims.append((busiest, "max_pending_handshakes"))
        for p, _ in victims:
            if not p.heard and (p.wakeup == self._wakeups or now - p.accepted < MIN_SILENT_AGE_S):
                return max(0.0, p.accepted + MIN_SILENT_AGE_S - now)
        for p, reason in victims:
            self._evict(p, reason)
        p = _Pending(sock, host, address, now, self._wakeups, now + limits.handshake_timeout_s)
        self._pending.add(p)
        self.stats.pending_handshakes += 1
        p.timer = loop.call_later(limits.handshake_timeout_s, self._expire, p)
        loop.add_reader(sock.fileno(), self._spoke, p)
        return None

    def _forget(self, p: _Pending) -> bool:
        """Take `p` out of the pending pool; False if it was not in it. A handshake's slot
        freed, a waiting one starts."""
        if not self._pending.remove(p):
            return False
        if self._handshaking.remove(p):
            self._pump_later()
        mine = self._waiting.get(p.host)
        if mine is not None and p in mine:
            del mine[p]
            if not mine:
                del self._waiting[p.host]
        self.stats.pending_handshakes -= 1
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        return True

    def _drop_pending(self, p: _Pending) -> None:
        """End a pending connection now, with a reset (no FIN_WAIT state is kept for a
        peer that never answers)."""
        if not self._forget(p):
            return
        if p.task is None:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(p.sock.fileno())
            _abort(p.sock)
        else:
            _linger_reset(p.sock)
            p.task.cancel()

    def _evict(self, p: _Pending, reason: str) -> None:
        """Drop `p` from the pending pool to make room: parked (`_park`), or closed with a
        reset when parking is off or its peer has gone already."""
        self.stats.closed_total[reason] += 1
        self._throttled.warning(f"pending handshake dropped: {reason}", peer=p.host)
        if self.limits.max_parked_handshakes > 0 and not _peer_gone(p.sock):
            self._park(p)
        else:
            self._drop_pending(p)

    def _park(self, p: _Pending) -> None:
        """Hold a dropped staller's socket open, reading and sending nothing, until its
        handshake deadline (a tarpit). Its TLS state, if any, is freed now: its handshake
        task is cancelled, and a duplicate of its descriptor keeps the connection. Closing
        it would hand its owner a fresh try: a flood that reopens whatever is closed comes
        back at once, with a new ClientHello that costs the server a handshake, so its
        rate would be the server's drops. Parked, it comes back once per
        `handshake_timeout_s`. At `max_parked_handshakes`, the oldest parked is closed."""
        if not self._forget(p):
            return
        loop = asyncio.get_running_loop()
        if p.task is None:
            with contextlib.suppress(RuntimeError, ValueError):
                loop.remove_reader(p.sock.fileno())
            sock = p.sock
        else:
            try:
                sock = p.sock.dup()
            except OSError:  # out of descriptors: closed, not parked
                _linger_reset(p.sock)
                p.task.cancel()
                return
            p.task.cancel()  # its end closes the descriptor it had, not the connection
        _linger_reset(sock)  # a reset, once it is closed at last
        while len(self._parked) >= self.limits.max_parked_handshakes:
            self.stats.parked_closed_early_total += 1
            self._unpark(next(iter(self._parked)))
        parked = _Parked(sock)
        self._parked[parked] = None
        self.stats.parked_handshakes += 1
        self.stats.parked_total += 1
        # Closed between its deadline and one more `handshake_timeout_s` after it, so that a
        # crowd accepted at once does not come back at once.
        until = p.deadline + random.uniform(0.0, self.limits.handshake_timeout_s)
        parked.timer = loop.call_at(max(until, loop.time()), self._unpark, parked)

    def _unpark(self, parked: _Parked) -> None:
        """Close a parked connection (its deadline, room for another, or the server
        stopping), with a reset."""
        if parked not in self._parked:
            return
        del self._parked[parked]
        self.stats.parked_handshakes -= 1
        if parked.timer is not None:
            parked.timer.cancel()
            parked.timer = None
        _abort(parked.sock)

    def _expire(self, p: _Pending) -> None:
        """A pending connection that never spoke ran out of time."""
        p.timer = None
        if p.task is not None or p not in self._pending:
            return  # its handshake task keeps the deadline now
        self.stats.closed_total["handshake_timeout"] += 1
        self._throttled.warning("TLS handshake timeout", peer=p.host)
        self._drop_pending(p)

    def _spoke(self, p: _Pending) -> None:
        """A pending connection is readable: start TLS if its first byte opens a TLS
        handshake (first dropping the oldest handshake of the address running the most
        when `max_handshakes_in_progress` run); close it if it is something else, or EOF."""
        if p not in self._pending or p.task is not None:
            return
        try:
            head = p.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            head = b""
        loop = asyncio.get_running_loop()
        loop.remove_reader(p.sock.fileno())
        if not head or head[0] != TLS_HANDSHAKE_RECORD:
            if head:
                self.stats.closed_total["not_tls"] += 1
                self._throttled.warning("not a TLS client; closing", peer=p.host)
            else:
                self.stats.closed_total["no_handshake"] += 1  # a port probe: not worth a line
            self._drop_pending(p)
            return
        p.heard = True
        if self._waiting or not self._room_for_a_handshake():
            # Its ClientHello waits in its socket for a slot (`_pump`).
            self._waiting.setdefault(p.host, {})[p] = None
            self._pump_later()
            return
        self._start_handshake(p)

    def _room_for_a_handshake(self) -> bool:
        """Whether one more handshake may start: fewer than `max_handshakes_in_progress`
        run, or one of them stalls on its client and is dropped (parked) for it. One the
        server has not answered yet is never dropped for another: under a burst, that
        would drop handshakes before the server gets to them, real clients' included,
        and start the next ones for nothing."""
        if len(self._handshaking) < self.limits.max_handshakes_in_progress:
            return True
        victim = self._handshaking.stalled()
        if victim is None:
            return False
        self._evict(victim, "max_handshakes_in_progress")
        return True

    def _start_handshake(self, p: _Pending) -> None:
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        self.stats.handshakes_started_total += 1
        self._handshaking.add(p)
        p.task = self._spawn(self._handshake(p), p.sock)

    def _pump_later(self, delay: float = 0.0) -> None:
        if self._pump_handle is None and self._waiting:
            loop = asyncio.get_running_loop()
            self._pump_handle = loop.call_later(delay, self._pump)

    def _pump(self) -> None:
        """Start waiting handshakes while there is room: one address's newest at a time,
        the addresses in turn, so that one address's crowd does not delay the others.
        While some still wait, look again every `PUMP_S` (a handshake starts stalling on
        its client unseen)."""
        self._pump_handle = None
        while self._waiting and self._room_for_a_handshake():
            host = next(iter(self._waiting))
            mine = self._waiting.pop(host)
            p = next(reversed(mine))  # the newest: under a crowd, the oldest are dropped
            del mine[p]
            if mine:
                self._waiting[host] = mine  # its next turn is after every other address's
            self._start_handshake(p)
        self._pump_later(PUMP_S)

    async def _handshake(self, p: _Pending) -> None:
        """Mutual TLS within the handshake deadline, then admission to the established
        pool under the certificate's principal, then serving."""
        loop = asyncio.get_running_loop()
        remaining = max(0.001, p.deadline - loop.time())
        # The transport, once the handshake made it: a cancellation or the deadline can
        # land after it is made and before this task resumes, and it must then be aborted
        # (the socket is its own), not left to a later close of the bare descriptor.
        made: list[asyncio.BaseTransport] = []
        try:
            async with asyncio.timeout(remaining):
                reader, writer = await _streams(loop, p.sock, self.ssl, remaining, made.append)
        except asyncio.CancelledError as exc:
            _unlink(exc)
            self._forget(p)  # dropped to make room (forgotten already), or stopping
            _let_go(p.sock, made)
            self._trim.released()
            return
        except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
            _unlink(exc)
            self._forget(p)
            reason = "handshake_timeout" if isinstance(exc, TimeoutError) else "handshake_failed"
            self.stats.closed_total[reason] += 1
            self._throttled.warning(f"TLS {reason.replace('_', ' ')}", peer=p.host)
            _let_go(p.sock, made)
            self._trim.released()
            return
        self._forget(p)
        try:
            await self._established(reader, writer, p)
        finally:
            self._trim.released()

    async def _established(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, p: _Pending
    ) -> None:
        principal = principal_of(writer.get_extra_info("peercert"))
        if principal is None:
            self.stats.closed_total["no_principal"] += 1
            self._throttled.warning("TLS certificate names no principal", peer=p.host)
            await _close(writer)
            return
        cluster = is_cluster_principal(principal)
        refused = self._refuse(principal, cluster)
        if refused is not None:
            self.stats.closed_total[refused] += 1
            self._throttled.warning(f"connection refused: {refused}", peer=principal)
            await _close(writer)
            return
        self._take(principal, cluster)
        await self._serve(reader, writer, Peer(p.address, principal), cluster=cluster)

    # --- frames ---------------------------------------------------------------------------

    async def _read_frame(self, reader: asyncio.StreamReader, peer: Peer) -> bytes | None:
        """The next frame's payload, or None once the connection should close: EOF, idle
        timeout, frame deadline, or a truncated frame. FrameTooLargeError propagates."""
        limits = self.limits
        try:
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    first = await reader.readexactly(1)
            except TimeoutError:
                self.stats.closed_total["idle_timeout"] += 1
                self._throttled.info("idle connection closed", peer=peer.name)
                return None
            try:
                async with asyncio.timeout(limits.frame_deadline_s):
                    header = first + await reader.readexactly(HEADER_BYTES - 1)
                    length = frame_length(header, self.max_frame_bytes)
                    return await reader.readexactly(length)
            except TimeoutError:
                self.stats.closed_total["frame_deadline"] += 1
                self._throttled.warning("frame deadline exceeded; closing", peer=peer.name)
                return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.stats.closed_total["truncated_frame"] += 1
                self._throttled.info("truncated frame; closing", peer=peer.name)
            return None
        except ssl.SSLError as exc:
            self._throttled.info("TLS error; closing", peer=peer.name, error=str(exc))
            return None

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        while True:
            try:
                payload = await self._read_frame(reader, peer)
            except FrameTooLargeError as exc:
                self.stats.closed_total["oversized_frame"] += 1
                self._throttled.warning(
                    "oversized frame; closing", peer=peer.name, error=exc.message
                )
                await _send(writer, 0, error_response(exc))
                return
            if payload is None:
                return
            try:
                frame = decode_frame(payload)
            except UnsupportedVersionError as exc:
                self.stats.bad_frames_total += 1
                self._throttled.warning(
                    "unsupported message version", peer=peer.name, error=exc.message
                )
                await _send(writer, exc.correlation_id, error_response(exc))
                continue
            except InvalidRequestError as exc:
                self.stats.bad_frames_total += 1
                self._throttled.warning("undecodable frame", peer=peer.name, error=exc.message)
                await _send(writer, 0, error_response(exc))
                continue
            await _send(writer, frame.correlation_id, await self._answer(frame.body, peer))

    async def _answer(self, body: Message, peer: Peer) -> Message:
        try:
            return await self.handler(body, peer)
        except MetactlError as exc:
            return error_response(exc)
        except Exception as exc:
            self._throttled.exception(
                "request handler failed", peer=peer.name, request=type(body).__name__
            )
            return ErrorResponse(code=MetactlError.code, message=type(exc).__name__)


class _Pool:
    """Pending connections, oldest first, in all and per address."""

    def __init__(self) -> None:
        self._all: dict[_Pending, None] = {}
        self._by_host: dict[str, dict[_Pending, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, p: _Pending) -> bool:
        return p in self._all

    def __iter__(self) -> Iterator[_Pending]:
        return iter(list(self._all))

    def count(self, host: str) -> int:
        mine = self._by_host.get(host)
        return 0 if mine is None else len(mine)

    def add(self, p: _Pending) -> None:
        self._all[p] = None
        self._by_host.setdefault(p.host, {})[p] = None

    def remove(self, p: _Pending) -> bool:
        if p not in self._all:
            return False
        del self._all[p]
        mine = self._by_host[p.host]
        del mine[p]
        if not mine:
            del self._by_host[p.host]
        return True

    def victim(self, host: str | None = None) -> _Pending:
        """Whom to drop to make room, among `host`'s connections (else those of the
        address holding the most), the cheapest loss first: the oldest that has not
        spoken (a socket whose first bytes have arrived but not yet been seen has spoken:
        it is no staller); else, of the oldest `STALL_SCAN`, the handshake the server
        answered and whose client has been silent since for longest, at least
        `MIN_STALL_MS` (`_stalled_ms`), as a ClientHello flood's are; else the oldest of
        those that spoke and wait for a handshake slot (the server has spent nothing on
        them); else the oldest."""
        mine = self._by_host[host] if host is not None else max(self._by_host.values(), key=len)
        heard: _Pending | None = None
        for p in mine:
            if not p.heard:
                try:
                    if not p.sock.recv(1, socket.MSG_PEEK):
                        return p  # EOF: a good victim
                except (BlockingIOError, InterruptedError):
                    return p
                except OSError:
                    return p  # reset: a good victim
                # It spoke; its reader callback has not run yet.
            if heard is None and p.task is None:
                heard = p
        stalled = self._stalled_among(itertools.islice(mine, STALL_SCAN))
        if stalled is not None:
            return stalled
        return heard if heard is not None else next(iter(mine))

    def stalled(self) -> _Pending | None:
        """The handshake stalled longest on its client (`_stalled_ms`) among the oldest
        `STALL_SCAN` of the address holding the most and the oldest `STALL_SCAN` of all,
        or None if none of them stalls."""
        if not self._all:
            return None
        busiest = max(self._by_host.values(), key=len)
        scan = dict.fromkeys(itertools.islice(busiest, STALL_SCAN))
        scan.update(dict.fromkeys(itertools.islice(self._all, STALL_SCAN)))
        return self._stalled_among(scan)

    @staticmethod
    def _stalled_among(ps: Iterable[_Pending]) -> _Pending | None:
        waiting = [
            (ms, p)
            for p in ps
            if p.task is not None and (ms := _stalled_ms(p.sock)) is not None
            if ms >= MIN_STALL_MS
        ]
        return max(waiting, key=lambda x: x[0])[1] if waiting else None


def _peer_gone(sock: socket.socket) -> bool:
    """Whether the peer has closed or reset the connection (nothing left to park)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _stalled_ms(sock: socket.socket) -> int | None:
    """How long (ms) the peer has been silent since the server last sent it data, or None
    if the server has sent it nothing yet or has not answered its last bytes (the wait
    is the server's), or where Linux's TCP_INFO is not available."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
        last_sent, _, last_received = struct.unpack_from("=III", info, 44)
        (acked,) = struct.unpack_from("=Q", info, 120)
    except (OSError, struct.error):
        return None
    # Times are in jiffies: a send and a receive in the same tick read alike.
    return last_sent if acked and last_sent <= last_received else None


async def _bind(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to (as asyncio.start_server)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, sockaddr in dict.fromkeys(infos):
            s = socket.socket(family, type_, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(sockaddr)
            s.listen(LISTEN_BACKLOG)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


class _TellingProtocol(asyncio.StreamReaderProtocol):
    """A StreamReaderProtocol that hands its transport to `on_made` as it is made."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        loop: asyncio.AbstractEventLoop,
        on_made: Callable[[asyncio.BaseTransport], None] | None,
    ) -> None:
        super().__init__(reader, loop=loop)
        self._on_made = on_made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._on_made is not None:
            self._on_made(transport)
        super().connection_made(transport)


async def _streams(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    ctx: ssl.SSLContext | None,
    handshake_timeout_s: float | None = None,
    on_made: Callable[[asyncio.BaseTransport], None] | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket, after a server-side TLS handshake with `ctx`;
    `on_made` is told the transport as soon as it exists."""
    reader = asyncio.StreamReader(loop=loop)
    protocol = _TellingProtocol(reader, loop, on_made)
    if ctx is None:
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    else:
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            sock,
            ssl=ctx,
            # asyncio.timeout bounds it; this only keeps asyncio's own 60 s out of the way.
            ssl_handshake_timeout=(handshake_timeout_s or DEFAULT_HANDSHAKE_TIMEOUT_S) + 1.0,
            ssl_shutdown_timeout=SSL_SHUTDOWN_TIMEOUT_S,
        )
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _format_address(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername)


def _unlink(exc: BaseException) -> None:
    """Break the reference cycle a failed handshake leaves: the exception's traceback holds
    asyncio's frames, one of which holds the future that holds the exception. Left to the
    cyclic garbage collector, each cycle keeps the connection's SSL state (about 270 KB)
    alive until a full collection, which a quiet process may not run for a long time."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)  # running frames are skipped
            e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def _linger_reset(sock: socket.socket) -> None:
    """Make the socket's close send a reset rather than a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _let_go(sock: socket.socket, made: list[asyncio.BaseTransport]) -> None:
    """A handshake's connection once it failed or was cancelled: its transport, if the
    handshake made one, is aborted (a reset; the transport closes the socket); else the
    socket is left to whatever transport asyncio built during the handshake
    (`_leave_to_transport`)."""
    if made:
        _linger_reset(sock)
        made[0].abort()  # type: ignore[attr-defined]
    else:
        _leave_to_transport(sock)


def _leave_to_transport(sock: socket.socket) -> None:
    """A handshake's socket once the handshake failed or was cancelled: asyncio's
    transport closes it (at once after an abort, within SSL_SHUTDOWN_TIMEOUT_S after a
    flush), with a reset. Closing it here could close a descriptor that a live transport
    still polls, and whose number a new connection may then get. Should no transport
    have taken it, it is closed a little later (closing a closed socket does nothing)."""
    _linger_reset(sock)
    with contextlib.suppress(RuntimeError):
        loop = asyncio.get_running_loop()
        loop.call_later(SSL_SHUTDOWN_TIMEOUT_S + CLOSE_WAIT_S, _abort, sock)


def _abort(sock: socket.socket) -> None:
    _linger_reset(sock)
    with contextlib.suppress(OSError):
        sock.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close and wait a little, swallowing a cancellation too: a connection task must not
    end cancelled. The wait is bounded (a TLS peer may never answer the close)."""
    writer.close()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()


async def _send(writer: asyncio.StreamWriter, correlation_id: int, body: Message) -> None:
    writer.write(encode_frame(correlation_id, body))
    await writer.drain()
