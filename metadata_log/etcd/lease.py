"""Leadership of a metadata log on etcd: the one writer, elected with a lease-bound key.

Whoever holds the log's leadership key (``<prefix>leader``) may append; the key is put
with a lease, so it disappears when its holder stops renewing it (a crash, a pause, a
partition). The pattern is etcd's election recipe, written out because the client
library's `Election` neither keeps its lease alive nor resigns cleanly:

* **Campaign.** Grant a lease, then one transaction: if the key does not exist
  (create_revision 0), put it with the lease and this process's address; otherwise read
  it. The winner's *create revision* of the key is its fencing token: unique to this
  term, and larger than every earlier term's. A loser watches the key and tries again
  when it is deleted (its holder's lease expired or was revoked).
* **Fencing.** Every append of the holder is a transaction that also compares the key's
  create revision with the token (`metadata_log.etcd.store`). Once the key is gone or
  held by another term, the compare fails and nothing is written, however late the
  request arrives: the equivalent of Raft's term check.
* **Renewal and stepping down.** The holder refreshes the lease every sixth of its TTL
  (`RENEWALS_PER_TTL`). A refresh sent at time t proves the lease lives until at least
  t + TTL, so the holder trusts its leadership until `valid_until` = t + TTL - `safety_s`
  and no longer: it stops acting at least `safety_s` before anyone else can be elected,
  even when renewals fail silently (a partition, a frozen etcd). `lost` is set then, on
  a refresh that finds the lease gone, and on `resign`, which revokes the lease so that a
  standby takes over at once.
* **Riding out an etcd leader change.** Only etcd's leader refreshes leases, so none can
  be refreshed between the loss of one leader and the election of the next (one to two
  election timeouts: 0.5-1 s on the local cluster, `ops.etcd_local`). A refresh is
  hedged over the members and sent anew every `RENEW_ATTEMPT_S` until one answers, so
  the first refresh after the election succeeds; refreshing six times per TTL leaves
  the TTL less the safety margin less a sixth (1.17 s with TTL 2 s) for that, where a
  third would leave 0.83 s, less than an election may take.

Clocks: `time.monotonic` only, on this host; etcd measures the TTL on its leader, which
extends leases when it changes, so a lease never ends earlier than the holder computes
(but see docs/ha.md on etcd 3.4.23's old leader revoking leases after a long pause).

This module must not know the log's records, nor decide what the holder does with its
leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final, NamedTuple

import msgspec
import structlog

from metactl.errors import LogError, MetactlError, StoreUnavailableError
from metadata_log.etcd import DEFAULT_LEASE_TTL_S
from metadata_log.etcd.client import (
    Etcd,
    compare_create_revision,
    op_get,
    op_put,
)

__all__ = ["LEADER_KEY", "Holder", "LeaderInfo", "Leadership", "current_leader", "decode_leader"]

log = structlog.get_logger("metadata_log.etcd")

LEADER_KEY: Final = "leader"
CAMPAIGN_RECHECK_S: Final = 5.0
"""A waiting campaign re-reads the key at least this often (a watch can be cut off)."""
RENEWALS_PER_TTL: Final = 6
"""The holder refreshes its lease this many times per TTL."""
RENEW_ATTEMPT_S: Final = 0.3
"""One refresh waits this long for an answer (from any member) before it is sent anew."""
RENEW_RETRY_S: Final = 0.02
"""A failed refresh is sent again after this long (while the leadership is valid)."""


class LeaderInfo(msgspec.Struct, frozen=True):
    """The value of the leadership key: who holds it and where to reach it."""

    node: str
    address: str = ""  # HOST:PORT of the holder's listener ("" for a tool with no listener)
    since_ms: int = 0


class Holder(NamedTuple):
    """The leadership key as a campaign found it held by another: its value (None if it
    does not decode), its create revision (that term's token) and its lease."""

    info: LeaderInfo | None
    token: int
    lease_id: int


def decode_leader(value: bytes) -> LeaderInfo | None:
    """The leadership key's value, or None if it does not decode as a `LeaderInfo`."""
    try:
        return msgspec.msgpack.decode(value, type=LeaderInfo)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def current_leader(etcd: Etcd) -> tuple[LeaderInfo | None, int]:
    """Who holds the leadership key now (None: nobody, or an unreadable value) and its
    create revision (0: nobody)."""
    kv, _ = await etcd.get(etcd.target.key(LEADER_KEY))
    if kv is None:
        return None, 0
    return decode_leader(kv.value), int(kv.create_revision)


class Leadership:
    """This process holds the log's leadership key while `valid`. Create with `acquire`."""

    def __init__(
        self, etcd: Etcd, info: LeaderInfo, *, lease_id: int, ttl_s: int, token: int, sent: float
    ) -> None:
        self.etcd = etcd
        self.info = info
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.token = token
        """The create revision of the leadership key: the fencing token of this term."""
        self.safety_s = max(0.25, ttl_s / 4)
        self.valid_until = sent + ttl_s - self.safety_s
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def acquire(
        cls,
        etcd: Etcd,
        info: LeaderInfo,
        *,
        ttl_s: int = DEFAULT_LEASE_TTL_S,
        wait: bool = True,
        on_leader: Callable[[Holder], None] | None = None,
    ) -> Leadership:
        """Campaign until elected. With `wait=False`, one try: a key held by another
        raises LogError naming the holder. `on_leader` hears of each other holder seen
        while waiting (again after each of the campaign's re-reads)."""
        key = etcd.target.key(LEADER_KEY)
        while True:
            sent = time.monotonic()
            lease_id, granted = await etcd.grant(ttl_s)
            try:
                stamped = msgspec.structs.replace(info, since_ms=time.time_ns() // 1_000_000)
                r = await etcd.txn(
                    "a leadership campaign",
                    [compare_create_revision(key, 0)],
                    [op_put(key, msgspec.msgpack.encode(stamped), lease=lease_id)],
                    [op_get(key)],
                )
            except BaseException:
                with contextlib.suppress(MetactlError):
                    await etcd.revoke(lease_id, timeout_s=1.0)
                raise
            if r.succeeded:
                leadership = cls(
                    etcd,
                    stamped,
                    lease_id=lease_id,
                    ttl_s=granted,
                    token=int(r.header.revision),
                    sent=sent,
                )
                leadership._task = asyncio.create_task(
                    leadership._renew(), name="leadership-keepalive"
                )
                log.info(
                    "elected: holds the metadata log's leadership",
                    node=info.node,
                    token=leadership.token,
                    lease_ttl_s=granted,
                    log=etcd.target.url,
                )
                return leadership
            with contextlib.suppress(MetactlError):
                await etcd.revoke(lease_id, timeout_s=1.0)
            kvs = r.responses[0].response_range.kvs
            holder = decode_leader(kvs[0].value) if kvs else None
            if not wait:
                who = holder.node if holder is not None else "another writer"
                raise LogError(
                    f"metadata log {etcd.target.url} is already open for writing by {who} "
                    f"(it holds the leadership key)"
                )
            if on_leader is not None and kvs:
                on_leader(Holder(holder, int(kvs[0].create_revision), int(kvs[0].lease)))
            await _await_release(etcd, key, int(r.header.revision) + 1)

    @property
    def valid(self) -> bool:
        """Whether this process may still act as the holder."""
        return not self.lost.is_set() and time.monotonic() < self.valid_until

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            log.warning("leadership lost", node=self.info.node, token=self.token, reason=reason)

    async def _renew(self) -> None:
        """Refresh the lease every `ttl_s / RENEWALS_PER_TTL`. A refresh is hedged over
        the members (`Etcd.keep_alive`) and bounded by `RENEW_ATTEMPT_S`; one that fails
        or is not answered in time is sent again at once (a new send time: an answer to
        an old one proves less), for as long as the leadership is valid. So a frozen or
        leaderless member does not use up the validity: when etcd's leader is lost, the
        first refresh after a new one is elected succeeds (etcd's new leader keeps every
        lease alive)."""
        interval = max(0.1, self.ttl_s / RENEWALS_PER_TTL)
        wait = interval
        failing_since: float | None = None
        while not self.lost.is_set():
            wait = min(wait, self.valid_until - time.monotonic())
            if wait <= 0:
                self._lose("the lease could not be renewed in time")
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.lost.wait()
            if self.lost.is_set():
                return
            sent = time.monotonic()
            budget = self.valid_until - sent
            if budget <= 0:
                self._lose("the lease could not be renewed in time")
                return
            try:
                ttl = await self.etcd.keep_alive(
                    self.lease_id,
                    timeout_s=min(budget, RENEW_ATTEMPT_S),
                    hedge_s=RENEW_ATTEMPT_S / 3,
                )
            except StoreUnavailableError as exc:
                if failing_since is None:
                    failing_since = sent
                    log.warning("lease renewal failed", node=self.info.node, error=exc.message)
                wait = RENEW_RETRY_S
                continue
            except MetactlError as exc:
                self._lose(f"lease renewal refused: {exc.message}")
                return
            if ttl <= 0:
                self._lose("the lease expired")
                return
            self.valid_until = max(self.valid_until, sent + ttl - self.safety_s)
            if failing_since is not None:
                log.info(
                    "lease renewed again",
                    node=self.info.node,
                    seconds_failing=round(time.monotonic() - failing_since, 3),
                )
                failing_since = None
            wait = interval

    async def resign(self) -> None:
        """Stop renewing and revoke the lease (the key goes with it), so that another
        controller can be elected now rather than after the TTL. Best effort: if etcd is
        unreachable the lease simply expires."""
        self._lose("resigned")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(MetactlError):
            await self.etcd.revoke(self.lease_id, timeout_s=1.0)


async def _await_release(etcd: Etcd, key: bytes, from_revision: int) -> None:
    """Return once the key is deleted (or after `CAMPAIGN_RECHECK_S`, to re-read it)."""
    with contextlib.suppress(TimeoutError, StoreUnavailableError):
        async with (
            asyncio.timeout(CAMPAIGN_RECHECK_S),
            contextlib.aclosing(etcd.watch(key, key + b"\0", from_revision)) as responses,
        ):
            async for response in responses:
                if response.canceled or response.compact_revision:
                    return
                if any(ev.type == 1 for ev in response.events):  # DELETE
                    return
