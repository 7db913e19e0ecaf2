"""What the driver's event task holds: queued events and the transaction it has open.

`Queued` is an event waiting for the event task (`CLOSE` stops it). `Slicing` is work
larger than the budget being done in slices (a topic creation, or a fence, unfence,
controlled shutdown or unclean registration of a large broker: a transaction the core
opened, `StepResult.follow_up`): the
next slice to step, the future of the request that started it, the image before it, and
a watermark future that resolves once everything queued before the transaction is
durable. Events that write nothing and arrive meanwhile are stepped against the image
before the transaction and answered after that watermark (`Slicing.answer`), never
after the slices: their answers depend on nothing of the transaction. While slices are
stepped the cyclic GC is paused (as `metadata_image.replay` does for bulk replays): the
slices build many objects that form no cycles, and full collections over a growing heap
would stall the event loop; `Slicing.end` freezes what was built and restores it.

This module holds data and futures only: no decisions, no IO.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Final

from controller.core.handlers import FollowUp
from controller.core.step import Event, Tick
from controller.runtime.committer import Outcome, settle
from metactl.errors import LogClosedError
from metadata_image.image import ClusterImage
from protocol.messages import ControllerResponse

__all__ = ["CLOSE", "GcPause", "Queued", "Slicing"]


class Queued:
    """An event waiting for the event task. A barrier (`Controller.drain`) waits for any
    open transaction, as events that write records do."""

    __slots__ = ("barrier", "enqueued", "event", "future")

    def __init__(
        self,
        event: Event,
        future: asyncio.Future[ControllerResponse] | None,
        enqueued: float,
        *,
        barrier: bool = False,
    ) -> None:
        self.event = event
        self.future = future
        self.enqueued = enqueued
        self.barrier = barrier


CLOSE: Final = Queued(Tick(), None, -1.0)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a watermark's failure as seen: nobody may be waiting on it."""
    if not future.cancelled():
        future.exception()


class GcPause:
    """The cyclic GC paused while bulk work runs (a transaction in slices, a recovery
    backlog being drained), for as long as any holder holds it.

    Bulk work builds many long-lived objects that form no cycles; with the loaded image
    frozen (`serve`), every full collection walks all that was built since, and its
    pauses grow with the work: measured at 100,000 leaderless partitions recovered,
    21 full collections of ~300 ms each, the worst controller stalls of the run. When
    the last holder releases, what was built is frozen (`gc.freeze`, as `serve` freezes
    the loaded image) and the GC runs again. Frozen objects are still freed when no
    longer referenced; only reference cycles made meanwhile stay until `gc.unfreeze`."""

    holders = 0
    was_enabled = False

    @classmethod
    def hold(cls) -> None:
        if cls.holders == 0:
            cls.was_enabled = gc.isenabled()
            gc.disable()
        cls.holders += 1

    @classmethod
    def release(cls) -> None:
        cls.holders -= 1
        if cls.holders == 0 and cls.was_enabled:
            cls.was_enabled = False
            gc.freeze()
            gc.enable()


class Slicing:
    """The event task's open transaction: work being done in slices."""

    __slots__ = ("_holds_gc", "follow_up", "future", "image_before", "watermark")

    def __init__(
        self,
        follow_up: FollowUp,
        future: asyncio.Future[ControllerResponse] | None,
        image_before: ClusterImage,
        watermark: asyncio.Future[ControllerResponse],
    ) -> None:
        self.follow_up = follow_up
        self.future = future
        self.image_before = image_before
        self.watermark = watermark
        watermark.add_done_callback(_retrieve)
        self._holds_gc = True
        GcPause.hold()

    def answer(self, future: asyncio.Future[ControllerResponse] | None, outcome: Outcome) -> None:
        """Release `outcome` (a response or a refusal) once everything before the
        transaction is durable (at once if it is), or fail it with the error that commit
        failed with."""
        if future is None:
            return

        def release(watermark: asyncio.Future[ControllerResponse]) -> None:
            if future.done():
                return
            if watermark.cancelled():
                future.set_exception(LogClosedError("the controller is shutting down"))
            elif (error := watermark.exception()) is not None:
                future.set_exception(error)  # the commit before the transaction failed
            else:
                settle(future, outcome)

        if self.watermark.done():
            release(self.watermark)
        else:
            self.watermark.add_done_callback(release)

    def end(self) -> None:
        """The transaction is over: its hold on the GC pause ends (`GcPause`: without it,
        the first collection would walk every object the slices built, about 85 ms for
        a 100,000-partition topic)."""
        if self._holds_gc:
            self._holds_gc = False
            GcPause.release()

    def end_when_answered(self) -> None:
        """The last slice is stepped: the GC runs again once its end marker is durable (or
        failed) and the records held for the listeners are gone, so that its first
        collection does not walk them."""
        if self.future is None:
            self.end()
        else:
            self.future.add_done_callback(lambda _: self.end())
