"""Admission: every connection of a listener until it is established, and its slot while
it serves. Whatever a listener frames (the frame server's own frames today, Kafka's
tomorrow), it gets the same TLS admission and limits by handing `Admission` the
coroutine that serves one established connection:

    admission = Admission(serve, ssl=ctx, limits=limits)   # serve(reader, writer, peer)
    address = await admission.start("0.0.0.0:9092")
    ...
    await admission.stop()

`Admission` calls `serve` once per connection that is admitted (and, under TLS,
authenticated), with the connection's slot taken; it frees the slot and closes the
connection when `serve` returns or raises. `serve` writes its own per-connection lines
through `admission.throttled` and counts in `admission.stats`.

Every connection is bounded (`ServerLimits`, each a flag of the processes that serve).
Under TLS a connection lives in one of two pools that never compete:

- *pending*: accepted, not yet authenticated. At most `max_pending_handshakes` in all and
  `max_pending_handshakes_per_address` per remote address. A new connection is always
  admitted: when its address's share or the whole pool is full, the server makes room
  by dropping the oldest pending connection of that address (of the address holding the
  most, when the pool is full), preferring one that has not sent a byte, though only once
  it has had a chance to (`MIN_SILENT_AGE_S` and a turn of the loop; meanwhile accepting
  pauses); else the handshake stalled longest on its client (`MIN_STALL_MS` at least);
  else one waiting for a handshake slot; else the oldest (`protocol.pending`). A pending
  connection costs a socket and a timer until its first bytes arrive (one that never
  speaks never allocates TLS state); TLS starts only once a ClientHello's first byte is
  there, at most `max_handshakes_in_progress` at once (each holds about 270 KB): one
  more starts when one ends, or in place of one stalled on its client, never of one the
  server has not answered yet; meanwhile it waits, the addresses taking turns, the
  newest first within one. The handshake must finish within `handshake_timeout_s` of
  the accept. Its memory is freed when it ends (`protocol.sockets.unlink`,
  `protocol.memory_trim`);
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
`max_connections_per_peer`; one over is closed at once. The caps are lowered, with a
WARNING, to fit the process's file-descriptor limit (`protocol.limits`). Accepting is the
`Listener`'s (`protocol.listener`).

With an `ssl` context (protocol/tls.py) every connection is mutual TLS and `serve` learns
the peer's principal from its certificate; without one the principal is None.

This module decides who gets a connection and for how long it may wait for one; it reads
and writes nothing on an established connection (that is `serve`'s), and what to answer,
and whether a principal may ask it, is the handler's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from protocol.limits import ServerLimits, ServerStats, fit_descriptor_limit
from protocol.listener import Listener
from protocol.memory_trim import MallocTrim
from protocol.pending import Parked, Pending, PendingPool, peer_gone
from protocol.rate_limited_log import Logger, RateLimitedLog
from protocol.sockets import abort, close, let_go, linger_reset, streams, unlink
from protocol.tls import is_cluster_principal, principal_of

# A pending connection that has not spoken is not dropped to make room before this age
# (nor in the accept wakeup that admitted it): a client's ClientHello follows its connect.
MIN_SILENT_AGE_S: Final = 0.005
# While spoken connections wait for a handshake slot, the running handshakes are looked at
# this often for one stalled on its client.
PUMP_S: Final = 0.01
TLS_HANDSHAKE_RECORD: Final = 0x16  # the first byte of every TLS ClientHello


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


class ConnectionServer(Protocol):
    """Serves one established connection until it ends: its framing, its requests and
    answers. Called by `Admission` with the connection's slot taken; the slot is freed and
    the connection closed once it returns or raises."""

    def __call__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> Awaitable[None]: ...


class Admission:
    def __init__(
        self,
        serve: ConnectionServer,
        *,
        log: Logger | None = None,
        ssl: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.serve = serve
        self.log: Logger = log if log is not None else structlog.get_logger("metactl.protocol")
        self.ssl = ssl
        self.limits = limits if limits is not None else ServerLimits()
        self.stats = ServerStats()
        # Every per-connection line (refusals, dropped and failed handshakes, bad frames,
        # accept failures, ...): one line per period per kind and peer, with a count.
        self.throttled = RateLimitedLog(self.log)
        self.listener = Listener(self._admit, self.stats, self.throttled)
        self._connections: set[asyncio.Task[Any]] = set()
        # Established connections: per principal (per address without TLS), and clients.
        self._per_peer: Counter[str] = Counter()
        self._clients = 0
        # Accepted TLS connections not yet authenticated, and those of them whose
        # handshake runs (TLS state allocated).
        self._pending = PendingPool()
        self._handshaking = PendingPool()
        # Spoken pending connections waiting for a handshake slot: per address, oldest
        # first; the addresses in the order of their turns.
        self._waiting: dict[str, dict[Pending, None]] = {}
        self._pump_handle: asyncio.TimerHandle | None = None
        # Dropped pending connections held open until their deadline, oldest first.
        self._parked: dict[Parked, None] = {}
        self._trim = MallocTrim()

    @property
    def address(self) -> str:
        """HOST:PORT once started ("" before)."""
        return self.listener.address

    # --- listening ------------------------------------------------------------------------

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        self._clamp_to_descriptor_limit()
        return await self.listener.start(listen)

    def _clamp_to_descriptor_limit(self) -> None:
        """Keep the caps below the process's file-descriptor limit (`fit_descriptor_limit`)."""
        self.limits = fit_descriptor_limit(self.limits, self.log)

    def _admit(self, sock: socket.socket, address: str) -> float | None:
        """An accepted connection (`Listener`): established at once without TLS, else
        pending. None once admitted or refused; or how long to wait before offering it
        again (`_admit_pending`)."""
        if self.ssl is None:
            self._admit_plain(sock, Peer(address))
            return None
        return self._admit_pending(sock, address.rsplit(":", 1)[0], address)

    def close(self, *, keep_bound: bool = False) -> None:
        """Stop accepting new connections (open ones keep serving until `stop`); with
        `keep_bound` the listening sockets stay bound until `release_listeners`
        (`Listener.close`)."""
        self.listener.close(keep_bound=keep_bound)

    def release_listeners(self) -> None:
        """Close the listening sockets `close(keep_bound=True)` kept."""
        self.listener.release()

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
            self.throttled.warning(f"connection refused: {refused}", peer=key)
            sock.close()  # a FIN: the client reads EOF, as from any full server
            return
        self._take(key, cluster=False)
        self._spawn(self._serve_plain(sock, peer), sock)

    async def _serve_plain(self, sock: socket.socket, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        try:
            reader, writer = await streams(loop, sock, None)
        except (OSError, asyncio.CancelledError):
            self._release(peer.name, cluster=False)
            abort(sock)
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
            await self.serve(reader, writer, peer)
        except (ConnectionError, OSError):
            pass  # the peer went away mid-answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        except Exception:  # never let one connection take the listener down
            self.throttled.exception("connection failed", peer=peer.name)
        finally:
            self._release(peer.name, cluster)
            await close(writer)

    def _spawn(self, coro: Coroutine[Any, Any, None], sock: socket.socket) -> asyncio.Task[None]:
        """A connection's task. One cancelled before it first ran (dropped, or the server
        stopping) never reached its own cleanup: its socket is closed here."""
        task = asyncio.get_running_loop().create_task(coro)
        self._connections.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._connections.discard(t)
            if t.cancelled():
                abort(sock)

        task.add_done_callback(done)
        return task

    # --- pending connections (TLS) --------------------------------------------------------

    def _admit_pending(self, sock: socket.socket, host: str, address: str) -> float | None:
        """Admit a new TLS connection to the pending pool, first dropping the oldest
        pending connection of its address when the address's share is full, then that of
        the address holding the most when the pool is full (`PendingPool.victim`). None once
        admitted; or, admitting nothing, how long to wait until the connection to drop
        has had its chance to speak."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        now = loop.time()
        victims: list[tuple[Pending, str]] = []
        if self._pending.count(host) >= limits.max_pending_handshakes_per_address:
            victims.append((self._pending.victim(host), "max_pending_handshakes_per_address"))
        if len(self._pending) - len(victims) >= limits.max_pending_handshakes:
            busiest = self._pending.victim()
            if not victims or busiest is not victims[0][0]:
                victims.append((busiest, "max_pending_handshakes"))
        for p, _ in victims:
            if not p.heard and (
                p.wakeup == self.listener.wakeups or now - p.accepted < MIN_SILENT_AGE_S
            ):
                return max(0.0, p.accepted + MIN_SILENT_AGE_S - now)
        for p, reason in victims:
            self._evict(p, reason)
        p = Pending(
            sock, host, address, now, self.listener.wakeups, now + limits.handshake_timeout_s
        )
        self._pending.add(p)
        self.stats.pending_handshakes += 1
        p.timer = loop.call_later(limits.handshake_timeout_s, self._expire, p)
        loop.add_reader(sock.fileno(), self._spoke, p)
        return None

    def _forget(self, p: Pending) -> bool:
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

    def _drop_pending(self, p: Pending) -> None:
        """End a pending connection now, with a reset (no FIN_WAIT state is kept for a
        peer that never answers)."""
        if not self._forget(p):
            return
        if p.task is None:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(p.sock.fileno())
            abort(p.sock)
        else:
            linger_reset(p.sock)
            p.task.cancel()

    def _evict(self, p: Pending, reason: str) -> None:
        """Drop `p` from the pending pool to make room: parked (`_park`), or closed with a
        reset when parking is off or its peer has gone already."""
        self.stats.closed_total[reason] += 1
        self.throttled.warning(f"pending handshake dropped: {reason}", peer=p.host)
        if self.limits.max_parked_handshakes > 0 and not peer_gone(p.sock):
            self._park(p)
        else:
            self._drop_pending(p)

    def _park(self, p: Pending) -> None:
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
                linger_reset(p.sock)
                p.task.cancel()
                return
            p.task.cancel()  # its end closes the descriptor it had, not the connection
        linger_reset(sock)  # a reset, once it is closed at last
        while len(self._parked) >= self.limits.max_parked_handshakes:
            self.stats.parked_closed_early_total += 1
            self._unpark(next(iter(self._parked)))
        parked = Parked(sock)
        self._parked[parked] = None
        self.stats.parked_handshakes += 1
        self.stats.parked_total += 1
        # Closed between its deadline and one more `handshake_timeout_s` after it, so that a
        # crowd accepted at once does not come back at once.
        until = p.deadline + random.uniform(0.0, self.limits.handshake_timeout_s)
        parked.timer = loop.call_at(max(until, loop.time()), self._unpark, parked)

    def _unpark(self, parked: Parked) -> None:
        """Close a parked connection (its deadline, room for another, or the server
        stopping), with a reset."""
        if parked not in self._parked:
            return
        del self._parked[parked]
        self.stats.parked_handshakes -= 1
        if parked.timer is not None:
            parked.timer.cancel()
            parked.timer = None
        abort(parked.sock)

    def _expire(self, p: Pending) -> None:
        """A pending connection that never spoke ran out of time."""
        p.timer = None
        if p.task is not None or p not in self._pending:
            return  # its handshake task keeps the deadline now
        self.stats.closed_total["handshake_timeout"] += 1
        self.throttled.warning("TLS handshake timeout", peer=p.host)
        self._drop_pending(p)

    def _spoke(self, p: Pending) -> None:
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
                self.throttled.warning("not a TLS client; closing", peer=p.host)
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

    def _start_handshake(self, p: Pending) -> None:
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

    async def _handshake(self, p: Pending) -> None:
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
                reader, writer = await streams(loop, p.sock, self.ssl, remaining, made.append)
        except asyncio.CancelledError as exc:
            unlink(exc)
            self._forget(p)  # dropped to make room (forgotten already), or stopping
            let_go(p.sock, made)
            self._trim.released()
            return
        except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
            unlink(exc)
            self._forget(p)
            reason = "handshake_timeout" if isinstance(exc, TimeoutError) else "handshake_failed"
            self.stats.closed_total[reason] += 1
            self.throttled.warning(f"TLS {reason.replace('_', ' ')}", peer=p.host)
            let_go(p.sock, made)
            self._trim.released()
            return
        self._forget(p)
        try:
            await self._established(reader, writer, p)
        finally:
            self._trim.released()

    async def _established(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, p: Pending
    ) -> None:
        principal = principal_of(writer.get_extra_info("peercert"))
        if principal is None:
            self.stats.closed_total["no_principal"] += 1
            self.throttled.warning("TLS certificate names no principal", peer=p.host)
            await close(writer)
            return
        cluster = is_cluster_principal(principal)
        refused = self._refuse(principal, cluster)
        if refused is not None:
            self.stats.closed_total[refused] += 1
            self.throttled.warning(f"connection refused: {refused}", peer=principal)
            await close(writer)
            return
        self._take(principal, cluster)
        await self._serve(reader, writer, Peer(p.address, principal), cluster=cluster)
