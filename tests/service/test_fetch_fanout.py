"""Metadata tailers after a commit, over real TCP and a real SQLite log: none sees a change
before it is durable, and all of them get the same answer (`ControllerApis.fetch` reads,
decodes and sizes it once for all of them), which names no record past the committed end
and is never an earlier commit's answer again once the log has moved on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metadata_log.records import RegisterBrokerRecord
from metadata_log.sqlite_store import SqliteLogStore
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.broker_controller import (
    FetchMetadataRequest,
    FetchMetadataResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from tests.brokers_stub.helpers import eventually

TAILERS = 5


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=ControllerConfig())
    await svc.start()
    yield svc
    await svc.stop()


async def connect(svc: ControllerService) -> RpcClient:
    return await RpcClient.open(*parse_address(svc.address))


def waiting(store: SqliteLogStore) -> int:
    """Callers parked in `wait_for` (the long polls at the end of the log)."""
    return len(store._advanced._waiters or ())


def fetched(answer: object) -> list[tuple[int, object]]:
    assert isinstance(answer, FetchMetadataResponse)
    assert all(r.offset < answer.end_offset for r in answer.records)  # committed only
    return [(r.offset, r.record) for r in answer.records]


async def test_tailers_see_a_change_once_durable_and_all_get_the_same_answer(
    service: ControllerService,
) -> None:
    store = service.store
    assert isinstance(store, SqliteLogStore)
    admin = await connect(service)
    tailers = [await connect(service) for _ in range(TAILERS)]
    gate = threading.Event()
    blocker: asyncio.Future[object] | None = None
    try:
        await admin.request(RegisterBroker(broker_id=1, incarnation_id="a"))
        end = store.end_offset
        polls = [
            asyncio.create_task(
                t.request(FetchMetadataRequest(from_offset=end, max_wait_ms=30_000))
            )
            for t in tailers
        ]
        await eventually(lambda: waiting(store) == TAILERS, what="the tailers' long polls")
        # The writer's SQLite thread is held: the next commit waits before its COMMIT.
        blocker = asyncio.ensure_future(store._w._execute(gate.wait, 30))
        register = asyncio.create_task(
            admin.request(RegisterBroker(broker_id=2, incarnation_id="b"))
        )
        await eventually(lambda: 2 in service.controller.image.brokers, what="the step")
        await eventually(store._write_lock.locked, what="the append at the medium")
        assert store.end_offset == end
        assert not any(p.done() for p in polls) and not register.done()
        assert 2 not in service.controller.committed_image.brokers
        gate.set()
        await blocker
        answer = await register
        assert isinstance(answer, RegisterBrokerResponse)
        answers = [fetched(await p) for p in polls]
        assert answers[0] and all(a == answers[0] for a in answers)
        first = answers[0][0]
        assert first[0] == end and isinstance(first[1], RegisterBrokerRecord)
        assert first[1].broker_id == 2
        assert answers[0] == [(e.offset, e.record) for e in await store.read(end)]
        # The log moves on: the same fetch is answered from the new end, not the cached one.
        await admin.request(RegisterBroker(broker_id=3, incarnation_id="c"))
        again = fetched(await tailers[0].request(FetchMetadataRequest(from_offset=end)))
        assert again[: len(answers[0])] == answers[0]
        assert [r.broker_id for _, r in again if isinstance(r, RegisterBrokerRecord)] == [2, 3]
        assert again == [(e.offset, e.record) for e in await store.read(end)]
    finally:
        gate.set()
        if blocker is not None:
            await blocker
        for c in [admin, *tailers]:
            await c.close()


async def test_a_smaller_limit_is_its_own_answer(service: ControllerService) -> None:
    """Tailers asking for fewer records than the last answer held get their own."""
    conn = await connect(service)
    try:
        for b in (1, 2, 3):
            await conn.request(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
        end = service.store.end_offset if service.store is not None else 0
        whole = fetched(await conn.request(FetchMetadataRequest(from_offset=end - 3)))
        one = fetched(await conn.request(FetchMetadataRequest(from_offset=end - 3, max_records=1)))
        assert len(whole) == 3 and one == whole[:1]
        assert fetched(await conn.request(FetchMetadataRequest(from_offset=end - 3))) == whole
    finally:
        await conn.close()
