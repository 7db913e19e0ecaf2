"""The leadership key without an etcd lease (`metadata_log.etcd.lease`), against a real
etcd member: a heartbeating holder is never deposed; a silent one is ended after its TTL
by a compare on the mod revision that a late heartbeat defeats; a tool is refused by a
live holder and takes a silent one's place; a controller's own stale key is taken back at
once; an older controller's leased key is left to its lease; the holder bounds etcd's
history. Waits are on events (heartbeats counted, campaigns returning), each bounded by
`BOUND_S` only as a guard against hanging."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from localcluster.etcd import LocalEtcd
from metactl.errors import LogError, StorageError, StoreUnavailableError
from metadata_log.etcd import lease
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LEADER_KEY, LeaderInfo, Leadership, TermEnd, current_leader
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import op_put

BOUND_S = 30.0


@pytest.fixture
async def client(etcd: LocalEtcd) -> AsyncIterator[Etcd]:
    c = await Etcd.connect(EtcdTarget.parse(etcd.url(f"leadership/{uuid.uuid4().hex[:10]}")))
    yield c
    await c.close()


async def stale_key(client: Etcd, info: LeaderInfo) -> int:
    """A key as a holder that died right after its election leaves it; its token."""
    key = client.target.key(LEADER_KEY)
    r = await client.txn("a dead holder's key", [], [op_put(key, msgspec.msgpack.encode(info))])
    return int(r.header.revision)


async def beats(leadership: Leadership, n: int) -> None:
    start = leadership.beats
    async with asyncio.timeout(BOUND_S):
        while leadership.beats < start + n:
            await asyncio.sleep(0.02)  # polling a counter the heartbeat task moves
            assert not leadership.lost.is_set(), leadership.lost_reason


async def test_a_heartbeating_holder_is_never_deposed(client: Etcd) -> None:
    """A campaign waits while the holder beats, for three of its TTLs; once the holder
    stops beating (its task cancelled, as a frozen process), the campaign ends its term
    and wins, and the old holder's next heartbeat would be fenced."""
    holder = await Leadership.acquire(client, LeaderInfo(node="a", address="h:1"), ttl_s=1)
    seen: list[str] = []
    campaign = asyncio.create_task(
        Leadership.acquire(
            client,
            LeaderInfo(node="b", address="h:2"),
            ttl_s=1,
            on_leader=lambda h: seen.append(h.info.node if h.info else "?"),
        )
    )
    try:
        await beats(holder, 3 * lease.RENEWALS_PER_TTL)
        assert not campaign.done() and seen == ["a"]
        await holder.stop_beating()  # silent from now on, still believing itself the holder
        async with asyncio.timeout(BOUND_S):
            new = await campaign
        assert new.token > holder.token and new.info.node == "b"
        # How the silent term ended, written with its deletion, read by the winner.
        assert new.previous == TermEnd(
            node="a", token=holder.token, reason=lease.LEASE_EXPIRED, by="b"
        )
        info, token = await current_leader(client)
        assert info is not None and (info.node, token) == ("b", new.token)
        await new.resign()
    finally:
        campaign.cancel()
        await holder.resign()


