"""The replica manager's leader side: the partitions this broker leads, across epochs.

`LeaderSide` keeps a `leader.LeaderState` per led partition and acts on it:

* becoming or staying leader at a caught-up image (`become_or_stay`): a new leader epoch
  starts a new epoch in the log's history and a new `LeaderState`. Led on from the epoch
  just before, nothing changed in its log: the followers keep their positions (the ISR
  members count as caught up as of now) and the acks=all batches waiting on the high
  watermark keep waiting, so neither the high watermark nor acks=all stalls. The fetches
  parked in the old epoch are released and handled anew (`_answer_parked`);
* advancing the high watermark (`update_high_watermark`: answering the acks=all batches
  it covers) at every append, recorded fetch and tick, and having `leader.IsrUpdater`
  ask the controller to shrink or expand the ISR (`maybe_alter_isr`);
* serving followers' ReplicaFetch, long-polled (`fetch`): the answer carries the log
  from the follower's fetch offset as chunks (stored record batches with their bytes,
  and ranges of records without bytes), within the follower's `max_bytes` and a share
  of the frame limit (`fetch_bytes_budget`), and names their end as its
  `log_end_offset` (the follower copies exactly what it was sent); a fetch is recorded
  (the follower's position, the high watermark) when it arrives, and when the leader has
  nothing new for the follower it parks on the partition's `LeaderState` until the log
  end or the high watermark moves past what the follower has, the leadership ends, or
  its `max_wait_ms` runs out. Every append, high-watermark advance and leadership change
  signals it: no timer is involved. A follower names the leader epoch its metadata
  shows (`current_leader_epoch`); a fetch of an older epoch is refused with
  FENCED_LEADER_EPOCH, of a newer one with UNKNOWN_LEADER_EPOCH, and neither is recorded
  (`handle_fetch`). So when a reassignment removes a replica and the leader stays, the
  bumped leader epoch fences the removed replica off the partition, as in Kafka.

It sees the rest of the replica manager through `ReplicaView` (the caught-up image,
whether the broker is stopping) and the collaborators it is handed: the replica files,
the data plane's waiters and the ISR updater. It must not create or delete replicas
(`replica_lifecycle`), apply a leader's answers as a follower (`follower_side`), or
decide replication rules itself (`replication.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from typing import Protocol

from brokers_stub.config import BrokerConfig
from brokers_stub.leader import IsrUpdater, LeaderState
from brokers_stub.logctx import BrokerLog
from brokers_stub.produce import DataPlane
from brokers_stub.replica_files import ReplicaFiles
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replication import (
    FollowerFetchState,
    divergence,
    join_floor,
    next_high_watermark,
    record_fetch,
    reelected_follower,
)
from metactl.errors import (
    FencedLeaderEpochError,
    InconsistentTopicIdError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import LeaderRecoveryState
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse

# The share of the frame limit an answer's record batches may take: the rest leaves room
# for the epoch history and the encoding (MessagePack adds a few bytes per chunk).
FETCH_FRAME_SHARE = 2


def fetch_bytes_budget(config: BrokerConfig, max_bytes: int) -> int:
    """How many bytes of batches a ReplicaFetch answer may carry for a follower asking
    for `max_bytes` (the first batch goes whatever its size: the Kafka listener must not
    accept a batch larger than this, or followers could not copy it)."""
    return min(max_bytes, config.max_frame_bytes // FETCH_FRAME_SHARE)


class ReplicaView(Protocol):
    """What the leader side reads of the replica manager's own state."""

    @property
    def image(self) -> ClusterImage | None:
        """The latest caught-up image (None before the first)."""
        ...

    @property
    def stopped(self) -> bool:
        """The broker is stopping: it leads nothing any more."""
        ...


