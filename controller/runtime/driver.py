"""The controller driver: two asyncio tasks around the one pure event step.

The event task owns the controller state and handles one event at a time (a request, a
heartbeat, a log-inspection answer, or a Tick when the injected clock reaches the next
recovery deadline): `controller.core.step.step` decides, replays and evaluates, so the
next event sees the records at once (as Kafka's QuorumController does). The committer
task appends everything queued so far in one durable batch. A response is released
only after the records it depends on are committed, in event order: a response with no
records of its own still waits for the commits queued before it.

If an append fails, every event whose records were not committed fails with the store's
error, and the image reverts to the last committed one. Nothing un-durable is ever
acknowledged.

This module holds the asyncio plumbing only; every decision is made by the pure core.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec
import structlog

from controller.core.config import ControllerConfig
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import load_policies
from controller.core.recovery.tracker import Inspection, RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, step
from controller.runtime.clock import Clock, SystemClock
from metactl.errors import LogClosedError, LogError, MetactlError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.snapshot import ImageSnapshot, from_snapshot, to_snapshot
from metadata_log.records import MetadataRecord, UncleanRecoveryRecord, record_type
from metadata_log.store import LogStore
from protocol.messages import ControllerResponse

log = structlog.get_logger("metactl.controller")

REPLAY_CHUNK: Final = 10_000


__all__ = ["CommitListener", "Controller", "Event", "Tick", "load_image"]


class _Commit:
    __slots__ = ("delta", "future", "image_after", "now_ms", "records", "response")

    def __init__(
        self, result: StepResult, future: asyncio.Future[ControllerResponse] | None, now_ms: int
    ) -> None:
        self.records = result.records
        self.response = result.response
        self.image_after = result.state.image
        self.delta = result.delta
        self.future = future
        self.now_ms = now_ms


# listener(base_offset, records, delta, now_ms), once an event's records are durable.
CommitListener = Callable[[int, Sequence[MetadataRecord], MetadataDelta, int], None]
InspectionSink = Callable[[Inspection], None]


async def load_image(store: LogStore) -> ClusterImage:
    """The committed image: the newest snapshot plus every record after it."""
    # Decoding and replaying millions of records allocates objects that form no cycles;
    # the cyclic GC's repeated full passes over the growing heap would dominate.
    paused = gc.isenabled()
    gc.disable()
    try:
        snap = await store.load_snapshot(ImageSnapshot)
        image = from_snapshot(snap[1]) if snap is not None else ClusterImage()
        if snap is None and store.start_offset > 0:
            raise LogError(
                f"the log starts at offset {store.start_offset} and there is no snapshot "
                "to start from"
            )
        chunk: list[MetadataRecord] = []
        async for entry in store.iter_entries(image.end_offset):
            chunk.append(entry.record)
            if len(chunk) >= REPLAY_CHUNK:
                image = replay(image, chunk)
                chunk = []
        if chunk:
            image = replay(image, chunk)
        return image
    finally:
        if paused:
            gc.enable()


class Controller:
    def __init__(
        self,
        store: LogStore,
        image: ClusterImage,
        *,
        config: ControllerConfig,
        policies: Mapping[str, RecoveryPolicy] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.policies: Mapping[str, RecoveryPolicy] = (
            policies if policies is not None else load_policies()
        )
        self.rules = Rules(config, self.policies)  # fails fast on an unknown strategy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.state = ControllerState(image)
        self.committed_image = image
        self.next_deadline_ms: int | None = None
        self.log_every_record = False  # services turn this on; bulk tools leave it off
        self.inspection_sinks: list[InspectionSink] = []
        self.commit_listeners: list[CommitListener] = []
        self.event_listeners: list[Callable[[str, float, float], None]] = []
        # Called as listener(seconds, record_count) after each successful durable append.
        self.append_listeners: list[Callable[[float, int], None]] = []
        self._queue: asyncio.Queue[tuple[Event, asyncio.Future[ControllerResponse] | None, float]]
        self._queue = asyncio.Queue()
        self._commits: deque[_Commit] = deque()
        self._commit_wakeup = asyncio.Event()
        self._closing = False
        self._run_task: asyncio.Task[None] | None = None
        self._commit_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        store: LogStore,
        *,
        config: ControllerConfig | None = None,
        policies: Mapping[str, RecoveryPolicy] | None = None,
        clock: Clock | None = None,
    ) -> Controller:
        image = await load_image(store)
        ctl = cls(store, image, config=config or ControllerConfig(), policies=policies, clock=clock)
        ctl.start()
        return ctl

    @property
    def image(self) -> ClusterImage:
        """The newest image: committed records plus those queued for the next commit."""
        return self.state.image

    @property
    def tracker(self) -> RecoveryTracker:
        return self.state.tracker

    # --- public API ---------------------------------------------------------------------

    def start(self) -> None:
        self._run_task = asyncio.create_task(self._run(), name="controller-events")
        self._commit_task = asyncio.create_task(self._commit_loop(), name="controller-commits")

    async def submit(self, request: Event) -> ControllerResponse:
        """Handle one request; returns once its records (and all before them) are durable."""
        if self._closing:
            raise LogClosedError("the controller is shutting down")
        future: asyncio.Future[ControllerResponse] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((request, future, time.perf_counter()))
        return await future

    async def tick(self) -> None:
        await self.submit(Tick())

    async def drain(self) -> None:
        """Wait until every event queued before this call is handled and committed.

        Responses are released in event order, so a no-op event's response is exactly that.
        """
        await self.submit(Tick())

    async def write_snapshot(self) -> int:
        """Snapshot the committed image; returns its offset."""
        await self.drain()
        image = self.committed_image
        await self.store.write_snapshot(image.end_offset, to_snapshot(image))
        return image.end_offset

    async def close(self) -> None:
        """Finish in-flight commits, then stop. The store stays open (its owner closes it)."""
        if self._closing:
            return
        self._closing = True
        if self._run_task is not None:
            self._queue.put_nowait((Tick(), None, -1.0))
            await self._run_task
        if self._commit_task is not None:
            self._commit_wakeup.set()
            await self._commit_task

    # --- the event loop -----------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            event, future, enqueued = await self._next_event()
            if enqueued < 0:
                return
            started = time.perf_counter()
            self._process(event, future)
            for listener in self.event_listeners:
                listener(type(event).__name__, started - enqueued, time.perf_counter() - started)

    async def _next_event(self) -> tuple[Event, asyncio.Future[ControllerResponse] | None, float]:
        """The next queued event, or a Tick once the clock reaches the next deadline.

        The timer waits on the injected clock, so virtual time fires timers as real time
        does. A cancelled Queue.get never consumes an item, so losing the race to the
        timer loses no event.
        """
        deadline = self.next_deadline_ms
        if deadline is None or not self._queue.empty():
            return await self._queue.get()
        getter = asyncio.ensure_future(self._queue.get())
        timer = asyncio.ensure_future(self.clock.sleep_until(deadline))
        try:
            done, _ = await asyncio.wait((getter, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            getter.cancel()
        if getter in done:
            return getter.result()
        return Tick(), None, time.perf_counter()

    def _process(self, event: Event, future: asyncio.Future[ControllerResponse] | None) -> None:
        now = self.clock.now_ms()
        try:
            result = step(self.state, event, now, self.rules)
        except MetactlError as exc:
            log.info(
                "request refused", request=type(event).__name__, code=exc.code, error=exc.message
            )
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        self.state, self.next_deadline_ms = result.state, result.next_deadline_ms
        self._commits.append(_Commit(result, future, now))
        self._commit_wakeup.set()
        for inspection in result.inspections:
            for sink in self.inspection_sinks:
                sink(inspection)

    # --- the committer ------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wakeup.wait()
            self._commit_wakeup.clear()
            while self._commits:
                batch = list(self._commits)
                self._commits.clear()
                await self._commit(batch)
            if self._closing and self._run_task is not None and self._run_task.done():
                return

    async def _commit(self, batch: list[_Commit]) -> None:
        records = [r for c in batch for r in c.records]
        base = self.committed_image.end_offset
        if records:
            try:
                started = time.perf_counter()
                offsets = await self.store.append(records, timestamp_ms=batch[-1].now_ms)
                elapsed = time.perf_counter() - started
                if offsets.start != base:
                    raise LogError(
                        f"the log assigned offset {offsets.start} where the controller expected "
                        f"{base}: another writer?"
                    )
            except Exception as exc:
                self._fail_uncommitted(batch, exc)
                return
            for append_listener in self.append_listeners:
                append_listener(elapsed, len(records))
        self.committed_image = batch[-1].image_after
        offset = base
        for c in batch:
            if c.records:
                for listener in self.commit_listeners:
                    listener(offset, c.records, c.delta, c.now_ms)
                _log_committed(offset, c.records, c.delta, self.log_every_record)
                offset += len(c.records)
            if c.future is not None and not c.future.done():
                c.future.set_result(c.response)

    def _fail_uncommitted(self, batch: list[_Commit], exc: Exception) -> None:
        error = exc if isinstance(exc, MetactlError) else LogError(f"append failed: {exc!r}")
        log.error("commit failed; reverting to the committed image", error=str(error))
        failed = batch + list(self._commits)
        self._commits.clear()
        # Soft state is rebuilt: pending recoveries start over, every leaderless
        # partition is looked at on the next event.
        self.state = ControllerState(self.committed_image)
        for c in failed:
            if c.future is not None and not c.future.done():
                c.future.set_exception(error)


def _log_committed(
    base: int, records: Sequence[MetadataRecord], delta: MetadataDelta, every_record: bool
) -> None:
    """An unclean recovery always logs a WARNING; other records only when asked for, since
    formatting one line per record would dominate bulk changes (a 100k-partition topic).
    The delta says whether there is a recovery at all, so a bulk change without one is
    not scanned."""
    if not every_record and not delta.unclean_recoveries:
        return
    for i, r in enumerate(records):
        if not (every_record or isinstance(r, UncleanRecoveryRecord)):
            continue
        fields: dict[str, Any] = msgspec.to_builtins(r)
        fields.pop("v", None)
        fields.pop("type", None)
        if isinstance(r, UncleanRecoveryRecord):
            log.warning(
                "unclean recovery: potential data loss",
                offset=base + i,
                record=record_type(r),
                **fields,
            )
        else:
            log.info("committed", offset=base + i, record=record_type(r), **fields)