async def test_a_heartbeat_between_the_read_and_the_delete_keeps_the_term(
    client: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The silence is confirmed by a read, then the key is deleted by a compare on the mod
    revision read. A heartbeat that lands between the two (planted here, once) defeats
    the delete: the term goes on, and the campaign waits again."""
    token = await stale_key(client, LeaderInfo(node="a", address="h:1", ttl_ms=1000))
    key = client.target.key(LEADER_KEY)
    get = client.get_at_term
    planted = asyncio.Event()
    late: list[int] = []  # the late heartbeat's revision
    read_after: list[int] = []  # mod revisions the campaign read after it

    async def get_then_beat(k: bytes, **kw: object) -> object:
        result = await get(k, **kw)  # type: ignore[arg-type]
        if not planted.is_set():
            planted.set()
            r = await client.txn("a late heartbeat", [], [op_put(key, result[0].value)])
            late.append(int(r.header.revision))
        elif result[0] is not None:
            read_after.append(int(result[0].mod_revision))
        return result

    monkeypatch.setattr(client, "get_at_term", get_then_beat)
    campaign = asyncio.create_task(
        Leadership.acquire(client, LeaderInfo(node="b", address="h:2"), ttl_s=1)
    )
    try:
        async with asyncio.timeout(BOUND_S):
            await planted.wait()
            # The next silence (nobody beats any more) ends the term: the campaign wins.
            new = await campaign
        kv, _, _ = await get(key)
        assert kv is not None and int(kv.create_revision) == new.token > token
        assert int(kv.version) == 1  # a new key: the old one was deleted, not overwritten
        # The delete after the first read failed: the campaign read the late heartbeat.
        assert late and late[0] in read_after, (late, read_after)
        await new.resign()
    finally:
        campaign.cancel()


async def test_a_tool_is_refused_by_a_live_holder_and_takes_a_silent_ones_place(
    client: Etcd,
) -> None:
    holder = await Leadership.acquire(client, LeaderInfo(node="a", address="h:1"), ttl_s=1)
    try:
        with pytest.raises(LogError, match="already open for writing by a"):
            await Leadership.acquire(client, LeaderInfo(node="tool"), ttl_s=1, wait=False)
    finally:
        await holder.resign()
    token = await stale_key(client, LeaderInfo(node="gone", address="h:9", ttl_ms=1000))
    async with asyncio.timeout(BOUND_S):
        tool = await Leadership.acquire(client, LeaderInfo(node="tool"), ttl_s=1, wait=False)
    assert tool.token > token
    await tool.resign()
    assert await current_leader(client) == (None, 0)  # resigned: the key is deleted


async def test_a_controllers_own_stale_key_is_taken_back_at_once(client: Etcd) -> None:
    """Same node and listener address: the earlier process is gone (this one holds the
    port), so its key is not waited out, however long its TTL."""
    me = LeaderInfo(node="c1", address="127.0.0.1:9092")
    token = await stale_key(client, msgspec.structs.replace(me, ttl_ms=3_600_000))
    async with asyncio.timeout(BOUND_S):
        again = await Leadership.acquire(client, me, ttl_s=3600)
    assert again.token > token
    assert again.previous == TermEnd(node="c1", token=token, reason=lease.RESTARTED, by="c1")
    await again.resign()


async def test_a_resignation_is_recorded_for_the_next_holder(client: Etcd) -> None:
    """The first term has no previous one; a resignation deletes the key and records
    why, and the next holder reads it as it wins. A resignation of a term already ended
    (its key gone) records nothing over the record of how it did end."""
    first = await Leadership.acquire(client, LeaderInfo(node="a", address="h:1"), ttl_s=1)
    assert first.previous is None
    await first.resign("shutting down")
    assert first.lost_reason == "resigned: shutting down" and first.lost.is_set()
    second = await Leadership.acquire(client, LeaderInfo(node="b", address="h:2"), ttl_s=1)
    assert second.previous == TermEnd(
        node="a", token=first.token, reason=lease.RESIGNED, detail="shutting down"
    )
    await first.resign("again")  # not its term any more: nothing is deleted or recorded
    info, token = await current_leader(client)
    assert info is not None and (info.node, token) == ("b", second.token)
    await second.resign()
    third = await Leadership.acquire(client, LeaderInfo(node="c", address="h:3"), ttl_s=1)
    assert third.previous == TermEnd(node="b", token=second.token, reason=lease.RESIGNED)
    await third.resign()


async def test_an_older_controllers_leased_key_is_left_to_its_lease(client: Etcd) -> None:
    """A key bound to an etcd lease (written by a controller of the previous version)
    is not ended by silence: the campaign waits for etcd to delete it with its lease."""
    key = client.target.key(LEADER_KEY)
    lease_id, _ = await client.grant(60)
    old = LeaderInfo(node="old", address="h:1")
    await client.txn("an old key", [], [op_put(key, msgspec.msgpack.encode(old), lease=lease_id)])
    seen = asyncio.Event()
    campaign = asyncio.create_task(
        Leadership.acquire(
            client, LeaderInfo(node="new", address="h:2"), ttl_s=1, on_leader=lambda h: seen.set()
        )
    )
    try:
        async with asyncio.timeout(BOUND_S):
            await seen.wait()
            with pytest.raises(LogError, match="already open for writing by old"):
                await Leadership.acquire(client, LeaderInfo(node="tool"), ttl_s=1, wait=False)
            assert not campaign.done()
            assert await client.revoke(lease_id)  # the old controller's lease ends
            new = await campaign
        assert new.info.node == "new"
        await new.resign()
    finally:
        campaign.cancel()


async def test_the_holder_compacts_etcds_history(
    client: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each heartbeat is a revision; the holder compacts history to the revision of its
    heartbeat one `HISTORY_S` earlier, so an idle log does not grow etcd for ever."""
    monkeypatch.setattr(lease, "HISTORY_S", 0.5)
    holder = await Leadership.acquire(client, LeaderInfo(node="a"), ttl_s=1)
    key = client.target.key(LEADER_KEY)
    try:
        async with asyncio.timeout(BOUND_S):
            while True:  # until a compaction has run past the election's revision
                await beats(holder, 1)
                try:
                    await client.range(key, key + b"\0", revision=holder.token)
                except StorageError as exc:
                    assert "compacted" in exc.message
                    break
    finally:
        await holder.resign()


def heartbeats_fail_until(
    leadership: Leadership, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> threading.Event:
    """The holder's heartbeats fail as in an etcd leader election (no leader: every member
    unavailable for writes) until `release` is set. The event returned is set once one
    fails with the holder past its validity (suspended). The heartbeat runs on a thread of
    its own with a client of its own (`metadata_log.etcd.beater`), so the plant is on the
    client class, for heartbeats only, and the events are threading ones."""
    send = Etcd.txn_hedged
    suspended = threading.Event()

    async def no_leader(self: Etcd, what: str, *args: object, **kw: object) -> object:
        if what == "a leadership heartbeat" and not release.is_set():
            if not leadership.valid:
                suspended.set()
            raise StoreUnavailableError("etcdserver: no leader (planted)")
        return await send(self, what, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Etcd, "txn_hedged", no_leader)
    return suspended


async def test_a_holder_past_its_validity_is_suspended_and_resumed_by_a_heartbeat(
    client: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No heartbeat lands for longer than the validity (an etcd election slower than the
    margin): the holder stops acting (not `valid`) but is not lost, and the first
    heartbeat that lands resumes it, same term."""
    holder = await Leadership.acquire(client, LeaderInfo(node="a"), ttl_s=1)
    release = threading.Event()
    suspended = heartbeats_fail_until(holder, monkeypatch, release)
    try:
        assert await asyncio.to_thread(suspended.wait, BOUND_S)
        assert not holder.valid and not holder.lost.is_set()  # suspended, not lost
        release.set()
        async with asyncio.timeout(BOUND_S):
            while holder.resumes == 0:
                await asyncio.sleep(0.02)  # polling a counter the heartbeat thread moves
                assert not holder.lost.is_set(), holder.lost_reason
        assert holder.valid
        info, token = await current_leader(client)
        assert info is not None and token == holder.token
    finally:
        release.set()
        await holder.resign()


async def test_a_holder_suspended_past_its_grace_is_lost(
    client: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = await Leadership.acquire(client, LeaderInfo(node="a"), ttl_s=1)
    release = threading.Event()
    heartbeats_fail_until(holder, monkeypatch, release)
    try:
        async with asyncio.timeout(BOUND_S):
            await holder.lost.wait()
        assert "grace" in holder.lost_reason and holder.resumes == 0
    finally:
        release.set()
        await holder.resign()


async def test_a_silence_across_an_etcd_election_gives_the_holder_another_ttl(
    client: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the end of a silence, etcd answers at a newer Raft term than when the holder
    was last seen (planted once: an election happened, when no heartbeat could land):
    the campaign does not end the term then, but after a new TTL of silence."""
    token = await stale_key(client, LeaderInfo(node="a", address="h:1", ttl_ms=1000))
    read = client.get_at_term
    terms: list[int] = []

    async def newer_term_once(k: bytes, **kw: object) -> tuple[object, int, int]:
        kv, revision, term = await read(k, **kw)  # type: ignore[arg-type]
        if not terms:
            term += 1  # as if etcd had elected a leader during the silence
        terms.append(term)
        return kv, revision, term

    monkeypatch.setattr(client, "get_at_term", newer_term_once)
    async with asyncio.timeout(BOUND_S):
        new = await Leadership.acquire(client, LeaderInfo(node="b", address="h:2"), ttl_s=1)
    assert new.token > token
    assert len(terms) >= 2  # the first silence did not end the term; a second one did
    await new.resign()


async def test_a_busy_event_loop_does_not_cost_the_term(client: Etcd) -> None:
    """The heartbeat used to share the event loop with the controller's work, so a
    takeover that kept the loop busy for longer than the TTL lost the very term it was
    taking over (issue 33's livelock). Here the holder's loop spins for three TTLs, CPU-bound
    and never yielding, while a rival campaigns from a thread and a client of its own: the
    heartbeat thread keeps the term (it beats meanwhile), and the rival wins only when the
    holder resigns."""
    holder = await Leadership.acquire(client, LeaderInfo(node="a", address="h:1"), ttl_s=1)
    won: list[Leadership] = []

    async def rival() -> None:
        etcd = await Etcd.connect(client.target)
        try:
            async with asyncio.timeout(BOUND_S):
                won.append(
                    await Leadership.acquire(etcd, LeaderInfo(node="b", address="h:2"), ttl_s=1)
                )
            await won[0].resign()
        finally:
            await etcd.close()

    campaign = threading.Thread(target=lambda: asyncio.run(rival()))
    campaign.start()
    try:
        await beats(holder, 1)  # the rival is campaigning by now, or soon
        before = holder.beats
        busy_until = time.monotonic() + 3 * holder.ttl_s
        while time.monotonic() < busy_until:
            pass  # a takeover's replay: the loop runs nothing else meanwhile
        assert holder.beats > before and not holder.lost.is_set() and holder.valid
        assert campaign.is_alive() and not won  # the rival is still waiting
    finally:
        await holder.resign("done")
        await asyncio.to_thread(campaign.join, BOUND_S)
    assert won and won[0].previous == TermEnd(
        node="a", token=holder.token, reason=lease.RESIGNED, detail="done"
    )
