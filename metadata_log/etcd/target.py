"""Where a metadata log lives in etcd (`EtcdTarget`, from an
``etcd://host:port[,host:port...]/prefix`` URL) and the key ranges under its prefix
(`prefix_end`).

Pure: parsing and bytes only. It loads no etcd client library and opens no connection
(`metadata_log.etcd.client` does), and knows none of the log's keys
(`metadata_log.etcd.layout` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from metactl.errors import InvalidConfigurationError
from metactl.numbers import is_digits
from metadata_log.etcd.tls import PROCESS_DEFAULT, EtcdTls, ProcessDefault, resolve_tls

SCHEME: Final = "etcd://"


@dataclass(frozen=True)
class EtcdTarget:
    """Where a log lives in etcd: the members' client endpoints and the key prefix that
    holds this cluster's log (every key of the log starts with `prefix`)."""

    endpoints: tuple[str, ...]
    prefix: bytes  # starts and ends with b"/"
    # TLS to the members (None: plaintext). Not part of the log's identity: the same log
    # is the same target whichever files reach it.
    tls: EtcdTls | None = field(default=None, compare=False)

    @classmethod
    def parse(
        cls, url: str, *, tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT
    ) -> EtcdTarget:
        """From ``etcd://host:port[,host:port...]/prefix``; INVALID_CONFIG if malformed.
        `tls` defaults to the process's (`metadata_log.etcd.tls.default_tls`)."""
        if not url.startswith(SCHEME):
            raise InvalidConfigurationError(f"not an etcd URL: {url!r} (etcd://host:port/prefix)")
        hosts, sep, path = url.removeprefix(SCHEME).partition("/")
        path = path.strip("/")
        if not sep or not path:
            raise InvalidConfigurationError(
                f"etcd URL {url!r} names no key prefix (etcd://host:port/prefix)"
            )
        if any(c in path for c in "?#\\") or "//" in path or not path.isprintable():
            raise InvalidConfigurationError(f"etcd URL {url!r}: invalid key prefix {path!r}")
        endpoints = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if not endpoints:
            raise InvalidConfigurationError(f"etcd URL {url!r} names no endpoint")
        for e in endpoints:
            split_endpoint(e, url)
        return cls(endpoints, f"/{path}/".encode(), resolve_tls(tls))

    @property
    def url(self) -> str:
        return f"{SCHEME}{','.join(self.endpoints)}{self.prefix.decode().rstrip('/')}"

    def key(self, suffix: str) -> bytes:
        return self.prefix + suffix.encode()


def split_endpoint(endpoint: str, url: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not is_digits(port) or not 0 < int(port) < 65536:
        raise InvalidConfigurationError(
            f"etcd URL {url!r}: endpoint {endpoint!r} is not host:port (port 1-65535)"
        )
    return host, int(port)


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range of every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"
