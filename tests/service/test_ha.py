"""Controllers taking turns on one etcd log, in one process over real TCP and a real etcd
member: one active, the others hot standbys that answer reads and send writers to the
active one; a resignation or an ended term moves the role, and the log never forks.
The real-process faults (SIGKILL, SIGSTOP, etcd members dying) are in tests/e2e/test_ha.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from structlog.testing import capture_logs

from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from controller.runtime.ha_settings import HaSettings
from controller.runtime.service import ControllerService
from localcluster.etcd import LocalEtcd
from metactl.errors import CorruptLogError, NotControllerError, StoreUnavailableError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LEADER_KEY, current_leader
from metadata_log.etcd.registry import Registration, registered
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import op_delete, op_put
from metadata_log.records import NoOpRecord
from protocol.client import Endpoints, RetryPolicy, RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.unions import Message
from tests.brokers_stub.helpers import eventually
from tests.e2e.ha import log_written_once

BOUND_S = 30.0  # bounds a hang; no test times anything


@pytest.fixture
def url(etcd: LocalEtcd) -> str:
    return etcd.url(f"ha/{uuid.uuid4().hex[:10]}")


def controller(
    tmp_path: object, url: str, name: str, verify_log: Literal["tail", "full"] = "tail"
) -> ControllerService:
    return ControllerService(
        tmp_path / name,  # type: ignore[operator]
        "127.0.0.1:0",
        config=ControllerConfig(broker_session_timeout_ms=600_000),
        verify_log=verify_log,
        metadata_log=url,
        ha=HaSettings(lease_ttl_s=2, node_id=name, cluster_id="ha-test"),
    )


@pytest.fixture
async def pair(tmp_path: object, url: str) -> AsyncIterator[list[ControllerService]]:
    services = [controller(tmp_path, url, n) for n in ("c1", "c2")]
    for s in services:
        await s.start()
    try:
        await eventually(
            lambda: sum(s.acting for s in services) == 1,
            timeout_s=BOUND_S,
            what="one active controller",
        )
        active, _ = roles(services)
        await broker_up(active.address, 1)
        yield services
    finally:
        for s in services:
            with contextlib.suppress(Exception):
                await s.stop()


def roles(services: list[ControllerService]) -> tuple[ControllerService, ControllerService]:
    active = next(s for s in services if s.acting)
    standby = next(s for s in services if s is not active)
    return active, standby


async def broker_up(address: str, broker_id: int) -> int:
    """Register and unfence a broker (so topics can be placed); its epoch."""
    async with RpcClient(address) as c:
        r = await c.request(RegisterBroker(broker_id=broker_id, incarnation_id="i"))
        assert isinstance(r, RegisterBrokerResponse)
        hb = await c.request(
            BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=r.broker_epoch, metadata_offset=1 << 40
            )
        )
        assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
    return r.broker_epoch


async def create(address: str | Endpoints, name: str) -> CreateTopicsResponse:
    async with RpcClient(address, retry=RetryPolicy(attempts=8, base_s=0.05)) as c:
        topic = CreateTopic(name=name, partitions=1, replication_factor=1)
        r = await c.request(CreateTopicsRequest(topics=[topic]), timeout_s=10)
    assert isinstance(r, CreateTopicsResponse)
    return r


async def describe(address: str) -> DescribeClusterResponse:
    async with RpcClient(address) as c:
        r = await c.request(DescribeClusterRequest(v=2), timeout_s=10)
    assert isinstance(r, DescribeClusterResponse)
    return r


async def test_one_active_the_standby_reads_and_redirects(pair: list[ControllerService]) -> None:
    active, standby = roles(pair)
    assert standby.role == "standby" and not standby.acting
    # A write to the standby: NOT_CONTROLLER naming the active controller, nothing written.
    async with RpcClient(standby.address) as c:
        with pytest.raises(NotControllerError) as e:
            await c.request(RegisterBroker(broker_id=1, incarnation_id="x"), timeout_s=10)
    assert e.value.leader == active.address and e.value.retriable
    assert standby.leader_hint == active.address
    # A client given both follows the hint; the standby's reads catch up by watch.
    r = await create(Endpoints([standby.address, active.address]), "t1")
    assert r.results[0].error_code is None, r
    assert standby.standby is not None
    await eventually(
        lambda: "t1" in standby.standby.image.topics, timeout_s=BOUND_S, what="the standby's image"
    )  # type: ignore[union-attr]
    seen = await describe(standby.address)
    assert [p.topic for p in seen.partitions] == ["t1"]
    assert seen.end_offset == (await describe(active.address)).end_offset
    # Metrics: the role gauge, and cluster gauges only on the active one.
    assert active.role_metrics.registry.get_sample_value("metactl_controller_active") == 1
    assert standby.role_metrics.registry.get_sample_value("metactl_controller_active") == 0
    assert standby.role_metrics.registry.get_sample_value("metactl_partitions") is None
    assert active.role_metrics.registry.get_sample_value("metactl_partitions") == 1


async def test_a_resigning_active_hands_over_and_nothing_acknowledged_is_lost(
    pair: list[ControllerService], url: str
) -> None:
    active, standby = roles(pair)
    acked = []
    for i in range(5):
        await create(active.address, f"before-{i}")
        acked.append(f"before-{i}")
    # A drain that takes a while (a large transaction, a slow disk): meanwhile the
    # standby, whose watch connection the stop ended, probes the port; it must find it
    # bound, not refusing, and leave the key to the resignation.
    assert active.ctl is not None
    drain = active.ctl.close

    async def slow_drain() -> None:
        await asyncio.sleep(1.0)  # longer than the standby's two refusals, 0.1 s apart
        await drain()

    active.ctl.close = slow_drain  # type: ignore[method-assign]
    await active.stop()  # resigns: the standby need not wait out the TTL
    await eventually(lambda: standby.acting, timeout_s=BOUND_S, what="the standby taking over")
    assert standby.role_metrics.registry.get_sample_value("metactl_controller_failovers_total") == 1
    revocations = "metactl_controller_dead_active_revocations_total"
    assert standby.role_metrics.registry.get_sample_value(revocations) == 0
    await create(standby.address, "after")
    acked.append("after")
    topics = set(standby.controller.committed_image.topics)
    assert set(acked) <= topics
    etcd = await Etcd.connect(EtcdTarget.parse(url))
    try:
        info, _ = await current_leader(etcd)
        assert info is not None and info.node == standby.ha.node_id
        assert info.address == standby.address
    finally:
        await etcd.close()
    assert await log_written_once(url) == standby.controller.committed_image.end_offset


async def test_a_term_ended_behind_its_back_makes_the_active_step_down(
    pair: list[ControllerService], url: str
) -> None:
    """The leadership key is deleted behind the active controller's back (as a standby
    does when it was paused past the TTL): its next heartbeat finds it gone, it steps
    down and refuses writes, and one of the two takes over; the log stays one line."""
    active, _ = roles(pair)
    await create(active.address, "t")
    assert active.leadership is not None
    old_token = active.leadership.token
    raw = await Etcd.connect(EtcdTarget.parse(url))
    try:
        await raw.txn("ending a term", [], [op_delete(raw.target.key(LEADER_KEY))])
    finally:
        await raw.close()

    def new_term() -> ControllerService | None:
        for s in pair:
            if s.acting and s.leadership is not None and s.leadership.token != old_token:
                return s
        return None

    await eventually(lambda: new_term() is not None, timeout_s=BOUND_S, what="a new term")
    new = new_term()
    assert new is not None
    r = await create(Endpoints([s.address for s in pair]), "t2")
    assert r.results[0].error_code is None
    await eventually(
        lambda: sum(s.acting for s in pair) == 1,
        timeout_s=BOUND_S,
        what="the old term stepping down",
    )
    assert {"t", "t2"} <= set(new.controller.committed_image.topics)
    assert await log_written_once(url) == new.controller.committed_image.end_offset


async def test_a_standby_ends_the_term_of_an_active_whose_port_refuses(
    pair: list[ControllerService], url: str
) -> None:
    """The active controller's listener goes away while its process lives on and keeps
    heartbeating (a SIGKILLed process's port refuses connections the same way): the
    standby, holding a connection to it, finds the port refusing, ends its term (deletes
    the key) and takes over, and counts it; the old one finds its key gone and steps
    down. Nothing acknowledged is lost, and the log stays one line: a term ended by
    mistake costs a failover, never data (its appends are fenced)."""
    active, standby = roles(pair)
    await create(active.address, "before")
    assert active.server is not None and active.leadership is not None
    token = active.leadership.token
    await active.server.stop()  # nothing listens on its port any more
    await eventually(lambda: standby.acting, timeout_s=BOUND_S, what="the standby taking over")
    revocations = "metactl_controller_dead_active_revocations_total"
    # Counted once etcd's answer is read, which may come after the campaign's win.
    await eventually(
        lambda: standby.role_metrics.registry.get_sample_value(revocations) == 1,
        timeout_s=BOUND_S,
        what="the ended term counted",
    )
    assert active.role_metrics.registry.get_sample_value(revocations) == 0
    assert standby.leadership is not None and standby.leadership.token > token
    await eventually(
        lambda: not active.acting, timeout_s=BOUND_S, what="the old term stepping down"
    )
    await create(standby.address, "after")
    assert {"before", "after"} <= set(standby.controller.committed_image.topics)
    assert await log_written_once(url) == standby.controller.committed_image.end_offset


async def test_a_registration_survives_a_failover(pair: list[ControllerService]) -> None:
    active, standby = roles(pair)
    epoch = await broker_up(active.address, 2)
    await active.stop()
    await eventually(lambda: standby.acting, timeout_s=BOUND_S, what="the standby taking over")
    b = standby.controller.committed_image.broker(2)
    assert b is not None and b.epoch == epoch and not b.fenced
    # Its session starts over on the new controller: a full timeout of grace, no fence.
    assert standby.sessions.expired([2], standby.clock.now_ms()) == []


async def test_every_controller_records_itself_and_a_failed_record_only_logs(
    pair: list[ControllerService], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each controller is in etcd from its start (node id, address, start and last-seen
    times), so either one's DescribeQuorum names both; a refresh moves the last-seen time
    on; a write etcd refuses is logged once (rate-limited) and raises nothing."""
    active, standby = roles(pair)
    async with RpcClient(standby.address) as c:
        r = await c.request(DescribeQuorumRequest(), timeout_s=10)
    assert isinstance(r, DescribeQuorumResponse) and r.controllers_error is None
    assert {(x.node_id, x.address) for x in r.controllers} == {
        (s.ha.node_id, s.advertised) for s in pair
    }
    mine = next(x for x in r.controllers if x.node_id == standby.ha.node_id)
    assert mine.last_seen_ms >= mine.started_ms > 0
    assert standby.election is not None
    assert await standby.election.registration.write()
    entries, problem = await standby.election.controllers()
    assert problem is None
    again = next(e for e in entries if e.node == standby.ha.node_id)
    assert again.started_ms == mine.started_ms and again.last_seen_ms >= mine.last_seen_ms

    etcd = await Etcd.connect(EtcdTarget.parse(url))
    try:

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("etcd is down")

        monkeypatch.setattr(etcd, "txn", refused)
        registration = Registration(etcd, "c9", "127.0.0.1:1")
        with capture_logs() as logs:
            assert await registration.write() is False
            assert await registration.write() is False
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1 and warnings[0]["error"] == "etcd is down", logs
    finally:
        await etcd.close()
    assert active.election is not None
    assert {e.node for e in await registered(active.election.etcd)} == {s.ha.node_id for s in pair}


async def test_an_append_in_flight_when_the_term_ends_is_refused_by_the_fence(
    pair: list[ControllerService], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The active controller's append is held back (as when its process is paused with
    a request in flight) while its term ends and the standby takes over. Sent late, the
    append is refused by the fence: the request is answered NOT_CONTROLLER, nothing of
    it is in the log, and no offset holds two batches."""
    active, standby = roles(pair)
    await create(active.address, "before")
    store = active.store
    assert isinstance(store, EtcdLogStore) and active.leadership is not None
    gate, held = asyncio.Event(), asyncio.Event()
    send = store.etcd.txn

    async def paused(what: str, *args: Any, **kw: Any) -> Any:
        if what.startswith("an append"):
            held.set()
            await gate.wait()
        return await send(what, *args, **kw)

    monkeypatch.setattr(store.etcd, "txn", paused)
    late = asyncio.create_task(create_once(active.address, "late"))
    await held.wait()
    raw = await Etcd.connect(EtcdTarget.parse(url))
    try:
        await raw.txn("ending a term", [], [op_delete(raw.target.key(LEADER_KEY))])
    finally:
        await raw.close()
    await eventually(lambda: standby.acting, timeout_s=BOUND_S, what="the standby taking over")
    gate.set()
    with pytest.raises(NotControllerError):
        await late
    assert "late" not in standby.controller.committed_image.topics
    await eventually(
        lambda: not active.acting, timeout_s=BOUND_S, what="the old term stepping down"
    )
    assert await log_written_once(url) == standby.controller.committed_image.end_offset
    # Stepped down, it is a standby again: its image (replayed on from its last term's)
    # is the log's, and follows the new term's writes.
    await create(standby.address, "after")
    await eventually(
        lambda: (
            active.standby is not None
            and set(active.standby.image.topics) == set(standby.controller.committed_image.topics)
        ),
        timeout_s=BOUND_S,
        what="the old active's standby image",
    )
    assert active.last_image is None
    assert {"before", "after"} <= set(active.standby.image.topics)  # type: ignore[union-attr]


async def create_once(address: str, name: str) -> Message:
    async with RpcClient(address) as c:
        topic = CreateTopic(name=name, partitions=1, replication_factor=1)
        return await c.request(CreateTopicsRequest(topics=[topic]), timeout_s=BOUND_S)


async def test_verify_log_full_checks_the_whole_etcd_log_before_serving(
    tmp_path: object, url: str
) -> None:
    """A batch damaged before the newest snapshot and before the tail: replay does not
    read it and the tail check does not reach it, so `--verify-log tail` serves (and
    takes over); `--verify-log full` refuses to start, naming the offset."""
    store = await EtcdLogStore.open(url, cluster_id="ha-test")
    try:
        for _ in range(100):  # a group key each, more than the tail check reads
            await store.append([NoOpRecord()])
        ctl = await Controller.open(store, clock=VirtualClock())
        await ctl.write_snapshot()
        await ctl.close()
    finally:
        await store.close()
    raw = await Etcd.connect(EtcdTarget.parse(url))
    try:
        key = raw.target.key(f"log/{3:020d}")
        kv, _ = await raw.get(key)
        value = bytearray(kv.value)
        value[-1] ^= 0x01
        await raw.txn("damage", [], [op_put(key, bytes(value))])
    finally:
        await raw.close()
    full = controller(tmp_path, url, "c1", verify_log="full")
    with pytest.raises(CorruptLogError) as e:
        await full.start()
    assert e.value.offset == 3
    tail = controller(tmp_path, url, "c2")
    await tail.start()
    try:
        await eventually(lambda: tail.acting, timeout_s=BOUND_S, what="it taking over")
    finally:
        await tail.stop()
