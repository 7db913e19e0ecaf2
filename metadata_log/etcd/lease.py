"""Leadership of a metadata log on etcd: the one writer, elected with a key it rewrites.

Whoever holds the log's leadership key (``<prefix>leader``) may append. The key has no
etcd lease: its holder rewrites it as a heartbeat, and a holder that stops rewriting it (a
crash, a pause, a partition) has it deleted by a standby once it has been silent for the
TTL. The campaign is etcd's election recipe; the liveness is this module's own, because
etcd 3.4's lessor can revoke a live holder's lease (below).

* **Campaign.** One transaction: if the key does not exist (create_revision 0), put it
  with this process's address and TTL; otherwise read it. The winner's *create revision*
  of the key is its fencing token: unique to this term, and larger than every earlier
  term's. A loser watches the key: a deletion (a resignation, or a standby ending a
  silent term) sends it campaigning at once; each rewrite is a heartbeat of the holder.
* **Ending a silent term.** A holder not seen to rewrite the key for the TTL (the larger
  of the holder's, which the key carries, and this campaign's) is deleted by a
  transaction that compares the key's mod revision with the last one seen: a heartbeat
  that lands meanwhile makes the delete fail, and the wait goes on. Before deleting, the
  key is read again linearizably, so a watch stuck on a partitioned member ends no live
  term. A key held by this very controller's earlier incarnation (same node and listener
  address: the old process is gone, since this one holds the port) is deleted at once.
* **Fencing.** Every append of the holder is a transaction that also compares the key's
  create revision with the token (`metadata_log.etcd.store`). Once the key is gone or
  held by another term, the compare fails and nothing is written, however late the
  request arrives: the equivalent of Raft's term check. Heartbeats are fenced the same
  way, so a deposed holder learns it at its next one.
* **Heartbeats and stepping down.** The holder rewrites the key every sixth of its TTL
  (`RENEWALS_PER_TTL`), a compare-and-put hedged over the members, from a thread of its
  own with its own event loop and etcd client (`metadata_log.etcd.beater`), so that the
  heartbeat lands on time however long the controller's event loop is busy (a takeover's
  replay on a starved host). A heartbeat sent at
  time t and applied was seen by any standby at t or later, and the standby waits the TTL
  from its last sight before deleting; so the holder trusts its leadership until
  `valid_until` = t + TTL - `safety_s` and no longer: it stops acting at least `safety_s`
  before anyone else can be elected, even when heartbeats fail silently (a partition, a
  frozen etcd). The margin (`SAFETY_FRACTION` of the TTL, at least 0.25 s) covers only
  the two processes' clock rates and the holder's own scheduling: no etcd timing is in
  it, since a standby, not etcd's lessor, ends a term (it was a quarter with the lease).
  Past `valid_until` the holder is *suspended*: it does not act, but goes on beating
  until `hold_until` (one TTL more); a heartbeat that lands meanwhile proves the key
  still this term's, and the term goes on. `lost` is set at `hold_until`, on a heartbeat
  that finds the key gone or another term's, and on `resign`, which deletes the key so
  that a standby takes over at once.
* **Riding out an etcd leader change.** Only etcd's leader commits writes, so no
  heartbeat lands between the loss of one leader and the election of the next (one to
  two election timeouts: 0.5-1 s on the local cluster, `localcluster.etcd`). A heartbeat is
  sent anew every `RENEW_ATTEMPT_S` until one answers, so the first one after the
  election lands; beating six times per TTL leaves the TTL less the safety margin less a
  sixth (1.42 s with TTL 2 s) for that. An election slower than that (a split vote: 1.7
  s seen on a loaded machine) suspends the holder, and its first heartbeat after the
  election resumes it. Standbys see no heartbeat meanwhile either: a standby whose TTL
  of silence ends with etcd at a newer Raft term than at the last heartbeat it saw (an
  election in between, when nobody could write) gives the holder another TTL.
* **Why not an etcd lease.** Until this version the key was bound to a lease, refreshed by
  keep-alives. etcd 3.4.23 (Debian bookworm's) lets an old etcd leader, resumed after a
  pause, revoke leases it thinks expired (etcd issue 15247, fixed upstream later): a
  paused etcd leader deposed a live controller at its resume in 11 of 40 trials. A key
  with no lease cannot be revoked. A key an older controller holds with a lease is still
  waited for until etcd deletes it (a rolling upgrade; docs/ha.md).
* **How a term ended.** Whoever ends a term writes how, in the transaction that deletes
  the key: ``<prefix>term-end`` gets a `TermEnd` (the holder, its token, "resigned", "lease
  expired" when a standby found it silent for its TTL, "dead-active detection"
  (`controller.runtime.dead_active`), or "restarted" when its own next incarnation took the
  key back; who ended it). The next holder reads it in its winning campaign transaction
  (`Leadership.previous`), for the record of its term that the controller writes.
* **Bounded history.** Each heartbeat is a revision of the key. The holder compacts etcd's
  history every `HISTORY_S` to the revision of its heartbeat `HISTORY_S` earlier, so an
  idle log does not grow etcd's history for ever (the store also compacts when it
  deletes records before a snapshot; compaction covers the whole keyspace).

Clocks: `time.monotonic` only, each process its own; no clocks are compared across
processes, only durations, which the safety margin covers.

This module must not know the log's records, nor decide what the holder does with its
leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Final

import msgspec
import structlog

from metactl.errors import MetactlError, StoreUnavailableError
from metadata_log.etcd import DEFAULT_LEASE_TTL_S
from metadata_log.etcd.beater import LoopThread
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.leader_key import (
    DEAD_ACTIVE,
    LEADER_KEY,
    LEASE_EXPIRED,
    RESIGNED,
    RESTARTED,
    TERM_END_KEY,
    Holder,
    LeaderInfo,
    TermEnd,
    current_leader,
    decode_leader,
    decode_term_end,
)
from metadata_log.etcd.outlast import await_release, held, outlast
from metadata_log.etcd.txn import compare_create_revision, op_delete, op_get, op_put

__all__ = [
    "DEAD_ACTIVE",
    "LEADER_KEY",
    "LEASE_EXPIRED",
    "RESIGNED",
    "RESTARTED",
    "TERM_END_KEY",
    "Holder",
    "LeaderInfo",
    "Leadership",
    "TermEnd",
    "current_leader",
    "decode_leader",
]

log = structlog.get_logger("metadata_log.etcd")

RENEWALS_PER_TTL: Final = 6
"""The holder rewrites the key (a heartbeat) this many times per TTL."""
RENEW_ATTEMPT_S: Final = 0.3
"""One heartbeat waits this long for an answer (from any member) before it is sent anew."""
RENEW_RETRY_S: Final = 0.02
"""A failed heartbeat is sent again after this long (while the leadership is valid)."""
SAFETY_FRACTION: Final = 1 / 8
"""The holder stops trusting its leadership this much of the TTL before a standby could
end it (at least 0.25 s)."""
HISTORY_S: Final = 3600.0
"""etcd history older than this (at least; at most twice this) is compacted by the holder."""


class Leadership:
    """This process holds the log's leadership key while `valid`. Create with `acquire`."""

    def __init__(
        self,
        etcd: Etcd,
        info: LeaderInfo,
        *,
        ttl_s: int,
        token: int,
        sent: float,
        previous: TermEnd | None = None,
    ) -> None:
        self.etcd = etcd
        self.info = info
        self.ttl_s = ttl_s
        self.token = token
        """The create revision of the leadership key: the fencing token of this term."""
        self.previous = previous
        """How the term before this one ended (None: not recorded: the log's first term,
        or one ended by an older controller's lease)."""
        self.safety_s = max(0.25, ttl_s * SAFETY_FRACTION)
        # Written by the heartbeat thread, read by the event loop's (a float: atomic).
        self.valid_until = sent + ttl_s - self.safety_s
        self.lost = asyncio.Event()
        """Set on the event loop once the leadership is lost (`valid` knows at once)."""
        self.lost_reason = ""
        self.beats = 0
        """Heartbeats applied (tests and the bench count them)."""
        self.resumes = 0
        """Times a heartbeat landed after the validity had run out (`hold_until`)."""
        self._value = msgspec.msgpack.encode(info)
        self._loop = asyncio.get_running_loop()
        self._gone = threading.Event()  # lost, as the heartbeat thread may set it
        self._gone_lock = threading.Lock()
        self._beater = LoopThread("leadership-heartbeat", etcd.target, self._beat)
        self._checkpoint = (time.monotonic(), token)  # (when, revision) for compaction
        self._compacting: asyncio.Task[None] | None = None  # on the heartbeat thread's loop

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
        """Campaign until elected. With `wait=False`, a key held by a live holder (one
        seen to beat) raises LogError naming it; a silent one is waited out (its TTL) and
        taken. `on_leader` hears of each other holder seen while waiting (again after each
        of the campaign's re-reads)."""
        key = etcd.target.key(LEADER_KEY)
        ended_key = etcd.target.key(TERM_END_KEY)
        ttl_s = max(1, ttl_s)
        while True:
            sent = time.monotonic()
            stamped = msgspec.structs.replace(
                info, since_ms=time.time_ns() // 1_000_000, ttl_ms=ttl_s * 1000
            )
            r = await etcd.txn(
                "a leadership campaign",
                [compare_create_revision(key, 0)],
                [op_put(key, msgspec.msgpack.encode(stamped)), op_get(ended_key)],
                [op_get(key)],
            )
            if r.succeeded:
                leadership = cls(
                    etcd,
                    stamped,
                    ttl_s=ttl_s,
                    token=int(r.header.revision),
                    sent=sent,
                    previous=decode_term_end(r.responses[1].response_range.kvs),
                )
                leadership._beater.start()
                log.info(
                    "elected: holds the metadata log's leadership",
                    node=info.node,
                    token=leadership.token,
                    lease_ttl_s=ttl_s,
                    log=etcd.target.url,
                )
                return leadership
            kvs = r.responses[0].response_range.kvs
            if not kvs:
                continue  # deleted since the compare: campaign again
            kv = kvs[0]
            holder = Holder(decode_leader(kv.value), int(kv.create_revision), int(kv.lease))
            if on_leader is not None:
                on_leader(holder)
            revision = int(r.header.revision)
            if holder.lease_id:  # an older controller's key: etcd deletes it with its lease
                if not wait:
                    raise held(etcd, holder)
                await await_release(etcd, key, revision + 1)
                continue

            def beat(holder: Holder = holder) -> None:
                if not wait:
                    raise held(etcd, holder)

            ours = (
                holder.info is not None
                and bool(info.address)
                and (holder.info.node, holder.info.address) == (info.node, info.address)
            )
            held_ttl = holder.info.ttl_ms / 1000 if holder.info is not None else 0.0
            await outlast(
                etcd,
                key,
                kv,
                revision,
                silence_s=0.0 if ours else max(float(ttl_s), held_ttl),
                on_beat=beat,
                term=int(r.header.raft_term),
                ended=TermEnd(
                    node=holder.info.node if holder.info is not None else "?",
                    token=holder.token,
                    reason=RESTARTED if ours else LEASE_EXPIRED,
                    by=info.node,
                ),
            )

    @property
    def valid(self) -> bool:
        """Whether this process may still act as the holder."""
        return not self._gone.is_set() and time.monotonic() < self.valid_until

    @property
    def hold_until(self) -> float:
        """Past `valid_until` the holder does not act but goes on beating until this
        (one more TTL): a heartbeat that lands meanwhile proves the key still this term's
        and the term goes on. An etcd leader election slower than the validity left
        (seen: 1.7 s) then costs no failover."""
        return self.valid_until + self.ttl_s

    def _lose(self, reason: str) -> None:
        """On either thread: the heartbeat's, or the event loop's (a resignation)."""
        with self._gone_lock:
            if self._gone.is_set():
                return
            self.lost_reason = reason
            self._gone.set()
        log.warning("leadership lost", node=self.info.node, token=self.token, reason=reason)
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.lost.set()
        else:
            with contextlib.suppress(RuntimeError):  # the event loop has ended
                self._loop.call_soon_threadsafe(self.lost.set)

    async def _beat(self, etcd: Etcd) -> None:
        """On the heartbeat thread, with its own client `etcd`: `_beats`, and any
        unexpected failure of it loses the leadership (never silently)."""
        try:
            await self._beats(etcd)
        except Exception as exc:  # a bug: stop acting rather than believe a dead heartbeat
            log.error("leadership heartbeat crashed", node=self.info.node, error=repr(exc))
            self._lose(f"the heartbeat crashed: {exc!r}")

    async def _beats(self, etcd: Etcd) -> None:
        """Rewrite the key every `ttl_s / RENEWALS_PER_TTL`, fenced by the token. A
        heartbeat is hedged over the members and bounded by `RENEW_ATTEMPT_S`; one that
        fails or is not answered in time is sent again at once (a new send time: an answer
        to an old one proves less), until `hold_until` (past `valid_until` the holder is
        suspended: it does not act, and the first heartbeat that lands resumes it). So a
        frozen or leaderless member does not use up the validity: when etcd's leader is
        lost, the first heartbeat after a new one is elected lands."""
        key = etcd.target.key(LEADER_KEY)
        interval = max(0.1, self.ttl_s / RENEWALS_PER_TTL)
        wait = interval
        failing_since: float | None = None
        suspended_at: float | None = None
        while not self._gone.is_set():
            now = time.monotonic()
            if now >= self.hold_until:
                self._lose("no heartbeat landed for the TTL and a grace of one more")
                return
            if suspended_at is None and now >= self.valid_until:
                suspended_at = now
                log.warning(
                    "leadership suspended: no heartbeat landed in time; not acting until one does",
                    node=self.info.node,
                    token=self.token,
                )
                wait = 0.0  # beat now
            wait = min(wait, (self.valid_until if suspended_at is None else self.hold_until) - now)
            if wait > 0:
                await asyncio.sleep(wait)  # a resignation cancels it (`LoopThread.stop`)
                if self._gone.is_set():
                    return
                if suspended_at is None and time.monotonic() >= self.valid_until:
                    continue  # validity ran out while waiting: suspend first, then beat
            sent = time.monotonic()
            budget = self.hold_until - sent
            if budget <= 0:
                continue  # lost at the top of the loop
            try:
                r = await etcd.txn_hedged(
                    "a leadership heartbeat",
                    [compare_create_revision(key, self.token)],
                    [op_put(key, self._value)],
                    timeout_s=min(budget, RENEW_ATTEMPT_S),
                    hedge_s=RENEW_ATTEMPT_S / 3,
                )
            except StoreUnavailableError as exc:
                if failing_since is None:
                    failing_since = sent
                    log.warning(
                        "leadership heartbeat failed", node=self.info.node, error=exc.message
                    )
                wait = RENEW_RETRY_S
                continue
            except MetactlError as exc:
                self._lose(f"leadership heartbeat refused: {exc.message}")
                return
            if not r.succeeded:
                self._lose("the leadership key was deleted or taken by another term")
                return
            self.beats += 1
            self.valid_until = max(self.valid_until, sent + self.ttl_s - self.safety_s)
            if failing_since is not None:
                log.info(
                    "leadership heartbeat landed again",
                    node=self.info.node,
                    seconds_failing=round(time.monotonic() - failing_since, 3),
                )
                failing_since = None
            if suspended_at is not None and self.valid:
                self.resumes += 1
                log.warning(
                    "leadership resumed: a heartbeat landed, the term goes on",
                    node=self.info.node,
                    token=self.token,
                    suspended_s=round(time.monotonic() - suspended_at, 3),
                )
                suspended_at = None
            self._bound_history(etcd, int(r.header.revision))
            wait = interval

    def _bound_history(self, etcd: Etcd, revision: int) -> None:
        """Every `HISTORY_S`, compact etcd's history to the heartbeat revision of
        `HISTORY_S` earlier (in the background; a failure is only logged: the next one
        compacts further)."""
        when, old = self._checkpoint
        now = time.monotonic()
        if now - when < HISTORY_S or (self._compacting is not None and not self._compacting.done()):
            return
        self._checkpoint = (now, revision)
        # On the heartbeat thread's loop; one still running when it stops is cancelled.

        async def compact() -> None:
            try:
                await etcd.compact(old)
            except MetactlError as exc:  # compacted further already, or etcd busy
                log.info("etcd history compaction skipped", revision=old, error=exc.message)

        self._compacting = asyncio.get_running_loop().create_task(
            compact(), name="leadership-compaction"
        )

    async def stop_beating(self) -> None:
        """Stop the heartbeat thread without ending the term: the holder falls silent, as
        a frozen process does (a standby ends the term after the TTL). For tests."""
        await self._beater.stop()

    async def resign(self, detail: str = "") -> None:
        """Stop beating and delete the key (if it is still this term's), recording that
        this holder resigned and why (`detail`), so that another controller can be
        elected now rather than after the TTL. Best effort: if etcd is unreachable the
        key is ended by a standby after the TTL."""
        self._lose(f"{RESIGNED}: {detail}" if detail else RESIGNED)
        await self._beater.stop()
        with contextlib.suppress(MetactlError):
            await end_term(
                self.etcd,
                self.token,
                "a resignation",
                timeout_s=1.0,
                hedge_s=RENEW_ATTEMPT_S / 3,
                ended=TermEnd(
                    node=self.info.node, token=self.token, reason=RESIGNED, detail=detail
                ),
            )


async def end_term(
    etcd: Etcd, token: int, what: str, *, timeout_s: float, hedge_s: float, ended: TermEnd
) -> bool:
    """Delete the leadership key if it is still term `token`'s (compared on its create
    revision), recording how it ended (`ended`, at `TERM_END_KEY`): True if it was, False
    if the key is gone or another term's."""
    key = etcd.target.key(LEADER_KEY)
    r = await etcd.txn_hedged(
        what,
        [compare_create_revision(key, token)],
        [op_delete(key), op_put(etcd.target.key(TERM_END_KEY), msgspec.msgpack.encode(ended))],
        timeout_s=timeout_s,
        hedge_s=hedge_s,
    )
    return bool(r.succeeded)
