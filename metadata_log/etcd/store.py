"""The etcd backend of the metadata log: `EtcdLogStore`, the same `LogStore` as SQLite's,
on a Raft-replicated store whose appends are fenced by leadership.

Keys, all under the log's prefix (``etcd://host:port/metactl/demo`` → ``/metactl/demo/``):

* ``meta``: what the prefix holds (magic, format version, cluster id, creation time);
  written once, by whoever opens the empty prefix first.
* ``state/end`` and ``state/start``: the log's end offset and its first retained offset
  (decimal). Every append moves ``state/end`` in the same transaction as its batches.
* ``log/<base offset, 20 digits>``: the stored batches of one group commit, in offset
  order from the key's base offset; each is its record count, timestamp, CRC and payload
  length (``>IqII``) and its payload (`records.encode_batch`). The CRC is
  `batch_format.batch_crc`, as in SQLite, and every read checks it. One key per group
  commit keeps a transaction at two operations whatever the group holds (etcd caps
  operations per transaction), and the offset index one key per commit.
* ``snap/<offset, 20 digits>/chunk/<n>`` and ``snap/<offset>/manifest``: a snapshot in
  chunks of at most one append's size, the manifest (timestamp, CRC, chunk count, size)
  written last; a snapshot without a manifest does not exist.
* ``leader``: the leadership key (`metadata_log.etcd.lease`).
* ``controllers/<node id>``: each controller of the log as it last recorded itself (its
  address, start and last-seen times), for `metactl quorum describe`
  (`metadata_log.etcd.registry`); advisory, written by every controller, fenced by none.

**Appends are fenced.** A group commit is one etcd transaction that succeeds only if
``state/end`` still holds the offset the writer expects and the leadership key's create
revision is still the writer's token (every writer holds a `Leadership`: one handed to
it, or one it took at open). A writer that lost
its leadership (its term ended while it was paused, say) cannot append, however late
its request arrives, and its store raises `WriterFencedError`. This is the equivalent of
Raft's term check, done by the store that runs Raft.

**Doubtful appends.** A transaction that times out (a member died, quorum was lost) may
still be applied. The same transaction is sent again, unchanged, until `settle_s` passes
or the leadership is lost (a suspended one keeps trying: `Leadership.hold_until`): it
commits once at most, because its compare on ``state/end``
fails if an earlier attempt was applied, and a failed compare is resolved by reading what
is there (this append's own first batch: it was applied; another term's leadership key:
fenced). If the doubt cannot be settled the append fails with `FatalStorageError`: the
store takes no more writes and its owner re-reads the log (the controller steps down).

**Limits.** etcd refuses requests over ``--max-request-bytes`` (1.5 MiB by default) and
transactions over ``--max-txn-ops`` (128). An append's payload is at most
`max_batch_bytes` (the request size less room for keys and headers), a group commit at
most that many bytes, and the controller cuts larger
changes into several appends inside a metadata transaction (KIP-868), as it does for
SQLite's larger limit. Reads are paged.

**Bounded keyspace.** `delete_before_snapshot` deletes the group keys before the snapshot in
one fenced transaction and then compacts etcd's history up to that revision, so that the
deleted values and old versions of ``state/end`` are freed (etcd's own defragmentation
returns the disk space; see docs/ha.md). Compaction covers the whole etcd keyspace, not
this prefix only: other users of the same etcd cluster lose their older revisions too.

**Tailing.** A read-only store (a standby controller, `metactl log tail`) watches
``state/`` from the revision it read at open, so `wait_for` wakes on each commit without
polling; a watch cut off by compaction or an outage is re-established after re-reading
the state. A watch runs on one member's channel, and a member frozen under it sends
neither events nor an error, so a watch quiet for `FOLLOW_IDLE_S` is checked by a read
of the state (hedged over the members), and opened again if the log moved past it.

This module must not interpret records, elect anyone (it is handed a `Leadership`, or
takes the key for itself, without waiting, as SQLite takes its file lock), or decide what
a fenced writer does next.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final

import structlog

from metactl.errors import (
    CorruptLogError,
    FatalStorageError,
    LogError,
    MetactlError,
    StoreUnavailableError,
    WriterFencedError,
)
from metadata_log.batch_format import (
    TAIL_CHECK_BATCHES,
    StoredBatch,
    StoredSnapshot,
    check_tail,
)
from metadata_log.etcd.client import Etcd, Kv
from metadata_log.etcd.layout import Keys, LogMeta, holder, open_meta, read_state
from metadata_log.etcd.lease import LeaderInfo, Leadership
from metadata_log.etcd.target import EtcdTarget, prefix_end
from metadata_log.etcd.txn import compare_create_revision, compare_value, op_delete, op_get, op_put
from metadata_log.store import LogStore

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "EtcdLogStore"]

log = structlog.get_logger("metadata_log")

DEFAULT_MAX_REQUEST_BYTES: Final = 1_572_864  # etcd's --max-request-bytes default
REQUEST_OVERHEAD: Final = 64 * 1024  # keys, batch headers, compares, gRPC framing
PAGE: Final = 64  # group keys (or snapshot chunks) per range read
SETTLE_S: Final = 10.0
RETRY_BACKOFF_S: Final = 0.2
FOLLOW_IDLE_S: Final = 1.0
"""A follower's watch quiet this long is checked by a read of the log's state."""
_BATCH: Final = struct.Struct(">IqII")  # record count, timestamp ms, CRC, payload bytes
_MANIFEST: Final = struct.Struct(">qIIq")  # timestamp ms, CRC, chunks, payload bytes


class EtcdLogStore(LogStore):
    """A `LogStore` under a key prefix of an etcd cluster. Create with `EtcdLogStore.open`."""

    def __init__(
        self,
        etcd: Etcd,
        *,
        meta: LogMeta,
        leadership: Leadership | None,
        owns_leadership: bool,
        start_offset: int,
        end_offset: int,
        revision: int,
        read_only: bool,
        max_request_bytes: int,
        owns_client: bool = True,
    ) -> None:
        self.max_batch_bytes = max(64 * 1024, max_request_bytes - REQUEST_OVERHEAD)
        self.group_commit_bytes = self.max_batch_bytes
        super().__init__(
            location=etcd.target.url,
            start_offset=start_offset,
            end_offset=end_offset,
            read_only=read_only,
        )
        self.etcd = etcd
        self.meta = meta
        self.keys = Keys(etcd.target)
        self.leadership = leadership  # None only for a read-only store
        self._owns_leadership = owns_leadership
        self._owns_client = owns_client  # a client shared with an election stays open
        self._revision = revision
        self.settle_s = SETTLE_S
        self._follow_task: asyncio.Task[None] | None = None
        self._heard = 0.0  # when the follower's watch last sent something (monotonic)

    @property
    def cluster_id(self) -> str:
        return self.meta.cluster_id

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        create: bool = True,
        read_only: bool = False,
        cluster_id: str | None = None,
        leadership: Leadership | None = None,
        node: str = "metactl",
        verify_tail: bool = True,
        verify_all: bool = False,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        timeout_s: float | None = None,
        client: Etcd | None = None,
    ) -> EtcdLogStore:
        """Open the log under an ``etcd://`` URL's prefix (creating it if the prefix is
        empty, unless `create` is false or the store is read-only).

        A writer appends only while it holds the leadership key: it is handed a won
        `leadership` (the controller's election), or takes the key for itself without
        waiting (a tool, a test), failing with LogError if another holds it. `cluster_id`
        is checked against the log's (InconsistentClusterIdError), or becomes the new
        log's. `verify_all` checks every batch and snapshot before returning, logging its
        progress (`LogStore.verify_logged`).
        """
        target = EtcdTarget.parse(url)
        if client is not None and client.target != target:
            raise LogError(f"the etcd client given is for {client.target.url}, not {target.url}")
        etcd = client or await (
            Etcd.connect(target) if timeout_s is None else Etcd.connect(target, timeout_s=timeout_s)
        )
        owned: Leadership | None = None
        try:
            meta = await open_meta(etcd, create=create and not read_only, cluster_id=cluster_id)
            if not read_only and leadership is None:
                owned = leadership = await Leadership.acquire(
                    etcd, LeaderInfo(node=node), wait=False
                )
            start, end, revision = await read_state(etcd)
            store = cls(
                etcd,
                meta=meta,
                leadership=None if read_only else leadership,
                owns_leadership=owned is not None,
                start_offset=start,
                end_offset=end,
                revision=revision,
                read_only=read_only,
                max_request_bytes=max_request_bytes,
                owns_client=client is None,
            )
            if verify_tail:
                await store._check_tail()
        except BaseException:
            if owned is not None:
                await owned.resign()
            if client is None:
                await etcd.close()
            raise
        if verify_all:
            try:
                await store.verify_logged()
            except BaseException:
                await store.close()
                raise
        return store

    # --- batches -------------------------------------------------------------------------

    @staticmethod
    def _value(batches: Sequence[StoredBatch]) -> bytes:
        parts: list[bytes] = []
        for b in batches:
            parts.append(_BATCH.pack(b.count, b.timestamp_ms, b.crc, len(b.payload)))
            parts.append(b.payload)
        return b"".join(parts)

    def _group(self, kv: Kv) -> list[StoredBatch]:
        """The stored batches of one group key."""
        key = bytes(kv.key)
        digits = key[len(self.keys.log) :]
        if len(digits) != 20 or not digits.isdigit():
            raise CorruptLogError(f"malformed batch key {key!r}", path=self.location)
        base = int(digits)
        value = memoryview(bytes(kv.value))
        out: list[StoredBatch] = []
        at = 0
        while at < len(value):
            if len(value) - at < _BATCH.size:
                raise CorruptLogError("truncated batch header", path=self.location, offset=base)
            count, timestamp_ms, crc, size = _BATCH.unpack_from(value, at)
            at += _BATCH.size
            if count < 1 or len(value) - at < size:
                raise CorruptLogError("truncated batch", path=self.location, offset=base)
            out.append(StoredBatch(base, count, timestamp_ms, crc, bytes(value[at : at + size])))
            at += size
            base += count
        if not out:
            raise CorruptLogError("empty batch key", path=self.location, offset=int(digits))
        return out

    def _groups(self, kvs: Sequence[Kv]) -> list[StoredBatch]:
        return [b for kv in kvs for b in self._group(kv)]

    async def _write_batches(self, batches: list[StoredBatch]) -> None:
        keys = self.keys
        expected, new_end = batches[0].base_offset, batches[-1].end_offset
        value = self._value(batches)
        leadership = self._writer_leadership
        compares = [compare_value(keys.end, b"%d" % expected), *self._fenced()]
        success = [op_put(keys.batch(expected), value), op_put(keys.end, b"%d" % new_end)]
        failure = [op_get(keys.leader), op_get(keys.end), op_get(keys.batch(expected))]
        deadline = time.monotonic() + self.settle_s
        doubt: MetactlError | None = None
        while True:
            sent = time.monotonic()
            try:
                r = await self.etcd.txn(
                    f"an append at offset {expected}", compares, success, failure
                )
            except StoreUnavailableError as exc:
                # Until settled, the term ends or `settle_s` passes: a leadership suspended
                # through an etcd election (`Leadership.hold_until`) keeps its append.
                if leadership.lost.is_set() or time.monotonic() >= deadline:
                    raise FatalStorageError(
                        f"the append at offset {expected} to {self.location} may or may not "
                        f"have been applied ({exc.message}); reopen the log to read which"
                    ) from None
                if doubt is not None:  # at most every RETRY_BACKOFF_S
                    await asyncio.sleep(max(0.0, RETRY_BACKOFF_S - (time.monotonic() - sent)))
                doubt = exc
                await self._find_member(min(deadline, leadership.hold_until))
                continue
            if r.succeeded:
                return
            leader_kvs, end_kvs, mine = (op.response_range.kvs for op in r.responses)
            if doubt is not None and mine and bytes(mine[0].value) == value:
                return  # an earlier attempt of this very transaction was applied
            if not leader_kvs or int(leader_kvs[0].create_revision) != leadership.token:
                raise WriterFencedError(
                    f"append at offset {expected} refused: this writer's leadership "
                    f"(token {leadership.token}) has ended; the log's leadership is "
                    f"now {holder(leader_kvs)}"
                )
            found = bytes(end_kvs[0].value).decode() if end_kvs else "nothing"
            raise FatalStorageError(
                f"the end of {self.location} moved under this writer: expected {expected}, "
                f"found {found}"
            )

    async def _find_member(self, until: float) -> None:
        """Before an append is sent again: a linearizable read, hedged over the members
        and asked again until one answers (or `until`, time.monotonic), so that the
        attempt goes to a member that answers and has a leader, not to the next one in
        line, which may be the frozen one (the client sends calls to the member that
        answered last)."""
        with contextlib.suppress(StoreUnavailableError):
            await self.etcd.get(
                self.keys.end, timeout_s=max(0.05, until - time.monotonic()), persist=True
            )

    async def _key_at(self, offset: int) -> bytes | None:
        """The group key holding `offset`, or the last one before it."""
        keys = self.keys
        kvs, _, _ = await self.etcd.range(
            keys.log, keys.batch(offset) + b"\0", limit=1, descending=True, keys_only=True
        )
        return bytes(kvs[0].key) if kvs else None

    async def _fetch_batches(self, from_offset: int, upper: int) -> list[StoredBatch]:
        first = await self._key_at(from_offset)
        start = first if first is not None else self.keys.batch(from_offset)
        out: list[StoredBatch] = []
        async for b in self._read(start, self.keys.batch(upper)):
            if b.end_offset > from_offset:
                out.append(b)
        return out

    async def _read(self, start: bytes, end: bytes) -> AsyncGenerator[StoredBatch, None]:
        """The batches of the group keys in [start, end), page by page. Pages are read at
        the newest revision: a group key never changes once written, so only a deletion
        before a snapshot can come between two pages, and it removes keys before the
        ones being read (a read of those fails in `LogReads` as out of range)."""
        async with contextlib.aclosing(self.etcd.range_pages(start, end, page=PAGE)) as pages:
            async for kvs in pages:
                for b in self._groups(kvs):
                    yield b

    async def _scan_batches(self, after: int | None, limit: int, near: int) -> list[StoredBatch]:
        keys = self.keys
        start = keys.log
        if after is not None:
            first = await self._key_at(after)
            start = first if first is not None else keys.batch(after)
        out: list[StoredBatch] = []
        async with contextlib.aclosing(self._read(start, keys.log_end)) as batches:
            async for b in batches:
                if after is None or b.base_offset > after:
                    out.append(b)
                    if len(out) >= limit:
                        break
        return out

    async def _retained_start(self, offset: int) -> int:
        """Group keys are deleted whole: the base of the key holding `offset`, or the end
        of the last one before it."""
        first = await self._key_at(offset)
        if first is None:
            return self._start_offset
        kv, _ = await self.etcd.get(first)
        if kv is None:
            return self._start_offset
        group = self._group(kv)
        return group[0].base_offset if group[-1].last_offset >= offset else group[-1].end_offset

    @property
    def _writer_leadership(self) -> Leadership:
        """The leadership a write is fenced by: every writable store has one (`open`),
        and `LogStore` refuses writes on a read-only one before they get here."""
        assert self.leadership is not None
        return self.leadership

    def _fenced(self) -> list[Any]:
        return [compare_create_revision(self.keys.leader, self._writer_leadership.token)]

    async def _fenced_txn(self, what: str, ops: Sequence[Any]) -> int:
        """A write outside appends (deletion, snapshots): fenced like an append, attempted
        once (repeating any of them is harmless); returns its revision."""
        r = await self.etcd.txn(what, self._fenced(), list(ops), [op_get(self.keys.leader)])
        if not r.succeeded:
            raise WriterFencedError(
                f"{what} on {self.location} refused: this writer's leadership has ended; the "
                f"log's leadership is now {holder(r.responses[0].response_range.kvs)}"
            )
        return int(r.header.revision)

    async def _delete_batches_before(self, new_start: int) -> None:
        keys = self.keys
        revision = await self._fenced_txn(
            "deleting records before a snapshot",
            [op_delete(keys.log, keys.batch(new_start)), op_put(keys.start, b"%d" % new_start)],
        )
        try:
            await self.etcd.compact(revision)
        except MetactlError as exc:  # the next deletion compacts again
            log.warning("etcd compaction failed", location=self.location, error=exc.message)

    # --- snapshots -----------------------------------------------------------------------

    async def _put_snapshot(self, snapshot: StoredSnapshot) -> None:
        prefix = self.keys.snapshot(snapshot.offset)
        size = self.max_batch_bytes
        payload = snapshot.payload
        chunks = max(1, -(-len(payload) // size))
        await self._fenced_txn("replacing a snapshot", [op_delete(prefix, prefix_end(prefix))])
        for i in range(chunks):
            await self._fenced_txn(
                f"writing snapshot {snapshot.offset} chunk {i}",
                [op_put(prefix + b"chunk/%08d" % i, payload[i * size : (i + 1) * size])],
            )
        manifest = _MANIFEST.pack(snapshot.timestamp_ms, snapshot.crc, chunks, len(payload))
        await self._fenced_txn(
            f"writing snapshot {snapshot.offset}", [op_put(prefix + b"manifest", manifest)]
        )

    async def _get_snapshot(self, offset: int) -> StoredSnapshot | None:
        prefix = self.keys.snapshot(offset)
        kv, _ = await self.etcd.get(prefix + b"manifest")
        if kv is None:
            return None
        value = bytes(kv.value)
        if len(value) != _MANIFEST.size:
            raise CorruptLogError("malformed snapshot manifest", path=self.location, offset=offset)
        timestamp_ms, crc, chunks, size = _MANIFEST.unpack(value)
        chunk = prefix + b"chunk/"
        parts = [
            bytes(kv.value)
            async for kvs in self.etcd.range_pages(chunk, prefix_end(chunk), page=PAGE)
            for kv in kvs
        ]
        payload = b"".join(parts)
        if len(parts) != chunks or len(payload) != size:
            raise CorruptLogError(
                f"snapshot has {len(parts)} of {chunks} chunks, {len(payload)} of {size} bytes",
                path=self.location,
                offset=offset,
            )
        return StoredSnapshot(offset, timestamp_ms, crc, payload)

    async def _snapshot_offsets(self) -> list[int]:
        snap = self.keys.snap
        offsets: list[int] = []
        async for kvs in self.etcd.range_pages(snap, prefix_end(snap), page=1000, keys_only=True):
            for kv in kvs:
                rest = bytes(kv.key)[len(snap) :]
                if rest.endswith(b"/manifest") and rest[:20].isdigit():
                    offsets.append(int(rest[:20]))
        return offsets

    # --- checks --------------------------------------------------------------------------

    async def _check_tail(self) -> None:
        """CRCs, record counts and continuity of the batches of the last
        `TAIL_CHECK_BATCHES` group keys before the end offset (`check_tail`, as SQLite's
        open does), and no batch at or past it.

        Every read agrees with itself: the start and end offsets and the batches are read
        at one etcd revision, so a writer appending meanwhile is never mistaken for
        corruption (a batch committed after the end offset was read lies past it)."""
        keys = self.keys
        start, end, revision = await read_state(self.etcd)
        kvs, _, _ = await self.etcd.range(
            keys.log, keys.batch(end), limit=TAIL_CHECK_BATCHES, descending=True, revision=revision
        )
        await self._check_nothing_past(end, revision)
        check_tail(
            self._groups(list(reversed(kvs))),
            start,
            end,
            self.location,
            whole=len(kvs) < TAIL_CHECK_BATCHES,
        )

    async def _verify_storage(self) -> None:
        # The end offset and the keys past it, at one revision (as `_check_tail`).
        _, end, revision = await read_state(self.etcd)
        await self._check_nothing_past(end, revision)

    async def _check_nothing_past(self, end: int, revision: int = 0) -> None:
        """No group key at or past the end offset `end` (as of `revision`; 0: now)."""
        keys = self.keys
        beyond, _, _ = await self.etcd.range(
            keys.batch(end), keys.log_end, limit=1, revision=revision, keys_only=True
        )
        if beyond:
            raise CorruptLogError(
                f"a batch lies at or past the log's end offset {end}: {bytes(beyond[0].key)!r}",
                path=self.location,
                offset=end,
            )

    # --- following another writer ---------------------------------------------------------

    async def _refresh(self) -> None:
        if self.read_only and (self._follow_task is None or self._follow_task.done()):
            self._apply_state(*await read_state(self.etcd))

    def _on_wait(self) -> None:
        if self.read_only and (self._follow_task is None or self._follow_task.done()):
            self._follow_task = asyncio.create_task(self._follow(), name="log-follower-watch")

    def _apply_state(self, start: int, end: int, revision: int) -> None:
        self._revision = max(self._revision, revision)
        self._start_offset = max(self._start_offset, start)
        if end > self._end_offset:
            self._advance(end)

    async def _follow(self) -> None:
        """Watch ``state/`` and publish each new end offset; re-read and re-watch when the
        watch ends (compaction, an outage). A watch quiet for `FOLLOW_IDLE_S` is checked
        by a linearizable read of the state: a member frozen under it (SIGSTOP, a stalled
        machine) sends nothing and no error, so a log end the read shows past the watch's
        is published, and the watch is opened again (on the member that answered)."""
        while not self.closed:
            watching = asyncio.create_task(self._watch_state(), name="log-follower-stream")
            try:
                while True:
                    done, _ = await asyncio.wait({watching}, timeout=FOLLOW_IDLE_S)
                    if done:
                        watching.result()  # its error, if any
                        self._apply_state(*await read_state(self.etcd))
                        break
                    if time.monotonic() - self._heard < FOLLOW_IDLE_S:
                        continue
                    start, end, revision = await read_state(self.etcd)
                    if end > self._end_offset or start > self._start_offset:
                        log.warning(
                            "the metadata log's watch fell behind (a frozen etcd member?); "
                            "watching again",
                            location=self.location,
                            end_offset=end,
                            watched_end_offset=self._end_offset,
                        )
                        self._apply_state(start, end, revision)
                        break
                    self._heard = time.monotonic()
            except StoreUnavailableError as exc:
                log.warning("following the metadata log failed", location=self.location,
                            error=exc.message)  # fmt: skip
                await asyncio.sleep(RETRY_BACKOFF_S)  # then re-read and watch again
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError, MetactlError):
                    await watching

    async def _watch_state(self) -> None:
        """One watch of ``state/`` from the revision read last, until it ends."""
        keys = self.keys
        self._heard = time.monotonic()
        async with contextlib.aclosing(
            self.etcd.watch(keys.state, prefix_end(keys.state), self._revision + 1)
        ) as responses:
            async for response in responses:
                self._heard = time.monotonic()
                for ev in response.events:
                    if ev.type != 0:  # only PUTs carry a value
                        continue
                    key, value = bytes(ev.kv.key), bytes(ev.kv.value)
                    if key == keys.end and value.isdigit():
                        self._advance(int(value))
                    elif key == keys.start and value.isdigit():
                        self._start_offset = max(self._start_offset, int(value))
                if response.header.revision:
                    self._revision = max(self._revision, int(response.header.revision))

    # --- lifecycle -----------------------------------------------------------------------

    async def _close_storage(self) -> None:
        try:
            if self._follow_task is not None:
                self._follow_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._follow_task
            if self._owns_leadership:
                await self._writer_leadership.resign()
        finally:
            if self._owns_client:
                await self.etcd.close()
