"""The replicas this broker hosts, and the replication it runs for them.

`ReplicaManager` is what the broker process talks to: it follows the metadata image and
hands each part its share of the work, all of them over one map of replica logs
(`replica_files.ReplicaFiles`, which also writes, flushes and deletes their files):

* `replica_lifecycle.ReplicaLifecycle` creates a replica for every partition assigned
  to this broker and deletes those of deleted (or deleted and re-created) topics and
  those this broker was reassigned away from;
* `leader_side.LeaderSide`, as a leader, appends the new leader epoch, appends the
  batches clients produce (`produce.DataPlane`: the log grows only through Produce),
  answers followers' ReplicaFetch (long-polled), advances the high watermark (answering
  the acks=all batches it covers) and has `leader.IsrUpdater` ask the controller to
  shrink or expand the ISR (one AlterPartition in flight per partition);
* `follower_side.FollowerSide`, as a follower, runs a `fetcher.Fetcher` per leader and
  applies its answers: truncates where the logs diverge and copies the rest.

Every change is written through the page cache; changed replicas are fsynced every
flush interval, as soon as `flush_messages` records are unflushed (Kafka's
flush.messages, off by default), and at shutdown.

Nothing acts on the image before it has caught up with the controller's committed end:
while a restarted broker replays the log from 0, old images would name it leader of
epochs long gone. Deltas that arrive meanwhile are folded together and acted on once
(`on_metadata`).

This module owns the order in which the parts act on an image, the manager's tasks
(timers, fetch lanes) and its start and stop. It must not decide broker-level matters
(registration, heartbeats, shutdown), nor write files other than the replica files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from brokers_stub.config import BrokerConfig
from brokers_stub.follower_side import FollowerSide
from brokers_stub.leader import IsrUpdater, LeaderState
from brokers_stub.leader_side import LeaderSide
from brokers_stub.logctx import BrokerLog
from brokers_stub.produce import DataPlane
from brokers_stub.replica_bytes import Chunk
from brokers_stub.replica_files import ReplicaFiles
from brokers_stub.replica_lifecycle import ReplicaLifecycle
from brokers_stub.replica_log import ReplicaLog
from metactl.errors import UnknownTopicOrPartitionError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from protocol.client import RpcClient
from protocol.messages.broker_controller import ReplicaLogInfoEntry, ReplicaRef
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ReplicaManager:
    def __init__(
        self,
        config: BrokerConfig,
        log: BrokerLog,
        *,
        broker_epoch: Callable[[], int | None],
        controller: RpcClient | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.log = log
        self.broker_epoch = broker_epoch
        self.controller = controller
        self.clock_ms = clock_ms
        self.files = ReplicaFiles(config, log)
        self.replicas_dir = self.files.dir
        self.logs: dict[TopicPartition, ReplicaLog] = self.files.logs
        self.image: ClusterImage | None = None  # the latest caught-up image
        self.latest_image: ClusterImage | None = None  # the latest image, caught up or not
        # What changed since the last caught-up image was acted on (None: everything).
        self._unseen: MetadataDelta | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False  # start() called: fetchers may run
        self._stopped = False  # stop() called: no new AlterPartition
        # Set (and replaced) at every caught-up image: the fetch lanes that were refused
        # FENCED_LEADER_EPOCH wait on it (`until_image_moved`).
        self._image_moved: asyncio.Event | None = None
        self.isr_updater = IsrUpdater(
            config,
            log,
            broker_epoch=broker_epoch,
            controller=controller,
            clock_ms=clock_ms,
            spawn=self.spawn,
        )
        self.data = DataPlane(self)  # Produce and ReadLog
        self.leading = LeaderSide(
            config,
            log,
            view=self,
            files=self.files,
            data=self.data,
            isr_updater=self.isr_updater,
            clock_ms=clock_ms,
        )
        self.leaders: dict[TopicPartition, LeaderState] = self.leading.leaders
        self.following = FollowerSide(self, files=self.files)
        self.fetchers = self.following.fetchers
        self.lifecycle = ReplicaLifecycle(
            self.broker_id, log, files=self.files, leading=self.leading, waiters=self.data.waiters
        )

    # --- files ----------------------------------------------------------------------

    def load(self, *, lose_unflushed: bool) -> None:
        """Read every replica file; with `lose_unflushed`, drop what was never fsynced."""
        self.files.load(lose_unflushed=lose_unflushed)

    def flush_changed(self) -> None:
        self.files.flush_changed()

    def flush_all(self) -> None:
        self.files.flush_all()

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        self.spawn(self._tick_loop(), "replica-ticks")
        self.spawn(self._flush_loop(), "replica-flush")
        if self.image is not None:
            self.following.reconcile(self.image)

    @property
    def stopped(self) -> bool:
        """stop() was called: this broker leads nothing any more."""
        return self._stopped

    async def stop(self) -> None:
        self._running = False
        self._stopped = True
        self.data.stop()
        for st in self.leaders.values():
            st.end()  # release the parked fetches
        self.following.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.log.error("replica task had failed", task=task.get_name())

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run `coro` as a task of the replica manager: stop() cancels and awaits it."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- metadata -------------------------------------------------------------------

    def on_metadata(
        self, image: ClusterImage, delta: MetadataDelta | None, caught_up: bool
    ) -> None:
        """A new image from the metadata follower, with what changed (None: everything).

        Only the partitions the deltas name are looked at: those that changed, and those
        shared with a broker whose registration changed (its epoch decides ISR
        membership). Deltas that arrive while the broker is catching up are folded
        together and acted on once it has caught up.

        The metadata lifecycle (`ReplicaLifecycle.drop_stale`): a replica of a deleted
        topic, of a topic id that is no longer the topic's (deleted and created again), or
        of a partition this broker was reassigned away from is dropped, its data deleted.
        Before the broker has caught up only what a delta names exactly (a removed topic
        id) is dropped: an older image may show a topic that a newer one deletes, or not
        yet show the topic a replica on disk belongs to.
        """
        self.latest_image = image
        if delta is not None and delta.removed_topics:
            self.lifecycle.drop_removed_ids(delta.removed_topics)
        if delta is None or self._unseen is None:
            self._unseen = None
        else:
            self._unseen.update(delta)
        if not caught_up:
            for tp in self.lifecycle.scope(image, delta):
                self.lifecycle.create(image, tp, caught_up=self.image is image)
            return
        self.image = image
        moved, self._image_moved = self._image_moved, None
        if moved is not None:
            moved.set()
        unseen = self._unseen
        self._unseen = MetadataDelta()
        self.lifecycle.drop_stale(image, unseen)
        now = self.clock_ms()
        led: set[TopicPartition] = set()
        for tp in self.lifecycle.scope(image, unseen):
            self.lifecycle.create(image, tp, caught_up=True)
            p = image.partitions.get(tp)
            if p is None or self.broker_id not in p.replicas:
                continue
            if p.leader == self.broker_id and self.leading.become_or_stay(p, now):
                led.add(tp)
                st = self.leaders[tp]
                self.data.partition_changed(p, st)
                if self.leading.update_high_watermark(p, st, self.logs[tp]):
                    self.files.save(tp)
            else:
                self.leading.resign(tp)
                self.data.partition_changed(p, None)
        if self._running:
            self.following.reconcile(image)
        for tp in led:
            self.leading.maybe_alter_isr(tp, now)

    async def until_image_moved(self) -> None:
        """Return at the next caught-up image (`on_metadata`)."""
        if self._image_moved is None:
            self._image_moved = asyncio.Event()
        await self._image_moved.wait()

    # --- the parts' entry points ------------------------------------------------------

    def followed_partitions(self, image: ClusterImage) -> Iterable[PartitionState]:
        return self.following.followed_partitions(image)

    def read(
        self, tp: TopicPartition, from_offset: int, end_offset: int, max_bytes: int
    ) -> list[Chunk]:
        """The replica's records from `from_offset` below `end_offset` (`ReplicaFiles.read`)."""
        return self.files.read(tp, from_offset, end_offset, max_bytes)

    def appended(self, p: PartitionState, st: LeaderState) -> None:
        """A produced batch was appended to `p`'s log (`LeaderSide.appended`)."""
        self.leading.appended(p, st)

    def tick(self, now: int) -> None:
        """Advance high watermarks, check the ISRs (`LeaderSide.tick`)."""
        self.leading.tick(now)

    async def fetch(self, req: ReplicaFetchRequest) -> ReplicaFetchResponse:
        """A follower's ReplicaFetch, long-polled (`LeaderSide.fetch`)."""
        return await self.leading.fetch(req)

    def handle_fetch(self, req: ReplicaFetchRequest) -> ReplicaFetchResponse:
        """A follower's ReplicaFetch, answered at once (`LeaderSide.handle_fetch`)."""
        return self.leading.handle_fetch(req)

    def apply_fetch_response(
        self,
        tp: TopicPartition,
        sent_offset: int,
        resp: ReplicaFetchResponse,
        fetched_for: ReplicaLog | None = None,
    ) -> bool:
        """A leader's answer to our fetch (`FollowerSide.apply_fetch_response`)."""
        return self.following.apply_fetch_response(tp, sent_offset, resp, fetched_for)

    # --- timers ---------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        period = self.config.replica_tick_ms / 1000
        while True:
            await asyncio.sleep(period)  # a timer: ISR checks (lagging followers)
            try:
                self.tick(self.clock_ms())
            except Exception:
                self.log.exception("replica tick failed")

    async def _flush_loop(self) -> None:
        period = self.config.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(period)  # a timer: the flush interval
            try:
                self.flush_changed()
            except OSError as exc:
                self.log.error("replica flush failed", error=str(exc))

    # --- GetReplicaLogInfo ----------------------------------------------------------------

    def log_info(self, refs: Iterable[ReplicaRef]) -> list[ReplicaLogInfoEntry]:
        out = []
        image = self.latest_image
        for ref in refs:
            log = self.logs.get((ref.topic, ref.partition))
            t = image.topics.get(ref.topic) if image is not None else None
            if log is None or (t is not None and log.topic_id and log.topic_id != t.topic_id):
                # None, or a replica of another topic of that name (not deleted yet: the
                # broker has not caught up): nothing to report for this topic.
                out.append(
                    ReplicaLogInfoEntry(
                        topic=ref.topic,
                        partition=ref.partition,
                        error_code=UnknownTopicOrPartitionError.code,
                    )
                )
            else:
                out.append(
                    ReplicaLogInfoEntry(
                        topic=ref.topic,
                        partition=ref.partition,
                        last_leader_epoch=log.last_leader_epoch,
                        log_end_offset=log.log_end_offset,
                    )
                )
        return out
