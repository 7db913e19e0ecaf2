"""What the etcd backend adds to the store contract (`test_store_contract.py` runs that on
etcd too): fenced appends, the one writer per log, cluster identity, bad prefixes and
unreachable endpoints, CRCs on values, chunked snapshots, compaction, tailing by watch,
and doubtful appends settled without a duplicate. All against a real etcd member.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from localcluster.etcd import LocalEtcd
from metactl.errors import (
    CorruptLogError,
    FatalStorageError,
    InconsistentClusterIdError,
    InvalidRequestError,
    LogError,
    LogSchemaError,
    StorageError,
    StoreUnavailableError,
    WriterFencedError,
)
from metadata_log.backends import open_store
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LEADER_KEY, LeaderInfo, Leadership, current_leader
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget, prefix_end
from metadata_log.etcd.txn import op_delete, op_put
from metadata_log.records import NoOpRecord
from tests.metadata_log.log_fixtures import records


@pytest.fixture
def url(etcd: LocalEtcd) -> str:
    return etcd.url(f"etcd-store/{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def raw(url: str) -> AsyncIterator[Etcd]:
    """A plain client to the same etcd, to play another process or a fault."""
    client = await Etcd.connect(EtcdTarget.parse(url))
    yield client
    await client.close()


async def keys_under(raw: Etcd, suffix: str) -> list[bytes]:
    start = raw.target.key(suffix)
    kvs, _, _ = await raw.range(start, prefix_end(start), keys_only=True)
    return [bytes(kv.key) for kv in kvs]


async def end_term(raw: Etcd) -> None:
    """Delete the leadership key, as a standby does to a holder silent for its TTL."""
    r = await raw.txn("ending a term", [], [op_delete(raw.target.key(LEADER_KEY))])
    assert r.succeeded


async def test_one_writer_per_log_and_its_fence(url: str, raw: Etcd) -> None:
    """A second writer is refused while the first holds the leadership key. Once that
    key is gone (deleted here, as a standby ending a silent term would), the old
    writer's next append is refused by the fence and writes nothing, and it takes no
    more writes; a new writer is elected and continues from the same end."""
    a = await EtcdLogStore.open(url, node="a")
    try:
        assert await a.append(records(3)) == range(3)
        with pytest.raises(LogError, match="already open for writing by a"):
            await EtcdLogStore.open(url, node="b")
        assert a.leadership is not None
        await end_term(raw)  # the term ends behind a's back
        b = await EtcdLogStore.open(url, node="b")
        try:
            with pytest.raises(WriterFencedError, match="held by b"):
                await a.append(records(2))
            with pytest.raises(FatalStorageError):  # the fenced writer stays fenced
                await a.append(records(1))
            assert await b.append(records(2)) == range(3, 5)
            assert [e.offset for e in await b.read(0)] == [0, 1, 2, 3, 4]
        finally:
            await b.close()
    finally:
        await a.close()


async def test_the_fence_is_the_create_revision_not_the_holders_name(url: str, raw: Etcd) -> None:
    """A deposed writer whose successor has the same name and address is still fenced:
    the token is the leadership key's create revision, new for every term."""
    etcd = await Etcd.connect(EtcdTarget.parse(url))
    try:
        first = await Leadership.acquire(etcd, LeaderInfo(node="ctl-1", address="h:1"))
        store = await EtcdLogStore.open(url, leadership=first)
        await store.append(records(1))
        await end_term(raw)
        second = await Leadership.acquire(etcd, LeaderInfo(node="ctl-1", address="h:1"))
        assert second.token > first.token
        info, token = await current_leader(raw)
        assert info is not None and (info.node, token) == ("ctl-1", second.token)
        with pytest.raises(WriterFencedError):
            await store.append(records(1))
        await store.close()
        again = await EtcdLogStore.open(url, leadership=second)
        assert await again.append(records(1)) == range(1, 2)
        await again.close()
        await second.resign()
        await first.resign()
    finally:
        await etcd.close()


