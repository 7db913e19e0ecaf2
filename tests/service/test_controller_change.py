"""Every term of the active controller is in the log (issue 33, item 4), with controllers in
one process over real TCP and a real etcd member: the first active controller writes
"controller c1 active (term T)" as its term's first record; one that takes over from a
controller that resigned writes how the term before ended ("c1 lost it (resigned:
shutting down)"), after the abort of a transaction its predecessor left open; and an
`events --follow` (`eventfeed.follow.follow_quorum`) given only the first controller
learns the other, outlives the first one's stop and tells the new term once, nothing
twice. The real-process SIGKILL is in tests/e2e/test_failover_visible.py."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid

import pytest

from eventfeed.feed import Event, Feed
from eventfeed.follow import follow_quorum
from localcluster.etcd import LocalEtcd
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    ControllerChangeRecord,
    MetadataRecord,
    NoOpRecord,
)
from protocol.client import RpcClient
from tests.brokers_stub.helpers import eventually
from tests.service.test_ha import BOUND_S, controller


@pytest.fixture
def url(etcd: LocalEtcd) -> str:
    return etcd.url(f"change/{uuid.uuid4().hex[:10]}")


async def records(url: str) -> list[MetadataRecord]:
    reader = await EtcdLogStore.open(url, read_only=True)
    try:
        return [e.record for e in await reader.read(0, 100_000)]
    finally:
        await reader.close()


def changes(log: list[MetadataRecord]) -> list[ControllerChangeRecord]:
    return [r for r in log if isinstance(r, ControllerChangeRecord)]


async def test_each_term_is_recorded_after_the_abort_it_owes(tmp_path: object, url: str) -> None:
    # A writer that leaves a transaction open and resigns (a controller killed between
    # the batches of a large change would leave the same log, without the resignation).
    writer = await EtcdLogStore.open(url, node="w0", cluster_id="ha-test")
    await writer.append([BeginTransactionRecord(name="CreateTopic big"), NoOpRecord()])
    await writer.close()
    before = len(await records(url))
    c1 = controller(tmp_path, url, "c1")
    c2 = controller(tmp_path, url, "c2")
    try:
        await c1.start()
        await eventually(lambda: c1.acting, timeout_s=BOUND_S, what="c1 active")
        assert c1.leadership is not None
        first_term = c1.leadership.token
        log = await records(url)
        # The abort first, then the term's record, before anything else of the term.
        abort, change = log[before], log[before + 1]
        assert isinstance(abort, AbortTransactionRecord) and "CreateTopic big" in abort.reason
        assert isinstance(change, ControllerChangeRecord)
        assert (change.node, change.term, change.address) == ("c1", first_term, c1.address)
        assert change.previous_node == "w0" and change.previous_reason == "resigned"
        assert change.term > change.previous_term > 0

        await c2.start()
        assert c2.role == "standby" and not changes(log[before + 2 :])
        await c1.stop()  # resigns: "shutting down"
        await eventually(lambda: c2.acting, timeout_s=BOUND_S, what="c2 taking over")
        assert c2.leadership is not None
        later = changes((await records(url))[before + 2 :])
        assert later == [
            ControllerChangeRecord(
                node="c2",
                term=c2.leadership.token,
                address=c2.address,
                previous_node="c1",
                previous_term=first_term,
                previous_reason="resigned",
                previous_detail="shutting down",
            )
        ]
        assert later[0].term > first_term
    finally:
        for s in (c1, c2):
            with contextlib.suppress(Exception):
                await s.stop()


async def test_a_follow_outlives_the_controller_it_follows(tmp_path: object, url: str) -> None:
    c1, c2 = controller(tmp_path, url, "c1"), controller(tmp_path, url, "c2")
    events: list[Event] = []
    notes: list[str] = []
    follow: asyncio.Task[None] | None = None
    try:
        await c1.start()
        await eventually(lambda: c1.acting, timeout_s=BOUND_S, what="c1 active")
        await c2.start()
        feed = Feed()  # the whole log, from offset 0
        # Given only c1: c2 is learnt from c1's DescribeQuorum.
        follow = asyncio.create_task(
            follow_quorum(
                RpcClient,
                c1.address,
                feed,
                events.extend,
                timeout_s=10,
                note=notes.append,
            )
        )
        await eventually(
            lambda: any(e.text.startswith("controller c1 active") for e in events),
            timeout_s=BOUND_S,
            what="the first term's line",
        )
        await c1.stop()
        await eventually(
            lambda: any(e.text.startswith("controller c2 active") for e in events),
            timeout_s=BOUND_S,
            what="the second term's line",
        )
    finally:
        if follow is not None:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        for s in (c1, c2):
            with contextlib.suppress(Exception):
                await s.stop()
    texts = [e.text for e in events if e.type == "ControllerChange"]
    assert len(texts) == 2, texts
    first = re.fullmatch(r"controller c1 active \(term (\d+)\)", texts[0])
    second = re.fullmatch(
        r"controller c2 active \(term (\d+)\); c1 lost it \(resigned: shutting down\)",
        texts[1],
    )
    assert first is not None and second is not None, texts
    assert int(second.group(1)) > int(first.group(1))
    # Nothing told twice, nothing skipped: every event's offset once, in order, and the
    # feed read every offset of the log up to its end.
    offsets = [e.offset for e in events]
    assert offsets == sorted(set(offsets))
    assert feed.next_offset == len(await records(url))