class LeaderSide:
    """The partitions this broker leads: their `LeaderState`s, high watermarks, ISR
    changes, and the fetches their followers send."""

    def __init__(
        self,
        config: BrokerConfig,
        log: BrokerLog,
        *,
        view: ReplicaView,
        files: ReplicaFiles,
        data: DataPlane,
        isr_updater: IsrUpdater,
        clock_ms: Callable[[], int],
    ) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.log = log
        self.view = view
        self.files = files
        self.logs = files.logs
        self.data = data
        self.isr_updater = isr_updater
        self.clock_ms = clock_ms
        self.leaders: dict[TopicPartition, LeaderState] = {}
        self._stale_leader_warned: set[tuple[TopicPartition, int]] = set()

    def resign(self, tp: TopicPartition) -> None:
        """This broker no longer leads `tp` (the image names another leader, or none)."""
        if tp in self.leaders:
            self.leaders.pop(tp).end()
            self.log.info("no longer leader", partition=f"{tp[0]}-{tp[1]}")

    def forget(self, tps: Collection[TopicPartition]) -> None:
        """These replicas are deleted: end their leaderships (releasing their parked
        fetches) and forget the warnings about them."""
        for tp in tps:
            st = self.leaders.pop(tp, None)
            if st is not None:
                st.end()
        self._stale_leader_warned = {k for k in self._stale_leader_warned if k[0] not in tps}

    def become_or_stay(self, p: PartitionState, now: int) -> bool:
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
            self.files.save(p.tp)
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

    def appended(self, p: PartitionState, st: LeaderState) -> None:
        """The leader appended a produced batch to `p`'s log: persist it, and advance the
        high watermark if the ISR allows (a lone ISR member commits at once). The parked
        fetches it wakes run after this returns: the records are written by then."""
        self.update_high_watermark(p, st, self.logs[p.tp])
        self.files.save(p.tp)
        st.moved()  # new records for the parked fetches

    def tick(self, now: int) -> None:
        """Advance high watermarks, check the ISRs."""
        image = self.view.image
        if image is None:
            return
        for tp, st in list(self.leaders.items()):
            p = image.partition(tp)
            if p is None:
                continue
            if self.update_high_watermark(p, st, self.logs[tp]):
                self.files.save(tp)
            self.maybe_alter_isr(tp, now)

    def update_high_watermark(self, p: PartitionState, st: LeaderState, log: ReplicaLog) -> bool:
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

    def maybe_alter_isr(self, tp: TopicPartition, now: int) -> None:
        image, st = self.view.image, self.leaders.get(tp)
        if image is not None and st is not None and not self.view.stopped:
            log = self.logs[tp]
            floor = join_floor(log.high_watermark, log.leader_epochs, st.leader_epoch)
            self.isr_updater.maybe_alter(image, tp, st, now, floor)

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
        if st.ended or self.view.stopped:
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
        image = self.view.image
        p = image.partition(tp) if image is not None else None
        current = self.leaders.get(tp)
        leads = (
            not self.view.stopped
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
        return self._answer(req, st.leader_epoch, self.logs[tp]), st

    def _answer(
        self, req: ReplicaFetchRequest, leader_epoch: int, log: ReplicaLog
    ) -> ReplicaFetchResponse:
        """The answer to a fetch that needs no truncation: the log from its fetch offset
        (chunks within the budget), whose end is the answer's `log_end_offset`. Records
        without bytes up to the LEO need no chunks (the follower copies the LEO, as from
        an older leader): a log without stored batches answers as before them."""
        leo = log.log_end_offset
        chunks: list[tuple[int, int, bytes | None]] = []
        if log.log_bytes:
            budget = fetch_bytes_budget(self.config, req.max_bytes)
            read = self.files.read((req.topic, req.partition), req.fetch_offset, leo, budget)
            if any(data is not None for _, _, data in read):
                chunks = list(read)
                leo = read[-1][0] + read[-1][1]
        return ReplicaFetchResponse(
            leader_epoch=leader_epoch,
            log_end_offset=leo,
            high_watermark=log.high_watermark,
            leader_epochs=list(log.leader_epochs),
            chunks=chunks,
        )

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
        if req.max_bytes < 0 or req.fetch_offset < 0:
            raise InvalidRequestError(
                f"max_bytes and fetch_offset must be >= 0, got {req.max_bytes}, {req.fetch_offset}"
            )
        image = self.view.image
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
        if self.update_high_watermark(p, st, log):
            self.files.save(tp)
        self.maybe_alter_isr(tp, now)
        return self._answer(req, p.leader_epoch, log)
