"""The /metrics endpoint over real TCP, served by prometheus_client's own HTTP server: in
plain HTTP without TLS, and with mutual TLS (a client certificate of the cluster CA
required) when the controller has an identity. It survives garbage, oversized and
half-sent requests, and a client that connects and never speaks does not stop other
scrapes. Also the process entry point: `python -m controller --metrics` announces the
bound address and serves HTTPS to a scraper holding the viewer's certificate."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller.runtime.service import ControllerService
from localcluster.certs import default_names, init_certs
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.broker_controller import RegisterBroker
from protocol.metrics_http import start_metrics_endpoint
from protocol.tls import CONTROLLER, VIEWER, TlsIdentity
from tests.observability.kit import REPO, scrape_context


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(tmp_path, "127.0.0.1:0", metrics="127.0.0.1:0")
    await svc.start()
    yield svc
    await svc.stop()


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    init_certs(d, default_names([1]))
    return d


@pytest.fixture
async def tls_service(tmp_path: Path, certs: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(
        tmp_path / "ctl",
        "127.0.0.1:0",
        metrics="127.0.0.1:0",
        tls=TlsIdentity.from_dir(certs, CONTROLLER),
    )
    await svc.start()
    yield svc
    await svc.stop()


async def raw(
    address: str, data: bytes, *, close_write: bool = False, tls: ssl.SSLContext | None = None
) -> bytes:
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        writer.write(data)
        await writer.drain()
        if close_write and tls is None:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 15)
    except (ConnectionResetError, BrokenPipeError):
        return b""  # the server hung up on unread input
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise
        return b""  # it hung up before our half-close (a TLS port refusing plain HTTP)
    finally:
        writer.close()


async def refused(address: str, tls: ssl.SSLContext) -> bool:
    """True if a TLS GET gets no HTTP answer: a failed handshake, or a connection closed
    or reset before any response."""
    try:
        r = await get(address, "/metrics", tls=tls)
    except OSError:  # a TLS alert, reset, broken pipe, or "not connected" (ENOTCONN)
        return True
    return not r.startswith(b"HTTP/")


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


async def get(
    address: str, path: str, method: str = "GET", *, tls: ssl.SSLContext | None = None
) -> bytes:
    return await raw(address, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), tls=tls)


async def test_get_metrics(service: ControllerService) -> None:
    assert service.metrics_address and service.metrics_address != "127.0.0.1:0"
    r = await get(service.metrics_address, "/metrics")
    assert status_of(r) == 200
    head, body = r.split(b"\r\n\r\n", 1)
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'metactl_build_info{version="0.1.0"} 1.0' in body
    assert b'metactl_elections_total{kind="unclean_recovery"} 0.0' in body
    # A query string is ignored; other methods than GET (and OPTIONS) are refused.
    assert status_of(await get(service.metrics_address, "/metrics?x=1")) == 200
    post = await get(service.metrics_address, "/metrics", "POST")
    assert status_of(post) == 405 and b"Allow: OPTIONS,GET" in post


async def test_metrics_follow_requests_over_the_wire(service: ControllerService) -> None:
    host, port = parse_address(service.address)
    conn = await RpcClient.open(host, port)
    try:
        await conn.request(RegisterBroker(broker_id=1, incarnation_id="a"))
    finally:
        await conn.close()
    body = body_of(await get(service.metrics_address, "/metrics"))
    assert b'metactl_brokers{state="fenced"} 1.0' in body
    assert b'metactl_committed_records_total{type="RegisterBroker"} 1.0' in body


@pytest.mark.parametrize(
    ("request_bytes", "expect"),
    [
        # An unparsable request line gets an HTTP/0.9-style error page (no status line).
        (b"\x00\xff\xfe garbage\r\n\r\n", b"Error code: 400"),
        (b"GET /metrics SPDY/3\r\n\r\n", b"Error code: 400"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"HTTP/1.0 431 "),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", b"HTTP/1.0 431 "),
        (b"GET /metr", None),  # half a request, then EOF
        (b"", None),
    ],
)
async def test_bad_input_never_crashes_it(
    service: ControllerService,
    request_bytes: bytes,
    expect: bytes | None,
    capfd: pytest.CaptureFixture[str],
) -> None:
    r = await raw(service.metrics_address, request_bytes, close_write=True)
    if expect is not None:
        assert expect in r and b"metactl_" not in r
    assert status_of(await get(service.metrics_address, "/metrics")) == 200
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


async def test_many_concurrent_scrapes(service: ControllerService) -> None:
    results = await asyncio.gather(*(get(service.metrics_address, "/metrics") for _ in range(20)))
    assert all(status_of(r) == 200 for r in results)


async def test_no_metrics_address_means_no_server(tmp_path: Path) -> None:
    svc = ControllerService(tmp_path, "127.0.0.1:0")
    await svc.start()
    try:
        assert svc.metrics_server is None and svc.metrics_address == ""
        assert svc.metrics is not None  # still counted, for in-process readers
    finally:
        await svc.stop()


# --- mutual TLS -----------------------------------------------------------------------------


async def test_tls_metrics_need_a_certificate_of_the_cluster_ca(
    tls_service: ControllerService, certs: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    address = tls_service.metrics_address
    assert tls_service.metrics_server is not None
    assert tls_service.metrics_server.endpoint.url == f"https://{address}/metrics"
    # The viewer's certificate: metrics.
    r = await get(address, "/metrics", tls=scrape_context(certs, VIEWER))
    assert status_of(r) == 200 and b"metactl_build_info" in body_of(r)
    # No client certificate: refused (TLS 1.3 clients learn it on their first read).
    anonymous = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    assert await refused(address, anonymous)
    # A certificate of another cluster's CA: refused too.
    other = tmp_path / "other"
    init_certs(other, default_names([]))
    foreign = scrape_context(other, VIEWER)
    foreign.load_verify_locations(cafile=str(certs / "ca.pem"))  # it trusts our server
    assert await refused(address, foreign)
    # Plain HTTP on the TLS port gets no metrics.
    plain = await raw(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", close_write=True)
    assert b"metactl_" not in plain
    # It still serves, and no failure left a traceback anywhere.
    r = await get(address, "/metrics", tls=scrape_context(certs, VIEWER))
    assert status_of(r) == 200
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert "metrics TLS handshake failed" in out + err


async def test_a_silent_client_does_not_stop_tls_scrapes(
    tls_service: ControllerService, certs: Path
) -> None:
    """prometheus_client wraps the listening socket: left alone, the handshake of a client
    that connects and sends nothing blocks the accepting thread, and every later scrape
    with it. The endpoint moves handshakes to the connection's own thread."""
    host, port = parse_address(tls_service.metrics_address)
    silent = await asyncio.open_connection(host, port)  # TCP only, no ClientHello
    try:
        r = await asyncio.wait_for(
            get(tls_service.metrics_address, "/metrics", tls=scrape_context(certs, VIEWER)), 8
        )
        assert status_of(r) == 200
    finally:
        silent[1].close()


