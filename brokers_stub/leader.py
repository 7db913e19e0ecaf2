"""The leader side of a partition's replication: its soft state, and the ISR changes it
asks the controller for.

`LeaderState` is what this broker knows of one partition it leads, for one leader epoch:
its followers' fetch positions, where its AlterPartition stands (in flight, accepted
but not yet in the image, or refused), and the event its parked (long-polled) fetches
wait on: the replica manager signals it when the log end, the high watermark or the
leadership moves.
`IsrUpdater` decides with `replication.isr_change` whether a led partition's ISR should
change (or its recovery be reported), at most one change in flight per partition, and
sends the changes it has queued as one batched AlterPartitions request at a time (as
Kafka's AlterPartitionManager does), recording each item's answer in its partition's
`LeaderState`. A broker back in a million ISRs sends 200 requests, not a million.

This module must not touch replica logs or files, nor follow the metadata log: the
replica manager hands it the caught-up image and the state of the partition it leads,
and owns the tasks it spawns.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from brokers_stub.config import BrokerConfig
from brokers_stub.logctx import BrokerLog
from brokers_stub.replication import FollowerFetchState, isr_change
from metactl.errors import (
    InvalidRequestError,
    InvalidUpdateVersionError,
    MetactlError,
    error_for_code,
)
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import LeaderRecoveryState
from protocol.client import RpcClient
from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.messages import broker_controller as wire
from protocol.messages.broker_controller import AlterPartition, AlterPartitions, IsrMember

ALTER_RETRY_MS = 1000
PENDING_MAX_MS = 10_000
MAX_ALTER_ITEMS = 5_000
"""Items per AlterPartitions request (the controller takes at most 10,000 and works
through them a work budget at a time); about 100 bytes each on the wire at RF 3."""
MAX_ALTER_BYTES = DEFAULT_MAX_FRAME_BYTES // 4
"""And at most this many bytes by `alter_item_bytes`'s estimate: long topic names and
wide ISRs (each member a broker id and epoch) stay well inside one frame."""


def alter_item_bytes(item: AlterPartition) -> int:
    """An upper estimate of an AlterPartitions item's encoded size: msgpack spends at
    most 9 bytes on an integer, an ISR member (a map of two named integers) at most 42,
    and the item's field names and headers are under 160 bytes."""
    return 160 + len(item.topic.encode()) + 48 * len(item.isr)


_Queued = tuple["LeaderState", AlterPartition, list[int]]  # state, item, ISR before it


@dataclass
class LeaderState:
    """Soft state of one partition this broker leads, for one leader epoch."""

    leader_epoch: int
    followers: dict[int, FollowerFetchState] = field(default_factory=dict)
    # The ISR of the AlterPartition in flight (None: none is): it counts in the high
    # watermark from the moment it is sent (Kafka's maximal ISR), as the controller may
    # commit it before the answer arrives.
    in_flight_isr: frozenset[int] | None = None
    # An accepted (or possibly committed) AlterPartition whose record the image has not
    # reached yet: its partition epoch and ISR, until `pending_until_ms` (stop waiting
    # then: the answer was never committed?).
    pending_partition_epoch: int | None = None
    pending_isr: frozenset[int] = frozenset()
    pending_until_ms: int = 0
    # A refused or failed AlterPartition: retry once the partition changes, or later.
    refused_at_partition_epoch: int | None = None
    retry_at_ms: int = 0
    # Long-polled fetches: the high watermark last sent to each follower (what it knows),
    # and the event their parked fetches wait on (see `moved`).
    hw_sent: dict[int, int] = field(default_factory=dict)
    ended: bool = False  # this leadership is over (new epoch, another leader, or stopping)
    parked: int = 0  # fetches held now
    _moved: asyncio.Event | None = field(default=None, repr=False, compare=False)

    @property
    def alter_in_flight(self) -> bool:
        return self.in_flight_isr is not None

    @property
    def accepted_isr(self) -> frozenset[int] | None:
        """The ISR of an accepted change the image has not shown yet, if any."""
        return self.pending_isr if self.pending_partition_epoch is not None else None

    @property
    def proposed_isr(self) -> frozenset[int]:
        """The ISRs proposed but not yet in the image: they count in the high watermark."""
        accepted = self.accepted_isr
        in_flight = self.in_flight_isr or frozenset()
        return in_flight if accepted is None else in_flight | accepted

    def await_change(self, partition_epoch: int, isr: Iterable[int], now_ms: int) -> None:
        """An AlterPartition to `isr` is (or may be) committed at `partition_epoch`."""
        self.pending_partition_epoch = partition_epoch
        self.pending_isr = frozenset(isr)
        self.pending_until_ms = now_ms + PENDING_MAX_MS

    def clear_pending(self) -> None:
        self.pending_partition_epoch, self.pending_isr = None, frozenset()

    def moved(self) -> None:
        """The log end, the high watermark or the leadership moved: wake every parked
        fetch of the partition (each checks whether it now has something to answer)."""
        event, self._moved = self._moved, None
        if event is not None:
            event.set()

    def end(self) -> None:
        """This leadership is over: release every parked fetch."""
        self.ended = True
        self.moved()

    async def until_moved(self) -> None:
        """Return at the next `moved` (or at once if the leadership has ended)."""
        if self.ended:
            return
        if self._moved is None:
            self._moved = asyncio.Event()
        await self._moved.wait()


