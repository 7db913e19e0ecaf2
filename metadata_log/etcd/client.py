"""The etcd connection of a metadata log: where the log lives (`EtcdTarget`, from an
``etcd://host:port[,host:port...]/prefix`` URL) and one client to it (`Etcd`).

Client library: `etcd3aio` (asyncio, etcd v3 gRPC API). It was chosen over `aetcd` (one
endpoint only, `limit` and `revision` silently dropped from range reads, no reconnecting
watch), `etcetra` (stale serializable reads only, watch events without revisions, pins
an old protobuf) and `etcd-client-py` (no revisions, limits or compaction): etcd3aio
exposes every Range field, raw compares and ops for transactions, takes several
endpoints on one channel with round-robin balancing (so a dead member is skipped), and
its watch stream reconnects and resumes from the last revision seen.

What this module adds on top, and why:

* **One channel per member, and calls that move off a member that does not answer.**
  The library balances round-robin over one channel, so a third of the calls would go to
  a member that is frozen (SIGSTOP, a stalled machine: its TCP connections stay open and
  look healthy) or is a follower of a dead leader, and wait out their deadline. Here
  every call goes first to the member that answered last (`member`), then to those that
  answered since they last failed:
  - an idempotent call (reads, lease grant and revoke, the member list, and the
    transactions that may be applied twice: `txn_hedged`, the leadership's) is
    *hedged*: with no answer from that member after `HEDGE_S` (`BULK_HEDGE_S` for a read
    of a page of values) it is also sent to the next member, and after a failure to the
    next at once; the first answer wins and its member serves the next calls. A member
    that answered with etcd's own transient error (no leader, leader changed: an
    election) is asked again after `RETRY_BACKOFF_S`. The call fails when no member can
    be reached (the last error: a cluster that is down fails at once) or at its
    deadline;
  - a transaction is sent once, to that member, within `TXN_ATTEMPT_S` (plus its size at
    `TXN_BYTES_PER_S`): an error or no answer means its outcome is unknown, and moves
    later calls to the next member, so the caller's retry of it goes elsewhere (the
    store's appends are safe to send again: `metadata_log.etcd.store`).
  Watches stay on one channel balanced over every member (the library's watch
  reconnects and resumes by itself there).
* Every call has a deadline (`timeout_s`): without one a call to a frozen member can hang
  for ever. The library's own retries are off (`rpc_max_attempts=1`): a retried
  compare-and-put that was applied the first time reports a failed compare, so the store
  settles doubtful writes itself (`metadata_log.etcd.store`).
* Errors become metactl's: unreachable, no quorum, or no answer before the deadline is
  `StoreUnavailableError` (retriable) naming the endpoints; a request over etcd's
  ``--max-request-bytes`` is `InvalidRequestError`; anything else `StorageError`.
* Host names are resolved to IPv4 addresses before they reach gRPC (the library builds
  an ``ipv4:`` target that takes literals only).
* gRPC reconnects at most `RECONNECT_BACKOFF_MS` after a member returns (its default
  backoff grows to two minutes, which would keep a healed cluster unused), and accepts
  answers up to `MAX_RECEIVE_BYTES` (range reads are paged well below it).
* TLS (`metadata_log.etcd.tls`): the target's `EtcdTls` (the CA, and a client
  certificate for an etcd with ``--client-cert-auth``) makes the channels TLS ones; the
  members' certificates are checked each against its own endpoint's host as given
  (every member has a channel of its own, watches included), as etcdctl checks them; a
  local cluster's carry 127.0.0.1 and localhost. A first round trip that
  fails on TLS (a refused or missing client certificate, a server that does not speak
  TLS, or one that does to a plaintext client) is SSL_AUTHENTICATION_FAILED, not a
  retriable unavailability: retrying cannot fix a certificate.
* `member_health`: each member's own status (`Maintenance.Status` on a channel to that
  member alone): whether it is the Raft leader, its Raft index and term, and whether it
  is healthy (it answered, knows a leader and reports no errors), for `metactl quorum
  describe --replication`.

This module must not know the log's keys or records; it only talks to etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast
from urllib.parse import urlsplit

import grpc
import grpc.aio
from etcd3aio import Etcd3Client, EtcdError
from etcd3aio._protobuf import Compare, RequestOp, TxnResponse
from etcd3aio.kv import KVService, SortOrder, SortTarget

from metactl.errors import (
    InvalidConfigurationError,
    InvalidRequestError,
    MetactlError,
    SslAuthenticationError,
    StorageError,
    StoreUnavailableError,
)
from metactl.numbers import is_digits
from metadata_log.etcd.tls import PROCESS_DEFAULT, EtcdTls, ProcessDefault, resolve_tls

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SCHEME",
    "Etcd",
    "EtcdTarget",
    "Kv",
    "MemberHealth",
    "compare_create_revision",
    "compare_mod_revision",
    "compare_value",
    "compare_version",
    "member_health",
    "op_delete",
    "op_get",
    "op_put",
    "prefix_end",
]

SCHEME: Final = "etcd://"
DEFAULT_TIMEOUT_S: Final = 5.0
HEDGE_S: Final = 0.25
"""An idempotent call unanswered this long by its member is also sent to the next one."""
BULK_HEDGE_S: Final = 2.0
"""The same for a range read of values (a page of group keys: megabytes)."""
TXN_ATTEMPT_S: Final = 0.5
"""A transaction's deadline, plus its size at `TXN_BYTES_PER_S`: longer than etcd takes
to commit one on a loaded machine, shorter than a new etcd leader takes to be elected
(a transaction sent to a follower of a dead leader waits for ever)."""
TXN_BYTES_PER_S: Final = 2_000_000
RETRY_BACKOFF_S: Final = 0.05
"""A call that asks members again after every one failed pauses this long first."""
RECONNECT_BACKOFF_MS: Final = 1000
MAX_RECEIVE_BYTES: Final = 256 * 1024 * 1024
MEMBER_STATUS_TIMEOUT_S: Final = 1.0

T = TypeVar("T")

Kv = Any  # mvccpb.KeyValue: .key .value .create_revision .mod_revision .version .lease


@dataclass(frozen=True)
class EtcdTarget:
    """Where a log lives in etcd: the members' client endpoints and the key prefix that
    holds this cluster's log (every key of the log starts with `prefix`)."""

    endpoints: tuple[str, ...]
    prefix: bytes  # starts and ends with b"/"
    # TLS to the members (None: plaintext). Not part of the log's identity: the same log
    # is the same target whichever files reach it.
    tls: EtcdTls | None = field(default=None, compare=False)

    @classmethod
    def parse(
        cls, url: str, *, tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT
    ) -> EtcdTarget:
        """From ``etcd://host:port[,host:port...]/prefix``; INVALID_CONFIG if malformed.
        `tls` defaults to the process's (`metadata_log.etcd.tls.default_tls`)."""
        if not url.startswith(SCHEME):
            raise InvalidConfigurationError(f"not an etcd URL: {url!r} (etcd://host:port/prefix)")
        hosts, sep, path = url.removeprefix(SCHEME).partition("/")
        path = path.strip("/")
        if not sep or not path:
            raise InvalidConfigurationError(
                f"etcd URL {url!r} names no key prefix (etcd://host:port/prefix)"
            )
        if any(c in path for c in "?#\\") or "//" in path or not path.isprintable():
            raise InvalidConfigurationError(f"etcd URL {url!r}: invalid key prefix {path!r}")
        endpoints = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if not endpoints:
            raise InvalidConfigurationError(f"etcd URL {url!r} names no endpoint")
        for e in endpoints:
            _split_endpoint(e, url)
        return cls(endpoints, f"/{path}/".encode(), resolve_tls(tls))

    @property
    def url(self) -> str:
        return f"{SCHEME}{','.join(self.endpoints)}{self.prefix.decode().rstrip('/')}"

    def key(self, suffix: str) -> bytes:
        return self.prefix + suffix.encode()


