"""Giving freed TLS memory back to the system (`MallocTrim`): glibc's malloc keeps what
Python frees in its heap, so without this a process's RSS stays near its peak after a
burst of handshakes.

Told by a listener each time a TLS connection's state is freed; owns one timer and
glibc's `malloc_trim`, nothing of connections. Does nothing where there is no glibc.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import time
from collections.abc import Callable
from typing import Final

# glibc keeps freed memory in its heap; after this many TLS states are freed the server
# asks it to give the free pages back (`MallocTrim`).
TRIM_AFTER_TLS_RELEASES: Final = 16
TRIM_INTERVAL_S: Final = 1.0


class MallocTrim:
    """glibc's malloc keeps what Python frees (a TLS connection's 256 KiB read buffer and
    OpenSSL's state) in its heap, so a process's RSS stays near its peak after a burst of
    handshakes: measured, 300 failed handshakes took a server from 40 to 120 MB; once they
    were freed it stayed at 56 MB, and 46 MB after `malloc_trim(0)`, which gives whole
    free pages back to the system (0.1 ms on a 500 MB heap). It runs at most once per
    `TRIM_INTERVAL_S`, after `TRIM_AFTER_TLS_RELEASES` TLS connections have ended, and
    never where there is no glibc."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._released = 0
        self._scheduled: asyncio.TimerHandle | None = None
        self._last = 0.0
        self.calls = 0

    def released(self) -> None:
        """One TLS connection's state was freed."""
        if self._trim is None:
            return
        self._released += 1
        if self._released < TRIM_AFTER_TLS_RELEASES or self._scheduled is not None:
            return
        delay = max(0.0, self._last + TRIM_INTERVAL_S - time.monotonic())
        with contextlib.suppress(RuntimeError):
            self._scheduled = asyncio.get_running_loop().call_later(delay, self._run)

    def _run(self) -> None:
        self._scheduled = None
        self._released = 0
        self._last = time.monotonic()
        if self._trim is not None:
            self.calls += 1
            self._trim(0)

    def cancel(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, from the symbols the process already has; None elsewhere."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim
