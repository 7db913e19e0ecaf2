"""Mutual TLS and the server's resource bounds, over real TCP on 127.0.0.1.

Certificates come from `localcluster.certs.init_certs`, the code behind `metactl certs init`.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import socket
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from localcluster.certs import default_names, init_certs
from metactl.errors import InvalidConfigurationError, NetworkError, SslAuthenticationError
from protocol.address import parse_address
from protocol.admission import Peer
from protocol.client import RpcClient
from protocol.codec import encode_frame
from protocol.flags import add_limit_arguments, server_limits
from protocol.limits import ServerLimits
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.tls import TlsIdentity
from tests.brokers_stub.helpers import eventually
from tests.protocol.conftest import Scripted

EMPTY = DescribeClusterResponse(brokers=[], partitions=[], end_offset=0, committed_offset=0)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    init_certs(d, default_names([1, 2]))
    return d


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("other")
    init_certs(d, ["admin", "controller"])
    return d


async def _always_empty(body: Message) -> Message:
    return EMPTY


async def tls_server(certs: Path, handler: Scripted, **limits: float) -> FrameServer:
    handler.default = _always_empty
    srv = FrameServer(
        handler,
        ssl=TlsIdentity.from_dir(certs, "controller").server_context(),
        limits=ServerLimits(**limits),  # type: ignore[arg-type]
    )
    await srv.start("127.0.0.1:0")
    return srv


async def test_mutual_tls_names_the_client_principal(certs: Path, handler: Scripted) -> None:
    srv = await tls_server(certs, handler)
    try:
        ctx = TlsIdentity.from_dir(certs, "broker-2").client_context()
        async with RpcClient(srv.address, ssl=ctx, expect_principal="controller") as c:
            assert await c.request(DescribeClusterRequest()) == EMPTY
        assert [p.principal for p in handler.peers] == ["broker-2"]
    finally:
        await srv.stop()


async def test_a_certificate_from_another_ca_is_refused(
    certs: Path, other_ca: Path, handler: Scripted
) -> None:
    srv = await tls_server(certs, handler)
    try:
        ctx = TlsIdentity.from_dir(other_ca, "admin").client_context()
        with pytest.raises((SslAuthenticationError, NetworkError)):
            await RpcClient(srv.address, ssl=ctx).request(DescribeClusterRequest(), timeout_s=5)
        assert handler.requests == []
    finally:
        await srv.stop()


async def test_a_plaintext_client_gets_nothing_from_a_tls_listener(
    certs: Path, handler: Scripted
) -> None:
    srv = await tls_server(certs, handler)
    try:
        with pytest.raises(NetworkError):
            await RpcClient(srv.address).request(DescribeClusterRequest(), timeout_s=5)
        assert handler.requests == []
    finally:
        await srv.stop()


async def test_the_client_checks_the_server_principal(certs: Path, handler: Scripted) -> None:
    srv = await tls_server(certs, handler)
    try:
        ctx = TlsIdentity.from_dir(certs, "admin").client_context()
        client = RpcClient(srv.address, ssl=ctx, expect_principal="broker-1")
        with pytest.raises(SslAuthenticationError, match="names 'controller', not 'broker-1'"):
            await client.request(DescribeClusterRequest())
        assert handler.requests == []
    finally:
        await srv.stop()


async def test_a_missing_certificate_file_is_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"ca\.pem is missing"):
        TlsIdentity.from_dir(tmp_path, "controller")


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closes the connection (EOF or reset)."""
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


async def test_connections_over_the_cap_are_closed_and_counted(handler: Scripted) -> None:
    handler.default = _always_empty
    srv = FrameServer(handler, limits=ServerLimits(max_connections=2))
    await srv.start("127.0.0.1:0")
    try:
        a = await RpcClient.open(*parse_address(srv.address))
        b = await RpcClient.open(*parse_address(srv.address))
        assert await a.request(DescribeClusterRequest()) == EMPTY
        assert await b.request(DescribeClusterRequest()) == EMPTY
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        assert await _closed_by_server(reader)
        writer.close()
        assert srv.stats.closed_total["max_connections"] == 1
        assert await a.request(DescribeClusterRequest()) == EMPTY  # the others keep serving
        await a.close()
        await b.close()
    finally:
        await srv.stop()