def _split_endpoint(endpoint: str, url: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not is_digits(port) or not 0 < int(port) < 65536:
        raise InvalidConfigurationError(
            f"etcd URL {url!r}: endpoint {endpoint!r} is not host:port (port 1-65535)"
        )
    return host, int(port)


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range of every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def compare_create_revision(key: bytes, revision: int) -> Compare:
    return KVService.txn_compare_create_revision(key, revision)


def compare_mod_revision(key: bytes, revision: int) -> Compare:
    """The key was last written at `revision` (0: it does not exist)."""
    return Compare(result=Compare.EQUAL, target=Compare.MOD, key=key, mod_revision=revision)


def compare_version(key: bytes, version: int) -> Compare:
    return KVService.txn_compare_version(key, version)


def compare_value(key: bytes, value: bytes) -> Compare:
    return KVService.txn_compare_value(key, value)


def op_put(key: bytes, value: bytes, *, lease: int = 0) -> RequestOp:
    return KVService.txn_op_put(key, value, lease=lease)


def op_get(key: bytes, end: bytes | None = None) -> RequestOp:
    return KVService.txn_op_get(key, range_end=end)


def op_delete(key: bytes, end: bytes | None = None) -> RequestOp:
    return KVService.txn_op_delete(key, range_end=end)


class Etcd:
    """One client to an etcd cluster, every call with a deadline and metactl's errors,
    sent first to the member that answered last (`member`) and moved to another when it
    does not answer (the module's docstring). Open with `Etcd.connect`; close with
    `close`."""

    def __init__(
        self, target: EtcdTarget, members: Sequence[Etcd3Client], timeout_s: float
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._members = list(members)  # one client (one channel) per endpoint, in order
        self._current = 0  # the member calls go to first
        # When each member last answered, and last failed or did not answer in time.
        self._ok = [0.0] * len(self._members)
        self._bad = [0.0] * len(self._members)
        self._closed = False

    @classmethod
    async def connect(cls, target: EtcdTarget, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Etcd:
        """A client to every endpoint of `target`, after one round trip shows that the
        cluster answers (else StoreUnavailableError naming the endpoints, or
        SslAuthenticationError when TLS is what failed)."""
        members: list[Etcd3Client] = []
        try:
            for endpoint in target.endpoints:
                members.append(await _client(endpoint, target.tls, target.url))
        except BaseException:
            for client in members:
                await client.close()
            raise
        etcd = cls(target, members, timeout_s)
        try:
            await etcd.get(target.key("meta"))
        except StoreUnavailableError as exc:
            await etcd.close()
            refused = await _tls_refusal(target, exc.message)
            if refused is not None:
                raise refused from None
            raise
        except BaseException:
            await etcd.close()
            raise
        return etcd

    @property
    def where(self) -> str:
        return ",".join(self.target.endpoints)

    @property
    def member(self) -> str:
        """The endpoint calls go to first now: the member that answered last."""
        return self.target.endpoints[self._current]

    def _order(self) -> list[int]:
        """The members in the order a call tries them: the one that answered last, then
        those that answered since they last failed (most recent first), then the rest
        (failed longest ago first); ties in endpoint order after it."""
        n = len(self._members)
        rest = [(self._current + k) % n for k in range(1, n)]
        rest.sort(
            key=lambda i: (0, -self._ok[i]) if self._ok[i] >= self._bad[i] else (1, self._bad[i])
        )
        return [self._current, *rest]

    def _answered(self, i: int) -> None:
        self._ok[i] = time.monotonic()
        self._current = i

    def _failed(self, i: int) -> None:
        """Member `i` failed or did not answer in time: later calls go to another (the
        next in `_order`), unless one moved on already."""
        self._bad[i] = time.monotonic()
        if self._current == i:
            self._current = self._order()[1] if len(self._members) > 1 else i

    def _service(self, client: Etcd3Client, name: str) -> Any:
        service = getattr(client, name)
        if service is None or self._closed:  # closed meanwhile (a controller stopping)
            raise StoreUnavailableError("the etcd client is closed")
        return service

    def _error(self, exc: BaseException, what: str) -> MetactlError:
        if isinstance(exc, MetactlError):
            return exc
        if isinstance(exc, (EtcdError, grpc.aio.AioRpcError)):
            return _mapped(exc, what, self.where)
        raise exc

    def _timed_out(self, what: str, timeout_s: float, last: MetactlError | None) -> MetactlError:
        after = f"; last error: {last.message}" if last is not None else ""
        return StoreUnavailableError(
            f"etcd at {self.where} did not answer {what} within {timeout_s:g} s "
            f"(members down or no quorum){after}"
        )

    async def _hedged(
        self,
        what: str,
        attempt: Callable[[Etcd3Client], Awaitable[T]],
        timeout_s: float | None = None,
        hedge_s: float = HEDGE_S,
        *,
        persist: bool = False,
    ) -> T:
        """An idempotent call: to the member that answered last; also to the next one
        (`_order`) when it has not answered after `hedge_s`, or at once when it failed.
        The first answer wins (its member serves the next calls). A member that failed
        but answered (etcd said "leader changed", "no leader"...: an election) is asked
        again after `RETRY_BACKOFF_S`; one that could not be reached is not, unless
        `persist`. Every member unreachable is the last error; no answer within
        `timeout_s`, StoreUnavailableError. Members that had not answered when the call
        ended count as failed."""
        total = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total
        pending: dict[asyncio.Future[T], int] = {}
        tried: set[int] = set()
        again_at: dict[int, float] = {}  # failed members to ask again, and when
        last: MetactlError | None = None
        hedge_at = loop.time()  # when the next member not yet asked may be
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    raise self._timed_out(what, total, last)
                order = self._order()
                fresh = [i for i in order if i not in tried]
                due = [i for i in order if again_at.get(i, deadline) <= now]
                if fresh and now >= hedge_at:
                    i = fresh[0]
                    hedge_at = now + hedge_s
                elif due:
                    i = due[0]
                    del again_at[i]
                else:
                    i = -1
                if i >= 0:
                    tried.add(i)
                    pending[asyncio.ensure_future(attempt(self._members[i]))] = i
                    continue
                if not pending and not fresh and not again_at:
                    assert last is not None  # every member failed and none will be asked
                    raise last
                wake = min([deadline, *again_at.values(), *([hedge_at] if fresh else [])])
                if not pending:
                    await asyncio.sleep(max(0.0, wake - now))
                    continue
                done, _ = await asyncio.wait(
                    pending, timeout=max(0.0, wake - now), return_when=FIRST_COMPLETED
                )
                for fut in done:
                    i = pending.pop(fut)
                    exc = fut.exception()
                    if exc is None:
                        self._answered(i)
                        return fut.result()
                    last = self._error(exc, what)
                    if not isinstance(last, StoreUnavailableError):
                        raise last
                    self._failed(i)
                    if persist or _answered_busy(last):
                        again_at[i] = loop.time() + RETRY_BACKOFF_S
                    hedge_at = min(hedge_at, loop.time())  # the next member at once
        finally:
            for fut, i in pending.items():
                fut.cancel()
                self._failed(i)
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _once(
        self, what: str, attempt: Callable[[Etcd3Client], Awaitable[T]], timeout_s: float
    ) -> T:
        """A call that must not be repeated blindly: once, to the member that answered
        last, within `timeout_s`; an error or no answer moves later calls to another."""
        i = self._current
        try:
            async with asyncio.timeout(timeout_s):
                result = await attempt(self._members[i])
        except TimeoutError:
            self._failed(i)
            raise self._timed_out(what, timeout_s, None) from None
        except Exception as exc:
            error = self._error(exc, what)
            if isinstance(error, StoreUnavailableError):
                self._failed(i)
            raise error from None
        self._ok[i] = time.monotonic()
        return result

    # --- reads ---------------------------------------------------------------------------

    async def get(
        self, key: bytes, *, timeout_s: float | None = None, persist: bool = False
    ) -> tuple[Kv | None, int]:
        """The key's current value (None if absent) and the store's revision, read
        linearizably (so only a member with a leader answers). With `persist`, members
        that fail are asked again until one answers or `timeout_s` passes (`_hedged`)."""
        kv, revision, _ = await self.get_at_term(key, timeout_s=timeout_s, persist=persist)
        return kv, revision

    async def get_at_term(
        self, key: bytes, *, timeout_s: float | None = None, persist: bool = False
    ) -> tuple[Kv | None, int, int]:
        """`get`, with the Raft term of the member that answered: (kv or None, the store's
        revision, etcd's Raft term). A term larger than one seen before means etcd
        elected a leader in between (a time nobody could write)."""
        r = await self._hedged(
            f"a read of {key!r}",
            lambda c: self._service(c, "kv").get(key),
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
        r = await self._hedged(
            f"a range read from {start!r}",
            lambda c: self._service(c, "kv").get(
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
        """One transaction, attempted once (`_once`) within `timeout_s` (default:
        `TXN_ATTEMPT_S` plus its size at `TXN_BYTES_PER_S`, at most the client's
        timeout): an error means its outcome is unknown."""
        if timeout_s is None:
            size = sum(op.ByteSize() for op in success)
            timeout_s = min(self.timeout_s, TXN_ATTEMPT_S + size / TXN_BYTES_PER_S)
        return await self._once(
            what,
            lambda c: self._service(c, "kv").txn(compare, success, failure, max_attempts=1),
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
        not answered after `hedge_s` (`_hedged`), within `timeout_s`. The leadership's
        heartbeat, so that a frozen etcd member does not use up its validity."""
        return await self._hedged(
            what,
            lambda c: self._service(c, "kv").txn(compare, success, [], max_attempts=1),
            timeout_s,
            hedge_s,
        )

    async def compact(self, revision: int) -> None:
        await self._once(
            f"compaction at revision {revision}",
            lambda c: self._service(c, "kv").compact(revision),
            min(self.timeout_s, TXN_ATTEMPT_S),
        )

    # --- leases --------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, the TTL etcd granted, which may be longer than asked). Sent to
        a second member too if the first is slow: a lease granted twice is never used and
        expires after its TTL."""
        r = await self._hedged("a lease grant", lambda c: self._service(c, "lease").grant(ttl_s))
        return int(r.ID), int(r.TTL)

    async def revoke(self, lease_id: int, timeout_s: float | None = None) -> bool:
        """Revoke a lease (its keys are deleted with it): True, or False if etcd no
        longer had it (expired, or revoked already)."""
        try:
            await self._hedged(
                "a lease revoke", lambda c: self._service(c, "lease").revoke(lease_id), timeout_s
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
        i = self._current
        stream = cast(
            AsyncGenerator[Any, None],
            self._service(self._members[i], "watch").watch(
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
                    error = _mapped(exc, "a watch", self.target.endpoints[i])
                    if isinstance(error, StoreUnavailableError):
                        self._failed(i)
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
        r = await self._hedged(
            "a member list", lambda c: self._service(c, "cluster").member_list(), timeout_s
        )
        scheme = "https" if self.target.tls is not None else "http"
        return [
            (str(m.name) or f"{int(m.ID):x}", str(m.clientURLs[0]) if m.clientURLs else "")
            for m in r.members
        ] or [(e, f"{scheme}://{e}") for e in self.target.endpoints]

    async def close(self) -> None:
        self._closed = True
        for client in self._members:
            await client.close()


@dataclass(frozen=True)
class MemberHealth:
    """One etcd member as it reports itself (`member_health`)."""

    name: str
    client_url: str
    healthy: bool
    leader: bool = False
    raft_role: str = ""  # "leader", "follower", "no leader"; "" if it did not answer
    member_id: str = ""  # hex, as etcdctl prints it
    raft_index: int | None = None
    raft_term: int | None = None
    version: str = ""
    error: str = ""  # why it is not healthy


async def member_health(
    etcd: Etcd, *, timeout_s: float = MEMBER_STATUS_TIMEOUT_S
) -> list[MemberHealth]:
    """Each member's status, asked of that member alone, all at once, each within
    `timeout_s`. The members come from etcd's member list; when that does not answer (no
    quorum), from the target's endpoints. A member that does not answer, knows no
    leader or reports errors (an alarm) is unhealthy, with the reason."""
    try:
        members = await etcd.member_urls(timeout_s)
    except MetactlError:
        scheme = "https" if etcd.target.tls is not None else "http"
        members = [(e, f"{scheme}://{e}") for e in etcd.target.endpoints]
    found = await asyncio.gather(
        *(_one_member(etcd.target, name, url, timeout_s) for name, url in members)
    )
    return sorted(found, key=lambda m: m.name)


async def _one_member(target: EtcdTarget, name: str, url: str, timeout_s: float) -> MemberHealth:
    endpoint = urlsplit(url).netloc or url
    try:
        client = await _client(endpoint, target.tls, url)
    except MetactlError as exc:
        return MemberHealth(name, url, healthy=False, error=exc.message)
    try:
        assert client.maintenance is not None
        async with asyncio.timeout(timeout_s):
            s = await client.maintenance.status(timeout=timeout_s)
    except (TimeoutError, EtcdError, grpc.aio.AioRpcError) as exc:
        detail = (
            f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else _cause(exc)
        )
        return MemberHealth(name, url, healthy=False, error=detail)
    finally:
        await client.close()
    me, leader = int(s.header.member_id), int(s.leader)
    errors = [str(e) for e in s.errors]
    problem = "; ".join(errors) or ("" if leader else "knows no leader (no quorum)")
    is_leader = leader != 0 and leader == me
    return MemberHealth(
        name,
        url,
        healthy=not problem,
        leader=is_leader,
        raft_role="leader" if is_leader else ("follower" if leader else "no leader"),
        member_id=f"{me:x}",
        raft_index=int(s.raftIndex),
        raft_term=int(s.raftTerm),
        version=str(s.version),
        error=problem,
    )


async def _client(endpoint: str, tls: EtcdTls | None, url: str) -> Etcd3Client:
    """A connected library client of one member, with TLS if `tls`: the member's
    certificate must carry the host of its own endpoint, as etcdctl checks."""
    addresses = [await _resolve(endpoint, url)]
    tls_args: dict[str, Any] = {}
    if tls is not None:
        ca, chain, key = tls.load()
        server_name = _split_endpoint(endpoint, url)[0].strip("[]")
        tls_args = {"ca_cert": ca, "cert_chain": chain, "cert_key": key}
        tls_args["tls_server_name"] = server_name
    client = Etcd3Client(addresses, rpc_max_attempts=1, **tls_args)
    # The library has no public knob for these channel options.
    client._manager.grpc_options += [
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.initial_reconnect_backoff_ms", min(RECONNECT_BACKOFF_MS, 200)),
    ]
    await client.connect()
    if client._channel is not None:  # connect now, not at the first call
        client._channel.get_state(try_to_connect=True)
    return client


_TLS_WORDS: Final = ("ssl", "tls", "tsi_", "handshake", "certificate", "hostname verification")


async def _tls_refusal(target: EtcdTarget, detail: str) -> SslAuthenticationError | None:
    """Why a first round trip failed, if TLS is the reason: with TLS on, a handshake the
    member refused (no certificate, one it does not trust) or one that failed here (its
    certificate not of our CA or not naming the host, a plaintext member); without TLS,
    a member that speaks TLS (it closes a plaintext connection). None: not TLS."""
    flags = "--etcd-cacert/--etcd-cert/--etcd-key (or METACTL_ETCD_CACERT/_CERT/_KEY)"
    if target.tls is not None:
        lowered = detail.lower()
        if any(w in lowered for w in _TLS_WORDS):
            _, found, last = detail.rpartition("last error: ")
            cause = last if found else detail
            while cause.endswith(")") and cause.count(")") > cause.count("("):
                cause = cause[:-1]
            return SslAuthenticationError(
                f"etcd at {','.join(target.endpoints)}: TLS failed ({cause}): its "
                "certificate is not of "
                "the --etcd-cacert CA or does not name the member's host as the URL gives "
                "it, it refused this "
                "client's certificate (or its lack of one: --client-cert-auth), or it does "
                f"not speak TLS; check {flags}"
            )
        return None
    for endpoint in target.endpoints:
        if await _speaks_tls(endpoint):
            return SslAuthenticationError(
                f"etcd at {endpoint} speaks TLS and refused a plaintext connection: give "
                f"{flags} (a local cluster's are in <data-dir>/certs/etcd)"
            )
    return None


async def _speaks_tls(endpoint: str) -> bool:
    """Whether `endpoint` answers a TLS handshake (no certificate checked or sent)."""
    host, _, port = endpoint.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx)
    except ssl.SSLError as exc:
        # The server answered in TLS (an alert: it wants a certificate, say).
        return exc.reason not in (None, "WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING")
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return True


def _cause(exc: BaseException) -> str:
    """The gist of a failed call: gRPC's last connection error, without its wrapping
    (e.g. "Connection refused")."""
    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    detail = " ".join((detail or type(exc).__name__).split())
    _, found, last = detail.rpartition("last error: ")
    if not found:
        return detail
    while last.endswith(")") and last.count(")") > last.count("("):
        last = last[:-1]
    return last.rsplit(": ", 1)[-1] or detail


async def _resolve(endpoint: str, url: str) -> str:
    host, port = _split_endpoint(endpoint, url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise InvalidConfigurationError(
            f"etcd URL {url!r}: cannot resolve {host!r}: {exc}"
        ) from None
    return f"{infos[0][4][0]}:{port}"


def _answered_busy(error: MetactlError) -> bool:
    """Whether a retriable failure came from a member that answered (etcd's own words:
    no leader, leader changed, request timed out, too many requests, a proposal dropped
    during an election), not from one that could not be reached."""
    return "etcdserver:" in error.message or "proposal dropped" in error.message


def _mapped(exc: BaseException, what: str, where: str) -> MetactlError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    detail = detail or type(exc).__name__
    if code is grpc.StatusCode.INVALID_ARGUMENT and "too large" in detail:
        return InvalidRequestError(f"etcd refused {what}: {detail}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" not in detail:
        return InvalidRequestError(f"etcd refused {what}: {detail}")
    # Retriable: no connection, no quorum or leader (a follower drops a proposal while
    # an election is under way), a member too far behind ("too many requests").
    if code in (
        None,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) or (
        code is grpc.StatusCode.UNKNOWN
        and any(w in detail for w in ("deadline", "timed out", "proposal dropped"))
    ):
        return StoreUnavailableError(f"etcd at {where} failed {what}: {detail}")
    return StorageError(f"etcd at {where} refused {what}: {code.name if code else ''} {detail}")
