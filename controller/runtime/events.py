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
would stall the event loop; `Slicing.end` freezes what was built and restores it, as
`settle_heap` freezes what each event built. `next_event` and `event_or_progress` are
the event task's waits: for the next event or the next recovery deadline on the injected
clock, and for the next event or the committer's progress; `committer_behind` paces
bulk work (slices, backlog Ticks) against the committer (`MAX_SLICES_AHEAD`,
`SLICES_PER_APPEND`).

This module holds data, futures and waits only: no decisions, no IO.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Final

from controller.core.handler_result import FollowUp
from controller.core.step import Event, Tick
from controller.runtime.clock import Clock
from controller.runtime.committer import Committer, Outcome, settle
from metactl.errors import LogClosedError
from metadata_image.image import ClusterImage
from protocol.messages.unions import ControllerResponse

MAX_SLICES_AHEAD: Final = 4
"""Commits of bulk work (slices, backlog Ticks) stepped but not yet told before the event
task waits (it also waits while an answer waits on a commit, `committer_behind`).
Measured (bench/controller_ops.py, bench/large_cluster.py (c), 100,000 partitions in
slices of 1,000): 1 ahead gives each slice its own fsync, 0.68-0.70 s for the create and
heartbeats at p99 7 ms meanwhile; 16 ahead lets group commit take several slices at
once, 0.49-0.56 s and p99 23 ms (the unsliced create: 0.42-0.48 s, heartbeats p99 420 ms).
A transaction's slices are paced by `SLICES_PER_APPEND` instead."""

SLICES_PER_APPEND: Final = 16
"""A transaction's slices are held until this many are stepped but not yet told, then
appended together (and the last ones with the transaction's end): a transaction of at most
this many slices is one append and one fsync, after its last step.

Appending each slice while the next ones were stepped did not overlap the disk with the
steps: the store's hops and its writer thread wait for the event loop, which is busy with
a slice (the thread takes the GIL back after its insert and after its fsync), so each
append took 6-10 ms, the event task stalled on the committer, and the last slices were
appended after the last step anyway. Traced with bench/controller_ops.py (a fence of a
broker with 10,000 partitions, 10 slices): four appends, the first 7-10 ms long, a 2 ms
stall after the fifth slice and a 2-3.5 ms append after the last; held, the ten slices
run back to back and one append of 3.5-4.5 ms follows. Nothing waits on a held slice: an
event that writes nothing during the transaction is answered once the log before it is
durable, and one that writes records waits for the end marker in any case."""


__all__ = [
    "CLOSE",
    "GcPause",
    "Queued",
    "Slicing",
    "committer_behind",
    "event_or_progress",
    "next_event",
    "settle_heap",
]


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


def settle_heap() -> None:
    """Freeze what an event built (`gc.freeze`, O(1)): the image and the recovery tracker
    are persistent maps whose roots the cyclic GC traverses whole (immutables.Map walks
    its tree), so a full collection with a new root of a 1,000,000-entry map in a young
    generation took ~700 ms (135 of them while 1,000,000 recoveries were decided). Frozen
    objects are still freed by reference counting when replaced; the state is acyclic
    by construction, so only reference cycles an event leaves behind are kept (as after
    `serve`'s freeze of the loaded image)."""
    if gc.isenabled():
        gc.freeze()


async def next_event(queue: asyncio.Queue[Queued], deadline: int | None, clock: Clock) -> Queued:
    """The next queued event, or a Tick once the clock reaches the next deadline.

    The timer waits on the injected clock, so virtual time fires timers as real time
    does. A cancelled Queue.get never consumes an item, so losing the race to the
    timer loses no event.
    """
    if deadline is None or not queue.empty():
        return await queue.get()
    getter = asyncio.ensure_future(queue.get())
    timer = asyncio.ensure_future(clock.sleep_until(deadline))
    try:
        done, _ = await asyncio.wait((getter, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        getter.cancel()
    if getter in done:
        return getter.result()
    return Queued(Tick(), None, time.perf_counter())


async def event_or_progress(queue: asyncio.Queue[Queued], progress: asyncio.Event) -> Queued | None:
    """The next queued event, or None once the committer makes progress first. A
    cancelled Queue.get never consumes an item."""
    getter = asyncio.ensure_future(queue.get())
    progressed = asyncio.ensure_future(progress.wait())
    try:
        done, _ = await asyncio.wait((getter, progressed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        getter.cancel()
        progressed.cancel()
    return getter.result() if getter in done else None


def committer_behind(committer: Committer, *, transaction: bool) -> bool:
    """Bulk work (slices, backlog Ticks) waits for the committer: while it is more
    than `MAX_SLICES_AHEAD` commits behind (`SLICES_PER_APPEND` during a transaction),
    or while an answer waits on the commit in flight. Answers first: an append is
    several hops between the committer and the store's thread, each a turn of the
    event loop, and with a 30 ms slice stepped in every turn a one-record commit took
    0.4-0.6 s (measured, 300,000 partitions)."""
    limit = SLICES_PER_APPEND if transaction else MAX_SLICES_AHEAD
    return committer.unpublished > limit or committer.answers_waiting()
