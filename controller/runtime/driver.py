"""The controller driver: two asyncio tasks around the one pure event step.

The event task owns the controller state and handles one event at a time (a request, a
heartbeat, a log-inspection answer, or a Tick when the injected clock reaches the next
recovery deadline): `controller.core.step.step` decides, replays and evaluates, so the
next event sees the records at once (as Kafka's QuorumController does). The committer
task appends everything queued so far, in as few durable batches as fit. A response is
released only after the records it depends on are committed, in event order: a response
with no records of its own still waits for the commits queued before it.

Transactions (KIP-868; the core places the markers, see `controller.core.step`):

* A change too large for one stored batch arrives wrapped in Begin/EndTransactionRecord;
  the committer cuts it into several appends, one after the other
  (`controller.runtime.committer`).
  The driver, not the store, splits: it alone knows where a change may be cut (inside a
  transaction only) and must know what is durable after each append to recover.
* Work in slices (a topic creation, or a fence, unfence, controlled shutdown or unclean
  registration of a broker with more partitions than the work budget; see
  `controller.core.work`): after each slice the event task yields to the event loop,
  handles the events queued meanwhile, waits for the committer if it is more than a
  slice behind, and steps the next slice. While the transaction is open, an event whose
  step writes records is deferred (its result discarded; the step is pure) and stepped
  again after the end marker, in arrival order; events that write nothing (most
  heartbeats) are answered in between. `drain()` waits for the transaction.
* `committed_image` advances only at transaction boundaries, and commit listeners hear
  about a transaction once, at its end marker, with all of its records.
* At start-up a log that ends inside a transaction (a crash between its batches) is
  loaded without it (`controller.runtime.loading`, `metadata_image.transactions`), and
  the controller appends an AbortTransactionRecord before anything else, as Kafka's new
  leader does (`unfinished_transaction_abort`).

Recovery evaluation has a backlog when an event changed more than a budget of
partitions: while nothing else is queued, the event task steps Ticks to drain it, a
budget each, never more than `MAX_SLICES_AHEAD` commits ahead of the committer.
The event task's queued events, waits, open transaction and pacing are in
`controller.runtime.events`; loading the log is `controller.runtime.loading`.

If an append fails, every event whose records were not committed fails with the store's
error and the image reverts to the last committed one (the committer says what the log
now holds). Nothing un-durable is ever acknowledged.

This module holds the asyncio plumbing only; every decision is made by the pure core.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import TypeVar

import msgspec
import structlog

from controller.core.config import ControllerConfig
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import load_policies
from controller.core.recovery.tracker import Inspection, RecoveryTracker
from controller.core.step import (
    ControllerState,
    Event,
    Rules,
    StepResult,
    Tick,
    step,
)
from controller.core.work import WORK_BUDGET
from controller.runtime.clock import Clock, SystemClock
from controller.runtime.committer import (
    Commit,
    CommitListener,
    Committer,
    Failure,
    abort_commit,
)
from controller.runtime.events import (
    CLOSE,
    GcPause,
    Queued,
    Slicing,
    committer_behind,
    event_or_progress,
    next_event,
    settle_heap,
)
from controller.runtime.loading import load_log
from metactl.errors import LogClosedError, MetactlError
from metadata_image.image import ClusterImage
from metadata_image.snapshot import to_snapshot
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    MAX_BATCH_BYTES,
    AbortTransactionRecord,
)
from metadata_log.store import LogStore
from protocol.messages.admin import CreateTopic
from protocol.messages.unions import ControllerResponse

log = structlog.get_logger("metactl.controller")

_T = TypeVar("_T")

__all__ = ["Controller", "Event", "Tick", "unfinished_transaction_abort"]


InspectionSink = Callable[[Inspection], None]


def unfinished_transaction_abort(state: LogReplay) -> AbortTransactionRecord | None:
    """What a controller taking over the log (at start-up or a failover) appends before
    anything else: the abort of the transaction the log ends inside (the previous
    controller crashed between its batches), so that later records are not taken as part
    of it; None when the log ends at a transaction boundary. The fault simulator's
    failover calls this too (simulation/faults_controller.py)."""
    txn = state.transaction
    if txn is None:
        return None
    return AbortTransactionRecord(
        reason=f"controller start: transaction {txn.name!r} begun at offset "
        f"{txn.begin_offset} has no end marker"
    )


class Controller:
    def __init__(
        self,
        store: LogStore,
        image: ClusterImage,
        *,
        config: ControllerConfig,
        policies: Mapping[str, RecoveryPolicy] | None = None,
        clock: Clock | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        work_budget: int | None = WORK_BUDGET,
    ) -> None:
        self.store = store
        self.config = config
        self.policies: Mapping[str, RecoveryPolicy] = (
            policies if policies is not None else load_policies()
        )
        # Fails fast on an unknown strategy.
        self.rules = Rules(config, self.policies, max_batch_bytes, work_budget)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.state = ControllerState(image)
        self.next_deadline_ms: int | None = None
        self.inspection_sinks: list[InspectionSink] = []
        self.commit_listeners: list[CommitListener] = []
        self.event_listeners: list[Callable[[str, float, float], None]] = []
        # Called as listener(seconds, record_count) after each successful durable append.
        self.append_listeners: list[Callable[[float, int], None]] = []
        self.committer = Committer(
            store,
            image,
            max_batch_bytes=max_batch_bytes,
            clock=self.clock,
            commit_listeners=self.commit_listeners,
            append_listeners=self.append_listeners,
        )
        # When the event being handled started (time.perf_counter()), None between
        # events: the metrics read it from their scrape thread, so that a stalled loop
        # shows while it is stalled (metactl_event_processing_age_seconds).
        self.busy_since: float | None = None
        self._queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._deferred: deque[Queued] = deque()
        self._slicing: Slicing | None = None
        self._holds_gc = False  # a hold on GcPause while the backlog drains
        self._commits: deque[Commit] = deque()
        self._commit_wakeup = asyncio.Event()
        self._closing = False
        self._run_task: asyncio.Task[None] | None = None
        self._commit_task: asyncio.Task[None] | None = None
        self._publish_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        store: LogStore,
        *,
        config: ControllerConfig | None = None,
        policies: Mapping[str, RecoveryPolicy] | None = None,
        clock: Clock | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        work_budget: int | None = WORK_BUDGET,
        replayed: LogReplay | None = None,
    ) -> Controller:
        """Replay the log (or only what follows `replayed`, a standby's image) and start.
        A log that ends inside a transaction gets its abort marker first."""
        state = await load_log(store, start=replayed)
        txn = state.transaction
        abort = unfinished_transaction_abort(state)
        if txn is not None and abort is not None:
            now = clock.now_ms() if clock is not None else None
            await store.append([abort], timestamp_ms=now)
            state = replay_log(state, [abort])
            log.warning(
                "aborted an unfinished transaction",
                name=txn.name,
                begin_offset=txn.begin_offset,
                records=txn.count,
                abort_offset=state.image.end_offset - 1,
            )
        ctl = cls(
            store,
            state.image,
            config=config or ControllerConfig(),
            policies=policies,
            clock=clock,
            # A change is cut into batches the store's backend can take in one append.
            max_batch_bytes=min(max_batch_bytes, store.max_batch_bytes),
            work_budget=work_budget,
        )
        ctl.start()
        return ctl

    @property
    def image(self) -> ClusterImage:
        """The newest image: committed records plus those queued for the next commit."""
        return self.state.image

    @property
    def committed_image(self) -> ClusterImage:
        """The image of everything durable, at the last transaction boundary: what describe
        and the metrics show."""
        return self.committer.committed_image

    @property
    def log_every_record(self) -> bool:
        """Log a line per committed record (services turn this on; bulk tools leave it off).
        A transaction logs one summary line."""
        return self.committer.log_every_record

    @log_every_record.setter
    def log_every_record(self, value: bool) -> None:
        self.committer.log_every_record = value

    @property
    def tracker(self) -> RecoveryTracker:
        return self.state.tracker

    @property
    def in_transaction(self) -> bool:
        """Work is being done in slices (its transaction is open)."""
        return self._slicing is not None

    # --- public API ---------------------------------------------------------------------

    def start(self) -> None:
        self._run_task = asyncio.create_task(self._run(), name="controller-events")
        self._commit_task = asyncio.create_task(self._commit_loop(), name="controller-commits")
        self._publish_task = asyncio.create_task(
            self.committer.publish_loop(), name="controller-publisher"
        )

    async def submit(self, request: Event) -> ControllerResponse:
        """Handle one request; returns once its records (and all before them) are durable."""
        return await self._submit(request, barrier=False)

    async def _submit(self, request: Event, *, barrier: bool) -> ControllerResponse:
        if self._closing:
            raise LogClosedError("the controller is shutting down")
        if isinstance(request, CreateTopic):
            # Topic ids are random (a client's value is replaced): the randomness is an
            # input of the event, so the step stays pure and replay deterministic.
            request = msgspec.structs.replace(request, topic_id=str(uuid.uuid4()))
        future: asyncio.Future[ControllerResponse] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Queued(request, future, time.perf_counter(), barrier=barrier))
        return await future

    async def tick(self) -> None:
        await self.submit(Tick())

    async def drain(self) -> None:
        """Wait until every event queued before this call is handled and committed, and
        any open transaction has ended.

        Responses are released in event order, so a no-op event's response is exactly that.
        """
        await self._submit(Tick(), barrier=True)

    async def write_snapshot(self) -> int:
        """Snapshot the committed image (always at a transaction boundary); returns its
        offset."""
        await self.drain()
        image = self.committed_image
        await self.store.write_snapshot(image.end_offset, to_snapshot(image))
        return image.end_offset

    async def close(self) -> None:
        """Finish in-flight commits, then stop. A transaction still being sliced is
        aborted. The store stays open (its owner closes it)."""
        if self._closing:
            return
        self._closing = True
        if self._run_task is not None:
            self._queue.put_nowait(CLOSE)
            await self._run_task
        if self._commit_task is not None:
            self._commit_wakeup.set()
            await self._commit_task
        if self._publish_task is not None:
            await self.committer.told()  # every durable commit told and answered
            self._publish_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publish_task

    # --- the event loop -----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._run_events()
        finally:
            self._draining(False)

    def _draining(self, draining: bool) -> None:
        """Hold the GC pause while recovery evaluation has a backlog (`GcPause`)."""
        if draining != self._holds_gc:
            self._holds_gc = draining
            if draining:
                GcPause.hold()
            else:
                GcPause.release()

    async def _run_events(self) -> None:
        while True:
            self._draining(not self.state.idle)
            if self._slicing is not None:
                if not await self._between_slices():
                    return
            elif self._deferred:
                self._handle(self._deferred.popleft())
            elif not self.state.idle and self._queue.empty():
                # Recovery evaluation has a backlog (a budget per step): work through it
                # with Ticks while nothing else waits, never far ahead of the committer.
                item = await self._catch_up()
                if item is CLOSE:
                    return
                if item is None:
                    item = Queued(Tick(), None, time.perf_counter())
                self._handle(item)
            else:
                item = await next_event(self._queue, self.next_deadline_ms, self.clock)
                if item is CLOSE:
                    return
                self._handle(item)

    async def _catch_up(self) -> Queued | None:
        """Yield to the event loop (connections queue requests, the committer writes) and
        wait while the committer is more than `MAX_SLICES_AHEAD` commits behind: the
        event that arrives meanwhile, if any, else None (time for the next Tick)."""
        await asyncio.sleep(0)
        if not self._queue.empty():
            return self._queue.get_nowait()
        while self._committer_behind():
            item = await event_or_progress(self._queue, self.committer.progress)
            if item is not None:
                return item
        return None

    def _committer_behind(self) -> bool:
        return committer_behind(self.committer, transaction=self._slicing is not None)

    async def _between_slices(self) -> bool:
        """Yield, answer what was queued meanwhile, then step the next slice, once the
        committer is at most `MAX_SLICES_AHEAD` behind (answering what arrives while
        waiting for it). False once the controller closes."""
        await asyncio.sleep(0)  # connections queue requests; the committer writes
        for _ in range(self._queue.qsize()):
            if not self._answer(self._queue.get_nowait()):
                return False
        while self._slicing is not None and self._committer_behind():
            item = await event_or_progress(self._queue, self.committer.progress)
            if item is not None and not self._answer(item):
                return False
        if self._slicing is not None:  # a failed commit may have ended it meanwhile
            self._step_slice(self._slicing)
        return True

    def _answer(self, item: Queued) -> bool:
        """Handle an event that arrived during a sliced create; False if it is CLOSE (the
        transaction is then aborted and what was deferred fails)."""
        if item is not CLOSE:
            self._handle(item)
            return True
        if self._slicing is not None:
            self._abort_slicing("the controller is shutting down", None)
        error = LogClosedError("the controller is shutting down")
        for deferred in self._deferred:
            if deferred.future is not None and not deferred.future.done():
                deferred.future.set_exception(error)
        self._deferred.clear()
        return False

    def _busy(self, work: Callable[[_T, float], None], arg: _T) -> None:
        """`work(arg, started)`, marked as being handled: `busy_since` is its start time,
        read by the metrics' scrape thread. Once it has changed the state, what it built
        is frozen (`settle_heap`). (A plain call, not a context manager: every event, each
        heartbeat, passes here.)"""
        before = self.state
        started = self.busy_since = time.perf_counter()
        try:
            work(arg, started)
        finally:
            self.busy_since = None
        if self.state is not before:
            settle_heap()

    def _handle(self, item: Queued) -> None:
        self._busy(self._handle_busy, item)

    def _handle_busy(self, item: Queued, started: float) -> None:
        slicing = self._slicing
        if slicing is not None and item.barrier:
            self._deferred.append(item)
            return
        event, future = item.event, item.future
        now = self.clock.now_ms()
        # While a transaction is open, an event sees the image before it.
        state = self.state
        if slicing is not None:
            state = ControllerState(slicing.image_before, state.tracker, state.backlog, hold=True)
        try:
            result = step(state, event, now, self.rules)
        except MetactlError as exc:
            log.info(
                "request refused",
                request=type(event).__name__,
                code=exc.code,
                error=exc.message,
            )
            # A refusal may tell what the log holds: it waits for durability too.
            if slicing is not None:
                slicing.answer(future, exc)
            else:
                self.committer.when_durable(future, exc)
            self._report(event, item.enqueued, started)
            return
        if slicing is not None:
            if result.records:
                # It writes records while a transaction is open: step it again after the end.
                self._deferred.append(item)
                return
            # It wrote nothing: keep its soft state, answer once the log before the
            # transaction is durable (nothing of the transaction is in its answer).
            self.state = msgspec.structs.replace(self.state, tracker=result.state.tracker)
            self._inspect(result)
            slicing.answer(future, result.response)
        elif result.follow_up is not None:
            before = self.state.image
            self._accept(result, now)
            watermark: asyncio.Future[ControllerResponse]
            watermark = asyncio.get_running_loop().create_future()
            self.committer.when_durable(watermark, result.response)
            self._slicing = Slicing(result.follow_up, future, before, watermark)
            self._queue_commit(result, None, None, now)
        else:
            self._accept(result, now)
            self._queue_commit(result, result.state.image, future, now, barrier=item.barrier)
        self._report(event, item.enqueued, started)

    def _step_slice(self, slicing: Slicing) -> None:
        self._busy(self._step_slice_busy, slicing)

    def _step_slice_busy(self, slicing: Slicing, started: float) -> None:
        now = self.clock.now_ms()
        try:
            result = step(self.state, slicing.follow_up, now, self.rules)
        except MetactlError as exc:  # a slice was validated with the first: a bug
            log.error("slice failed; aborting its transaction", error=exc.message)
            self._abort_slicing(f"slice failed: {exc.message}", exc)
            return
        self._accept(result, now)
        if result.follow_up is not None:
            slicing.follow_up = result.follow_up
            self._queue_commit(result, None, None, now)
        else:
            self._slicing = None
            self._queue_commit(result, result.state.image, slicing.future, now)
            slicing.end_when_answered()
        self._report(slicing.follow_up, started, started)

    def _end_slicing(self) -> Slicing | None:
        slicing, self._slicing = self._slicing, None
        if slicing is not None:
            slicing.end()
        return slicing

    def _accept(self, result: StepResult, now: int) -> None:
        self.state, self.next_deadline_ms = result.state, result.wake_ms
        self._inspect(result)

    def _inspect(self, result: StepResult) -> None:
        for inspection in result.inspections:
            for sink in self.inspection_sinks:
                sink(inspection)

    def _queue_commit(
        self,
        result: StepResult,
        image_after: ClusterImage | None,
        future: asyncio.Future[ControllerResponse] | None,
        now: int,
        *,
        barrier: bool = False,
    ) -> None:
        if not result.records and not barrier:
            # It wrote nothing: it waits for the records before it to be durable, and for
            # nothing else (not for the listeners of a transaction, say).
            self.committer.when_durable(future, result.response)
            return
        c = Commit(
            result.records,
            result.response,
            image_after=image_after,
            delta=result.delta,
            future=future,
            now_ms=now,
            size=result.encoded_bytes,
            payload=result.encoded,
            barrier=barrier,
        )
        self._enqueue(c)

    def _enqueue(self, c: Commit) -> None:
        self.committer.queued(c)
        self._commits.append(c)
        if self._slicing is None or c.image_after is not None or self._committer_behind():
            self._commit_wakeup.set()
        # else: a slice of the open transaction, held (`SLICES_PER_APPEND`). The
        # committer takes it with the next slice that wakes it, or the last.

    def _report(self, event: Event, enqueued: float, started: float) -> None:
        done = time.perf_counter()
        for listener in self.event_listeners:
            listener(type(event).__name__, started - enqueued, done - started)

    def _abort_slicing(self, reason: str, error: MetactlError | None) -> None:
        """Abandon the open transaction of a sliced create: its records so far are queued
        or durable, an AbortTransactionRecord follows them, and the working image forgets
        them (only events that wrote nothing ran meanwhile)."""
        slicing = self._end_slicing()
        assert slicing is not None
        base = msgspec.structs.replace(slicing.image_before, end_offset=self.image.end_offset)
        abort = abort_commit(base, reason, self.clock.now_ms())
        assert abort.image_after is not None
        self.state = ControllerState(abort.image_after, self.state.tracker)
        self._enqueue(abort)
        if slicing.future is not None and not slicing.future.done():
            slicing.future.set_exception(error or LogClosedError(reason))

    # --- the committer ------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wakeup.wait()
            self._commit_wakeup.clear()
            while self._commits:
                batch = list(self._commits)
                self._commits.clear()
                failure = await self.committer.commit(batch)
                if failure is not None:
                    self._revert(failure)
            if self._closing and self._run_task is not None and self._run_task.done():
                return

    def _revert(self, failure: Failure) -> None:
        """Every event not committed fails; the image reverts to the committed one (plus
        room for the abort marker the log is owed, if any)."""
        failed = failure.commits + list(self._commits)
        self._commits.clear()
        slicing = self._end_slicing()
        # Soft state is rebuilt: pending recoveries start over, every leaderless
        # partition is looked at on the next event.
        self.state = ControllerState(failure.image)
        futures = [c.future for c in failed]
        futures += [future for c in failed for future, _ in c.followers]
        if slicing is not None:
            futures.append(slicing.future)
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(failure.error)
