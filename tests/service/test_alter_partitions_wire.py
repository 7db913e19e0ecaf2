"""A broker's batched AlterPartition over the wire: the service cuts it into pieces of a
work budget of items, each its own event and commit, answers every item in order, and
serves a heartbeat between two pieces (the events' order shows it: no timing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

import controller.runtime.apis as apis_module
from controller.runtime.service import ControllerService
from metactl.errors import InvalidRequestError, NotControllerError
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    IsrMember,
)
from protocol.messages.internal import FenceBroker
from tests.service.test_lifecycle_wire import LONG, create
from tests.service.test_operator_cli import register


async def test_a_batch_in_pieces_with_a_heartbeat_between(tmp_path: Path) -> None:
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=LONG, work_budget=3)
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address))
    beat_conn = await RpcClient.open(*parse_address(svc.address))
    try:
        epochs = {b: (await register(conn, b, f"i{b}")).broker_epoch for b in (1, 2, 3)}
        await create(conn, "t", assignments=[[2, 1]] * 7, min_isr=1)
        await svc.controller.submit(FenceBroker(broker_id=1))
        epochs[1] = (await register(conn, 1, "i1-again")).broker_epoch  # out of the ISRs
        image = svc.controller.committed_image
        items = [
            AlterPartition(
                topic="t",
                partition=i,
                leader=2,
                broker_epoch=epochs[2],
                partition_epoch=image.partitions[("t", i)].partition_epoch,
                isr=[IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2)],
            )
            for i in range(7)
        ]
        items[5] = msgspec.structs.replace(items[5], partition_epoch=99)  # a stale view

        order: list[str] = []
        beats: list[asyncio.Task[object]] = []
        beat = BrokerHeartbeatRequest(broker_id=3, broker_epoch=epochs[3], metadata_offset=1 << 40)

        def seen(name: str, queued: float, took: float) -> None:
            order.append(name)
            if name == "AlterPartitions" and not beats:  # during the first piece
                beats.append(asyncio.ensure_future(beat_conn.request(beat)))

        svc.controller.event_listeners.append(seen)
        r = await conn.request(AlterPartitions(items=items))
        assert isinstance(r, AlterPartitionsResponse)
        assert isinstance(await beats[0], BrokerHeartbeatResponse)
        pieces = [i for i, name in enumerate(order) if name == "AlterPartitions"]
        assert len(pieces) == 3  # 7 items, 3 a piece
        heartbeat = order.index("BrokerHeartbeatRequest")
        assert pieces[0] < heartbeat < pieces[-1], order
        assert [(x.partition, x.error_code) for x in r.results] == [
            (i, "INVALID_UPDATE_VERSION" if i == 5 else None) for i in range(7)
        ]
        after = svc.controller.committed_image
        assert [sorted(after.partitions[("t", i)].isr) for i in range(7)] == [
            [2] if i == 5 else [1, 2] for i in range(7)
        ]
        for i, x in enumerate(r.results):
            if i != 5:
                assert x.view is not None
                assert x.view.partition_epoch == after.partitions[("t", i)].partition_epoch
    finally:
        await conn.close()
        await beat_conn.close()
        await svc.stop()


async def test_a_failed_piece_answers_each_item_and_keeps_the_committed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second piece fails (the controller stepped down): the first piece's items keep
    their answers, committed; the failed piece's and the later ones each carry the error
    (their outcome unknown to the broker, which keeps counting them); a partition named
    again in another piece is INVALID_REQUEST; a request over the cap is refused whole."""
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=LONG, work_budget=3)
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address))
    try:
        epochs = {b: (await register(conn, b, f"i{b}")).broker_epoch for b in (1, 2)}
        await create(conn, "t", assignments=[[2, 1]] * 7, min_isr=1)
        await svc.controller.submit(FenceBroker(broker_id=1))
        epochs[1] = (await register(conn, 1, "i1-again")).broker_epoch
        image = svc.controller.committed_image
        items = [
            AlterPartition(
                topic="t", partition=i, leader=2, broker_epoch=epochs[2],
                partition_epoch=image.partitions[("t", i)].partition_epoch,
                isr=[IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2)],
            )
            for i in [*range(7), 1]
        ]  # fmt: skip
        submit = svc.controller.submit
        pieces = 0

        async def failing(event: object) -> object:
            nonlocal pieces
            if isinstance(event, AlterPartitions):
                pieces += 1
                if pieces == 2:
                    raise NotControllerError("stepped down between two pieces")
            return await submit(event)  # type: ignore[arg-type]

        monkeypatch.setattr(svc.controller, "submit", failing)
        r = await conn.request(AlterPartitions(items=items))
        assert isinstance(r, AlterPartitionsResponse)
        assert [x.error_code for x in r.results] == [None] * 3 + ["NOT_CONTROLLER"] * 4 + [
            "INVALID_REQUEST"
        ]
        after = svc.controller.committed_image
        assert [sorted(after.partitions[("t", i)].isr) for i in range(7)] == [[1, 2]] * 3 + [
            [2]
        ] * 4
        monkeypatch.setattr(apis_module, "MAX_ALTER_PARTITION_ITEMS", 7)
        with pytest.raises(InvalidRequestError, match="at most 7"):
            await conn.request(AlterPartitions(items=items))
    finally:
        await conn.close()
        await svc.stop()
