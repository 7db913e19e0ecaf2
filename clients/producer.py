"""The data plane's producer: batches of records to the partitions' leaders, each
acknowledged batch made durable in an acked log before it counts.

`produce` finds each partition's leader (`clients.data.Leaders`), sends batches of
records to it (Produce, docs/protocol.md) from `in_flight` workers, paced by `rate`,
follows a leader that moves and retries every retriable error with `RetryPolicy` backoff
(`leader_request`), and appends each acknowledged batch (topic, partition, base_offset,
count, leader_epoch, acks) to the acked log (`AckedLog`) as one JSON line, written,
flushed and fsynced *before* it is counted. A batch refused for good is counted by its
error code (`ProduceSummary`).

Used by `metactl produce` (ops/data_cmds.py), the chaos runner (its `AckedLog`) and the
produce benchmark. It owns the client side only: what a broker answers is
`brokers_stub.produce`'s business. It must not import the CLI (`ops`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from clients.controller import INSECURE, Security
from clients.data import DATA_RETRY, Connections, Leaders, leader_request
from metactl.errors import InvalidRequestError, MetactlError, UnknownTopicOrPartitionError
from protocol.client import RetryPolicy
from protocol.messages.data import ACKS_ALL, ProduceRequest, ProduceResponse


class AckedLog:
    """The acknowledged batches, one JSON line each, durable before they count."""

    def __init__(self, path: Path) -> None:
        created = not path.exists()
        self._file: IO[str] = path.open("a", encoding="utf-8")
        if created:
            fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def append(self, resp: ProduceResponse, acks: int) -> None:
        line = json.dumps(
            {
                "topic": resp.topic,
                "partition": resp.partition,
                "base_offset": resp.base_offset,
                "count": resp.count,
                "leader_epoch": resp.leader_epoch,
                "acks": "all" if acks == ACKS_ALL else acks,
            },
            separators=(",", ":"),
        )
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


@dataclass
class ProduceSummary:
    acked_records: int = 0
    acked_batches: int = 0
    refused_records: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # batches, by error code

    def line(self) -> str:
        refused = " ".join(f"{code}={n}" for code, n in sorted(self.refused.items())) or "none"
        return (
            f"acked {self.acked_records} records in {self.acked_batches} batches; "
            f"refused {self.refused_records} records: {refused}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "acked_records": self.acked_records,
            "acked_batches": self.acked_batches,
            "refused_records": self.refused_records,
            "refused_batches": dict(sorted(self.refused.items())),
        }


async def produce(
    *,
    controller: str,
    topic: str,
    partition: int | None,
    acks: int,
    count: int,
    batch: int,
    acked_log: Path,
    rate: float | None = None,
    in_flight: int = 1,
    timeout_ms: int | None = None,
    retry: RetryPolicy = DATA_RETRY,
    security: Security = INSECURE,
    timeout_s: float = 10.0,
) -> ProduceSummary:
    """Produce `count` records; `timeout_s` bounds each answer of the controller."""
    leaders = Leaders(controller, topic, retry, security, timeout_s=timeout_s)
    await leaders.refresh()
    targets = [partition] if partition is not None else sorted(leaders.partitions)
    for t in targets:
        if t not in leaders.partitions:
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{t}")
    log = AckedLog(acked_log)
    summary = ProduceSummary()
    sizes = [min(batch, count - start) for start in range(0, count, batch)]
    next_batch = 0
    start = time.monotonic()
    client_timeout_s = (timeout_ms if timeout_ms is not None else 30_000) / 1000 + 5.0

    async def worker() -> None:
        nonlocal next_batch
        conns = Connections(security)
        try:
            while next_batch < len(sizes):
                i, next_batch = next_batch, next_batch + 1
                size = sizes[i]
                if rate is not None:  # pace: batch i may leave once its records are due
                    due = start + i * batch / rate  # every batch but the last is full
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                target = targets[i % len(targets)]
                req = ProduceRequest(
                    topic=topic, partition=target, acks=acks, count=size, timeout_ms=timeout_ms
                )
                try:
                    resp = await leader_request(
                        leaders, conns, target, req, timeout_s=client_timeout_s, retry=retry
                    )
                    if not isinstance(resp, ProduceResponse):
                        raise InvalidRequestError(f"unexpected {type(resp).__name__}")
                except MetactlError as exc:
                    summary.refused[exc.code] += 1
                    summary.refused_records += size
                    continue
                log.append(resp, acks)  # durable first ...
                summary.acked_records += resp.count  # ... then acknowledged
                summary.acked_batches += 1
        finally:
            await conns.close()

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, in_flight))))
    finally:
        log.close()
    return summary
