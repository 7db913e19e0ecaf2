"""A broker tailing the log holds the records of an open transaction and applies them
only at the end marker (never, after an abort), while it keeps fetching past them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from brokers_stub.logctx import BrokerLog
from brokers_stub.metadata import MetadataFollower
from brokers_stub.storage import read_metadata_offset
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from protocol.client import RpcClient
from protocol.messages.broker_controller import (
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
)
from tests.brokers_stub.fake_controller import FakeController

Seen = list[tuple[ClusterImage, MetadataDelta | None, bool]]


def _follower(tmp_path: Path, address: str = "127.0.0.1:1") -> tuple[MetadataFollower, Seen]:
    f = MetadataFollower(
        RpcClient(address), tmp_path, BrokerLog(1), max_wait_ms=0, request_timeout_ms=1000
    )
    seen: Seen = []
    f.listeners.append(lambda image, delta, caught_up: seen.append((image, delta, caught_up)))
    return f, seen


def _topic(partitions: int) -> list[MetadataRecord]:
    return [
        TopicRecord(name="t", topic_id="t", partitions=partitions, min_isr=1),
        *(
            PartitionRecord(topic="t", partition=i, replicas=[0], isr=[0], leader=0)
            for i in range(partitions)
        ),
    ]


def _response(first: int, records: list[MetadataRecord], end: int) -> FetchMetadataResponse:
    fetched = [FetchedRecord(first + i, 0, r) for i, r in enumerate(records)]
    return FetchMetadataResponse(records=fetched, end_offset=end)


REG = RegisterBrokerRecord(broker_id=0, incarnation_id="x", broker_epoch=0)


def test_a_partial_transaction_is_held_until_its_end_marker(tmp_path: Path) -> None:
    f, seen = _follower(tmp_path)
    topic = _topic(2)  # offsets 2..4
    f._apply(_response(0, [REG, BeginTransactionRecord(name="CreateTopic t"), *topic[:2]], 6))
    assert set(f.image.brokers) == {0} and not f.image.topics
    assert f.applied_offset == 1 == read_metadata_offset(tmp_path)
    assert f.state.next_offset == 4 and not f.caught_up
    f._apply(_response(4, topic[2:], 6))
    assert not f.image.topics and f.applied_offset == 1 and f.state.next_offset == 5
    image, delta, caught_up = seen[-1]
    assert delta is not None and delta.empty and not caught_up
    f._apply(_response(5, [EndTransactionRecord()], 6))
    assert f.image.topics["t"].partitions == 2 and len(f.image.partitions) == 2
    assert f.applied_offset == 6 == read_metadata_offset(tmp_path) and f.caught_up
    image, delta, caught_up = seen[-1]
    assert delta is not None and delta.partitions == {("t", 0), ("t", 1)} and caught_up
    assert image is f.image


def test_an_aborted_transaction_is_never_applied(tmp_path: Path) -> None:
    f, seen = _follower(tmp_path)
    f._apply(_response(0, [REG, BeginTransactionRecord(), *_topic(2)], 5))
    f._apply(_response(5, [AbortTransactionRecord(reason="crash"), REG], 7))
    assert not f.image.topics and f.applied_offset == 7 and f.caught_up
    delta = seen[-1][1]
    assert delta is not None and delta.brokers == {0} and not delta.partitions


async def _until(f: MetadataFollower, condition: Callable[[], bool]) -> None:
    while not condition():
        await f.updated.wait()


async def test_the_fetch_loop_continues_past_held_records(
    tmp_path: Path, controller: FakeController
) -> None:
    f, _ = _follower(tmp_path, controller.address)
    f.max_wait_ms = 2000
    controller.append(REG, BeginTransactionRecord(name="CreateTopic t"), *_topic(3))
    task = asyncio.create_task(f.run())
    try:
        await _until(f, lambda: f.state.next_offset == 6)
        assert not f.image.topics and f.applied_offset == 1
        controller.append(EndTransactionRecord())
        await _until(f, lambda: "t" in f.image.topics)
        assert len(f.image.partitions) == 3 and f.applied_offset == 7
        fetches = controller.of(FetchMetadataRequest)
        starts = [r.from_offset for r in fetches if isinstance(r, FetchMetadataRequest)]
        assert starts[0] == 0 and 6 in starts  # after the held records, not from 1 again
        assert 1 not in starts
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await f.client.close()
