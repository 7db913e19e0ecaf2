"""One member's channel (`connect_member`): a library client on a gRPC channel to that
member alone, with its host resolved to IPv4 (the library builds an ``ipv4:`` target that
takes literals only), TLS checked against the member's own host as etcdctl checks it,
reconnects at most `RECONNECT_BACKOFF_MS` after a member returns (gRPC's default backoff
grows to two minutes, which would keep a healed cluster unused), and answers up to
`MAX_RECEIVE_BYTES` (range reads are paged well below it). And, when a first round trip
fails, whether TLS is why (`tls_refusal`): a refused or missing client certificate, a
server that does not speak TLS, or one that does to a plaintext client is
SSL_AUTHENTICATION_FAILED, not a retriable unavailability.

Opens channels and probes; makes no calls on them (`metadata_log.etcd.client` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any, Final

from etcd3aio import Etcd3Client

from metactl.errors import InvalidConfigurationError, SslAuthenticationError
from metadata_log.etcd.target import EtcdTarget, split_endpoint
from metadata_log.etcd.tls import EtcdTls

RECONNECT_BACKOFF_MS: Final = 1000
MAX_RECEIVE_BYTES: Final = 256 * 1024 * 1024


async def connect_member(endpoint: str, tls: EtcdTls | None, url: str) -> Etcd3Client:
    """A connected library client of one member, with TLS if `tls`: the member's
    certificate must carry the host of its own endpoint, as etcdctl checks."""
    addresses = [await resolve(endpoint, url)]
    tls_args: dict[str, Any] = {}
    if tls is not None:
        ca, chain, key = tls.load()
        server_name = split_endpoint(endpoint, url)[0].strip("[]")
        tls_args = {"ca_cert": ca, "cert_chain": chain, "cert_key": key}
        tls_args["tls_server_name"] = server_name
    client = Etcd3Client(addresses, rpc_max_attempts=1, **tls_args)
    # The library has no public knob for these channel options.
    client._manager.grpc_options += [
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.initial_reconnect_backoff_ms", min(RECONNECT_BACKOFF_MS, 200)),
    ]
    await client.connect()
    if client._channel is not None:  # connect now, not at the first call
        client._channel.get_state(try_to_connect=True)
    return client


_TLS_WORDS: Final = ("ssl", "tls", "tsi_", "handshake", "certificate", "hostname verification")


async def tls_refusal(target: EtcdTarget, detail: str) -> SslAuthenticationError | None:
    """Why a first round trip failed, if TLS is the reason: with TLS on, a handshake the
    member refused (no certificate, one it does not trust) or one that failed here (its
    certificate not of our CA or not naming the host, a plaintext member); without TLS,
    a member that speaks TLS (it closes a plaintext connection). None: not TLS."""
    flags = "--etcd-cacert/--etcd-cert/--etcd-key (or METACTL_ETCD_CACERT/_CERT/_KEY)"
    if target.tls is not None:
        lowered = detail.lower()
        if any(w in lowered for w in _TLS_WORDS):
            _, found, last = detail.rpartition("last error: ")
            cause = last if found else detail
            while cause.endswith(")") and cause.count(")") > cause.count("("):
                cause = cause[:-1]
            return SslAuthenticationError(
                f"etcd at {','.join(target.endpoints)}: TLS failed ({cause}): its "
                "certificate is not of "
                "the --etcd-cacert CA or does not name the member's host as the URL gives "
                "it, it refused this "
                "client's certificate (or its lack of one: --client-cert-auth), or it does "
                f"not speak TLS; check {flags}"
            )
        return None
    for endpoint in target.endpoints:
        if await speaks_tls(endpoint):
            return SslAuthenticationError(
                f"etcd at {endpoint} speaks TLS and refused a plaintext connection: give "
                f"{flags} (a local cluster's are in <data-dir>/certs/etcd)"
            )
    return None


async def speaks_tls(endpoint: str) -> bool:
    """Whether `endpoint` answers a TLS handshake (no certificate checked or sent)."""
    host, _, port = endpoint.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx)
    except ssl.SSLError as exc:
        # The server answered in TLS (an alert: it wants a certificate, say).
        return exc.reason not in (None, "WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING")
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return True


async def resolve(endpoint: str, url: str) -> str:
    host, port = split_endpoint(endpoint, url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise InvalidConfigurationError(
            f"etcd URL {url!r}: cannot resolve {host!r}: {exc}"
        ) from None
    return f"{infos[0][4][0]}:{port}"
