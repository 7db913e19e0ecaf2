"""What keeps a listener off a port of this host, looked at before the local cluster's
processes are started on it: `await_listenable` refuses, with LISTEN_FAILED naming the
port, what holds it and the flag that moves it, only where the process's own listener
would fail, and waits (bounded) where a closing connection will let go.

What Linux does (measured by ``bench/cluster_restart.py --experiment``; docs/cli.md,
"cluster up: its ports"): a listener opened with SO_REUSEADDR, as etcd's (Go) and
asyncio's are, binds past a connection on its port only if that connection's socket had
SO_REUSEADDR too (every connection a listener accepted does: it inherits it). A
connection opened without it, and so every outgoing connection whose port the kernel
chose from its ephemeral range (`ephemeral_range`), keeps any listener off its port in
every state, ESTABLISHED, FIN-WAIT-2 and TIME-WAIT alike, until it is gone. So the test
is the listener's own bind (`listenable`), and /proc/net/tcp and tcp6 say what is in the
way (`sockets_on`): a listener or a live connection is refused at once; a closing one
(TIME-WAIT ends within 60 s, an orphaned FIN-WAIT-2 within ``tcp_fin_timeout``) is
waited for. The ports the kernel never gives an outgoing connection are those outside
its ephemeral range: where `cluster up`'s defaults are (`localcluster.settings`).

It only looks: it binds a probe socket and closes it at once, and reads /proc; it starts
nothing and decides no port.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcluster.settings import PlannedPort
from metactl.errors import ListenError

__all__ = [
    "CLOSING_STATES",
    "ListenSocket",
    "WantedPort",
    "await_listenable",
    "closing_wait_s",
    "cluster_listeners",
    "ephemeral_range",
    "listenable",
    "sockets_on",
]

PORT_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIN_TIMEOUT_FILE: Final = Path("/proc/sys/net/ipv4/tcp_fin_timeout")
TCP_TABLES: Final = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LINUX_EPHEMERAL: Final = (32768, 60999)  # the kernel's default ip_local_port_range
TIME_WAIT_S: Final = 60.0  # Linux's TCP_TIMEWAIT_LEN, fixed
POLL_S: Final = 0.25  # how often a port held by a closing connection is looked at again
# /proc/net/tcp's st column, named as `ss` names the states.
STATES: Final = {
    "01": "ESTABLISHED", "02": "SYN-SENT", "03": "SYN-RECV", "04": "FIN-WAIT-1",
    "05": "FIN-WAIT-2", "06": "TIME-WAIT", "07": "CLOSE", "08": "CLOSE-WAIT",
    "09": "LAST-ACK", "0A": "LISTEN", "0B": "CLOSING", "0C": "NEW-SYN-RECV",
}  # fmt: skip
# A connection in one of these is on its way out, and the kernel ends it on its own.
CLOSING_STATES: Final = frozenset(
    {"SYN-SENT", "FIN-WAIT-1", "FIN-WAIT-2", "TIME-WAIT", "CLOSING", "LAST-ACK"}
)
WILDCARDS: Final = frozenset({"0.0.0.0", "::", "::ffff:0.0.0.0"})


@dataclass(frozen=True)
class WantedPort:
    """A port a process of ours is about to listen on."""

    host: str
    port: int
    who: str  # "etcd member etcd-2's client port", "controller 1's --listen"
    remedy: str  # what to do if it is taken: the flag that moves it, and so on


@dataclass(frozen=True)
class ListenSocket:
    """A socket on a port, as /proc/net/tcp shows it."""

    state: str
    local: str  # HOST:PORT
    remote: str  # HOST:PORT (0.0.0.0:0 for a listener)

    def __str__(self) -> str:
        if self.state == "LISTEN":
            return f"LISTEN {self.local}"
        return f"{self.state} {self.local} -> {self.remote}"


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (and port 0): ip_local_port_range,
    Linux's default if it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        low, high = PORT_RANGE_FILE.read_text().split()
        return int(low), int(high)
    return LINUX_EPHEMERAL


def closing_wait_s() -> float:
    """How long a closing connection can hold a port: TIME-WAIT's 60 s, or an orphaned
    FIN-WAIT-2's tcp_fin_timeout if longer, and a margin."""
    fin = TIME_WAIT_S
    with contextlib.suppress(OSError, ValueError):
        fin = float(FIN_TIMEOUT_FILE.read_text())
    return max(TIME_WAIT_S, fin) + 5.0


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listenable(host: str, port: int) -> OSError | None:
    """None if a listener with SO_REUSEADDR (etcd's, asyncio's) could bind `host:port`
    now, else the error its bind would get."""
    with socket.socket(_family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _address(hex_text: str) -> str:
    """An address of /proc/net/tcp (IPv4: 8 hex digits; IPv6: 32), each 32-bit word in
    host byte order."""
    words = [struct.pack("=I", int(hex_text[i : i + 8], 16)) for i in range(0, len(hex_text), 8)]
    family = socket.AF_INET if len(words) == 1 else socket.AF_INET6
    return socket.inet_ntop(family, b"".join(words))


def _joined(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _same_address(local: str, wanted: str | None) -> bool:
    """Whether a socket on `local` is in the way of a listener on `wanted` (None: a
    name, any address)."""
    if wanted is None or wanted in WILDCARDS or local in WILDCARDS:
        return True
    return wanted in (local, local.removeprefix("::ffff:"))


def sockets_on(host: str, port: int) -> list[ListenSocket]:
    """The TCP sockets whose local port is `port` on `host`, a wildcard address or (for
    a host that is not an address) any, from /proc/net/tcp and tcp6. A socket only bound
    (neither listening nor connected) is not in those tables."""
    try:
        wanted: str | None = socket.inet_ntop(_family(host), socket.inet_pton(_family(host), host))
    except OSError:
        wanted = None  # a name: every address on the port
    found = []
    for table in TCP_TABLES:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 4:
                    continue
                local_hex, local_port = fields[1].split(":")
                if int(local_port, 16) != port:
                    continue
                local = _address(local_hex)
                if not _same_address(local, wanted):
                    continue
                remote_hex, remote_port = fields[2].split(":")
                found.append(
                    ListenSocket(
                        STATES.get(fields[3], fields[3]),
                        _joined(local, port),
                        _joined(_address(remote_hex), int(remote_port, 16)),
                    )
                )
    return found


def _weight(s: ListenSocket) -> int:
    """A listener, then a live connection, then a closing one (which may be a stopped
    listener's own, opened with SO_REUSEADDR and so in nobody's way)."""
    return 0 if s.state == "LISTEN" else 2 if s.state in CLOSING_STATES else 1


def _refusal(p: WantedPort, error: OSError, held: list[ListenSocket], waited_s: float) -> str:
    where = _joined(p.host, p.port)
    if error.errno != errno.EADDRINUSE:
        return f"cannot listen on {where} ({p.who}): {error.strerror}; {p.remedy}"
    held = sorted(held, key=_weight)  # what keeps a listener off first
    shown = ", ".join(map(str, held[:3])) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    if any(s.state == "LISTEN" for s in held):
        what = f"another process listens on it ({shown})"
    elif held and all(s.state in CLOSING_STATES for s in held):
        what = f"a closing connection still holds it after {waited_s:.0f} s ({shown})"
    elif held:
        what = (
            f"a connection holds it ({shown}), and one opened without SO_REUSEADDR (every "
            "outgoing one whose port the kernel chose) keeps any listener off its port "
            "until it ends"
        )
    else:
        what = "a socket that is only bound (neither listening nor connected) holds it"
    return (
        f"{where} ({p.who}) is in use: {what}; {p.remedy} "
        f"(`ss -tanp 'sport = :{p.port}'` names the process)"
    )


def await_listenable(
    ports: Iterable[WantedPort],
    *,
    wait_s: float | None = None,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Return once a listener could bind each of `ports`; ListenError (naming the port,
    what holds it and `remedy`) as soon as one is held by a listener, a live connection
    or a bound socket, or by a closing connection still after `wait_s` (default
    `closing_wait_s`). `notify` is told, once per port, that it is waited for."""
    bound_s = closing_wait_s() if wait_s is None else wait_s
    started = time.monotonic()
    for p in ports:
        told = False
        while (error := listenable(p.host, p.port)) is not None:
            held = sockets_on(p.host, p.port) if error.errno == errno.EADDRINUSE else []
            closing = bool(held) and all(s.state in CLOSING_STATES for s in held)
            waited_s = time.monotonic() - started
            if not closing or waited_s >= bound_s:
                raise ListenError(_refusal(p, error, held, waited_s))
            if not told and notify is not None:
                notify(
                    f"{_joined(p.host, p.port)} ({p.who}) is held by a closing connection "
                    f"({', '.join(map(str, held[:3]))}): waiting up to {bound_s:.0f} s for "
                    "the kernel to let it go"
                )
                told = True
            time.sleep(POLL_S)  # the kernel's timer ends it; nothing to be told of


def cluster_listeners(planned: Iterable[PlannedPort]) -> list[WantedPort]:
    """`cluster up`'s controllers' and brokers' fixed ports (`UpSettings.listeners`),
    each refused, if taken, with the flag that moves it."""
    return [
        WantedPort(p.host, p.port, p.who, f"move it with {p.flag} (port 0: any free port)")
        for p in planned
    ]
