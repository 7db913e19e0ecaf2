"""Follower fetching: one `Fetcher` per leader this broker follows partitions from.

A ReplicaFetch names one partition and a connection carries one request at a time, so a
`Fetcher` runs *lanes*, each a connection to the leader and a task fetching over it:

- a lane of its own for each of the first `replica_fetch_sessions_max` partitions it
  follows from that leader, which long-polls: its fetch carries `max_wait_ms`
  (`BrokerConfig.fetch_wait_ms`, Kafka's replica.fetch.wait.max.ms), so the leader holds
  it until it has something new for the follower (records, a higher high watermark, a
  leadership change) or the wait ends. An answer that changed the replica is followed by
  the next fetch at once: that fetch carries the new log end to the leader (advancing its
  high watermark), and its answer carries the high watermark back;
- one shared lane for any partitions beyond that, fetching each in turn without waiting
  on the leader (`max_wait_ms` 0), one round every `fetch_interval_ms` unless a round
  changed something.

A fetch asks for at most `REPLICA_FETCH_MAX_BYTES` of record batches (Kafka's
replica.fetch.max.bytes, within half the frame limit: the leader sends the first batch
whatever its size).

A fetch names the partition's leader epoch as this broker's image shows it
(`current_leader_epoch`), as Kafka's followers do. A leader at a newer epoch refuses it
with FENCED_LEADER_EPOCH: the partition is then not fetched again until this broker's
image shows another leader epoch for it (a lane whose partitions are all fenced waits
for the next image, `FetchHost.until_image_moved`; nothing polls). The new image
either names the new epoch, and fetching resumes in it, or no longer lists this broker
among the replicas (a reassignment removed it), and the replica manager deletes the
replica and closes its lane. A leader at an older epoch (its metadata is behind) refuses
with UNKNOWN_LEADER_EPOCH: the partition is fetched again after the pause below, as
Kafka's fetcher backs off, since only the leader's metadata has to move. Neither refusal
changes the replica: it is no progress, and nothing is truncated.

A lane pauses after an answer that changed nothing and came sooner than
`fetch_interval_ms` (a refusal, or a leader that does not long-poll), and backs off while
the leader is unreachable. Each answer that still matches the partition's leadership
goes to `FetchHost.apply_fetch_response` (the replica manager's follower side).

This module owns the fetch loops and their connections only, and sees the replica
manager only through `FetchHost`, the few things a fetch needs. It must not change a
replica log itself (the replica manager applies answers and writes files), nor decide
which leaders to fetch from (`follower_side.FollowerSide` hands each `Fetcher` its
partitions as the image moves, and cancels the lanes through it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from brokers_stub.config import BrokerConfig
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_log import ReplicaLog
from metactl.errors import FencedLeaderEpochError, MetactlError, NetworkError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from protocol.client import RpcClient
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse
from protocol.tls import broker_principal

REPLICA_FETCH_MAX_BYTES = 1048576  # Kafka's replica.fetch.max.bytes default


class FetchHost(Protocol):
    """What the fetch loops need of the replicas they fetch for (`ReplicaManager`)."""

    config: BrokerConfig
    broker_id: int
    log: BrokerLog
    logs: dict[TopicPartition, ReplicaLog]
    broker_epoch: Callable[[], int | None]

    @property
    def image(self) -> ClusterImage | None:
        """The latest caught-up image (None before the first)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...

    async def until_image_moved(self) -> None: ...

    def apply_fetch_response(
        self,
        tp: TopicPartition,
        sent_offset: int,
        resp: ReplicaFetchResponse,
        fetched_for: ReplicaLog | None = None,
    ) -> bool: ...