async def test_connections_per_peer_are_capped(certs: Path, handler: Scripted) -> None:
    srv = await tls_server(certs, handler, max_connections_per_peer=1)
    try:
        admin = TlsIdentity.from_dir(certs, "admin").client_context()
        viewer = TlsIdentity.from_dir(certs, "viewer").client_context()
        first = RpcClient(srv.address, ssl=admin)
        assert await first.request(DescribeClusterRequest()) == EMPTY
        with pytest.raises(NetworkError):
            await RpcClient(srv.address, ssl=admin).request(DescribeClusterRequest())
        async with RpcClient(srv.address, ssl=viewer) as other:  # another principal is fine
            assert await other.request(DescribeClusterRequest()) == EMPTY
        assert srv.stats.closed_total["max_connections_per_peer"] == 1
        await first.close()
        await eventually(lambda: srv.stats.open_connections == 0, what="the connections closed")
        # Every key (addresses in the pending pool, principals once established) is
        # forgotten with its last connection: a stream of new peers cannot grow a table.
        assert srv.admission._per_peer == {}
        assert len(srv.admission._pending) == 0 and srv.admission._pending._by_host == {}
    finally:
        await srv.stop()


async def test_an_idle_connection_is_closed(handler: Scripted) -> None:
    srv = FrameServer(handler, limits=ServerLimits(idle_timeout_s=0.05))
    await srv.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        assert await _closed_by_server(reader)
        writer.close()
        assert srv.stats.closed_total["idle_timeout"] == 1
        assert srv.stats.open_connections == 0
    finally:
        await srv.stop()


async def test_a_frame_that_trickles_in_is_cut_off(handler: Scripted) -> None:
    """Slowloris: two bytes of a header, then nothing."""
    srv = FrameServer(handler, limits=ServerLimits(frame_deadline_s=0.05))
    await srv.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        writer.write(encode_frame(1, DescribeClusterRequest())[:2])
        await writer.drain()
        assert await _closed_by_server(reader)
        writer.close()
        assert srv.stats.closed_total["frame_deadline"] == 1
        assert handler.requests == []
    finally:
        await srv.stop()


class _Emfile:
    """A listening socket whose accept() fails as when the process is out of
    descriptors."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real

    def fileno(self) -> int:
        return self.real.fileno()

    def accept(self) -> tuple[socket.socket, Any]:
        raise OSError(errno.EMFILE, "Too many open files")


async def test_accept_errors_pause_accepting_and_are_logged_once_a_second_with_a_count(
    handler: Scripted,
) -> None:
    srv = FrameServer(handler)
    srv.admission.throttled.period_s = 0.5  # a burst of 50 calls takes far less
    await srv.start("127.0.0.1:0")
    failing = _Emfile(srv.admission.listener.sockets[0])
    try:
        with capture_logs() as logs:
            for _ in range(50):
                srv.admission.listener._accept(failing)  # type: ignore[arg-type]
            lines = [e for e in logs if e["event"].startswith("accept failed")]
            assert len(lines) == 1 and lines[0]["count"] == 1
            assert srv.stats.closed_total["accept_error"] == 50
            # Accepting pauses, as asyncio's own server does.
            assert failing in srv.admission.listener._paused
            # The 49 held back are told one period later, though nothing else happens.
            await eventually(
                lambda: sum(e["event"].startswith("accept failed") for e in logs) > 1,
                what="the summary line",
            )
        lines = [e for e in logs if e["event"].startswith("accept failed")]
        assert [e["count"] for e in lines] == [1, 49]
    finally:
        await srv.stop()


def test_peer_name_is_the_principal_or_the_host() -> None:
    assert Peer("10.0.0.1:5555", "broker-1").name == "broker-1"
    assert Peer("10.0.0.1:5555").name == "10.0.0.1"


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError):
        ServerLimits(idle_timeout_s=0)
    with pytest.raises(ValueError):
        ServerLimits(max_pending_handshakes_per_address=0)
    with pytest.raises(ValueError):
        ServerLimits(max_handshakes_in_progress=0)


def test_the_pending_handshake_flags_read_into_limits_and_refuse_nonsense() -> None:
    p = argparse.ArgumentParser()
    add_limit_arguments(p)
    limits = server_limits(
        p.parse_args(["--max-pending-handshakes", "64", "--max-pending-handshakes-per-address",
                      "8", "--max-handshakes-in-progress", "4"])
    )  # fmt: skip
    assert (
        limits.max_pending_handshakes,
        limits.max_pending_handshakes_per_address,
        limits.max_handshakes_in_progress,
    ) == (64, 8, 4)
    assert server_limits(p.parse_args([])) == ServerLimits()
    for flag in (
        "--max-pending-handshakes",
        "--max-pending-handshakes-per-address",
        "--max-handshakes-in-progress",
    ):
        with pytest.raises(InvalidConfigurationError, match=f"{flag} must be >= 1, got 0"):
            server_limits(p.parse_args([flag, "0"]))
