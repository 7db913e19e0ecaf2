"""The data plane of ``metactl simulate faults``: the network and the brokers' replication.

`Cluster` holds the state of one simulated run (the event heap, the network's cuts, the
brokers and their `ReplicaLog`s, the oracle's acknowledged records) and runs what the
brokers do between controller requests, with the real decisions of
`brokers_stub.replication` (divergence, truncation, caught-up tracking, high watermark,
ISR changes) on `brokers_stub.replica_log.ReplicaLog`s:

* the network delays each message by 1..max_delay_ms (so messages reorder), drops it at
  random, and drops it when its link is cut or either end's process has died since;
* brokers follow the controller's image (pushed on every commit and with every
  heartbeat answer), lead and follow what it says once they have caught up with their
  own registration, fetch every tick, and ask for ISR changes with AlterPartition. An
  ISR addition counts in the high watermark from the moment it is asked (Kafka's maximal
  ISR), and a follower joins only if its log reaches the leader's high watermark and
  the start of its epoch (`replication.join_floor`, Kafka's isFollowerInSync);
* replicas come and go with the image (`_sync_logs`, once a broker has caught up with
  its own registration): a broker holds a log for exactly the partitions whose replicas
  name it, of the topic id the image names. A new replica (a reassignment's adding
  replica, an added partition, a re-created topic) starts empty and gets records only
  by fetching them from its leader; a replica that leaves the assignment (a completed
  or cancelled reassignment) or whose topic is deleted or has another id now is deleted
  with its data. Every message about a partition (produce, fetch and its answer, an
  AlterPartition's answer, a log inspection's answer) names the topic id it was meant
  for, and one that meets a log of another id is dropped, so a re-created topic never
  gets its predecessor's records;
* producers with acks=all: a leader appends a batch only while the ISR it knows has at
  least MinISR members, and acknowledges it once its high watermark covers it; every
  acknowledged record (topic id, partition, offsets, leader epoch) goes to the oracle
  with the sequence number of the event that acknowledged it. A producer per partition
  name keeps producing across deletes and re-creates, to whatever topic the name
  denotes when it refreshes its metadata: on an error, when its metadata names no
  leader, and at least every `METADATA_REFRESH_MS` (a batch to a leader that is cut off
  or dead is lost without an answer; the request timeout makes a producer refresh).

The controller side is `simulation.faults_controller.ControllerSide`'s, the faults
`simulation.faults_sim.FaultSim`'s and the verdict `simulation.faults_verdict`'s.
This module must not call the controller step itself, change `brokers_stub` (it imports
only its pure modules), read the clock, or iterate a set or dict in hash order where
the order matters.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any, Final

from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replication import (
    FollowerFetchState,
    divergence,
    follower_truncation,
    isr_change,
    join_floor,
    next_high_watermark,
    record_fetch,
)
from controller.core.step import ControllerState, Event
from metactl.errors import MetactlError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import (
    NO_LEADER,
    LeaderRecoveryState,
)
from protocol.messages.broker_controller import AlterPartition, IsrMember, PartitionView
from simulation.faults_schedule import Mode, Schedule

CONTROLLER: Final = 0
PRODUCER: Final = -1
TOPIC: Final = "events"  # the topic the producers write to (deleted and re-created by ops)

TICK_MS: Final = 250  # broker replication tick: fetches, ISR checks
PRODUCE_MS: Final = 200  # one batch per partition per interval
# Producers refresh their metadata at least this often: a batch sent to a leader that is
# cut off or dead is lost without an answer, and a producer's request timeout makes it
# refresh (request.timeout.ms, scaled down with the run like the lag time below).
METADATA_REFRESH_MS: Final = 2_000
LAG_MAX_MS: Final = 3_000  # replica.lag.time.max.ms, scaled down with the run
RETRY_MS: Final = 1_000  # registration, AlterPartition and shutdown retries
ANSWER_TIMEOUT_MS: Final = 3_000  # an unanswered AlterPartition is sent again
SHUTDOWN_TIMEOUT_MS: Final = 5_000  # a controlled shutdown stops then regardless
SESSION_CHECK_MS: Final = 1_000

# AlterPartition refusals that mean the partition moved on: the metadata will tell.
_MOVED: Final = frozenset(
    {"INVALID_UPDATE_VERSION", "FENCED_LEADER_EPOCH", "NOT_LEADER_OR_FOLLOWER"}
)


class _Lead:
    """A broker's soft state for one partition it leads, in one leader epoch (of one
    topic id: a new log starts a new one)."""

    __slots__ = ("acks", "epoch", "followers", "pending", "req_pe", "retry_ms", "sent_ms")

    def __init__(self, epoch: int, followers: dict[int, FollowerFetchState]) -> None:
        self.epoch = epoch
        self.followers = followers
        self.acks: list[tuple[int, int]] = []  # appended batches awaiting the HW
        self.req_pe: int | None = None  # partition epoch of the unresolved AlterPartition
        self.pending: frozenset[int] = frozenset()  # its ISR, counted in the HW meanwhile
        self.sent_ms: int | None = None  # when it left, while unanswered
        self.retry_ms = 0


class _Broker:
    __slots__ = (
        "active_epochs",
        "clean_file",
        "epoch",
        "fetching",
        "id",
        "inc",
        "last_epoch",
        "leaders",
        "logs",
        "stopping",
        "topic_ids",
        "up",
        "view",
    )

    def __init__(self, broker_id: int) -> None:
        self.id = broker_id
        self.up = False
        self.inc = 0  # process incarnation: timers and answers of older ones are void
        self.epoch: int | None = None  # broker epoch of this incarnation's registration
        self.last_epoch: int | None = None  # the last epoch it ever had (for mutant a)
        self.clean_file: int | None = None  # the clean-shutdown file's epoch
        self.logs: dict[TopicPartition, ReplicaLog] = {}  # the replicas it hosts
        self.topic_ids: dict[TopicPartition, str] = {}  # the topic id of each log
        self.view: ClusterImage | None = None
        self.active_epochs: dict[int, int] = {}
        self.leaders: dict[TopicPartition, _Lead] = {}
        self.fetching: dict[TopicPartition, int] = {}  # outstanding fetch -> sent at
        self.stopping: int | None = None  # controlled shutdown started at


class Cluster:
    """The run's state, the event heap, the network and the brokers' data plane."""

    core: ControllerState  # the controller's state, which FaultSim steps

    def __init__(self, schedule: Schedule, mode: Mode) -> None:
        self.s = schedule
        self.mode = mode
        self.rnd = random.Random(f"metactl-faults-run:{schedule.seed}")
        self.now = 0
        self.seq = 0  # how many events have been processed: orders acks and reports
        self.queue: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self.order = itertools.count()
        self.cuts: dict[tuple[int, int], int] = {}
        self.healed = False  # the fault window is over: no cuts, no loss, no producing
        self.drop = schedule.drop
        self.brokers = {b: _Broker(b) for b in range(1, schedule.brokers + 1)}
        self.producer_view = ClusterImage()  # the producers' metadata
        self.producer_view_ms = 0  # when they last refreshed it
        self.producing: set[TopicPartition] = set()  # partition names with a producer
        # The oracle: topic id, partition, start, end, leader epoch, event sequence number.
        self.acked: list[tuple[str, TopicPartition, int, int, int, int]] = []
        # The active controller: whether one is (a failover leaves none for a while), and
        # its incarnation (messages to or from an earlier one are gone with it).
        self.ctl_up = True
        self.ctl_inc = 0

    # --- the event loop ------------------------------------------------------------------

    def at(self, when: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self.queue, (max(when, self.now), next(self.order), fn, arg))

    # --- the network ---------------------------------------------------------------------

    def _blocked(self, a: int, b: int) -> bool:
        return self.cuts.get((a, b) if a < b else (b, a), 0) > 0

    def send(self, src: int, dst: int, fn: Callable[[Any], None], arg: Any) -> None:
        """Deliver `fn(arg)` at `dst` after a random delay, unless lost or cut off. A
        message goes from one process incarnation (a broker's, or the active controller's)
        to another: when either end has died meanwhile, the connection is gone and so is
        the message."""
        if self._blocked(src, dst) or (self.drop and self.rnd.random() < self.drop):
            return
        brokers = self.brokers
        src_inc = brokers[src].inc if src > 0 else self.ctl_inc if src == CONTROLLER else 0
        dst_inc = brokers[dst].inc if dst > 0 else self.ctl_inc if dst == CONTROLLER else 0
        delay = 1 + int(self.rnd.random() * self.s.max_delay_ms)
        self.at(self.now + delay, self._deliver, (src, src_inc, dst, dst_inc, fn, arg))

    def _deliver(self, msg: tuple[int, int, int, int, Callable[[Any], None], Any]) -> None:
        src, src_inc, dst, dst_inc, fn, arg = msg
        if self._blocked(src, dst):
            return
        for node, inc in ((src, src_inc), (dst, dst_inc)):
            if node > 0:
                b = self.brokers[node]
                if not b.up or b.inc != inc:
                    return
            elif node == CONTROLLER and (not self.ctl_up or self.ctl_inc != inc):
                return
        fn(arg)

    def _cut(self, pairs: list[tuple[int, int]], delta: int) -> None:
        if self.healed:
            return
        for a, b in pairs:
            key = (a, b) if a < b else (b, a)
            self.cuts[key] = self.cuts.get(key, 0) + delta

    # --- requests to the controller -------------------------------------------------------

    def _ctl_request(self, msg: tuple[int, Event, Callable[[Any], None] | None]) -> None:
        raise NotImplementedError  # the controller side: FaultSim

    def to_controller(
        self, b: _Broker, event: Event, reply: Callable[[Any], None] | None = None
    ) -> None:
        self.send(b.id, CONTROLLER, self._ctl_request, (b.id, event, reply))

    # --- broker processes -----------------------------------------------------------------

    def _alive(self, key: tuple[int, int]) -> _Broker | None:
        b = self.brokers[key[0]]
        return b if b.up and b.inc == key[1] else None

    # --- metadata on the broker ------------------------------------------------------------

    def _on_image(self, arg: tuple[int, ClusterImage]) -> None:
        bid, image = arg
        b = self.brokers[bid]
        if not b.up or (b.view is not None and image.end_offset <= b.view.end_offset):
            return
        b.view = image
        b.active_epochs = {x.broker_id: x.epoch for x in image.brokers.values() if x.active}
        self._roles(b)

    def _roles(self, b: _Broker) -> None:
        """Host the replicas the image names; lead what it says we lead, stop leading
        the rest."""
        image = b.view
        if b.epoch is None or image is None or image.end_offset <= b.epoch:
            return  # not caught up with our own registration: old images name old roles
        self._sync_logs(b, image)
        for tp in sorted(b.logs):
            if image.partitions[tp].leader == b.id:
                self._lead(b, tp)
            else:
                b.leaders.pop(tp, None)

    def _sync_logs(self, b: _Broker, image: ClusterImage) -> None:
        """Delete the logs the image no longer names on this broker (a deleted topic, a
        topic id that changed, a replica moved away) with their data; create an empty log
        for every replica it names that has none (it fills by fetching)."""
        for tp in sorted(b.logs):
            p = image.partition(tp)
            t = image.topics.get(tp[0])
            if p is None or t is None or t.topic_id != b.topic_ids[tp] or b.id not in p.replicas:
                del b.logs[tp], b.topic_ids[tp]
                b.leaders.pop(tp, None)
                b.fetching.pop(tp, None)
        for p in image.partitions_of(b.id):
            if p.tp not in b.logs:
                b.logs[p.tp] = ReplicaLog(topic=p.topic, partition=p.partition)
                b.topic_ids[p.tp] = image.topics[p.topic].topic_id

    def current_log(self, b: _Broker, tp: TopicPartition, topic_id: str) -> ReplicaLog | None:
        """The broker's log of `tp` if it is of `topic_id` (else the message is stale)."""
        return b.logs.get(tp) if b.topic_ids.get(tp) == topic_id else None

    def _lead(self, b: _Broker, tp: TopicPartition) -> None:
        assert b.view is not None
        p = b.view.partitions[tp]
        log = b.logs[tp]
        if p.leader_epoch < log.last_leader_epoch:
            b.leaders.pop(tp, None)
            return  # our history knows a newer epoch than this image
        st = b.leaders.get(tp)
        if st is None or st.epoch != p.leader_epoch:
            log.assign_epoch(p.leader_epoch)
            # Kafka: the ISR members start caught up as of now; others must prove it.
            start = FollowerFetchState(last_caught_up_ms=self.now)
            followers = {r: start for r in p.isr if r != b.id}
            b.leaders[tp] = st = _Lead(p.leader_epoch, followers)
        else:
            for r in sorted(p.isr):
                if r != b.id and r not in st.followers:
                    st.followers[r] = FollowerFetchState(last_caught_up_ms=self.now)
            if st.req_pe is not None and p.partition_epoch > st.req_pe:
                st.req_pe, st.pending, st.sent_ms = None, frozenset(), None
        self._advance_hw(b, tp, st)

    # --- the leader ------------------------------------------------------------------------

    def _advance_hw(self, b: _Broker, tp: TopicPartition, st: _Lead) -> None:
        assert b.view is not None
        p = b.view.partitions[tp]
        log = b.logs[tp]
        hw = next_high_watermark(
            current_hw=log.high_watermark,
            leader_id=b.id,
            leader_leo=log.log_end_offset,
            isr=p.isr,
            min_isr=1 if self.mode.hw_ignores_min_isr else p.min_isr,
            follower_offsets={r: f.fetch_offset for r, f in st.followers.items()},
            pending_isr=st.pending,
        )
        if not log.advance_high_watermark(hw) or not st.acks:
            return
        hw = log.high_watermark
        done = [a for a in st.acks if a[1] <= hw]
        if done:
            st.acks = [a for a in st.acks if a[1] > hw]
            topic_id = b.topic_ids[tp]
            for start, end in done:
                self.acked.append((topic_id, tp, start, end, st.epoch, self.seq))

    def start_producers(self, image: ClusterImage) -> None:
        """A producer for every partition name of `image` that has none yet (a created
        topic, added partitions); it outlives deletes and re-creates of its topic."""
        for t in sorted(image.topics):
            for i in range(image.topics[t].partitions):
                tp = (t, i)
                if tp not in self.producing:
                    self.producing.add(tp)
                    self.at(self.now + self.rnd.randrange(PRODUCE_MS), self._produce_tick, tp)

    def refresh_producers(self) -> None:
        """The producers fetch metadata (from the controller's image, as a broker with
        current metadata would answer)."""
        self.producer_view, self.producer_view_ms = self.core.image, self.now

    def _produce_tick(self, tp: TopicPartition) -> None:
        if self.healed:
            return
        self.at(self.now + PRODUCE_MS, self._produce_tick, tp)
        if self.now - self.producer_view_ms >= METADATA_REFRESH_MS:
            self.refresh_producers()
        view = self.producer_view
        p = view.partition(tp)
        if p is None or p.leader == NO_LEADER:
            self.refresh_producers()
            return
        topic_id = view.topics[tp[0]].topic_id
        count = self.rnd.randint(1, 3)
        self.send(PRODUCER, p.leader, self._on_produce, (p.leader, tp, topic_id, count))

    def _on_produce(self, arg: tuple[int, TopicPartition, str, int]) -> None:
        bid, tp, topic_id, count = arg
        b = self.brokers[bid]
        st = b.leaders.get(tp)
        if st is None or b.view is None or self.current_log(b, tp, topic_id) is None:
            self.refresh_producers()  # NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_ID
            return
        p = b.view.partitions[tp]
        if len(p.isr) < p.min_isr:
            return  # NOT_ENOUGH_REPLICAS
        log = b.logs[tp]
        start = log.log_end_offset
        log.append(count)
        st.acks.append((start, start + count))
        self._advance_hw(b, tp, st)

    def _maybe_alter(self, b: _Broker, tp: TopicPartition, st: _Lead) -> None:
        assert b.view is not None and b.epoch is not None
        p = b.view.partitions[tp]
        if st.req_pe is not None:
            if st.sent_ms is None or self.now - st.sent_ms < ANSWER_TIMEOUT_MS:
                return  # answered (the metadata will tell), or still in flight
        elif self.now < st.retry_ms:
            return
        target = isr_change(
            leader_id=b.id,
            isr=p.isr,
            replicas=p.replicas,
            followers=st.followers,
            active_epochs=b.active_epochs,
            now_ms=self.now,
            lag_max_ms=LAG_MAX_MS,
            join_floor=self._join_floor(b, tp, st),
        )
        recovering = p.recovery_state is LeaderRecoveryState.RECOVERING
        if target is None and not recovering:
            return
        isr = target if target is not None else p.isr | {b.id}
        epochs = b.active_epochs
        members = [
            IsrMember(broker_id=r, broker_epoch=b.epoch if r == b.id else epochs.get(r, -1))
            for r in sorted(isr)
        ]
        req = AlterPartition(
            topic=tp[0],
            partition=tp[1],
            leader=b.id,
            broker_epoch=b.epoch,
            partition_epoch=p.partition_epoch,
            isr=members,
            leader_epoch=p.leader_epoch,
            recovered=True,
        )
        # Kafka's maximal ISR: additions count in the HW from the moment they are asked.
        st.req_pe, st.pending, st.sent_ms = p.partition_epoch, isr, self.now
        key = (b.topic_ids[tp], st.epoch, p.partition_epoch)
        self.to_controller(b, req, lambda resp: self._altered(b, tp, key, resp))

    def _join_floor(self, b: _Broker, tp: TopicPartition, st: _Lead) -> int:
        if self.mode.isr_join_ignores_hw:
            return 0  # the mutant: caught up at the last fetch is enough
        log = b.logs[tp]
        return join_floor(log.high_watermark, log.leader_epochs, st.epoch)

    def _altered(
        self, b: _Broker, tp: TopicPartition, key: tuple[str, int, int], resp: Any
    ) -> None:
        st = b.leaders.get(tp)
        if st is None or (b.topic_ids.get(tp), st.epoch, st.req_pe) != key:
            return
        st.sent_ms = None
        if isinstance(resp, PartitionView):
            st.pending = st.pending | frozenset(resp.isr)
        elif isinstance(resp, MetactlError) and resp.code not in _MOVED:
            st.req_pe, st.pending, st.retry_ms = None, frozenset(), self.now + RETRY_MS

    # --- replication ticks, fetches ------------------------------------------------------------

    def _broker_tick(self, key: tuple[int, int]) -> None:
        b = self._alive(key)
        if b is None:
            return
        self.at(self.now + TICK_MS, self._broker_tick, key)
        view = b.view
        if b.epoch is None or view is None or view.end_offset <= b.epoch:
            return
        for tp in sorted(b.logs):
            log = b.logs[tp]
            st = b.leaders.get(tp)
            if st is not None:
                self._maybe_alter(b, tp, st)
                continue
            p = view.partitions[tp]
            if p.leader in (NO_LEADER, b.id):
                continue
            sent = b.fetching.get(tp)
            if sent is not None and self.now - sent < RETRY_MS:
                continue
            b.fetching[tp] = self.now
            fetch = (
                b.id,
                b.epoch,
                b.topic_ids[tp],
                tp,
                p.leader_epoch,
                log.log_end_offset,
                log.last_fetched_epoch,
            )
            self.send(b.id, p.leader, self._on_fetch, (p.leader, fetch))

    def _on_fetch(
        self, arg: tuple[int, tuple[int, int, str, TopicPartition, int, int, int]]
    ) -> None:
        lid, (fid, f_epoch, topic_id, tp, leader_epoch, offset, last_epoch) = arg
        leader = self.brokers[lid]
        st = leader.leaders.get(tp)
        log = self.current_log(leader, tp, topic_id)
        if st is None or st.epoch != leader_epoch or log is None or leader.view is None:
            return  # NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH: the follower refreshes
        if fid not in leader.view.partitions[tp].replicas:
            return  # not a replica (any more, or not yet as far as the leader knows)
        history = list(log.leader_epochs)
        truncate_to = divergence(history, log.log_end_offset, last_epoch, offset)
        if truncate_to is None:
            st.followers[fid] = record_fetch(
                st.followers.get(fid),
                broker_epoch=f_epoch,
                fetch_offset=offset,
                leader_leo=log.log_end_offset,
                now_ms=self.now,
            )
            self._advance_hw(leader, tp, st)
            self._maybe_alter(leader, tp, st)
        answer = (
            fid,
            topic_id,
            tp,
            leader_epoch,
            offset,
            history,
            log.log_end_offset,
            log.high_watermark,
        )
        self.send(lid, fid, self._on_fetched, (answer, truncate_to))

    def _on_fetched(self, arg: tuple[tuple[Any, ...], int | None]) -> None:
        (fid, topic_id, tp, leader_epoch, sent_offset, history, leo, hw), truncate_to = arg
        b = self.brokers[fid]
        log = self.current_log(b, tp, topic_id)
        if log is None:
            return  # the replica was deleted (or is of another topic id) meanwhile
        b.fetching.pop(tp, None)
        p = None if b.view is None else b.view.partition(tp)
        if p is None or tp in b.leaders or p.leader_epoch != leader_epoch:
            return
        if log.log_end_offset != sent_offset:
            return  # the log changed while the fetch was out: ask again
        if truncate_to is not None:
            point = follower_truncation(
                log.leader_epochs, log.log_end_offset, history, leo, truncate_to
            )
            log.truncate_to(point)
            return
        log.copy_from_leader(history, leo)
        log.advance_high_watermark(hw)
