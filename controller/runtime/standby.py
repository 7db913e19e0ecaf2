"""A hot standby's view of the log: the committed image of a log that another controller
writes, kept current by tailing it.

A standby controller answers reads from it (describe; metadata fetches are served from
its read-only store) and, once elected, starts the driver from it, reading only the
records it has not replayed yet (`loading.load_log(start=...)`), so a failover does not
replay the whole log; a controller that steps down opens its standby from its last
term's image the same way. The image is always at a transaction boundary, like every reader's
(`metadata_image.transactions`).

This module must not write to the log, decide anything, or know how the standby was
elected.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

import structlog

from controller.runtime.loading import load_log
from metactl.errors import LogClosedError, LogError, OffsetOutOfRangeError, StoreUnavailableError
from metadata_image.image import ClusterImage
from metadata_image.transactions import LogReplay
from metadata_log.store import LogStore

__all__ = ["Standby"]

log = structlog.get_logger("metactl.controller.standby")

RETRY_S: Final = 0.2


class Standby:
    """The tailing image of a read-only store. Create with `Standby.open`."""

    def __init__(self, store: LogStore, state: LogReplay) -> None:
        self.store = store
        self.state = state
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, store: LogStore, *, start: LogReplay | None = None) -> Standby:
        """Replay the log (after `start`, an image already replayed, when the log still
        holds what follows it) and follow it."""
        standby = cls(store, await load_log(store, start=start))
        standby._task = asyncio.create_task(standby._follow(), name="standby-follow")
        return standby

    @property
    def image(self) -> ClusterImage:
        """The committed image, at a transaction boundary."""
        return self.state.image

    async def _follow(self) -> None:
        while True:
            try:
                await self.store.wait_for(self.state.next_offset)
                self.state = await load_log(self.store, start=self.state)
            except OffsetOutOfRangeError:  # deleted before a snapshot while being read
                self.state = await load_log(self.store)
            except LogClosedError:
                return
            except StoreUnavailableError as exc:
                log.warning("standby: reading the log failed; retrying", error=exc.message)
                await asyncio.sleep(RETRY_S)  # the store reconnects by itself
                continue
            except LogError as exc:  # corruption: keep the image, say so, retry later
                log.error("standby: the log cannot be replayed", code=exc.code, error=exc.message)
                await asyncio.sleep(RETRY_S * 10)

    async def close(self) -> None:
        """Stop following and close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.store.close()
