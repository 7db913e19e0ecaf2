"""`LocalEtcd` restarts on its directory while other connections hold its kept ports
(issue 33, item 3), with real etcd members and real sockets.

What holds a port decides (bench/cluster_restart.py --experiment measured it): an
outgoing connection opened with SO_REUSEADDR does not keep etcd's listener (Go sets
SO_REUSEADDR) off its port, though a plain bind fails there; one opened without it (every
connection whose port the kernel chose) keeps etcd itself off, so that is refused by
name before any member starts, while it is closing (FIN-WAIT-2, TIME-WAIT) it is waited
for, where the old check (a bind with SO_REUSEADDR) refused at once."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.etcd import PORTS_FILE, LocalEtcd
from localcluster.ports import listenable, sockets_on
from metactl.errors import ListenError, StoreUnavailableError
from tests.e2e.cluster import free_block
from tests.localcluster.test_etcd_local import put_get

pytestmark = pytest.mark.slow

LO = "127.0.0.1"
RESTARTS = 3
BOUND_S = 10.0  # bounds a wait; nothing is timed


class Connection:
    """An outgoing connection of the test's own whose local port is `port`, to a
    listener of the test's own; `reuse`: opened with SO_REUSEADDR. Without it, it is
    bound with it all the same (past the stopped members' own connections in TIME-WAIT
    on the port, which they opened with it), and it is cleared before connecting: the
    kernel looks at the flag as it is when another socket binds."""

    def __init__(self, server: socket.socket, port: int, *, reuse: bool) -> None:
        self.client = socket.socket()
        self.client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.client.bind((LO, port))
        if not reuse:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        self.server_address = server.getsockname()
        self.client.connect(self.server_address)
        self.accepted, _ = server.accept()
        self.port = port

    def half_close(self) -> None:
        """Its FIN sent, the peer's end left open: the client's end in FIN-WAIT-2 once
        the peer's kernel acknowledged it."""
        self.client.shutdown(socket.SHUT_WR)
        assert self.accepted.recv(1) == b""  # the FIN arrived
        deadline = time.monotonic() + BOUND_S
        while self.states() != {"FIN-WAIT-2"}:  # its ACK may be delayed (by ~40 ms)
            assert time.monotonic() < deadline, self.states()
            time.sleep(0.01)  # polling the kernel's state of the connection

    def reset(self) -> None:
        """Gone at once (SO_LINGER 0: an RST, no TIME-WAIT)."""
        for s in (self.client, self.accepted):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def states(self) -> set[str]:
        """Its own end's state, and a listener's on its port if any (not the stopped
        members' old connections there)."""
        host, port = self.server_address
        return {
            s.state
            for s in sockets_on(LO, self.port)
            if s.state == "LISTEN" or s.remote == f"{host}:{port}"
        }


@contextlib.contextmanager
def connections(ports: list[int], *, reuse: bool) -> Iterator[list[Connection]]:
    with socket.socket() as server:
        server.bind((LO, 0))
        server.listen(16)
        held = [Connection(server, p, reuse=reuse) for p in ports]
        try:
            yield held
        finally:
            for c in held:
                c.reset()


def plain_bind_error(port: int) -> int | None:
    """The errno of a bind without SO_REUSEADDR (None: it binds)."""
    with socket.socket() as s:
        try:
            s.bind((LO, port))
        except OSError as exc:
            return exc.errno
    return None


def kept(d: Path) -> list[int]:
    return [int(p) for p in json.loads((d / PORTS_FILE).read_text())["ports"]]


def first_start(d: Path, members: int, value: bytes) -> list[int]:
    cluster = LocalEtcd(d, members, base_port=free_block(2 * members)).start()
    try:
        assert asyncio.run(put_get(cluster, value)) == value
    finally:
        cluster.stop()
    return kept(d)


