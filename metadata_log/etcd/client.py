"""One client to the etcd cluster of a metadata log (`Etcd`): the key-value, lease, watch
and member-list calls the log uses, every one with a deadline and metactl's errors.

Client library: `etcd3aio` (asyncio, etcd v3 gRPC API). It was chosen over `aetcd` (one
endpoint only, `limit` and `revision` silently dropped from range reads, no reconnecting
watch), `etcetra` (stale serializable reads only, watch events without revisions, pins
an old protobuf) and `etcd-client-py` (no revisions, limits or compaction): etcd3aio
exposes every Range field, raw compares and ops for transactions, takes several
endpoints on one channel with round-robin balancing (so a dead member is skipped), and
its watch stream reconnects and resumes from the last revision seen.

What this package adds on top, and where:

* **One channel per member, and calls that move off a member that does not answer**
  (`metadata_log.etcd.hedging`): idempotent calls (reads, lease grant and revoke, the
  member list, and the transactions that may be applied twice: `txn_hedged`, the
  leadership's) are hedged to the next member after `HEDGE_S` (`BULK_HEDGE_S` for a read
  of a page of values); a transaction is sent once, to the member that answered last,
  within `TXN_ATTEMPT_S` (plus its size at `TXN_BYTES_PER_S`): an error or no answer
  means its outcome is unknown, and moves later calls to the next member, so the
  caller's retry of it goes elsewhere (the store's appends are safe to send again:
  `metadata_log.etcd.store`). Watches stay on the channel of the member that answered
  last (the library's watch reconnects and resumes by itself there).
* Every call has a deadline (`timeout_s`): without one a call to a frozen member can hang
  for ever. The library's own retries are off (`rpc_max_attempts=1`): a retried
  compare-and-put that was applied the first time reports a failed compare, so the store
  settles doubtful writes itself (`metadata_log.etcd.store`).
* Errors become metactl's (`metadata_log.etcd.errors`).
* Channels (`metadata_log.etcd.channels`): host names resolved to IPv4 addresses, gRPC's
  reconnect backoff and message size, and TLS (`metadata_log.etcd.tls`): the target's
  `EtcdTls` makes the channels TLS ones; the members' certificates are checked each
  against its own endpoint's host as given, as etcdctl checks them; a local cluster's
  carry 127.0.0.1 and localhost. A first round trip that fails on TLS is
  SSL_AUTHENTICATION_FAILED, not a retriable unavailability: retrying cannot fix a
  certificate.
* Each member's own status, for `metactl quorum describe --replication`:
  `metadata_log.etcd.health`.

Where the log lives is `metadata_log.etcd.target`, what a transaction is built of
`metadata_log.etcd.txn`. This module must not know the log's keys or records; it only
talks to etcd.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final, cast

import grpc.aio
from etcd3aio import Etcd3Client, EtcdError
from etcd3aio._protobuf import Compare, RequestOp, TxnResponse
from etcd3aio.kv import SortOrder, SortTarget

from metactl.errors import StorageError, StoreUnavailableError
from metadata_log.etcd.channels import connect_member, tls_refusal
from metadata_log.etcd.errors import mapped
from metadata_log.etcd.hedging import HEDGE_S, Members
from metadata_log.etcd.target import EtcdTarget

DEFAULT_TIMEOUT_S: Final = 5.0
BULK_HEDGE_S: Final = 2.0
"""An idempotent range read of values (a page of group keys: megabytes) unanswered this
long by its member is also sent to the next one (`HEDGE_S` for other calls)."""
TXN_ATTEMPT_S: Final = 0.5
"""A transaction's deadline, plus its size at `TXN_BYTES_PER_S`: longer than etcd takes
to commit one on a loaded machine, shorter than a new etcd leader takes to be elected
(a transaction sent to a follower of a dead leader waits for ever)."""
TXN_BYTES_PER_S: Final = 2_000_000
MEMBER_STATUS_TIMEOUT_S: Final = 1.0

Kv = Any  # mvccpb.KeyValue: .key .value .create_revision .mod_revision .version .lease


class Etcd:
    """One client to an etcd cluster, every call with a deadline and metactl's errors,
    sent first to the member that answered last (`member`) and moved to another when it
    does not answer (`Members`). Open with `Etcd.connect`; close with `close`."""

    def __init__(
        self, target: EtcdTarget, members: Sequence[Etcd3Client], timeout_s: float
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.members = Members(target, members, timeout_s)

    @classmethod
    async def channels(cls, target: EtcdTarget, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Etcd:
        """A client to every endpoint of `target`, its channels opened but no call made:
        for a second client of a target already reached (the leadership's heartbeat
        thread has one of its own, `metadata_log.etcd.beater`)."""
        members: list[Etcd3Client] = []
        try:
            for endpoint in target.endpoints:
                members.append(await connect_member(endpoint, target.tls, target.url))
        except BaseException:
            for client in members:
                await client.close()
            raise
        return cls(target, members, timeout_s)

    @classmethod
    async def connect(cls, target: EtcdTarget, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Etcd:
        """A client to every endpoint of `target`, after one round trip shows that the
        cluster answers (else StoreUnavailableError naming the endpoints, or
        SslAuthenticationError when TLS is what failed)."""
        etcd = await cls.channels(target, timeout_s=timeout_s)
        try:
            await etcd.get(target.key("meta"))
        except StoreUnavailableError as exc:
            await etcd.close()
            refused = await tls_refusal(target, exc.message)
            if refused is not None:
                raise refused from None
            raise
        except BaseException:
            await etcd.close()
            raise
        return etcd

    @property
    def where(self) -> str:
        return self.members.where

    @property
    def member(self) -> str:
        """The endpoint calls go to first now: the member that answered last."""
        return self.members.member

    # --- reads ---------------------------------------------------------------------------

    async def get(
        self, key: bytes, *, timeout_s: float | None = None, persist: bool = False
    ) -> tuple[Kv | None, int]:
        """The key's current value (None if absent) and the store's revision, read
        linearizably (so only a member with a leader answers). With `persist`, members
        that fail are asked again until one answers or `timeout_s` passes (`Members.hedged`)."""
        kv, revision, _ = await self.get_at_term(key, timeout_s=timeout_s, persist=persist)
        return kv, revision

    async def get_at_term(
        self, key: bytes, *, timeout_s: float | None = None, persist: bool = False
    ) -> tuple[Kv | None, int, int]:
        """`get`, with the Raft term of the member that answered: (kv or None, the store's
        revision, etcd's Raft term). A term larger than one seen before means etcd
        elected a leader in between (a time nobody could write)."""
        r = await self.members.hedged(
            f"a read of {key!r}",
            lambda c: self.members.service(c, "kv").get(key),
            timeout_s,
            persist=persist,
        )
        return (r.kvs[0] if r.kvs else None), int(r.header.revision), int(r.header.raft_term)

    async def range(
        self,
        start: bytes,
        end: bytes,
        *,
        limit: int = 0,
        descending: bool = False,
        keys_only: bool = False,
        revision: int = 0,
    ) -> tuple[Sequence[Kv], bool, int]:
        """Keys in [start, end) by key, up to `limit` (0: all): (kvs, more, revision)."""
        r = await self.members.hedged(
            f"a range read from {start!r}",
            lambda c: self.members.service(c, "kv").get(
                start,
                range_end=end,
                limit=limit,
                revision=revision,
                keys_only=keys_only,
                sort_order=SortOrder.DESCEND if descending else SortOrder.ASCEND,
                sort_target=SortTarget.KEY,
            ),
            hedge_s=HEDGE_S if keys_only or limit == 1 else BULK_HEDGE_S,
        )
        return r.kvs, bool(r.more), int(r.header.revision)

    async def range_pages(
        self, start: bytes, end: bytes, *, page: int, keys_only: bool = False
    ) -> AsyncGenerator[Sequence[Kv], None]:
        """The keys in [start, end) by key, `page` per range read (each at the newest
        revision: for keys that never change once written)."""
        while True:
            kvs, more, _ = await self.range(start, end, limit=page, keys_only=keys_only)
            if kvs:
                yield kvs
            if not more or not kvs:
                return
            start = bytes(kvs[-1].key) + b"\0"

    # --- writes --------------------------------------------------------------------------

    async def txn(
        self,
        what: str,
        compare: Sequence[Compare],
        success: Sequence[RequestOp],
        failure: Sequence[RequestOp] = (),
        timeout_s: float | None = None,
    ) -> TxnResponse:
        """One transaction, attempted once (`Members.once`) within `timeout_s` (default:
        `TXN_ATTEMPT_S` plus its size at `TXN_BYTES_PER_S`, at most the client's
        timeout): an error means its outcome is unknown."""
        if timeout_s is None:
            size = sum(op.ByteSize() for op in success)
            timeout_s = min(self.timeout_s, TXN_ATTEMPT_S + size / TXN_BYTES_PER_S)
        return await self.members.once(
            what,
            lambda c: self.members.service(c, "kv").txn(compare, success, failure, max_attempts=1),
            timeout_s,
        )

    async def txn_hedged(
        self,
        what: str,
        compare: Sequence[Compare],
        success: Sequence[RequestOp],
        timeout_s: float,
        hedge_s: float,
    ) -> TxnResponse:
        """A transaction that may be applied twice without harm (a compare-and-put of the
        same value, a compare-and-delete): sent to the next member too when the first has
        not answered after `hedge_s` (`Members.hedged`), within `timeout_s`. The leadership's
        heartbeat, so that a frozen etcd member does not use up its validity."""
        return await self.members.hedged(
            what,
            lambda c: self.members.service(c, "kv").txn(compare, success, [], max_attempts=1),
            timeout_s,
            hedge_s,
        )

    async def compact(self, revision: int) -> None:
        await self.members.once(
            f"compaction at revision {revision}",
            lambda c: self.members.service(c, "kv").compact(revision),
            min(self.timeout_s, TXN_ATTEMPT_S),
        )

    # --- leases --------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, the TTL etcd granted, which may be longer than asked). Sent to
        a second member too if the first is slow: a lease granted twice is never used and
        expires after its TTL."""
        r = await self.members.hedged(
            "a lease grant", lambda c: self.members.service(c, "lease").grant(ttl_s)
        )
        return int(r.ID), int(r.TTL)

    async def revoke(self, lease_id: int, timeout_s: float | None = None) -> bool:
        """Revoke a lease (its keys are deleted with it): True, or False if etcd no
        longer had it (expired, or revoked already)."""
        try:
            await self.members.hedged(
                "a lease revoke",
                lambda c: self.members.service(c, "lease").revoke(lease_id),
                timeout_s,
            )
        except StorageError as exc:
            if "lease not found" not in exc.message:
                raise
            return False
        return True

    # --- watches -------------------------------------------------------------------------

    async def watch(
        self, start: bytes, end: bytes, start_revision: int
    ) -> AsyncGenerator[Any, None]:
        """Watch responses for keys in [start, end) from `start_revision` on, from the
        member that answered last (its own channel: a watch follows the calls off a member
        that stopped answering, when the caller watches again). An error ends the stream
        (StoreUnavailableError) and moves later calls to another member; a response with
        `canceled` or `compact_revision` set ends it too (the caller re-reads and watches
        again). A member frozen under an open watch sends nothing and no error: callers
        that must notice read again when a watch stays quiet (`EtcdLogStore`'s follower,
        the leadership's campaign)."""
        i = self.members.current
        stream = cast(
            AsyncGenerator[Any, None],
            self.members.service(self.members.clients[i], "watch").watch(
                start, range_end=end, start_revision=start_revision
            ),
        )
        try:
            while True:
                try:
                    response = await anext(stream)
                except StopAsyncIteration:
                    return
                except (EtcdError, grpc.aio.AioRpcError) as exc:
                    error = mapped(exc, "a watch", self.target.endpoints[i])
                    if isinstance(error, StoreUnavailableError):
                        self.members.failed(i)
                    raise error from None
                yield response
                if response.canceled or response.compact_revision:
                    return
        finally:
            await stream.aclose()

    # --- the members -----------------------------------------------------------------------

    async def member_urls(
        self, timeout_s: float = MEMBER_STATUS_TIMEOUT_S
    ) -> list[tuple[str, str]]:
        """(name, first client URL) of each member, from etcd's member list."""
        r = await self.members.hedged(
            "a member list", lambda c: self.members.service(c, "cluster").member_list(), timeout_s
        )
        scheme = "https" if self.target.tls is not None else "http"
        return [
            (str(m.name) or f"{int(m.ID):x}", str(m.clientURLs[0]) if m.clientURLs else "")
            for m in r.members
        ] or [(e, f"{scheme}://{e}") for e in self.target.endpoints]

    async def close(self) -> None:
        await self.members.close()
