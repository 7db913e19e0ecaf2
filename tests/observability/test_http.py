"""The /metrics endpoint over real TCP: the service serves it when asked, answers 404 and
405 where it should, and survives garbage, oversized and half-sent requests. Also the
process entry point: `python -m controller --metrics` announces the bound address."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.runtime.service import ControllerService
from protocol.client import RpcClient
from protocol.codec import parse_address
from protocol.messages import RegisterBroker
from tests.observability.kit import REPO


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(tmp_path, "127.0.0.1:0", metrics="127.0.0.1:0")
    await svc.start()
    yield svc
    await svc.stop()


async def raw(address: str, data: bytes, *, close_write: bool = False) -> bytes:
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        if close_write:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 15)
    except ConnectionResetError:
        return b""  # the server hung up on unread input
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


async def get(address: str, path: str, method: str = "GET") -> bytes:
    return await raw(address, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


async def test_get_metrics(service: ControllerService) -> None:
    assert service.metrics_address and service.metrics_address != "127.0.0.1:0"
    r = await get(service.metrics_address, "/metrics")
    assert status_of(r) == 200
    head, body = r.split(b"\r\n\r\n", 1)
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'metactl_build_info{version="0.1.0"} 1.0' in body
    assert b'metactl_elections_total{kind="unclean_recovery"} 0.0' in body
    # A query string is ignored; HEAD gets the headers only.
    assert status_of(await get(service.metrics_address, "/metrics?x=1")) == 200
    head_only = await get(service.metrics_address, "/metrics", "HEAD")
    assert status_of(head_only) == 200 and body_of(head_only) == b""


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


async def test_wrong_path_and_method(service: ControllerService) -> None:
    assert status_of(await get(service.metrics_address, "/nope")) == 404
    assert status_of(await get(service.metrics_address, "/")) == 404
    r = await get(service.metrics_address, "/metrics", "POST")
    assert status_of(r) == 405 and b"Allow: GET, HEAD" in r


@pytest.mark.parametrize(
    ("request_bytes", "expect"),
    [
        (b"\x00\xff\xfe garbage\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),  # no HTTP version
        (b"GET /metrics SPDY/3\r\n\r\n", 400),
        # A head too large: 400, or a reset when the server closes on the unread rest.
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 400),
        (b"GET /metr", None),  # half a request, then EOF: the server hangs up
        (b"", None),
    ],
)
async def test_bad_input_never_crashes_it(
    service: ControllerService, request_bytes: bytes, expect: int | None
) -> None:
    r = await raw(service.metrics_address, request_bytes, close_write=True)
    if expect is None:
        assert r == b""
    elif len(request_bytes) > 65_536 and r == b"":
        pass
    else:
        assert status_of(r) == expect
    assert status_of(await get(service.metrics_address, "/metrics")) == 200


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


@pytest.mark.slow
def test_process_entry_point_serves_metrics(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--data-dir", str(tmp_path), "--listen",
         "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
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
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
            assert resp.status == 200
            assert b"metactl_build_info" in resp.read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{metrics}/nope", timeout=10)
        assert err.value.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