def test_outgoing_connections_with_so_reuseaddr_do_not_keep_a_restart_off(tmp_path: Path) -> None:
    ports = first_start(tmp_path, 1, b"kept")
    with connections(ports, reuse=True) as held:
        for c in held:
            assert c.states() == {"ESTABLISHED"}
            # What a check without SO_REUSEADDR would have refused ...
            assert plain_bind_error(c.port) == errno.EADDRINUSE
            assert listenable(LO, c.port) is None  # ... while etcd's listener binds there
        again = LocalEtcd(tmp_path, 1).start()
        try:
            assert asyncio.run(put_get(again, None)) == b"kept"
            assert all(c.states() >= {"LISTEN", "ESTABLISHED"} for c in held)
        finally:
            again.stop()


def test_a_live_connection_without_so_reuseaddr_is_named_and_would_stop_etcd_too(
    tmp_path: Path,
) -> None:
    client_port = first_start(tmp_path, 1, b"kept")[0]
    with connections([client_port], reuse=False):
        blocked = LocalEtcd(tmp_path, 1)
        with pytest.raises(ListenError) as refused:
            blocked.start()
        text = refused.value.message
        assert f"{LO}:{client_port} (etcd member etcd-1's client port) is in use" in text
        assert "a connection holds it (ESTABLISHED" in text
        assert str(tmp_path / PORTS_FILE) in text and "new --data-dir" in text
        assert "--etcd-base-port" in text
        assert not blocked.members[0].running
        # No false alarm: the member started anyway, past the check, cannot listen.
        blocked.start_member(0)
        try:
            with pytest.raises(StoreUnavailableError, match="exited"):
                blocked.wait_healthy()
        finally:
            blocked.stop()
        assert "address already in use" in blocked.members[0].log_path.read_text()


def test_a_closing_connection_is_waited_out_where_the_old_check_refused(tmp_path: Path) -> None:
    peer_port = first_start(tmp_path, 1, b"kept")[1]
    told: list[str] = []
    with connections([peer_port], reuse=False) as (held,):
        held.half_close()
        assert held.states() == {"FIN-WAIT-2"}
        # The old check (a bind with SO_REUSEADDR, as etcd's) refused here, at once.
        error = listenable(LO, peer_port)
        assert error is not None and error.errno == errno.EADDRINUSE

        def notify(line: str) -> None:
            told.append(line)
            if "closing connection" in line:
                held.reset()  # what the kernel does to it in time, done now

        again = LocalEtcd(tmp_path, 1, notify=notify).start()
        try:
            assert asyncio.run(put_get(again, None)) == b"kept"
        finally:
            again.stop()
    assert len(told) == 1, told
    assert f"{LO}:{peer_port} (etcd member etcd-1's peer port) is held by a closing " in told[0]
    assert "FIN-WAIT-2" in told[0]


def test_three_members_restart_again_and_again_while_connections_hold_their_ports(
    tmp_path: Path,
) -> None:
    ports = first_start(tmp_path, 3, b"0")
    for n in range(1, RESTARTS + 1):
        # Each round: one kept port under a closing connection without SO_REUSEADDR (reset
        # when waited for), the other five under live ones with it.
        closing_port = ports[n % len(ports)]
        others = [p for p in ports if p != closing_port]
        with (
            connections(others, reuse=True) as live,
            connections([closing_port], reuse=False) as (closing,),
        ):
            closing.half_close()
            assert all(plain_bind_error(c.port) == errno.EADDRINUSE for c in live)
            assert listenable(LO, closing_port) is not None  # the old check refused
            waited: list[str] = []

            def notify(
                line: str, closing: Connection = closing, waited: list[str] = waited
            ) -> None:
                if "closing connection" in line:
                    waited.append(line)
                    closing.reset()

            again = LocalEtcd(tmp_path, 3, notify=notify).start()
            try:
                assert asyncio.run(put_get(again, None)) == str(n - 1).encode()
                assert asyncio.run(put_get(again, str(n).encode())) == str(n).encode()
            finally:
                again.stop()
            assert len(waited) == 1 and f":{closing_port} " in waited[0]
        assert kept(tmp_path) == ports