class IsrUpdater:
    """Sends the AlterPartition requests of the partitions this broker leads."""

    def __init__(
        self,
        config: BrokerConfig,
        log: BrokerLog,
        *,
        broker_epoch: Callable[[], int | None],
        controller: RpcClient | None,
        clock_ms: Callable[[], int],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.log = log
        self.broker_epoch = broker_epoch
        self.controller = controller
        self.clock_ms = clock_ms
        self._spawn = spawn  # the replica manager's: it cancels them at stop
        self._in_flight: set[asyncio.Task[None]] = set()
        self._queue: deque[_Queued] = deque()  # decided, not yet sent
        self._sender: asyncio.Task[None] | None = None  # sends the queue, a batch at a time

    async def settled(self) -> None:
        """Return once every AlterPartition sent so far has been answered (or has failed).

        Lets a caller that has just driven the leader (a tick, a fetch) know that any
        request it decided on has reached the controller."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))  # never cancels them

    def maybe_alter(
        self, image: ClusterImage, tp: TopicPartition, st: LeaderState, now: int, join_floor: int
    ) -> None:
        """Send an AlterPartition if the ISR should change (or the partition still awaits
        the end of its recovery) and none is in flight or waiting to be seen. A follower
        joins only once its log reaches `join_floor` (`replication.join_floor`)."""
        epoch = self.broker_epoch()
        if epoch is None or st.alter_in_flight or self.controller is None:
            return
        p = image.partition(tp)
        if p is None or p.leader != self.broker_id:
            return
        if st.pending_partition_epoch is not None:
            if p.partition_epoch < st.pending_partition_epoch and now < st.pending_until_ms:
                return  # the accepted change is not in our image yet
            st.clear_pending()
        if st.refused_at_partition_epoch is not None:
            if p.partition_epoch == st.refused_at_partition_epoch and now < st.retry_at_ms:
                return
            st.refused_at_partition_epoch = None
        elif now < st.retry_at_ms:
            return
        target = isr_change(
            leader_id=self.broker_id,
            isr=p.isr,
            replicas=p.replicas,
            followers=st.followers,
            active_epochs=_active_epochs(image),
            now_ms=now,
            lag_max_ms=self.config.replica_lag_time_max_ms,
            join_floor=join_floor,
        )
        recovering = p.recovery_state is LeaderRecoveryState.RECOVERING
        if target is None and not recovering:
            return
        isr = target if target is not None else p.isr | {self.broker_id}
        members = [
            IsrMember(
                broker_id=b,
                broker_epoch=epoch if b == self.broker_id else image.brokers[b].epoch,
            )
            for b in sorted(isr)
        ]
        req = AlterPartition(
            topic=p.topic,
            partition=p.partition,
            leader=self.broker_id,
            broker_epoch=epoch,
            partition_epoch=p.partition_epoch,
            isr=members,
            leader_epoch=p.leader_epoch,
            recovered=True,  # the simulated log needs no recovery work
        )
        st.in_flight_isr = frozenset(isr)
        self._queue.append((st, req, sorted(p.isr)))
        if self._sender is None:
            task = self._sender = self._spawn(self._send_queued(), "alter-partitions")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            task.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        """A sender cancelled before its first step never ran its `finally`: drop the
        queue it was to send, as that `finally` would have."""
        if self._sender is task:
            self._sender = None
            self._drop_queue()

    def _drop_queue(self) -> None:
        for st, _, _ in self._queue:
            st.in_flight_isr = None
        self._queue.clear()

    def _next_batch(self) -> list[_Queued]:
        """Up to `MAX_ALTER_ITEMS` queued items and `MAX_ALTER_BYTES` (at least one item),
        leaving out those of a leadership that has ended and all but the newest item of a
        partition (a new leader epoch's state queued beside its predecessor's), which
        would only be refused."""
        batch: dict[tuple[str, int], _Queued] = {}
        size = 0
        while self._queue and len(batch) < MAX_ALTER_ITEMS:
            size += alter_item_bytes(self._queue[0][1])
            if batch and size > MAX_ALTER_BYTES:
                break
            st, req, _ = item = self._queue.popleft()
            key = (req.topic, req.partition)
            stale = batch.get(key)
            if stale is not None:
                stale[0].in_flight_isr = None
            if st.ended:
                st.in_flight_isr = None
                batch.pop(key, None)
                continue
            batch[key] = item
        return list(batch.values())

    async def _send_queued(self) -> None:
        """Send the queue, `MAX_ALTER_ITEMS` at a time, one request in flight: what is
        queued meanwhile goes in the next. Stopped (cancelled), the unsent items are
        dropped and their partitions free to decide again."""
        try:
            while self._queue:
                batch = self._next_batch()
                try:
                    if batch:
                        await self._alter_partitions(batch)
                finally:
                    for st, _, _ in batch:
                        st.in_flight_isr = None
        finally:
            # No await from the last look at the queue to here: an item queued after it
            # finds no sender and starts one.
            self._sender = None
            self._drop_queue()

    async def _alter_partitions(self, batch: list[_Queued]) -> None:
        assert self.controller is not None
        request = AlterPartitions(items=[req for _, req, _ in batch])
        try:
            resp = await self.controller.request(request, self.config.request_timeout_ms / 1000)
            if not isinstance(resp, wire.AlterPartitionsResponse) or len(resp.results) != len(
                batch
            ):
                raise InvalidRequestError(f"unexpected answer {type(resp).__name__}")
        except MetactlError as exc:
            # No answer (NETWORK_EXCEPTION, REQUEST_TIMED_OUT) or the whole request refused
            # (NOT_CONTROLLER after the client's retries, a storage failure): whether any
            # item was committed is unknown (the controller commits a request piece by
            # piece), so each proposed ISR keeps counting until the image moves past the
            # epoch it was proposed against.
            now = self.clock_ms()
            for st, req, _ in batch:
                self._outcome_unknown(st, req, now)
            self.log.warning(
                "AlterPartition failed; will retry",
                partition=_names(batch),
                partitions=len(batch),
                code=exc.code,
                error=exc.message,
            )
            return
        for (st, req, old_isr), result in zip(batch, resp.results, strict=True):
            if result.error_code is not None or result.view is None:
                code = result.error_code or "UNKNOWN_SERVER_ERROR"
                if code == InvalidUpdateVersionError.code or _retriable(code, result.message):
                    # A retriable error leaves the outcome unknown; INVALID_UPDATE_VERSION
                    # may be this very change, committed by an earlier try of the request
                    # (resent after NOT_CONTROLLER): keep counting it (maximal ISR).
                    self._outcome_unknown(st, req, self.clock_ms())
                self._refused(st, req, code, result.message)
                continue
            view = result.view
            st.await_change(view.partition_epoch, view.isr, self.clock_ms())
            self.log.info(
                "AlterPartition accepted",
                partition=f"{req.topic}-{req.partition}",
                old_isr=old_isr,
                proposed_isr=[m.broker_id for m in req.isr],
                isr=view.isr,
                partition_epoch=view.partition_epoch,
            )

    @staticmethod
    def _outcome_unknown(st: LeaderState, req: AlterPartition, now: int) -> None:
        st.await_change(req.partition_epoch + 1, [m.broker_id for m in req.isr], now)
        st.retry_at_ms = now + ALTER_RETRY_MS // 2

    def _refused(self, st: LeaderState, req: AlterPartition, code: str, message: str) -> None:
        """INVALID_UPDATE_VERSION, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
        INELIGIBLE_REPLICA, STALE_BROKER_EPOCH, INVALID_REQUEST: our view is behind.
        Re-evaluate once the metadata moves on (or after a pause)."""
        st.refused_at_partition_epoch = req.partition_epoch
        st.retry_at_ms = self.clock_ms() + ALTER_RETRY_MS
        self.log.info(
            "AlterPartition refused",
            partition=f"{req.topic}-{req.partition}",
            code=code,
            error=message,
        )


def _retriable(code: str, message: str) -> bool:
    return error_for_code(code, message).retriable


def _names(batch: list[_Queued], shown: int = 3) -> str:
    """The first partitions of a batch, for a log line."""
    names = [f"{req.topic}-{req.partition}" for _, req, _ in batch[:shown]]
    more = len(batch) - shown
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _active_epochs(image: ClusterImage) -> dict[int, int]:
    return {b.broker_id: b.epoch for b in image.brokers.values() if b.active}
