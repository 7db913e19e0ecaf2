"""The replicas this broker hosts, and the replication it runs for them.

Follows the metadata image: creates a replica for every partition assigned to this
broker; as a leader appends the new leader epoch, appends the batches clients produce
(`produce.DataPlane`: the log grows only through Produce), answers followers'
ReplicaFetch, advances the high watermark (answering the acks=all batches it covers) and
has `leader.IsrUpdater` ask the controller to shrink or expand the ISR (one
AlterPartition in flight per partition); as a follower runs a `fetcher.Fetcher` per
leader and applies its answers: truncates where the logs diverge and copies the rest.
Every change is written through the page cache; changed replicas are fsynced every
flush interval, as soon as `flush_messages` records are unflushed (Kafka's
flush.messages, off by default), and at shutdown.

ReplicaFetch is long-polled (`fetch`): a fetch is recorded (the follower's position, the
high watermark) when it arrives, and when the leader has nothing new for the follower it
parks on the partition's `LeaderState` until the log end or the high watermark moves
past what the follower has, the leadership ends, or its `max_wait_ms` runs out. Every
append, high-watermark advance and leadership change signals it: no timer is involved.
A follower names the leader epoch its metadata shows (`current_leader_epoch`); a fetch
of an older epoch is refused with FENCED_LEADER_EPOCH, of a newer one with
UNKNOWN_LEADER_EPOCH, and neither is recorded (`handle_fetch`). So when a reassignment
removes a replica and the leader stays, the bumped leader epoch fences the removed
replica off the partition, as in Kafka.

A new leader epoch where this broker stays leader starts a new epoch in its log's
history and a new `LeaderState`. Led on from the epoch just before, nothing changed in
its log: the followers keep their positions (the ISR members count as caught up as of
now) and the acks=all batches waiting on the high watermark keep waiting, so neither
the high watermark nor acks=all stalls (`_become_or_stay_leader`). The fetches parked in
the old epoch are released and handled anew (`_answer_parked`).

Nothing acts on the image before it has caught up with the controller's committed end:
while a restarted broker replays the log from 0, old images would name it leader of
epochs long gone.

The metadata lifecycle reaches the replicas through the deltas: a deleted topic's
replicas (`MetadataDelta.removed_topics`) and a replica this broker was reassigned away
from stop being served and replicated and their files are deleted; a topic created
again under the same name has a new topic id, and a replica recording another id than
the topic's (left by a broker that was down during the delete) is deleted, never served.
A reassignment's adding replica and an added partition are created as any new replica
(`MetadataDelta.partitions`); a changed MinISR is in the partition's state, which the
high watermark and acks=all read.

This module applies the decisions of `replication.py` and owns the tasks that drive
them. It must not decide broker-level matters (registration, heartbeats, shutdown), nor
write files other than the replica files.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Final

from brokers_stub import replica_log as rl
from brokers_stub.config import BrokerConfig
from brokers_stub.fetcher import Fetcher
from brokers_stub.leader import IsrUpdater, LeaderState
from brokers_stub.logctx import BrokerLog
from brokers_stub.produce import DataPlane
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replication import (
    FollowerFetchState,
    divergence,
    follower_truncation,
    join_floor,
    next_high_watermark,
    record_fetch,
    reelected_follower,
)
from brokers_stub.storage import REPLICAS_DIR, fsync_dir
from metactl.errors import (
    FencedLeaderEpochError,
    InconsistentTopicIdError,
    InvalidRequestError,
    MetactlError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import EMPTY_INDEX, ClusterImage, PartitionState, TopicPartition, common
from metadata_log.records import NO_LEADER, LeaderRecoveryState
from protocol.client import RpcClient
from protocol.messages import (
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicaLogInfoEntry,
    ReplicaRef,
)

# Why a replica is deleted (`ReplicaManager._stale`).
TOPIC_DELETED: Final = "topic deleted"
TOPIC_RECREATED: Final = "another topic id: the topic was deleted and created again"
NOT_A_REPLICA: Final = "no longer a replica (reassigned)"


def gone_error(name: str, reason: str) -> MetactlError:
    """What a batch waiting on a replica that is deleted gets: the partition moved to
    other brokers (NOT_LEADER_OR_FOLLOWER: the client looks for the new leader), or
    it no longer exists (UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers a deleted topic)."""
    message = f"{name} is not served here any more: {reason}"
    if reason == NOT_A_REPLICA:
        return NotLeaderOrFollowerError(message)
    return UnknownTopicOrPartitionError(message)


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
        self.replicas_dir: Path = config.data_dir / REPLICAS_DIR
        self.log = log
        self.broker_epoch = broker_epoch
        self.controller = controller
        self.clock_ms = clock_ms
        self.logs: dict[TopicPartition, ReplicaLog] = {}
        self.leaders: dict[TopicPartition, LeaderState] = {}
        self.image: ClusterImage | None = None  # the latest caught-up image
        self.latest_image: ClusterImage | None = None  # the latest image, caught up or not
        # What changed since the last caught-up image was acted on (None: everything).
        self._unseen: MetadataDelta | None = None
        self.fetchers: dict[int, Fetcher] = {}
        self._unflushed: set[TopicPartition] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False  # start() called: fetchers may run
        self._stopped = False  # stop() called: no new AlterPartition
        self._stale_leader_warned: set[tuple[TopicPartition, int]] = set()
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

    # --- files ----------------------------------------------------------------------

    def load(self, *, lose_unflushed: bool) -> None:
        """Read every replica file; with `lose_unflushed`, drop what was never fsynced."""
        self.replicas_dir.mkdir(parents=True, exist_ok=True)
        logs, problems = rl.load_all(self.replicas_dir)
        for problem in problems:
            self.log.error("unreadable replica file ignored", problem=problem)
        for log in logs:
            tp = (log.topic, log.partition)
            self.logs[tp] = log
            if lose_unflushed:
                before = (log.log_end_offset, len(log.leader_epochs))
                if log.lose_unflushed():
                    self.log.warning(
                        "lost unflushed data",
                        partition=log.name,
                        log_end_offset_before=before[0],
                        log_end_offset=log.log_end_offset,
                        epochs_dropped=before[1] - len(log.leader_epochs),
                    )
                rl.flush(log, self.replicas_dir)  # the surviving state is on disk
        self.log.info(
            "replicas loaded",
            replicas={
                log.name: [log.last_leader_epoch, log.log_end_offset] for log in self.logs.values()
            },
        )

    def _save(self, tp: TopicPartition) -> None:
        """Write the replica through the page cache, or fsync it once `flush_messages`
        records are unflushed (Kafka's flush.messages)."""
        log = self.logs[tp]
        every = self.config.flush_messages
        if every is not None and log.log_end_offset - log.flushed_offset >= every:
            rl.flush(log, self.replicas_dir)
            self._unflushed.discard(tp)
        else:
            rl.save(log, self.replicas_dir)
            self._unflushed.add(tp)

    def flush_changed(self) -> None:
        for tp in sorted(self._unflushed):
            log = self.logs.get(tp)
            if log is not None:
                rl.flush(log, self.replicas_dir)
        self._unflushed.clear()

    def flush_all(self) -> None:
        for tp in sorted(self.logs):
            rl.flush(self.logs[tp], self.replicas_dir)
        self._unflushed.clear()

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        self.spawn(self._tick_loop(), "replica-ticks")
        self.spawn(self._flush_loop(), "replica-flush")
        if self.image is not None:
            self._reconcile_fetchers(self.image)

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
        for fetcher in self.fetchers.values():
            fetcher.close()
        self.fetchers.clear()
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

        The metadata lifecycle (`_drop_stale`): a replica of a deleted topic, of a topic
        id that is no longer the topic's (deleted and created again), or of a partition
        this broker was reassigned away from is dropped, its data deleted. Before the
        broker has caught up only what a delta names exactly (a removed topic id) is
        dropped: an older image may show a topic that a newer one deletes, or not yet
        show the topic a replica on disk belongs to.
        """
        self.latest_image = image
        if delta is not None and delta.removed_topics:
            self._drop_removed_ids(delta.removed_topics)
        if delta is None or self._unseen is None:
            self._unseen = None
        else:
            self._unseen.update(delta)
        if not caught_up:
            for tp in self._scope(image, delta):
                self._create_replica(image, tp)
            return
        self.image = image
        moved, self._image_moved = self._image_moved, None
        if moved is not None:
            moved.set()
        unseen = self._unseen
        self._unseen = MetadataDelta()
        self._drop_stale(image, unseen)
        now = self.clock_ms()
        led: set[TopicPartition] = set()
        for tp in self._scope(image, unseen):
            self._create_replica(image, tp)
            p = image.partitions.get(tp)
            if p is None or self.broker_id not in p.replicas:
                continue
            if p.leader == self.broker_id and self._become_or_stay_leader(p, now):
                led.add(tp)
                st = self.leaders[tp]
                self.data.partition_changed(p, st)
                if self._update_high_watermark(p, st, self.logs[tp]):
                    self._save(tp)
            else:
                if tp in self.leaders:
                    self.leaders.pop(tp).end()
                    self.log.info("no longer leader", partition=f"{tp[0]}-{tp[1]}")
                self.data.partition_changed(p, None)
        if self._running:
            self._reconcile_fetchers(image)
        for tp in led:
            self._maybe_alter_isr(tp, now)

    async def until_image_moved(self) -> None:
        """Return at the next caught-up image (`on_metadata`)."""
        if self._image_moved is None:
            self._image_moved = asyncio.Event()
        await self._image_moved.wait()

    def _create_replica(self, image: ClusterImage, tp: TopicPartition) -> None:
        """Create the replica of `tp` if this broker hosts it and has none yet. A replica
        on disk without a topic id (written before ids were recorded) takes the topic's
        id once the image is caught up (`self.image`): nothing deleted it since."""
        p = image.partitions.get(tp)
        t = image.topics.get(tp[0])
        if p is None or t is None or self.broker_id not in p.replicas:
            return
        log = self.logs.get(tp)
        if log is None:
            self.logs[tp] = ReplicaLog(topic=p.topic, partition=p.partition, topic_id=t.topic_id)
            self._save(tp)
            self.log.info(
                "replica created", partition=f"{p.topic}-{p.partition}", topic_id=t.topic_id
            )
        elif not log.topic_id and self.image is image:
            log.topic_id = t.topic_id
            self._save(tp)

    def _stale(self, image: ClusterImage, tp: TopicPartition, removed: bool) -> str | None:
        """Why the replica of `tp` must go, judged on a caught-up image (None: it stays).
        `removed`: a delta since the replica was last judged deleted its topic's name,
        so a replica without a recorded id predates that deletion."""
        log = self.logs[tp]
        t = image.topics.get(tp[0])
        p = image.partitions.get(tp)
        if t is None or p is None:
            return TOPIC_DELETED
        if log.topic_id != t.topic_id and (log.topic_id or removed):
            return TOPIC_RECREATED
        if self.broker_id not in p.replicas:
            return NOT_A_REPLICA
        return None

    def _drop_removed_ids(self, removed: dict[str, tuple[str, int]]) -> None:
        """Drop the replicas of topics a delta removed, by exact topic id: safe on any
        image, since an id is never used again."""
        self._drop(
            {
                tp: TOPIC_DELETED
                for tp, log in self.logs.items()
                if tp[0] in removed and log.topic_id and log.topic_id == removed[tp[0]][0]
            }
        )

    def _drop_stale(self, image: ClusterImage, unseen: MetadataDelta | None) -> None:
        """Drop the replicas the caught-up `image` no longer gives this broker: those of
        the partitions `unseen` names, of the topics it removed (by name: an id of a
        topic deleted while deltas were folded may not be named), or, when everything
        may have changed (a start), every replica (Kafka's stray replicas)."""
        removed: set[str] = set()
        if unseen is None:
            candidates: set[TopicPartition] = set(self.logs)
        else:
            removed = set(unseen.removed_topics)
            candidates = set(common(unseen.partitions, self.logs.keys()))
            if removed:
                candidates.update(tp for tp in self.logs if tp[0] in removed)
        stale = {}
        for tp in candidates:
            reason = self._stale(image, tp, tp[0] in removed)
            if reason is not None:
                stale[tp] = reason
        self._drop(stale)

    def _drop(self, reasons: dict[TopicPartition, str]) -> None:
        """Stop serving and replicating these replicas and delete them: end each
        leadership (releasing its parked fetches), fail the batches waiting on it (an
        unknown partition, or NOT_LEADER_OR_FOLLOWER where it moved to other brokers),
        forget it and delete its file; then make the deletions durable at once. The
        fetcher lanes go at the next `_reconcile_fetchers`; an answer in flight is not
        applied (`apply_fetch_response` checks the replica it fetched for)."""
        if not reasons:
            return
        summary: Counter[tuple[str, str, str]] = Counter()
        for tp, reason in sorted(reasons.items()):
            log = self.logs.pop(tp)
            st = self.leaders.pop(tp, None)
            if st is not None:
                st.end()
            self.data.waiters.fail(tp, functools.partial(gone_error, log.name, reason))
            self._unflushed.discard(tp)
            try:
                rl.remove(self.replicas_dir, tp[0], tp[1])
            except OSError as exc:
                self.log.error("replica file not deleted", partition=log.name, error=str(exc))
            summary[(tp[0], log.topic_id, reason)] += 1
        self._stale_leader_warned = {k for k in self._stale_leader_warned if k[0] not in reasons}
        self._sync_replicas_dir()
        for (topic, topic_id, reason), n in sorted(summary.items()):
            self.log.info(
                "replicas deleted", topic=topic, topic_id=topic_id, reason=reason, partitions=n
            )

    def _sync_replicas_dir(self) -> None:
        """Make the deletions durable (one directory fsync for a batch of them)."""
        try:
            fsync_dir(self.replicas_dir)
        except OSError as exc:
            self.log.error("replica deletions not synced", error=str(exc))

    def _scope(self, image: ClusterImage, delta: MetadataDelta | None) -> set[TopicPartition]:
        """Our partitions a delta may concern (None: all of ours)."""
        mine = image.replicas_by_broker.get(self.broker_id)
        if mine is None:
            return set()
        if delta is None:
            return set(mine)
        if self.broker_id in delta.brokers:
            return set(mine)
        scope = set(common(delta.partitions, mine))
        for broker_id in delta.brokers:
            scope.update(common(mine, image.replicas_by_broker.get(broker_id, EMPTY_INDEX)))
        return scope

    def _become_or_stay_leader(self, p: PartitionState, now: int) -> bool:
        log = self.logs[p.tp]
        latest = log.last_leader_epoch
        if p.leader_epoch < latest:
            # Our history knows a newer epoch than the controller: do not act on it.
            if (p.tp, p.leader_epoch) not in self._stale_leader_warned:
                self._stale_leader_warned.add((p.tp, p.leader_epoch))
                self.log.warning(
                    "image names us leader of an epoch older than our history; ignoring",
                    partition=log.name,
                    leader_epoch=p.leader_epoch,
                    latest_epoch=latest,
                )
            return False
        st = self.leaders.get(p.tp)
        if st is not None and st.leader_epoch == p.leader_epoch:
            for r in p.isr:
                if r != self.broker_id and r not in st.followers:
                    st.followers[r] = FollowerFetchState(last_caught_up_ms=now)
            for r in [r for r in st.followers if r not in p.replicas]:
                # Reassigned away (its replica deleted): were it added again, it must
                # prove it is caught up from scratch, as Kafka forgets a removed
                # replica's state.
                del st.followers[r]
                st.hw_sent.pop(r, None)
            return True
        if st is not None:
            st.end()  # an older epoch's parked fetches: answered anew (`_answer_parked`)
        # Led on from the epoch just before: no other leader came in between (every
        # leader change is a new epoch), so this log is the partition's log of both
        # epochs. The followers keep their positions in it and the batches waiting to
        # commit keep waiting (Kafka: a re-elected leader); after a gap the epochs between
        # may have had another leader, so the followers start afresh and the batches fail.
        led_on = st is not None and p.leader_epoch == st.leader_epoch + 1
        if log.assign_epoch(p.leader_epoch):
            self._save(p.tp)
        # Kafka: the ISR members start caught up as of now; others must prove it.
        followers = {
            r: FollowerFetchState(last_caught_up_ms=now) for r in p.isr if r != self.broker_id
        }
        if st is not None and led_on:
            for r, prev in st.followers.items():
                if r in p.replicas and r != self.broker_id:
                    followers[r] = reelected_follower(
                        prev, in_isr=r in p.isr, leader_leo=log.log_end_offset, now_ms=now
                    )
            self.data.waiters.carry(p.tp, st.leader_epoch, p.leader_epoch)
        self.leaders[p.tp] = LeaderState(leader_epoch=p.leader_epoch, followers=followers)
        self.log.info(
            "became leader",
            partition=log.name,
            leader_epoch=p.leader_epoch,
            led_on=led_on,
            log_end_offset=log.log_end_offset,
            high_watermark=log.high_watermark,
            isr=sorted(p.isr),
            recovering=p.recovery_state is LeaderRecoveryState.RECOVERING,
        )
        return True

    def followed_partitions(self, image: ClusterImage) -> Iterable[PartitionState]:
        for p in image.partitions_of(self.broker_id):
            if p.leader not in (NO_LEADER, self.broker_id):
                yield p

    def _reconcile_fetchers(self, image: ClusterImage) -> None:
        wanted: dict[int, list[TopicPartition]] = {}
        for p in self.followed_partitions(image):
            wanted.setdefault(p.leader, []).append(p.tp)
        for leader_id in list(self.fetchers):
            if leader_id not in wanted:
                self.fetchers.pop(leader_id).close()
        for leader_id, tps in wanted.items():
            fetcher = self.fetchers.get(leader_id)
            if fetcher is None:
                fetcher = self.fetchers[leader_id] = Fetcher(self, leader_id)
            fetcher.assign(tps)

    # --- leader: appends, high watermark, ISR -----------------------------------------

    def appended(self, p: PartitionState, st: LeaderState) -> None:
        """The leader appended a produced batch to `p`'s log: persist it, and advance the
        high watermark if the ISR allows (a lone ISR member commits at once). The parked
        fetches it wakes run after this returns: the records are written by then."""
        self._update_high_watermark(p, st, self.logs[p.tp])
        self._save(p.tp)
        st.moved()  # new records for the parked fetches

    async def _tick_loop(self) -> None:
        period = self.config.replica_tick_ms / 1000
        while True:
            await asyncio.sleep(period)  # a timer: ISR checks (lagging followers)
            try:
                self.tick(self.clock_ms())
            except Exception:
                self.log.exception("replica tick failed")

    def tick(self, now: int) -> None:
        """Advance high watermarks, check the ISRs."""
        image = self.image
        if image is None:
            return
        for tp, st in list(self.leaders.items()):
            p = image.partition(tp)
            if p is None:
                continue
            if self._update_high_watermark(p, st, self.logs[tp]):
                self._save(tp)
            self._maybe_alter_isr(tp, now)

    def _update_high_watermark(self, p: PartitionState, st: LeaderState, log: ReplicaLog) -> bool:
        hw = next_high_watermark(
            current_hw=log.high_watermark,
            leader_id=self.broker_id,
            leader_leo=log.log_end_offset,
            isr=p.isr,
            min_isr=p.min_isr,
            follower_offsets={b: f.fetch_offset for b, f in st.followers.items()},
            pending_isr=st.proposed_isr,
        )
        if not log.advance_high_watermark(hw):
            return False
        self.data.high_watermark_advanced(p.tp, log.high_watermark, st.leader_epoch)
        st.moved()  # the parked fetches carry it to the followers
        return True

    def _maybe_alter_isr(self, tp: TopicPartition, now: int) -> None:
        image, st = self.image, self.leaders.get(tp)
        if image is not None and st is not None and not self._stopped:
            log = self.logs[tp]
            floor = join_floor(log.high_watermark, log.leader_epochs, st.leader_epoch)
            self.isr_updater.maybe_alter(image, tp, st, now, floor)

    # --- leader: serving followers ------------------------------------------------------

    async def fetch(self, req: ReplicaFetchRequest) -> ReplicaFetchResponse:
        """ReplicaFetch, long-polled: recorded and checked at once (`handle_fetch`), then,
        unless the answer is news to the follower (a truncation, records past its fetch
        offset, a high watermark above the one it was last sent), held until it is, until
        this leadership ends, or for `max_wait_ms` (at most half the replica lag time,
        since an idle follower counts as caught up as of its fetch's arrival)."""
        if req.max_wait_ms < 0:
            raise InvalidRequestError(f"max_wait_ms must be >= 0, got {req.max_wait_ms}")
        resp = self.handle_fetch(req)
        tp = (req.topic, req.partition)
        st = self.leaders[tp]
        wait_ms = min(req.max_wait_ms, self.config.fetch_hold_max_ms)
        if resp.truncate_to is None and wait_ms > 0 and not self._news(req, st):
            st.parked += 1
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_ms / 1000):
                        while not self._news(req, st):
                            await st.until_moved()
            finally:
                st.parked -= 1
            resp, st = self._answer_parked(req, st)
        st.hw_sent[req.follower_id] = resp.high_watermark
        return resp

    def _news(self, req: ReplicaFetchRequest, st: LeaderState) -> bool:
        """Whether a fetch has something to answer: records past its offset, a high
        watermark the follower has not been sent, or the end of the leadership."""
        if st.ended or self._stopped:
            return True
        log = self.logs[(req.topic, req.partition)]
        known = st.hw_sent.get(req.follower_id)
        return log.log_end_offset > req.fetch_offset or known is None or log.high_watermark > known

    def _answer_parked(
        self, req: ReplicaFetchRequest, st: LeaderState
    ) -> tuple[ReplicaFetchResponse, LeaderState]:
        """The answer to a fetch that was held, and the leadership it is answered in.

        If this broker still leads the epoch the fetch was recorded in: the log as it is
        now (the log only grew since, so it cannot diverge where it did not). If it leads
        the partition in a newer epoch, the fetch is handled anew in that epoch
        (`handle_fetch`, as Kafka reads a delayed fetch again when it completes): a
        follower that named the old epoch gets FENCED_LEADER_EPOCH and learns the new one
        from its metadata, one that named none (an older follower) is answered and
        recorded in the new epoch. NOT_LEADER_OR_FOLLOWER otherwise: the leadership moved
        or ended, or the broker is stopping."""
        tp = (req.topic, req.partition)
        image = self.image
        p = image.partition(tp) if image is not None else None
        current = self.leaders.get(tp)
        leads = (
            not self._stopped
            and p is not None
            and p.leader == self.broker_id
            and current is not None
            and not current.ended
            and current.leader_epoch == p.leader_epoch
        )
        if not leads or current is None:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} no longer leads {req.topic}-{req.partition} "
                f"in leader epoch {st.leader_epoch}"
            )
        if current is not st:
            return self.handle_fetch(req), current
        log = self.logs[tp]
        resp = ReplicaFetchResponse(
            leader_epoch=st.leader_epoch,
            log_end_offset=log.log_end_offset,
            high_watermark=log.high_watermark,
            leader_epochs=list(log.leader_epochs),
        )
        return resp, st

    def handle_fetch(self, req: ReplicaFetchRequest) -> ReplicaFetchResponse:
        """ReplicaFetch answered at once: checked, recorded, and the log as it is.

        The checks, in Kafka's order: the partition is known; the follower's replica is
        of this topic id (INCONSISTENT_TOPIC_ID); the follower's `current_leader_epoch`,
        if it names one, is the image's (older: FENCED_LEADER_EPOCH, so a replica a
        reassignment removed, which has not seen that yet, copies nothing more; newer:
        UNKNOWN_LEADER_EPOCH, this broker's metadata is behind); this broker leads that
        epoch and the follower is one of the partition's other replicas
        (NOT_LEADER_OR_FOLLOWER). A refused fetch is not recorded: it moves neither the
        follower's position and caught-up time nor the high watermark."""
        tp = (req.topic, req.partition)
        name = f"{req.topic}-{req.partition}"
        if req.current_leader_epoch < -1:
            raise InvalidRequestError(
                f"current_leader_epoch must be >= 0, or -1 for none, got {req.current_leader_epoch}"
            )
        image = self.image
        if image is None:
            raise NotLeaderOrFollowerError("metadata not caught up yet")
        p = image.partition(tp)
        if p is None:
            raise UnknownTopicOrPartitionError(f"unknown partition {name}")
        log = self.logs.get(tp)
        if req.topic_id and log is not None and log.topic_id and req.topic_id != log.topic_id:
            raise InconsistentTopicIdError(
                f"{name}: the follower's replica is of topic id "
                f"{req.topic_id[:36]}, broker {self.broker_id}'s of {log.topic_id}"
            )
        if 0 <= req.current_leader_epoch < p.leader_epoch:
            raise FencedLeaderEpochError(
                f"{name}: broker {req.follower_id} fetches in leader epoch "
                f"{req.current_leader_epoch}, the partition is at {p.leader_epoch}"
            )
        if req.current_leader_epoch > p.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{name}: broker {req.follower_id} fetches in leader epoch "
                f"{req.current_leader_epoch}, broker {self.broker_id} knows only "
                f"{p.leader_epoch} so far"
            )
        st = self.leaders.get(tp)
        if p.leader != self.broker_id or st is None or st.leader_epoch != p.leader_epoch:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead {name}")
        if req.follower_id not in p.replicas or req.follower_id == self.broker_id:
            raise NotLeaderOrFollowerError(f"broker {req.follower_id} is not a follower of {name}")
        log = self.logs[tp]
        history = list(log.leader_epochs)
        truncate_to = divergence(
            log.leader_epochs, log.log_end_offset, req.last_fetched_epoch, req.fetch_offset
        )
        if truncate_to is not None:
            self.log.info(
                "follower diverges",
                partition=log.name,
                follower=req.follower_id,
                fetch_offset=req.fetch_offset,
                last_fetched_epoch=req.last_fetched_epoch,
                truncate_to=truncate_to,
            )
            return ReplicaFetchResponse(
                leader_epoch=p.leader_epoch,
                log_end_offset=log.log_end_offset,
                high_watermark=log.high_watermark,
                truncate_to=truncate_to,
                leader_epochs=history,
            )
        now = self.clock_ms()
        st.followers[req.follower_id] = record_fetch(
            st.followers.get(req.follower_id),
            broker_epoch=req.follower_broker_epoch,
            fetch_offset=req.fetch_offset,
            leader_leo=log.log_end_offset,
            now_ms=now,
        )
        if self._update_high_watermark(p, st, log):
            self._save(tp)
        self._maybe_alter_isr(tp, now)
        return ReplicaFetchResponse(
            leader_epoch=p.leader_epoch,
            log_end_offset=log.log_end_offset,
            high_watermark=log.high_watermark,
            leader_epochs=history,
        )

    # --- follower -----------------------------------------------------------------------

    def apply_fetch_response(
        self,
        tp: TopicPartition,
        sent_offset: int,
        resp: ReplicaFetchResponse,
        fetched_for: ReplicaLog | None = None,
    ) -> bool:
        """Apply a leader's answer to our fetch from `sent_offset` (for the replica
        `fetched_for`, if given); True if the replica changed (or changed while the fetch
        was out): the fetcher asks again at once. An answer for a replica that has been
        deleted meanwhile (or replaced: its topic was created again) is dropped."""
        log = self.logs.get(tp)
        if log is None or (fetched_for is not None and log is not fetched_for):
            return False
        if log.log_end_offset != sent_offset:
            return True  # the log changed while the fetch was out: ask again
        if resp.truncate_to is not None:
            point = follower_truncation(
                log.leader_epochs,
                log.log_end_offset,
                resp.leader_epochs,
                resp.log_end_offset,
                resp.truncate_to,
            )
            before = log.log_end_offset
            if log.truncate_to(point):
                self._save(tp)
                self.log.info(
                    "truncated diverging log",
                    partition=log.name,
                    log_end_offset_before=before,
                    log_end_offset=log.log_end_offset,
                    leader_truncate_to=resp.truncate_to,
                )
                return True
            return False
        changed = log.copy_from_leader(resp.leader_epochs, resp.log_end_offset)
        changed |= log.advance_high_watermark(resp.high_watermark)
        if changed:
            self._save(tp)
        return changed

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

    async def _flush_loop(self) -> None:
        period = self.config.flush_interval_ms / 1000
        while True:
            await asyncio.sleep(period)  # a timer: the flush interval
            try:
                self.flush_changed()
            except OSError as exc:
                self.log.error("replica flush failed", error=str(exc))
