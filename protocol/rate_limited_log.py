"""Per-connection log lines, rate-limited: one line per period per kind and peer, with
the count it stands for (`RateLimitedLog`).

A listener writes a line for every refusal, dropped or failed handshake, bad or
oversized frame and accept failure: under a flood that would be thousands a second.
This holds them to one a period per event and peer, and still tells what it held back.
`Logger` is the logging interface every listener takes (structlog's loggers are one).

Owns no sockets and knows nothing of connections: only lines, counts and timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol


class Logger(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...
    def exception(self, event: str, **kw: Any) -> Any: ...


@dataclass(eq=False)
class _Line:
    """One rate-limited line's state: when it was last written, what it holds back."""

    level: str
    written: float
    held: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None


class RateLimitedLog:
    """At most one line a period per event and peer (the `peer` field), with the count it
    stands for. What is held back is still told: a summary line (`count` of the held-back
    ones, the latest fields) follows one period after a line, even if nothing more
    happens; a line quiet for a period is forgotten. At most `peers_per_event` peers of
    one event have lines of their own at once; further peers share one line, marked
    `other_peers=True`, so that a flood from many addresses still writes a bounded number
    of lines, and the table stays small."""

    def __init__(self, log: Logger, period_s: float = 1.0, peers_per_event: int = 8) -> None:
        self.log = log
        self.period_s = period_s
        self.peers_per_event = peers_per_event
        self._lines: dict[tuple[str, str | None, bool], _Line] = {}
        self._peers: Counter[str] = Counter()  # event -> peers with a line of their own

    def warning(self, event: str, **kw: Any) -> None:
        self._log("warning", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._log("info", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._log("error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        """The first line carries the traceback; a summary is an ERROR with the count."""
        self._log("exception", event, kw)

    def _log(self, level: str, event: str, kw: dict[str, Any]) -> None:
        peer = kw.get("peer")
        key: tuple[str, str | None, bool] = (event, peer, False)
        line = self._lines.get(key)
        if line is None and peer is not None and self._peers[event] >= self.peers_per_event:
            key = (event, None, True)
            line = self._lines.get(key)
            kw = {**kw, "other_peers": True}
        now = time.monotonic()
        if line is not None and now - line.written < self.period_s:
            line.held += 1
            line.fields = kw
            return
        count = 1
        if line is None:
            if peer is not None and not key[2]:
                self._peers[event] += 1
        else:  # its period is over and no timer told what it held (no running loop)
            count += line.held
            if line.timer is not None:
                line.timer.cancel()
        line = self._lines[key] = _Line(level, now)
        getattr(self.log, level)(event, count=count, **kw)
        self._schedule(key, line)

    def _schedule(self, key: tuple[str, str | None, bool], line: _Line) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the next line tells
            line.timer = asyncio.get_running_loop().call_later(self.period_s, self._tick, key)

    def _tick(self, key: tuple[str, str | None, bool]) -> None:
        line = self._lines.get(key)
        if line is None:
            return
        line.timer = None
        if line.held:
            level = "error" if line.level == "exception" else line.level
            getattr(self.log, level)(key[0], count=line.held, **line.fields)
            line.held, line.written = 0, time.monotonic()
            self._schedule(key, line)
            return
        del self._lines[key]
        if key[1] is not None:
            self._peers[key[0]] -= 1
            if self._peers[key[0]] <= 0:
                del self._peers[key[0]]
