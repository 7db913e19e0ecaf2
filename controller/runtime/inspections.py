"""Unclean recovery's questions to brokers: GetReplicaLogInfo, asked for the core.

When a recovery needs to know a replica's log end, the core says so (an `Inspection`,
through `Controller.inspection_sinks`); this module asks the broker. Inspections are
queued per broker incarnation and asked in batches of `INSPECTION_BATCH` partitions, one
task per incarnation (a million partitions recovering after an outage are a thousand
requests, not a million connections), retried with backoff while the broker stays
active at the inspected epoch. Under TLS the broker must prove `broker-<id>`, and an
answer is only taken for the broker and the partitions asked. The answers reach the core
as one `LogInfoAnswers` event per request.

Must not: decide anything (the core decides each recovery from the answers) or touch the
log.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from controller.core.recovery.tracker import Inspection
from controller.core.step import LogInfoAnswers
from controller.core.work import WORK_BUDGET
from controller.runtime.driver import Controller
from metactl.errors import InvalidRequestError, MetactlError, StaleBrokerEpochError
from protocol.client import RetryPolicy, RpcClient
from protocol.messages.broker_controller import (
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    ReplicaRef,
)
from protocol.messages.internal import ReplicaLogInfo
from protocol.tls import broker_principal

__all__ = ["INSPECTION_BATCH", "INSPECTION_RETRY", "Inspections"]

log = structlog.get_logger("metactl.controller.service")

# GetReplicaLogInfo: up to 20 attempts, backoff capped at 2 s, while the broker stays
# active at the same epoch.
INSPECTION_RETRY = RetryPolicy(attempts=20, base_s=0.1, cap_s=2.0)
# Partitions per GetReplicaLogInfo request (and per LogInfoAnswers event): a quarter of
# the work budget, as each answer may decide a recovery (two records, a WARNING line):
# about 15 ms of step per batch at 300,000 partitions, where a whole budget took 60 ms.
INSPECTION_BATCH = WORK_BUDGET // 4


class Inspections:
    """The GetReplicaLogInfo requests of the active controller (`queue` is its
    inspection sink)."""

    def __init__(
        self,
        controller: Callable[[], Controller],
        *,
        max_frame_bytes: int,
        client_ssl: ssl.SSLContext | None,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> None:
        self._controller = controller  # the active term's driver
        self.max_frame_bytes = max_frame_bytes
        # Mutual TLS (None: plaintext): the controller's identity for these calls.
        self.client_ssl = client_ssl
        self._spawn = spawn
        # Inspections waiting for their broker's inspecting task: (broker, epoch) -> them.
        self._inspections: dict[tuple[int, int], list[Inspection]] = {}

    def queue(self, inspection: Inspection) -> None:
        """Queue an inspection; one task per broker incarnation asks for them in batches
        (a million partitions recovering after an outage are a thousand requests, not a
        million connections)."""
        key = (inspection.broker_id, inspection.broker_epoch)
        queued = self._inspections.get(key)
        if queued is not None:
            queued.append(inspection)
            return
        self._inspections[key] = [inspection]
        self._spawn(self._inspect_queued(key), f"inspect-{inspection.broker_id}")

    async def _inspect_queued(self, key: tuple[int, int]) -> None:
        try:
            while queued := self._inspections.get(key):
                await asyncio.sleep(0)  # inspections decided in the same turn join in
                batch = queued[:INSPECTION_BATCH]
                del queued[:INSPECTION_BATCH]
                await self.inspect(*batch)
        finally:
            self._inspections.pop(key, None)

    async def inspect(self, *asked: Inspection) -> None:
        """Ask a broker for its replicas' log ends (one request; every inspection names
        the same broker and epoch). The client retries retriable failures with backoff
        while the broker stays active at the inspected epoch (its endpoint is fixed for
        that epoch); any other error ends the inspection. A recovery that needs the answer
        again asks again: a revert restarts pending recoveries. The answers reach the
        core as one event."""
        ctl = self._controller()
        insp = asked[0]
        wanted = {(i.topic, i.partition) for i in asked}

        def still_wanted() -> bool:
            b = ctl.image.broker(insp.broker_id)
            return b is not None and b.epoch == insp.broker_epoch and b.active

        b = ctl.image.broker(insp.broker_id)
        if b is None or not b.endpoint or not still_wanted():
            return
        request = GetReplicaLogInfoRequest(
            broker_id=insp.broker_id,
            broker_epoch=insp.broker_epoch,
            partitions=[ReplicaRef(i.topic, i.partition) for i in asked],
        )
        try:
            async with RpcClient(
                b.endpoint,
                max_frame_bytes=self.max_frame_bytes,
                retry=INSPECTION_RETRY,
                ssl=self.client_ssl,
                expect_principal=broker_principal(insp.broker_id) if self.client_ssl else None,
            ) as client:
                resp = await client.request(request, timeout_s=10, still_wanted=still_wanted)
            if not isinstance(resp, GetReplicaLogInfoResponse):
                raise InvalidRequestError(f"unexpected {type(resp).__name__}")
            if resp.broker_id != insp.broker_id:
                # The endpoint proved broker-<id> (expect_principal) but answers for
                # another broker: an answer is only ever taken for the broker asked.
                log.warning(
                    "replica log info refused: the answer names another broker",
                    broker=insp.broker_id,
                    answered_for=resp.broker_id,
                )
                return
            answers: list[ReplicaLogInfo] = []
            for entry in resp.partitions:
                if (entry.topic, entry.partition) not in wanted:
                    log.warning(
                        "replica log info refused: a partition that was not asked",
                        broker=insp.broker_id,
                        partition=f"{entry.topic}-{entry.partition}",
                    )
                    continue
                if entry.error_code is not None:
                    log.warning(
                        "replica log info error", broker=insp.broker_id, code=entry.error_code
                    )
                    continue
                answers.append(
                    ReplicaLogInfo(
                        broker_id=resp.broker_id,
                        broker_epoch=resp.broker_epoch,
                        topic=entry.topic,
                        partition=entry.partition,
                        last_leader_epoch=entry.last_leader_epoch,
                        log_end_offset=entry.log_end_offset,
                    )
                )
            if answers:
                await ctl.submit(LogInfoAnswers(tuple(answers)))
        except StaleBrokerEpochError as exc:
            log.warning("replica log info rejected: stale broker epoch", error=exc.message)
        except MetactlError as exc:
            log.warning("replica log info failed; giving up", broker=insp.broker_id, error=str(exc))
