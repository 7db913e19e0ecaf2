"""Kafka's wire for tests: kio-framed requests of our own over a plain or TLS socket, the
TLS settings of librdkafka-based clients and kcat for a cluster's certificates, and
record batches built with kio's writer.
"""

from __future__ import annotations

import datetime
import io
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.serial import entity_reader, entity_writer

from protocol.tls import ADMIN, CA_CERT, cert_path, key_path


def librdkafka_tls(certs: Path, principal: str = ADMIN) -> dict[str, str]:
    """confluent-kafka's settings for the cluster's TLS as `principal`."""
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs / CA_CERT),
        "ssl.certificate.location": str(cert_path(certs, principal)),
        "ssl.key.location": str(key_path(certs, principal)),
        "ssl.endpoint.identification.algorithm": "none",
    }


def kcat_flags(settings: dict[str, str]) -> list[str]:
    return [x for k, v in settings.items() for x in ("-X", f"{k}={v}")]


def client_context(certs: Path, principal: str = ADMIN) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / CA_CERT))
    ctx.check_hostname = False
    ctx.load_cert_chain(cert_path(certs, principal), key_path(certs, principal))
    return ctx


def connect(address: str, tls: ssl.SSLContext | None = None) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return tls.wrap_socket(sock) if tls is not None else sock


def frame(request: Any, correlation_id: int = 7, version: int | None = None) -> bytes:
    header_cls: Any = request.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__ if version is None else version,
            correlation_id=correlation_id,
            client_id="test",
        ),
    )
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


def read_frame(sock: socket.socket) -> bytes:
    """The next response frame's payload; b"" once the server closed the connection."""
    prefix = recv_exactly(sock, 4)
    if not prefix:
        return b""
    return recv_exactly(sock, struct.unpack(">i", prefix)[0])


def decode(payload: bytes, response_cls: Any, correlation_id: int = 7) -> Any:
    header, used = entity_reader(response_cls.__header_schema__)(payload, 0)
    assert header.correlation_id == correlation_id
    body, _ = entity_reader(response_cls)(payload, used)
    return body


def exchange(sock: socket.socket, request: Any, response_cls: Any, correlation_id: int = 7) -> Any:
    """Send `request` on an open connection and read its answer."""
    sock.sendall(frame(request, correlation_id))
    payload = read_frame(sock)
    assert payload, "the server closed the connection"
    return decode(payload, response_cls, correlation_id)


def call(address: str, request: Any, response_cls: Any, tls: ssl.SSLContext | None = None) -> Any:
    with connect(address, tls) as sock:
        return exchange(sock, request, response_cls)


def batch(
    values: list[bytes | None],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    """An uncompressed v2 record batch of `values` (null keys), as a client sends it."""
    ts = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    records = tuple(
        Record(attributes=0, timestamp=ts, offset=i, key=None, value=v, headers=())  # type: ignore[arg-type]
        for i, v in enumerate(values)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=producer_id,  # type: ignore[arg-type]
            producer_epoch=producer_epoch,  # type: ignore[arg-type]
            base_sequence=base_sequence,  # type: ignore[arg-type]
            records=records,
            attributes=0,  # type: ignore[arg-type]
        ),
    )
    return buf.getvalue()
