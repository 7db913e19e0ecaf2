"""The controller driver: one asyncio task owns the image and handles one event at a time.

Each event (a request, a timer tick, a log-inspection answer) runs through the pure
handlers against the newest image. Its records are replayed at once onto that image, so
the next event sees them (as Kafka's QuorumController does), and handed to a committer
task that appends everything queued so far in one durable batch. A response is released
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
from controller.core.dispatch import decide
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.registry import load_policies, require
from controller.core.recovery.tracker import (
    Inspection,
    RecoveryTracker,
    evaluate,
)
from controller.runtime.clock import Clock, SystemClock
from metactl.errors import LogClosedError, LogError, MetactlError
from metadata_image.image import ClusterImage, TopicPartition
from metadata_image.replay import replay
from metadata_image.snapshot import ImageSnapshot, from_snapshot, to_snapshot
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    record_type,
)
from metadata_log.store import LogStore
from protocol.requests import (
    Ack,
    ControllerRequest,
    ControllerResponse,
)

log = structlog.get_logger("metactl.controller")

REPLAY_CHUNK: Final = 10_000


class Tick(msgspec.Struct, frozen=True):
    """Internal event: time moved; timers (recovery windows) may be due."""


Event = ControllerRequest | Tick


class _Commit:
    __slots__ = ("future", "image_after", "now_ms", "records", "response")

    def __init__(
        self,
        records: list[MetadataRecord],
        future: asyncio.Future[ControllerResponse] | None,
        response: ControllerResponse,
        image_after: ClusterImage,
        now_ms: int,
    ) -> None:
        self.records = records
        self.future = future
        self.response = response
        self.image_after = image_after
        self.now_ms = now_ms


CommitListener = Callable[[int, Sequence[MetadataRecord], int], None]
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
        require(self.policies, config.unclean_recovery_strategy)  # fail fast on a typo
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.image = image
        self.committed_image = image
        self.tracker = RecoveryTracker()
        self.next_deadline_ms: int | None = None
        # The first evaluation (and the one after a revert) looks at every leaderless
        # partition; later ones only at what each event's records touched.
        self._full_scan = True
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
        # The loaded image is long-lived: move it out of the cyclic GC's generations so
        # full collections do not rescan millions of partition objects on every change.
        gc.collect()
        gc.freeze()
        ctl = cls(store, image, config=config or ControllerConfig(), policies=policies, clock=clock)
        ctl.start()
        return ctl

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
            timeout: float | None = None
            if self.next_deadline_ms is not None and isinstance(self.clock, SystemClock):
                timeout = max(0.0, (self.next_deadline_ms - self.clock.now_ms()) / 1000)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop a result that
            # arrives as the timeout fires, which here would lose an event. A cancelled
            # Queue.get never consumes an item.
            try:
                async with asyncio.timeout(timeout):
                    event, future, enqueued = await self._queue.get()
            except TimeoutError:
                event, future, enqueued = Tick(), None, time.perf_counter()
            if enqueued < 0:
                return
            started = time.perf_counter()
            self._process(event, future)
            for listener in self.event_listeners:
                listener(type(event).__name__, started - enqueued, time.perf_counter() - started)

    def _decide(
        self, event: Event, now: int
    ) -> tuple[list[MetadataRecord], ControllerResponse, RecoveryTracker]:
        if isinstance(event, Tick):
            return [], Ack(), self.tracker
        return decide(
            self.image,
            self.tracker,
            event,
            now,
            config=self.config,
            strategies=self.policies.keys(),
        )

    def _process(self, event: Event, future: asyncio.Future[ControllerResponse] | None) -> None:
        now = self.clock.now_ms()
        try:
            records, response, tracker = self._decide(event, now)
        except MetactlError as exc:
            log.info(
                "request refused", request=type(event).__name__, code=exc.code, error=exc.message
            )
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        image = replay(self.image, records) if records else self.image
        touched = None if self._full_scan else touched_partitions(image, records)
        self._full_scan = False
        step = evaluate(
            image, tracker, now, policies=self.policies, config=self.config, touched=touched
        )
        if step.records:
            image = replay(image, step.records)
            records = records + step.records
        self.image, self.tracker, self.next_deadline_ms = image, step.tracker, step.next_deadline_ms
        self._commits.append(_Commit(records, future, response, image, now))
        self._commit_wakeup.set()
        for inspection in step.inspections:
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
                    listener(offset, c.records, c.now_ms)
                _log_committed(offset, c.records, self.log_every_record)
                offset += len(c.records)
            if c.future is not None and not c.future.done():
                c.future.set_result(c.response)

    def _fail_uncommitted(self, batch: list[_Commit], exc: Exception) -> None:
        error = exc if isinstance(exc, MetactlError) else LogError(f"append failed: {exc!r}")
        log.error("commit failed; reverting to the committed image", error=str(error))
        failed = batch + list(self._commits)
        self._commits.clear()
        self.image = self.committed_image
        self.tracker = RecoveryTracker()  # soft state: rebuilt on the next event
        self._full_scan = True
        for c in failed:
            if c.future is not None and not c.future.done():
                c.future.set_exception(error)


def touched_partitions(
    image: ClusterImage, records: Sequence[MetadataRecord]
) -> list[TopicPartition]:
    """Leaderless partitions whose recovery status the records may have changed: the ones
    they name, and those hosted by a broker whose state changed (fenced, unfenced,
    registered), since broker activity decides the proactive trigger and who can answer."""
    out: list[TopicPartition] = []
    for r in records:
        if isinstance(r, PartitionChangeRecord | PartitionRecord):
            out.append((r.topic, r.partition))
        elif isinstance(r, ClearElrRecord):
            out.extend(tp for tp in image.offline if tp[0] == r.topic)
        elif isinstance(
            r,
            FenceBrokerRecord
            | UnfenceBrokerRecord
            | RegisterBrokerRecord
            | BrokerRegistrationChangeRecord,
        ):
            hosted = image.replicas_by_broker.get(r.broker_id)
            if hosted is None:
                continue
            if len(image.offline) < len(hosted):
                out.extend(tp for tp in image.offline if tp in hosted)
            else:
                out.extend(tp for tp in hosted if tp in image.offline)
    return out


def _log_committed(base: int, records: Sequence[MetadataRecord], every_record: bool) -> None:
    """An unclean recovery always logs a WARNING; other records only when asked for, since
    formatting one line per record would dominate bulk changes (a 100k-partition topic)."""
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