async def test_a_flood_of_idle_connections_is_capped() -> None:
    """Each connection takes a thread and a descriptor while it is served: past the cap
    one more is closed at accept (without an answer), and scrapes resume as soon as the
    idle ones go."""
    endpoint = start_metrics_endpoint(CollectorRegistry(), "127.0.0.1:0", None, max_connections=2)
    host, port = parse_address(endpoint.address)
    try:
        idle = [await asyncio.open_connection(host, port) for _ in range(2)]
        assert await raw(endpoint.address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        for _, writer in idle:
            writer.close()
        async with asyncio.timeout(30):  # the idle ones' threads see EOF and end
            while True:
                r = await get(endpoint.address, "/metrics")
                if r:
                    break
                await asyncio.sleep(0.01)  # polling interval of an observable condition
        assert status_of(r) == 200
    finally:
        await asyncio.to_thread(endpoint.stop)


@pytest.mark.slow
def test_process_entry_point_serves_metrics_over_tls(tmp_path: Path, certs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("METACTL_TLS_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--data-dir", str(tmp_path / "ctl"), "--listen",
         "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--tls-dir", str(certs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY controller listen="), line
        fields = dict(f.split("=", 1) for f in line.split()[2:])
        metrics = fields["metrics"]
        assert not metrics.endswith(":0")
        ctx = scrape_context(certs, VIEWER)
        with urllib.request.urlopen(f"https://{metrics}/metrics", timeout=10, context=ctx) as r:
            assert r.status == 200
            assert b"metactl_build_info" in r.read()
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10)  # no TLS
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
