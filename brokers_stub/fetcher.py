"""Follower fetching: one task per leader this broker follows partitions from.

A `Fetcher` sends ReplicaFetch for each partition it follows from its leader, in turn,
every fetch interval (backing off while the leader is unreachable), and hands each
answer that still matches the partition's leadership to
`ReplicaManager.apply_fetch_response`.

This module owns the fetch loop and its connection only. It must not change a replica
log itself (the replica manager applies answers and writes files), nor decide which
leaders to fetch from (`ReplicaManager` starts and cancels fetchers as the image moves).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from metactl.errors import MetactlError, NetworkError
from metadata_image.image import TopicPartition
from protocol.client import RpcClient
from protocol.messages import ReplicaFetchRequest, ReplicaFetchResponse
from protocol.tls import broker_principal

if TYPE_CHECKING:
    from brokers_stub.replica_manager import ReplicaManager


class Fetcher:
    """Fetches, for every partition this broker follows from one leader, in turn."""

    def __init__(self, manager: ReplicaManager, leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.client = RpcClient(
            self._endpoint,
            connect_timeout=manager.config.request_timeout_ms / 1000,
            max_frame_bytes=manager.config.max_frame_bytes,
            ssl=manager.config.client_ssl,
            expect_principal=broker_principal(leader_id) if manager.config.tls else None,
        )
        self.failures = 0
        self.task = asyncio.ensure_future(self._run())
        self.task.set_name(f"fetcher-{leader_id}")

    def _endpoint(self) -> str:
        image = self.manager.image
        b = image.broker(self.leader_id) if image is not None else None
        return b.endpoint if b is not None else ""

    async def _run(self) -> None:
        m = self.manager
        try:
            while True:
                try:
                    await self._round()
                except Exception:
                    m.log.exception("fetcher round failed", leader=self.leader_id)
                    self.failures += 1
                delay = m.config.fetch_interval_ms / 1000
                if self.failures:
                    delay = max(delay, min(0.05 * 2 ** min(self.failures, 5), 1.0))
                await asyncio.sleep(delay)  # a timer: the fetch interval
        finally:
            with contextlib.suppress(Exception):
                await self.client.close()

    async def _round(self) -> None:
        m = self.manager
        image = m.image
        if image is None or not self._endpoint():
            return
        for p in list(m.followed_partitions(image)):
            if p.leader == self.leader_id:
                await self._fetch(p.tp)

    async def _fetch(self, tp: TopicPartition) -> None:
        m = self.manager
        epoch = m.broker_epoch()
        image = m.image
        if epoch is None or image is None:
            return
        p = image.partition(tp)
        log = m.logs.get(tp)
        if p is None or log is None or p.leader != self.leader_id:
            return
        sent_offset = log.log_end_offset
        req = ReplicaFetchRequest(
            topic=tp[0],
            partition=tp[1],
            follower_id=m.broker_id,
            follower_broker_epoch=epoch,
            fetch_offset=sent_offset,
            last_fetched_epoch=log.last_fetched_epoch,
        )
        try:
            resp = await self.client.request(req, m.config.request_timeout_ms / 1000)
        except NetworkError as exc:
            if self.failures == 0:
                m.log.warning("replica fetch failed", leader=self.leader_id, error=exc.message)
            self.failures += 1
            return
        except MetactlError as exc:
            m.log.debug("replica fetch refused", partition=log.name, code=exc.code)
            return
        if self.failures:
            m.log.info("replica fetch recovered", leader=self.leader_id)
            self.failures = 0
        if not isinstance(resp, ReplicaFetchResponse):
            m.log.warning("unexpected fetch answer", answer=type(resp).__name__)
            return
        now_image = m.image
        now_p = now_image.partition(tp) if now_image is not None else None
        if (
            now_p is None
            or now_p.leader != self.leader_id
            or now_p.leader_epoch != p.leader_epoch
            or resp.leader_epoch != p.leader_epoch
        ):
            return  # leadership moved, or the leader has not caught up with it yet
        m.apply_fetch_response(tp, sent_offset, resp)
