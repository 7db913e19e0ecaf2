"""HOST:PORT addresses as flags and configs give them: parsed, checked and named.

Owns the one reading of an address that every listener, client and tool shares. Must not
import frames or messages (connection admission uses it, and knows no framing) nor do IO.
"""

from __future__ import annotations

from metactl.errors import InvalidRequestError
from metactl.numbers import is_digits


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (an empty host is 127.0.0.1); InvalidRequestError for
    anything else, a port over 65535 included (0 asks a listener for any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not is_digits(port) or int(port) > 65535:
        raise InvalidRequestError(f"not a HOST:PORT address (port 0-65535): {address!r}")
    return host or "127.0.0.1", int(port)
