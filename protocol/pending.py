"""The pending pool: accepted TLS connections not yet authenticated (`Pending`), kept
oldest first in all and per address (`PendingPool`), and how the pool picks whom to drop
to make room: one that has not spoken, else a handshake stalled on its client
(`stalled_ms`, from Linux's TCP_INFO), else one waiting for a handshake slot.

Bookkeeping and socket peeks only: when to admit, drop, park or start a handshake is
`protocol.admission`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

# A full pool's handshakes are looked at, oldest first, this many at a time for one that
# stalls (two syscalls each).
STALL_SCAN: Final = 8
# A handshake the server answered counts as stalled on its client (a victim to make room)
# only once its client has been silent this long: a real client's reply may take a while
# on a loaded machine (Linux's TCP_INFO reads in jiffies, 4 ms at HZ=250).
MIN_STALL_MS: Final = 100
# struct tcp_info (linux/tcp.h): tcpi_last_data_sent, tcpi_last_ack_sent and
# tcpi_last_data_recv (ms ago) are u32s at byte 44, tcpi_bytes_acked a u64 at byte 120
# (Linux 4.1 and later; an older kernel's shorter struct reads as "no answer").
_TCP_INFO: Final = getattr(socket, "TCP_INFO", -1)
_TCP_INFO_BYTES: Final = 136


@dataclass(eq=False)
class Pending:
    """An accepted TLS connection not yet authenticated: only its socket until its first
    bytes arrive, then the task doing its handshake."""

    sock: socket.socket
    host: str  # the remote address without its port: the per-address key
    address: str  # HOST:PORT, for the Peer
    accepted: float  # loop time
    wakeup: int  # the accept wakeup that admitted it (`Listener.wakeups`)
    deadline: float  # loop time by which the handshake must be done
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None  # set once it spoke: the handshake runs
    heard: bool = False  # its first byte was seen (a TLS record): it waits or handshakes

    @property
    def spoke(self) -> bool:
        return self.task is not None


@dataclass(eq=False)
class Parked:
    """A dropped pending connection held open until its deadline (`Admission._park`):
    its socket and the timer that closes it."""

    sock: socket.socket
    timer: asyncio.TimerHandle | None = None


class PendingPool:
    """Pending connections, oldest first, in all and per address."""

    def __init__(self) -> None:
        self._all: dict[Pending, None] = {}
        self._by_host: dict[str, dict[Pending, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, p: Pending) -> bool:
        return p in self._all

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._all))

    def count(self, host: str) -> int:
        mine = self._by_host.get(host)
        return 0 if mine is None else len(mine)

    def add(self, p: Pending) -> None:
        self._all[p] = None
        self._by_host.setdefault(p.host, {})[p] = None

    def remove(self, p: Pending) -> bool:
        if p not in self._all:
            return False
        del self._all[p]
        mine = self._by_host[p.host]
        del mine[p]
        if not mine:
            del self._by_host[p.host]
        return True

    def victim(self, host: str | None = None) -> Pending:
        """Whom to drop to make room, among `host`'s connections (else those of the
        address holding the most), the cheapest loss first: the oldest that has not
        spoken (a socket whose first bytes have arrived but not yet been seen has spoken:
        it is no staller); else, of the oldest `STALL_SCAN`, the handshake the server
        answered and whose client has been silent since for longest, at least
        `MIN_STALL_MS` (`stalled_ms`), as a ClientHello flood's are; else the oldest of
        those that spoke and wait for a handshake slot (the server has spent nothing on
        them); else the oldest."""
        mine = self._by_host[host] if host is not None else max(self._by_host.values(), key=len)
        heard: Pending | None = None
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

    def stalled(self) -> Pending | None:
        """The handshake stalled longest on its client (`stalled_ms`) among the oldest
        `STALL_SCAN` of the address holding the most and the oldest `STALL_SCAN` of all,
        or None if none of them stalls."""
        if not self._all:
            return None
        busiest = max(self._by_host.values(), key=len)
        scan = dict.fromkeys(itertools.islice(busiest, STALL_SCAN))
        scan.update(dict.fromkeys(itertools.islice(self._all, STALL_SCAN)))
        return self._stalled_among(scan)

    @staticmethod
    def _stalled_among(ps: Iterable[Pending]) -> Pending | None:
        waiting = [
            (ms, p)
            for p in ps
            if p.task is not None and (ms := stalled_ms(p.sock)) is not None
            if ms >= MIN_STALL_MS
        ]
        return max(waiting, key=lambda x: x[0])[1] if waiting else None


def peer_gone(sock: socket.socket) -> bool:
    """Whether the peer has closed or reset the connection (nothing left to park)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def stalled_ms(sock: socket.socket) -> int | None:
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
