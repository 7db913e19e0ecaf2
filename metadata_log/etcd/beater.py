"""A thread of its own, with its own event loop and its own etcd client, for work that must
run on time however busy the process's event loop is: the leadership's heartbeat
(`metadata_log.etcd.lease`).

Why a thread: a controller taking over replays the log and steps its backlog on its event
loop, CPU-bound work of seconds on a starved host. A heartbeat sharing that loop waited
behind it, and a standby ended the very term that was being taken over: on a 2-core host at
load 55-60, 24 elections in 71 s and no write served for over a minute (issue 33). In a
thread, a heartbeat needs the GIL only for the fraction of a millisecond it takes to build
and read one call; CPython hands the GIL over every `sys.getswitchinterval()` (5 ms), so a
CPU-bound event loop delays a heartbeat by milliseconds, not seconds (measured: a beat every
0.33 s kept its period within 0.36 s while the main thread spun for 5 s). gRPC's asyncio
channels belong to the loop that opened them, so the thread opens channels of its own
(`Etcd.channels`); the process holds two clients, not two connections per call.

This module runs what it is given and knows nothing of leadership (it must not import
`metadata_log.etcd.lease`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Final

import structlog

from metadata_log.etcd.client import Etcd
from metadata_log.etcd.target import EtcdTarget

__all__ = ["LoopThread"]

log = structlog.get_logger("metadata_log.etcd")

JOIN_S: Final = 5.0
"""`stop` waits this long for the thread to end (its work is cancelled: milliseconds)."""


class LoopThread:
    """Runs `work(etcd)` on an event loop in a daemon thread of its own, with an etcd client
    of its own on `target`, until the work returns or `stop` cancels it."""

    def __init__(
        self, name: str, target: EtcdTarget, work: Callable[[Etcd], Awaitable[None]]
    ) -> None:
        self.name = name
        self.target = target
        self.work = work
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        with self._lock:
            if self._stopping:
                return
            self._loop, self._task = asyncio.get_running_loop(), task
        try:
            etcd = await Etcd.channels(self.target)
            try:
                await self.work(etcd)
            finally:
                await etcd.close()
        except asyncio.CancelledError:
            pass

    async def stop(self) -> None:
        """Cancel the work and wait (off the caller's loop) until the thread has ended."""
        with self._lock:
            self._stopping = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(task.cancel)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, JOIN_S)
            if self._thread.is_alive():
                log.warning("a background thread did not end in time", thread=self.name)
