"""The read-back of a chaos run, once healed: what every partition's final leader holds
(ReadLog, through `metactl consume`'s client) and the whole committed metadata log.

This module only reads: it must not start, signal or fault anything (`chaos.processes`,
`chaos.faults`) nor classify a record (`chaos.check`).
"""

from __future__ import annotations

import asyncio

from chaos.check import TOPIC
from clients.consumer import Range, consume, ranges
from metactl.errors import MetactlError
from protocol.client import RetryPolicy, request_once
from protocol.messages.broker_controller import (
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
)
from protocol.messages.data import ReadLogResponse

POLL_S = 0.1
READ_RETRY = RetryPolicy(attempts=20, base_s=0.05, cap_s=0.5)


async def read_logs(address: str) -> tuple[dict[int, list[Range]], dict[int, str]]:
    """Every partition's committed ranges from its leader (and the partitions that could
    not be read, with the error code), once no leader's high watermark is still catching
    up with its log end."""
    committed: dict[int, list[Range]] = {}
    errors: dict[int, str] = {}
    for _ in range(50):
        try:
            results = await consume(
                controller=address, topic=TOPIC, partition=None, retry=READ_RETRY
            )
        except (MetactlError, OSError, TimeoutError) as exc:
            errors = {-1: str(exc)}
            await asyncio.sleep(POLL_S)
            continue
        committed, errors, settling = {}, {}, False
        for st, res in results:
            if isinstance(res, ReadLogResponse):
                committed[st.partition] = ranges(res.leader_epochs, res.high_watermark)
                settling |= res.high_watermark < res.log_end_offset
            else:
                errors[st.partition] = res.code
        if not settling:
            break
        await asyncio.sleep(POLL_S)  # a leader's HW still catching up with its LEO
    return committed, errors


async def fetch_metadata(address: str) -> tuple[list[FetchedRecord], int | None]:
    """The committed metadata log, and the offset of the snapshot it starts from (None:
    it starts at 0)."""
    out: list[FetchedRecord] = []
    offset = 0
    snapshot_at: int | None = None
    while True:
        r = await request_once(
            address, FetchMetadataRequest(from_offset=offset, max_wait_ms=0), timeout_s=10.0
        )
        assert isinstance(r, FetchMetadataResponse)
        if r.snapshot is not None:  # the log's head was compacted away
            snapshot_at = offset = r.snapshot.offset
            continue
        out.extend(r.records)
        if not r.records or r.records[-1].offset + 1 >= r.end_offset:
            return out, snapshot_at
        offset = r.records[-1].offset + 1