class Fetcher:
    """The lanes fetching, from one leader, the partitions this broker follows from it."""

    def __init__(self, manager: FetchHost, leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.lanes: dict[TopicPartition, FetchLane] = {}  # long-polling, one partition each
        self.shared: FetchLane | None = None  # the partitions beyond the cap, polled
        self.unreachable = False  # a lane failed to reach the leader (logged once)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch exactly these partitions from now on: a lane for each new one while
        there is room, and the rest on the shared lane (a partition keeps its lane)."""
        wanted = set(partitions)
        for tp in [tp for tp in self.lanes if tp not in wanted]:
            self.lanes.pop(tp).close()
        room = self.manager.config.replica_fetch_sessions_max - len(self.lanes)
        rest: list[TopicPartition] = []
        for tp in sorted(wanted - self.lanes.keys()):
            if room > 0:
                self.lanes[tp] = FetchLane(self, [tp], long_poll=True)
                room -= 1
            else:
                rest.append(tp)
        if not rest:
            if self.shared is not None:
                self.shared.close()
                self.shared = None
        elif self.shared is None:
            self.shared = FetchLane(self, rest, long_poll=False)
        else:
            self.shared.partitions = rest
            kept = set(rest)
            self.shared.fenced = {tp: e for tp, e in self.shared.fenced.items() if tp in kept}

    def close(self) -> None:
        """Cancel every lane (the replica manager awaits their tasks at stop)."""
        self.assign(())

    def endpoint(self) -> str:
        image = self.manager.image
        b = image.broker(self.leader_id) if image is not None else None
        return b.endpoint if b is not None else ""


class FetchLane:
    """One connection to the leader, and the task fetching `partitions` over it."""

    def __init__(
        self, fetcher: Fetcher, partitions: list[TopicPartition], *, long_poll: bool
    ) -> None:
        self.fetcher = fetcher
        self.partitions = partitions
        self.long_poll = long_poll
        m = fetcher.manager
        self.client = RpcClient(
            fetcher.endpoint,
            connect_timeout=m.config.request_timeout_ms / 1000,
            max_frame_bytes=m.config.max_frame_bytes,
            ssl=m.config.client_ssl,
            expect_principal=broker_principal(fetcher.leader_id) if m.config.tls else None,
        )
        self.failures = 0
        # The partitions a leader refused with FENCED_LEADER_EPOCH, and the epoch they
        # were fetched in: not fetched again while the image shows that epoch.
        self.fenced: dict[TopicPartition, int] = {}
        self.awaiting_metadata = False  # every partition is fenced: waiting for an image
        name = f"{partitions[0][0]}-{partitions[0][1]}" if long_poll else "shared"
        self.task = m.spawn(self._run(), f"fetch-{fetcher.leader_id}-{name}")

    def close(self) -> None:
        self.task.cancel()

    async def _run(self) -> None:
        m = self.fetcher.manager
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                changed = False
                try:
                    for tp in list(self.partitions):
                        changed |= await self._fetch(tp)
                except Exception:
                    m.log.exception("replica fetch failed", leader=self.fetcher.leader_id)
                    self.failures += 1
                interval = m.config.fetch_interval_ms / 1000
                if self.failures:
                    delay = max(interval, min(0.05 * 2 ** min(self.failures, 5), 1.0))
                elif changed:
                    continue  # carry the new log end (and fetch the high watermark) at once
                elif self._all_fenced():
                    self.awaiting_metadata = True
                    try:
                        await m.until_image_moved()  # the new epoch, or the replica's end
                    finally:
                        self.awaiting_metadata = False
                    continue
                else:  # nothing new, sooner than a long poll would take: do not spin
                    delay = interval - (loop.time() - started)
                if delay > 0:
                    await asyncio.sleep(delay)  # a timer: the fetch interval, or a back-off
        finally:
            with contextlib.suppress(Exception):
                await self.client.close()

    def _all_fenced(self) -> bool:
        """Every partition of the lane was refused FENCED_LEADER_EPOCH in the leader epoch
        the image still shows: nothing to fetch before the next image."""
        image = self.fetcher.manager.image
        if image is None or not self.partitions:
            return False
        for tp in self.partitions:
            p = image.partition(tp)
            if p is None or self.fenced.get(tp) != p.leader_epoch:
                return False
        return True

    async def _fetch(self, tp: TopicPartition) -> bool:
        """Fetch `tp` once; True if the answer changed the replica."""
        fetcher = self.fetcher
        m = fetcher.manager
        epoch = m.broker_epoch()
        image = m.image
        if epoch is None or image is None or not fetcher.endpoint():
            return False
        p = image.partition(tp)
        log = m.logs.get(tp)
        if p is None or log is None or p.leader != fetcher.leader_id:
            return False
        fenced_in = self.fenced.get(tp)
        if fenced_in == p.leader_epoch:
            return False  # the leader fenced this epoch: wait for the image to move
        if fenced_in is not None:
            del self.fenced[tp]
        wait_ms = m.config.fetch_wait_ms if self.long_poll else 0
        sent_offset = log.log_end_offset
        req = ReplicaFetchRequest(
            topic=tp[0],
            partition=tp[1],
            follower_id=m.broker_id,
            follower_broker_epoch=epoch,
            fetch_offset=sent_offset,
            last_fetched_epoch=log.last_fetched_epoch,
            max_wait_ms=wait_ms,
            topic_id=log.topic_id or "",
            current_leader_epoch=p.leader_epoch,
            max_bytes=min(REPLICA_FETCH_MAX_BYTES, m.config.max_frame_bytes // 2),
        )
        try:
            resp = await self.client.request(req, (m.config.request_timeout_ms + wait_ms) / 1000)
        except NetworkError as exc:
            if not fetcher.unreachable:
                m.log.warning("replica fetch failed", leader=fetcher.leader_id, error=exc.message)
                fetcher.unreachable = True
            self.failures += 1
            return False
        except FencedLeaderEpochError as exc:
            # The leader is at a newer epoch: this broker's metadata is behind, or a
            # reassignment removed this replica. Either way the next image says which.
            self.fenced[tp] = p.leader_epoch
            m.log.info(
                "replica fetch fenced; waiting for metadata",
                partition=log.name,
                leader=fetcher.leader_id,
                leader_epoch=p.leader_epoch,
                error=exc.message,
            )
            return False
        except MetactlError as exc:  # UNKNOWN_LEADER_EPOCH among them: retried after a pause
            m.log.debug("replica fetch refused", partition=log.name, code=exc.code)
            return False
        self.failures = 0
        if fetcher.unreachable:
            m.log.info("replica fetch recovered", leader=fetcher.leader_id)
            fetcher.unreachable = False
        if not isinstance(resp, ReplicaFetchResponse):
            m.log.warning("unexpected fetch answer", answer=type(resp).__name__)
            return False
        now_image = m.image
        now_p = now_image.partition(tp) if now_image is not None else None
        if (
            now_p is None
            or now_p.leader != fetcher.leader_id
            or now_p.leader_epoch != p.leader_epoch
            or resp.leader_epoch != p.leader_epoch
        ):
            return False  # leadership moved, or the leader has not caught up with it yet
        return m.apply_fetch_response(tp, sent_offset, resp, fetched_for=log)