async def test_a_log_is_one_clusters(url: str) -> None:
    store = await EtcdLogStore.open(url, cluster_id="cluster-a")
    assert store.cluster_id == "cluster-a"
    await store.close()
    with pytest.raises(InconsistentClusterIdError, match="cluster 'cluster-a', not of 'b'"):
        await EtcdLogStore.open(url, cluster_id="b")
    same = await EtcdLogStore.open(url, cluster_id="cluster-a")
    await same.close()
    anyone = await EtcdLogStore.open(url, read_only=True)  # no expectation: told which
    assert anyone.cluster_id == "cluster-a"
    await anyone.close()


async def test_a_prefix_holding_something_else_is_refused(url: str, raw: Etcd) -> None:
    await raw.txn("plant", [], [op_put(raw.target.key("unrelated"), b"x")])
    with pytest.raises(LogSchemaError, match="not a metactl metadata log"):
        await EtcdLogStore.open(url)
    await raw.txn("plant", [], [op_put(raw.target.key("meta"), b"\x01\x02")])
    with pytest.raises(LogSchemaError, match="unreadable meta"):
        await EtcdLogStore.open(url)


async def test_a_log_created_meanwhile_by_another_controller_is_opened(
    url: str, raw: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two controllers start on an empty prefix: one finds no meta, and the other creates
    the log before the first looks for foreign keys. The first opens the log the other
    made (it used to read the keys at a newer revision than the meta, and refused the
    log with a contradiction: "holds keys (such as .../meta) but no .../meta")."""
    from metadata_log.etcd.layout import LogMeta, open_meta

    other = await Etcd.connect(EtcdTarget.parse(url))
    real_range = raw.range
    created: list[LogMeta] = []

    async def range_after_the_other_creates(*args: Any, **kwargs: Any) -> Any:
        if not created:
            created.append(await open_meta(other, create=True, cluster_id="theirs"))
        return await real_range(*args, **kwargs)

    monkeypatch.setattr(raw, "range", range_after_the_other_creates)
    try:
        meta = await open_meta(raw, create=True, cluster_id=None)
    finally:
        await other.close()
    assert created and meta == created[0] and meta.cluster_id == "theirs"


async def test_read_only_on_an_empty_prefix_names_it(url: str) -> None:
    with pytest.raises(LogError, match="no metadata log at etcd://"):
        await open_store(url, read_only=True)


async def test_an_unreachable_cluster_is_one_named_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as e:
        await EtcdLogStore.open("etcd://127.0.0.1:1,127.0.0.1:2/x", timeout_s=2.0)
    assert "127.0.0.1:1,127.0.0.1:2" in e.value.message
    assert e.value.retriable
    assert time.monotonic() - started < 30  # bounded: a hang would fail here, not a speed


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("etcd://127.0.0.1:2379", "names no key prefix"),
        ("etcd:///x", "names no endpoint"),
        ("etcd://127.0.0.1:99999/x", "is not host:port"),
        ("etcd://nohost/x", "is not host:port"),
    ],
)
async def test_malformed_urls_are_invalid_config(url: str, words: str) -> None:
    with pytest.raises(Exception) as e:
        await EtcdLogStore.open(url)
    assert getattr(e.value, "code", "") == "INVALID_CONFIG" and words in str(e.value)


async def test_a_damaged_value_is_found_by_its_crc(url: str, raw: Etcd) -> None:
    store = await EtcdLogStore.open(url)
    await store.append(records(5), timestamp_ms=1)
    await store.append(records(5, first=5), timestamp_ms=2)
    await store.close()
    key = raw.target.key(f"log/{5:020d}")
    kv, _ = await raw.get(key)
    value = bytearray(kv.value)
    value[-1] ^= 0xFF  # one bit of the payload
    await raw.txn("damage", [], [op_put(key, bytes(value))])
    with pytest.raises(CorruptLogError, match="CRC mismatch") as e:
        await EtcdLogStore.open(url, read_only=True)  # the tail check at open
    assert e.value.offset == 5 and e.value.path == EtcdTarget.parse(url).url
    reader = await EtcdLogStore.open(url, read_only=True, verify_tail=False)
    try:
        assert [e.offset for e in await reader.read(0, max_records=5)] == list(range(5))
        with pytest.raises(CorruptLogError, match="CRC mismatch"):
            await reader.read(5)
        with pytest.raises(CorruptLogError):
            await reader.verify()
    finally:
        await reader.close()


async def test_a_batch_past_the_end_is_corruption(url: str, raw: Etcd) -> None:
    store = await EtcdLogStore.open(url)
    await store.append(records(2))
    await store.close()
    await raw.txn("plant", [], [op_put(raw.target.key(f"log/{7:020d}"), b"junk")])
    with pytest.raises(CorruptLogError, match="past the log's end offset 2"):
        await EtcdLogStore.open(url, read_only=True)


async def test_appends_over_one_request_are_refused_and_snapshots_are_chunked(url: str) -> None:
    store = await EtcdLogStore.open(url, max_request_bytes=200_000)
    try:
        assert store.max_batch_bytes == 200_000 - 64 * 1024
        big = [NoOpRecord()] * 100_000  # ~100 kB encoded
        with pytest.raises(InvalidRequestError, match="exceeds the"):
            await store.append(big)
        await store.append(records(10))
        state = {"blob": "x" * 700_000}  # about five chunks
        await store.write_snapshot(10, state)
        chunks = await keys_under(store.etcd, f"snap/{10:020d}/chunk/")
        assert len(chunks) == -(-len(msgspec.msgpack.encode(state)) // store.max_batch_bytes)
        assert await store.load_snapshot(dict) == (10, state)
        await store.write_snapshot(10, {"blob": "y"})  # replaces, chunks and all
        assert len(await keys_under(store.etcd, f"snap/{10:020d}/chunk/")) == 1
        assert await store.load_snapshot(dict) == (10, {"blob": "y"})
    finally:
        await store.close()


async def test_deleting_before_a_snapshot_compacts_etcds_history(url: str, raw: Etcd) -> None:
    store = await EtcdLogStore.open(url)
    try:
        for i in range(5):
            await store.append(records(10, first=10 * i), timestamp_ms=i)
        _, before = await raw.get(raw.target.key("meta"))
        await store.write_snapshot(30, {"n": 30})
        assert await store.delete_before_snapshot() == 30
        assert len(await keys_under(raw, "log/")) == 2
        with pytest.raises(StorageError, match="compacted"):
            await raw.range(raw.target.key("log/"), raw.target.key("log0"), revision=before)
    finally:
        await store.close()


async def test_a_reader_follows_commits_by_watch(url: str) -> None:
    writer = await EtcdLogStore.open(url)
    reader = await EtcdLogStore.open(url, read_only=True)
    try:
        await writer.append(records(2))
        waiter = asyncio.create_task(reader.wait_for(3, timeout=30))
        done, _ = await asyncio.wait({waiter}, timeout=0.05)
        assert not done  # offset 3 is not committed yet
        await writer.append(records(2, first=2))
        assert await waiter
        assert reader.end_offset == 4
        assert [e.record for e in await reader.read(2)] == records(2, first=2)
        with pytest.raises(InvalidRequestError, match="read-only"):
            await reader.append(records(1))
        assert reader._follow_task is not None and not reader._follow_task.done()
    finally:
        await reader.close()
        await writer.close()


class TimesOutOnce:
    """A transaction that etcd applies but whose answer is lost (a member died after
    committing it): the client sees StoreUnavailableError."""

    def __init__(self, etcd: Etcd) -> None:
        self.txn = etcd.txn
        self.fired = False

    async def __call__(self, what: str, *args: Any, **kw: Any) -> Any:
        result = await self.txn(what, *args, **kw)
        if what.startswith("an append") and not self.fired:
            self.fired = True
            raise StoreUnavailableError("injected: the answer was lost")
        return result


async def test_a_doubtful_append_is_settled_without_a_duplicate(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await EtcdLogStore.open(url)
    try:
        await store.append(records(2))
        monkeypatch.setattr(store.etcd, "txn", TimesOutOnce(store.etcd))
        assert await store.append(records(3, first=2)) == range(2, 5)
        assert [e.record for e in await store.read(0)] == records(5)
        assert await store.append(records(1, first=5)) == range(5, 6)
        assert (await store.verify()).records == 6
    finally:
        await store.close()


async def test_a_doubtful_append_that_cannot_be_settled_stops_writes(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await EtcdLogStore.open(url)
    try:
        store.settle_s = 0.3

        async def unavailable(*args: Any, **kw: Any) -> Any:
            raise StoreUnavailableError("injected: no quorum")

        monkeypatch.setattr(store.etcd, "txn", unavailable)
        with pytest.raises(FatalStorageError, match="may or may not have been applied"):
            await store.append(records(1))
        monkeypatch.undo()
        with pytest.raises(FatalStorageError, match="stopped taking writes"):
            await store.append(records(1))
    finally:
        await store.close()
    again = await EtcdLogStore.open(url)  # reopening reads what is really there
    assert again.end_offset == 0
    await again.close()


async def test_checks_read_at_one_revision_while_a_writer_appends(url: str) -> None:
    """Issue 21, item 3: the tail check read the end offset at one revision and the keys
    past it at a newer one, so a live log was reported corrupt. The checks now read at
    one revision; the old mixed read (`_check_nothing_past` at the newest revision with
    an end offset read earlier) still reports the false corruption, deterministically."""
    writer = await EtcdLogStore.open(url)
    try:
        await writer.append(records(3))
        reader = await EtcdLogStore.open(url, read_only=True)
        try:
            stale_end = reader.end_offset
            await writer.append(records(2, first=3))  # the reader has not seen these yet
            with pytest.raises(CorruptLogError, match="past the log's end offset 3"):
                await reader._check_nothing_past(stale_end)  # the old, mixed read
            await reader._check_tail()  # one revision: no false corruption
            await reader._verify_storage()
        finally:
            await reader.close()

        # And with appends flowing all the while: every open checks its tail.
        stop = asyncio.Event()

        async def append_until_stopped() -> int:
            n = 5
            while not stop.is_set():
                await writer.append(records(1, first=n))
                n += 1
            return n

        appending = asyncio.create_task(append_until_stopped())
        try:
            for _ in range(30):
                reader = await EtcdLogStore.open(url, read_only=True)
                await reader._verify_storage()
                await reader.close()
        finally:
            stop.set()
            written = await appending
        assert written > 5  # the writer really was appending meanwhile
    finally:
        await writer.close()


async def test_a_crafted_record_count_is_corruption_not_a_crash(url: str, raw: Etcd) -> None:
    """Issue 21 item 7: a group value whose header claims 2^31 or more records made the
    CRC check's struct.pack raise (`'i' format requires ...`), exit 70; it is
    CORRUPT_MESSAGE, at open (the tail) and on reads."""
    from metadata_log.etcd.store import _BATCH

    store = await EtcdLogStore.open(url)
    await store.append(records(2))
    await store.close()
    key = raw.target.key(f"log/{0:020d}")
    kv, _ = await raw.get(key)
    assert kv is not None
    value = bytes(kv.value)
    count, timestamp_ms, crc, size = _BATCH.unpack_from(value, 0)
    assert count == 2
    crafted = _BATCH.pack(2**31 + 5, timestamp_ms, crc, size) + value[_BATCH.size :]
    await raw.txn("plant", [], [op_put(key, crafted)])
    with pytest.raises(CorruptLogError) as raised:
        await EtcdLogStore.open(url, read_only=True)
    assert raised.value.code == "CORRUPT_MESSAGE"
    reader = await EtcdLogStore.open(url, read_only=True, verify_tail=False)
    try:
        with pytest.raises(CorruptLogError):
            await reader.read(0)
    finally:
        await reader.close()
