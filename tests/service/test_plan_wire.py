"""The maintenance pre-flight over real TCP against a real controller on a SQLite log:
PlanRestart and PlanRoll are answered from the committed image by the planner (the same
answer `planning` gives for that image), write nothing, refuse by name, and are made off
the event loop: the controller answers other requests while a large plan is made."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.quota import MutationLimits
from controller.runtime.service import ControllerService
from metactl.errors import BrokerIdNotRegisteredError, InvalidRequestError
from planning.restart import plan_restart
from planning.roll import plan_roll
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)
from protocol.messages.plan import (
    PLAN_LIST_ITEMS,
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)
from tests.service.test_operator_cli import register

LONG = ControllerConfig(broker_session_timeout_ms=3_600_000)


async def started(
    path: Path, limits: MutationLimits | None = None
) -> tuple[ControllerService, RpcClient]:
    svc = ControllerService(path, "127.0.0.1:0", config=LONG, mutation_limits=limits)
    await svc.start()
    host, port = parse_address(svc.address)
    conn = await RpcClient.open(host, port)
    for b in (1, 2, 3):
        await register(conn, b, f"i{b}")
    return svc, conn


async def create(conn: RpcClient, *topics: CreateTopic) -> None:
    r = await conn.request(CreateTopicsRequest(topics=list(topics)), 120.0)
    assert isinstance(r, CreateTopicsResponse)
    assert all(t.error_code is None for t in r.results), r


async def test_plans_are_the_planners_answers_from_the_committed_image(tmp_path: Path) -> None:
    svc, conn = await started(tmp_path)
    try:
        await create(
            conn,
            CreateTopic(name="t", assignments=[[1, 2, 3], [2, 3, 1]], min_isr=2),
            CreateTopic(name="b", assignments=[[1, 2]], min_isr=2),
        )
        ctl = svc.controller
        image = ctl.committed_image
        end = image.end_offset

        r = await conn.request(PlanRestartRequest(broker_id=1))
        assert isinstance(r, PlanRestartResponse)
        expected = plan_restart(image, 1, rules=ctl.rules, now_ms=0, limit=PLAN_LIST_ITEMS)
        assert r == expected
        assert r.end_offset == end and r.replicas == 3 and r.leads == 2
        # b-0 (replicas [1,2], MinISR 2) goes under MinISR while broker 1 is down.
        assert [(p.topic, p.isr) for p in r.clean.under_min_isr.partitions] == [("b", [2])]

        roll = await conn.request(PlanRollRequest(limit=0))
        assert isinstance(roll, PlanRollResponse)
        assert roll == plan_roll(image, rules=ctl.rules, now_ms=0, limit=0)
        assert [s.broker_id for s in roll.steps] == [3] and roll.blocked == [1, 2]
        assert roll.blocking_count == 1 and roll.blocking == []  # counts only

        # A plan writes nothing.
        assert ctl.committed_image.end_offset == end
    finally:
        await conn.close()
        await svc.stop()


async def test_plans_refuse_by_name(tmp_path: Path) -> None:
    svc, conn = await started(tmp_path)
    try:
        with pytest.raises(BrokerIdNotRegisteredError):
            await conn.request(PlanRestartRequest(broker_id=7))
        with pytest.raises(InvalidRequestError, match="limit"):
            await conn.request(PlanRollRequest(limit=-1))
        with pytest.raises(InvalidRequestError, match="limit"):
            await conn.request(PlanRestartRequest(broker_id=1, limit=100_001))
        with pytest.raises(InvalidRequestError):
            await conn.request(PlanRestartRequest(broker_id=-5))
    finally:
        await conn.close()
        await svc.stop()


async def test_the_controller_answers_while_a_large_plan_is_made(tmp_path: Path) -> None:
    """A roll of 30,000 partitions (RF 3 on three brokers) is made in a worker thread:
    while it is, a describe sent after it is answered before it."""
    unlimited = MutationLimits(rate=0, max_partitions_per_request=1_000_000)
    svc, conn = await started(tmp_path, unlimited)
    host, port = parse_address(svc.address)
    other = await RpcClient.open(host, port)
    try:
        await create(
            conn,
            CreateTopic(name="big", partitions=30_000, replication_factor=3, min_isr=2),
            CreateTopic(name="small", partitions=1, replication_factor=3),
        )
        planning = svc.apis.admin._planning
        plan = asyncio.create_task(conn.request(PlanRollRequest(limit=0), 300.0))
        while not planning.locked():  # the plan has begun, in its thread
            assert not plan.done()
            await asyncio.sleep(0.001)
        d = await other.request(DescribeClusterRequest(topic="small", v=2, partition_limit=1))
        assert isinstance(d, DescribeClusterResponse)
        assert not plan.done()  # answered while the plan was still being made
        roll = await plan
        assert isinstance(roll, PlanRollResponse)
        assert [s.await_count for s in roll.steps] == [30_001, 30_001, 30_001]
    finally:
        await other.close()
        await conn.close()
        await svc.stop()
