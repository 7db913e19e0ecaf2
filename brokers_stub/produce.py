"""The data plane of the partitions this broker leads: Produce (metactl's and Kafka's)
and ReadLog.

A batch of `count` records gets the consecutive offsets `[base, base+count)` in the
current leader epoch, and a record is identified by its (offset, leader epoch).
metactl's own producer sends a count and no bytes (`produce`); a Kafka client's batch
(`append_batch`) is stored as it came, stamped with its base offset and leader epoch
(`replica_log`), with Kafka's idempotent-producer checks. Both follow Kafka
(docs/protocol.md, "Client → broker"; docs/kafka.md):

- only the leader of the partition's current epoch accepts (else NOT_LEADER_OR_FOLLOWER);
- acks=1 is answered once the leader has appended (through the page cache);
- acks=all is refused with NOT_ENOUGH_REPLICAS while the ISR the leader knows (the
  image's, and an accepted change not yet in the image) is below MinISR; otherwise it is
  appended and answered once the high watermark covers it. It fails with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND when the committed ISR drops below MinISR first, with
  NOT_LEADER_OR_FOLLOWER when leadership moves first, and with REQUEST_TIMED_OUT after
  its timeout. Such a batch stays in the log and may still commit: it was not
  acknowledged, nothing more. A new leader epoch of the same leader, led on from the
  epoch just before (Kafka bumps the leader epoch when a reassignment removes a replica,
  and the leader stays), is no move: the batch is in the same log and goes on waiting
  (`ProduceWaiters.carry`); its answer names the epoch it was appended in.

Acknowledgements are never gated on fsync (Kafka relies on replication): flushing stays
the replica manager's business (`flush_interval_ms`, `flush_messages`).

`ProduceWaiters` holds the acks=all batches waiting for the high watermark, per
partition, sorted by end offset; the replica manager completes them where the high
watermark advances and fails them on metadata changes (`DataPlane.partition_changed`).
Nothing here polls.

This module owns the validation of data-plane requests, the append of a batch and the
waiters, and sees the replica manager only through `LedReplicas`. It must not make
replication decisions (`replication.py`), change the ISR
(`leader.py`), or write files itself (the replica manager persists after an append).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from brokers_stub.config import BrokerConfig
from brokers_stub.leader import LeaderState
from brokers_stub.replica_log import ReplicaLog
from metactl.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    MetactlError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from protocol.kafka.producer_state import ProducerStates
from protocol.kafka.records import read_header, stamp
from protocol.messages.data import (
    ACKS_ALL,
    ACKS_LEADER,
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
    ReadLogResponse,
)


class LedReplicas(Protocol):
    """What the data plane needs of the replicas it serves (`ReplicaManager`)."""

    config: BrokerConfig
    broker_id: int
    leaders: dict[TopicPartition, LeaderState]
    logs: dict[TopicPartition, ReplicaLog]

    @property
    def image(self) -> ClusterImage | None:
        """The latest caught-up image (None before the first)."""
        ...

    @property
    def stopped(self) -> bool: ...

    def appended(self, p: PartitionState, st: LeaderState) -> None:
        """Persist a batch appended to `p`'s log, and advance the high watermark."""
        ...


# --- pure checks -----------------------------------------------------------------------


def check_produce(req: ProduceRequest, *, max_batch_records: int) -> None:
    """Refuse a malformed batch before looking at the partition."""
    if req.acks not in (ACKS_ALL, ACKS_LEADER):
        raise InvalidRequestError(f"acks must be -1 (all) or 1, got {req.acks}")
    if req.count < 1:
        raise InvalidRequestError(f"a batch holds at least one record, got count={req.count}")
    if req.count > max_batch_records:
        raise MessageTooLargeError(
            f"a batch of {req.count} records exceeds the broker's {max_batch_records}-record limit"
        )
    if req.timeout_ms is not None and req.timeout_ms < 0:
        raise InvalidRequestError(f"timeout_ms must be >= 0, got {req.timeout_ms}")


def known_isr_size(isr: Iterable[int], pending_isr: Iterable[int] | None) -> int:
    """The ISR size an acks=all append is judged by: the committed ISR's, or the smaller
    one of an accepted change the image has not shown yet (a shrink on its way)."""
    size = len(frozenset(isr))
    return size if pending_isr is None else min(size, len(frozenset(pending_isr)))


# --- waiters ---------------------------------------------------------------------------


@dataclass(order=True)
class _Waiter:
    end_offset: int
    seq: int
    leader_epoch: int = field(compare=False)
    future: asyncio.Future[int] = field(compare=False)


