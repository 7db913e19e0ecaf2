"""The `/metrics` endpoint of every metactl process (controller and brokers):
prometheus_client's own WSGI server, with mutual TLS when the process has an identity.

`start_metrics_endpoint(registry, listen, tls)` calls `prometheus_client.start_wsgi_server`
(a daemon thread, one thread per connection). With a `TlsIdentity` it passes the
process's certificate and key, the cluster CA as `client_cafile` and
`client_auth_required=True`: every scraper must present a certificate of the cluster's CA
(Prometheus uses e.g. `viewer`'s, grafana/README.md). Without one it serves plain HTTP.

prometheus_client wraps the *listening* socket, so by default the TLS handshake runs
inside accept() on the server's only accepting thread, with no deadline: one client that
opens a TCP connection and sends nothing would stop every later scrape. This module
turns the handshake off at accept (`do_handshake_on_connect = False`: it then happens on
the connection's first read, in that connection's own thread), gives every connection a
socket timeout (`REQUEST_TIMEOUT_S`), serves at most `MAX_CONNECTIONS` at once (one
over is closed at accept), and replaces socketserver's per-error traceback on stderr with
a log line at most once a second. The four are set right after the server starts: a
connection accepted in between gets the library's behaviour.

What is served is prometheus_client's: metrics on GET of any path, 405 for methods other
than GET and OPTIONS, OpenMetrics when asked by `Accept`, gzip when asked by
`Accept-Encoding`. Collectors run in the server's threads, so they must only read.

This module owns the endpoint's threads and sockets; it defines no metric.
"""

from __future__ import annotations

import errno
import ssl
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import CollectorRegistry, start_wsgi_server

from metactl.errors import InvalidConfigurationError, ListenError
from protocol.address import parse_address
from protocol.tls import TlsIdentity

log = structlog.get_logger("metactl.metrics_http")

REQUEST_TIMEOUT_S: Final = 10.0
MAX_CONNECTIONS: Final = 64
"""Connections served at once (one thread each). One over is closed at accept, counted
in the log line, so a flood of idle scrapers cannot take a thread and a descriptor
each: at most this many are held, for at most `REQUEST_TIMEOUT_S` of silence."""


@dataclass
class MetricsEndpoint:
    httpd: WSGIServer
    thread: threading.Thread
    address: str  # HOST:PORT actually bound
    tls: bool

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}/metrics"

    def stop(self) -> None:
        """Stop serving (blocks up to the server's 0.5 s poll interval)."""
        self.httpd.shutdown()
        self.httpd.server_close()


_BIND_ERRNOS: Final = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def start_metrics_endpoint(
    registry: CollectorRegistry,
    listen: str,
    tls: TlsIdentity | None,
    *,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsEndpoint:
    """Serve `registry` on HOST:PORT (port 0: any free port). INVALID_CONFIG when the
    address cannot be bound or the TLS files cannot be loaded."""
    host, port = parse_address(listen)
    try:
        if tls is None:
            httpd, thread = start_wsgi_server(port, addr=host, registry=registry)
        else:
            httpd, thread = start_wsgi_server(
                port,
                addr=host,
                registry=registry,
                certfile=str(tls.cert),
                keyfile=str(tls.key),
                client_cafile=str(tls.ca),
                client_auth_required=True,
                tls_min_version=ssl.TLSVersion.TLSv1_2,
            )
    except ssl.SSLError as exc:  # the certificate files: configuration
        raise InvalidConfigurationError(f"cannot serve /metrics on {listen}: {exc}") from None
    except OSError as exc:
        if exc.errno in _BIND_ERRNOS:
            # A busy port is one failure with one name, --listen's or --metrics' alike.
            reason = exc.strerror or str(exc)
            raise ListenError(f"cannot serve /metrics on {listen}: {reason}") from None
        raise InvalidConfigurationError(f"cannot serve /metrics on {listen}: {exc}") from None
    _harden(httpd, max_connections)
    bound = httpd.server_address
    return MetricsEndpoint(httpd, thread, f"{host}:{bound[1]}", tls is not None)


def _harden(httpd: WSGIServer, max_connections: int) -> None:
    if isinstance(httpd.socket, ssl.SSLSocket):
        # Read by SSLSocket.accept() for each connection it wraps (typeshed omits it).
        httpd.socket.do_handshake_on_connect = False  # type: ignore[attr-defined]
    handler: Any = httpd.RequestHandlerClass
    httpd.RequestHandlerClass = type(
        "TimedMetricsHandler", (handler,), {"timeout": REQUEST_TIMEOUT_S}
    )
    limited = _RateLimited()

    def handle_error(request: object, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) else str(client_address)
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ssl.SSLError):
            limited.log("warning", "metrics TLS handshake failed", peer=peer, error=error)
        else:
            limited.log("info", "metrics connection failed", peer=peer, error=error)

    httpd.handle_error = handle_error  # type: ignore[method-assign]

    # ThreadingMixIn.process_request starts a thread running process_request_thread;
    # a slot is taken before the thread exists and given back when it ends.
    slots = threading.BoundedSemaphore(max_connections)
    server: Any = httpd  # a ThreadingWSGIServer; typeshed types it as the base class
    start_thread: Any = server.process_request
    serve_one: Any = server.process_request_thread

    def process_request(request: Any, client_address: Any) -> None:
        if not slots.acquire(blocking=False):
            peer = client_address[0] if isinstance(client_address, tuple) else "?"
            limited.log("warning", "metrics connection refused: max connections", peer=peer)
            httpd.shutdown_request(request)
            return
        try:
            start_thread(request, client_address)
        except BaseException:
            slots.release()
            raise

    def process_request_thread(request: Any, client_address: Any) -> None:
        try:
            serve_one(request, client_address)
        finally:
            slots.release()

    server.process_request = process_request
    server.process_request_thread = process_request_thread


class _RateLimited:
    """At most one line a second per event, with the count since the last one; called
    from the server's connection threads."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._count: Counter[str] = Counter()

    def log(self, level: str, event: str, **kw: Any) -> None:
        with self._lock:
            self._count[event] += 1
            now = time.monotonic()
            if now - self._last.get(event, -1e9) < self.period_s:
                return
            self._last[event] = now
            count = self._count.pop(event)
        getattr(log, level)(event, count=count, **kw)