class ProduceWaiters:
    """Per partition, the acks=all batches appended but not yet covered by the HW."""

    def __init__(self) -> None:
        self._by_tp: dict[TopicPartition, list[_Waiter]] = {}
        self._seq = 0

    def add(self, tp: TopicPartition, end_offset: int, leader_epoch: int) -> asyncio.Future[int]:
        """A future completed with the high watermark once it reaches `end_offset`."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._seq += 1
        waiter = _Waiter(end_offset, self._seq, leader_epoch, fut)
        bisect.insort(self._by_tp.setdefault(tp, []), waiter)
        return fut

    def discard(self, tp: TopicPartition, fut: asyncio.Future[int]) -> None:
        waiters = self._by_tp.get(tp)
        if waiters is None:
            return
        waiters[:] = [w for w in waiters if w.future is not fut]
        if not waiters:
            del self._by_tp[tp]

    def pending(self, tp: TopicPartition) -> int:
        return len(self._by_tp.get(tp, ()))

    def complete(self, tp: TopicPartition, high_watermark: int, leader_epoch: int) -> int:
        """Answer every batch of `leader_epoch` that `high_watermark` covers; how many."""
        waiters = self._by_tp.get(tp)
        if not waiters:
            return 0
        done = 0
        while waiters and waiters[0].end_offset <= high_watermark:
            w = waiters.pop(0)
            if w.future.done():
                continue
            if w.leader_epoch == leader_epoch:
                w.future.set_result(high_watermark)
            else:  # cannot happen: the manager fails or carries them on epoch changes
                w.future.set_exception(NotLeaderOrFollowerError("the leader epoch changed"))
            done += 1
        if not waiters:
            del self._by_tp[tp]
        return done

    def carry(self, tp: TopicPartition, from_epoch: int, to_epoch: int) -> int:
        """The leader led on from `from_epoch` into `to_epoch`, its log untouched: the
        batches of `from_epoch` wait on as batches of `to_epoch` (their records are in
        the log the new epoch's high watermark covers); how many."""
        carried = 0
        for w in self._by_tp.get(tp, ()):
            if w.leader_epoch == from_epoch:
                w.leader_epoch = to_epoch
                carried += 1
        return carried

    def fail(
        self,
        tp: TopicPartition,
        error: Callable[[], MetactlError],
        *,
        keep_epoch: int | None = None,
    ) -> int:
        """Fail the partition's waiting batches (those of another epoch than `keep_epoch`,
        if given); how many."""
        waiters = self._by_tp.get(tp)
        if not waiters:
            return 0
        kept = []
        failed = 0
        for w in waiters:
            if keep_epoch is not None and w.leader_epoch == keep_epoch:
                kept.append(w)
            elif not w.future.done():
                w.future.set_exception(error())
                failed += 1
        if kept:
            self._by_tp[tp] = kept
        else:
            del self._by_tp[tp]
        return failed

    def fail_all(self, error: Callable[[], MetactlError]) -> None:
        for tp in list(self._by_tp):
            self.fail(tp, error)

    def partitions(self) -> list[TopicPartition]:
        return list(self._by_tp)


# --- the data plane --------------------------------------------------------------------


class DataPlane:
    """Produce and ReadLog for one broker, over its replica manager's state."""

    def __init__(self, manager: LedReplicas) -> None:
        self.m = manager
        self.waiters = ProduceWaiters()
        # Idempotent producers' state per led partition, and the leadership it is of.
        self._producers: dict[TopicPartition, tuple[LeaderState, ProducerStates]] = {}

    def led(self, topic: str, partition: int) -> tuple[PartitionState, LeaderState, ReplicaLog]:
        """The partition, its leader state and log, if this broker leads it now."""
        m = self.m
        image = m.image
        if image is None or m.stopped:
            raise NotLeaderOrFollowerError(f"broker {m.broker_id} leads nothing now")
        p = image.partition((topic, partition))
        if p is None:
            raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
        st = m.leaders.get(p.tp)
        if p.leader != m.broker_id or st is None or st.leader_epoch != p.leader_epoch:
            raise NotLeaderOrFollowerError(
                f"broker {m.broker_id} does not lead {topic}-{partition}"
                + (f" (leader: {p.leader})" if p.leader >= 0 else " (no leader)")
            )
        return p, st, m.logs[p.tp]

    async def produce(self, req: ProduceRequest) -> ProduceResponse:
        m = self.m
        check_produce(req, max_batch_records=m.config.max_batch_records)
        p, st, log = self.led(req.topic, req.partition)
        if req.acks == ACKS_ALL:
            self._check_min_isr(p, st, log)
        base = log.log_end_offset
        end = base + req.count
        log.append(req.count)
        m.appended(p, st)  # persists, and may advance the HW (answering waiters)
        hw = log.high_watermark
        if req.acks == ACKS_ALL:
            hw = await self._await_commit(p, st, log, base=base, end=end, timeout_ms=req.timeout_ms)
        return ProduceResponse(
            topic=req.topic,
            partition=req.partition,
            base_offset=base,
            count=req.count,
            leader_epoch=st.leader_epoch,
            high_watermark=hw,
        )

    async def append_batch(
        self, topic: str, partition: int, data: bytes, *, acks: int, timeout_ms: int
    ) -> int:
        """Kafka's Produce of one partition: append one validated record batch (magic 2,
        `protocol.kafka.records.validate_produce_records`), stamped with its base offset
        and the leader epoch, and answer its base offset: at once for acks 0 and 1, once
        committed for acks=all (-1), with the errors of `produce`.

        An idempotent producer's batch is checked against the partition's producer state
        first (`ProducerStates`, rebuilt from the log's batches at each new leadership,
        so a new leader dedupes what its predecessor appended): a duplicate of one of its
        last five batches appends nothing and answers the original base offset (once
        committed, for acks=all); a gap or an old epoch is refused."""
        header = read_header(data)
        if header is None:  # the caller validated it: a bug
            raise InvalidRequestError("a record batch shorter than its header")
        p, st, log = self.led(topic, partition)
        if acks == ACKS_ALL:
            self._check_min_isr(p, st, log)
        producers = self._producer_states(p.tp, st, log) if header.idempotent else None
        duplicate = producers.check(header) if producers is not None else None
        if duplicate is not None:
            base, end = duplicate.base_offset, duplicate.last_offset + 1
        else:
            base = log.log_end_offset
            stamped = stamp(data, base, st.leader_epoch)
            end = base + header.last_offset_delta + 1
            log.append(end - base, stamped)
            if producers is not None:
                producers.update(replace(header, base_offset=base))
            self.m.appended(p, st)  # persists, and may advance the HW (answering waiters)
        if acks == ACKS_ALL and log.high_watermark < end:
            await self._await_commit(p, st, log, base=base, end=end, timeout_ms=timeout_ms)
        return base

    def _producer_states(
        self, tp: TopicPartition, st: LeaderState, log: ReplicaLog
    ) -> ProducerStates:
        """The idempotent producers' state of a led partition, for this leadership."""
        cached = self._producers.get(tp)
        if cached is not None and cached[0] is st:
            return cached[1]
        states = ProducerStates.from_batches(log.batches())
        self._producers[tp] = (st, states)
        return states

    def _check_min_isr(self, p: PartitionState, st: LeaderState, log: ReplicaLog) -> None:
        size = known_isr_size(p.isr, st.accepted_isr)
        if size < p.min_isr:
            raise NotEnoughReplicasError(
                f"{log.name}: the ISR has {size} member(s), min.insync.replicas is {p.min_isr}"
            )

    async def _await_commit(
        self,
        p: PartitionState,
        st: LeaderState,
        log: ReplicaLog,
        *,
        base: int,
        end: int,
        timeout_ms: int | None,
    ) -> int:
        """The high watermark once it covers `end` (offsets `base`..`end - 1`, appended in
        this leadership), or the error of what came first (see the module docstring)."""
        if log.high_watermark >= end:
            return log.high_watermark
        fut = self.waiters.add(p.tp, end, st.leader_epoch)
        timeout_ms = timeout_ms if timeout_ms is not None else self.m.config.request_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await fut
        except TimeoutError:
            raise RequestTimedOutError(
                f"{log.name}: offsets {base}..{end - 1} not committed within {timeout_ms} ms "
                f"(high watermark {log.high_watermark})"
            ) from None
        finally:
            self.waiters.discard(p.tp, fut)

    def high_watermark_advanced(self, tp: TopicPartition, hw: int, leader_epoch: int) -> None:
        self.waiters.complete(tp, hw, leader_epoch)

    def partition_changed(self, p: PartitionState, st: LeaderState | None) -> None:
        """The metadata moved for a partition of ours: `st` is its leader state if this
        broker (still) leads it. Fail what can no longer commit as asked."""
        tp = p.tp
        if st is None:
            self._producers.pop(tp, None)
            self.waiters.fail(
                tp,
                lambda: NotLeaderOrFollowerError(
                    f"broker {self.m.broker_id} lost the leadership of {p.topic}-{p.partition}"
                ),
            )
            return
        self.waiters.fail(
            tp,
            lambda: NotLeaderOrFollowerError(f"the leader epoch of {p.topic}-{p.partition} moved"),
            keep_epoch=st.leader_epoch,
        )
        if len(p.isr) < p.min_isr:
            self.waiters.fail(
                tp,
                lambda: NotEnoughReplicasAfterAppendError(
                    f"{p.topic}-{p.partition}: the ISR shrank to {sorted(p.isr)}, below "
                    f"min.insync.replicas {p.min_isr}, before the batch committed"
                ),
            )

    def stop(self) -> None:
        self._producers.clear()
        self.waiters.fail_all(lambda: NotLeaderOrFollowerError("the broker is stopping"))

    def read_log(self, req: ReadLogRequest) -> ReadLogResponse:
        _, st, log = self.led(req.topic, req.partition)
        hw = log.high_watermark
        return ReadLogResponse(
            topic=req.topic,
            partition=req.partition,
            leader_epoch=st.leader_epoch,
            high_watermark=hw,
            log_end_offset=log.log_end_offset,
            leader_epochs=[(e, s) for e, s in log.leader_epochs if s < hw],
        )
