"""Waiting out another controller's term of the leadership (`outlast`), for a campaign
(`metadata_log.etcd.lease.Leadership.acquire`): watch its heartbeats, and end the term of
a holder silent for its TTL by a compare on the key's mod revision, recording how it ended
(`TermEnd`); or wait for an older controller's leased key to go (`await_release`).

Why it is safe, and the etcd-election allowance, are in `metadata_log.etcd.lease`'s
docstring. This module must not hold a leadership (it only ends other terms).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final

import msgspec
import structlog

from metactl.errors import LogError, StoreUnavailableError
from metadata_log.etcd.client import Etcd, Kv
from metadata_log.etcd.leader_key import TERM_END_KEY, Holder, TermEnd, decode_leader
from metadata_log.etcd.txn import compare_mod_revision, op_delete, op_put

__all__ = ["CAMPAIGN_RECHECK_S", "await_release", "held", "outlast"]

log = structlog.get_logger("metadata_log.etcd")

CAMPAIGN_RECHECK_S: Final = 5.0
"""A waiting campaign re-reads the key at least this often (a watch can be cut off)."""
ATTEMPT_S: Final = 0.3
"""A read or a delete that etcd did not answer is tried again after this long (and hedged
to the next member after a third of it), as the holder's heartbeats are."""


def held(etcd: Etcd, holder: Holder) -> LogError:
    who = holder.info.node if holder.info is not None else "another writer"
    return LogError(
        f"metadata log {etcd.target.url} is already open for writing by {who} "
        f"(it holds the leadership key)"
    )


async def outlast(
    etcd: Etcd,
    key: bytes,
    kv: Kv,
    revision: int,
    *,
    silence_s: float,
    on_beat: Callable[[], None],
    term: int,
    ended: TermEnd,
) -> None:
    """Return once the term of the holder in `kv` (read at `revision`) is over: its key
    deleted or created anew, or not rewritten for `silence_s` and then deleted here by a
    compare on its mod revision, recording `ended`. `on_beat` is called at each rewrite
    seen (it may raise)."""
    token = int(kv.create_revision)
    last = int(kv.mod_revision)
    seen_at = time.monotonic()  # the loop's clock too (asyncio's default)
    watch_from = revision + 1
    # etcd's Raft term when the last rewrite was seen: a newer one at the silence's end
    # means etcd elected a leader meanwhile, a time in which no heartbeat could land, so
    # the holder gets a new TTL (it goes on beating past its validity: `hold_until`).
    while True:
        remaining = seen_at + silence_s - time.monotonic()
        reread = False
        if remaining > 0:
            try:
                async with (
                    asyncio.timeout(None) as deadline,
                    contextlib.aclosing(etcd.watch(key, key + b"\0", watch_from)) as responses,
                ):
                    deadline.reschedule(seen_at + silence_s)
                    async for response in responses:
                        if response.canceled or response.compact_revision:
                            break
                        for ev in response.events:
                            if ev.type == 1 or int(ev.kv.create_revision) != token:  # DELETE
                                return
                            last = int(ev.kv.mod_revision)
                            seen_at = time.monotonic()
                            term = max(term, int(response.header.raft_term))
                            deadline.reschedule(seen_at + silence_s)
                            on_beat()
                        watch_from = int(response.header.revision) + 1
                    reread = True  # the watch ended (cut off, compacted): read again
            except TimeoutError:
                pass
            except StoreUnavailableError:
                await asyncio.sleep(ATTEMPT_S)  # etcd unreachable: read again below
                reread = True
            if not reread and seen_at + silence_s > time.monotonic():
                continue
        # Silent for `silence_s` as the watch saw it (or the watch ended): read again
        # linearizably (a watch on a partitioned member sees nothing), then end the term.
        current, at, now_term = await etcd.get_at_term(key, timeout_s=1.0)
        if current is None or int(current.create_revision) != token:
            return
        watch_from = at + 1
        if int(current.mod_revision) != last:
            last = int(current.mod_revision)
            seen_at = time.monotonic()
            term = max(term, now_term)
            on_beat()
            continue
        if seen_at + silence_s > time.monotonic():
            continue
        if now_term > term:
            log.info(
                "etcd elected a leader while the active controller was silent; it gets another TTL",
                token=token,
                raft_term=now_term,
            )
            term, seen_at = now_term, time.monotonic()
            continue
        r = await etcd.txn_hedged(
            "ending a silent leadership",
            [compare_mod_revision(key, last)],
            [
                op_delete(key),
                op_put(etcd.target.key(TERM_END_KEY), msgspec.msgpack.encode(ended)),
            ],
            timeout_s=1.0,
            hedge_s=ATTEMPT_S / 3,
        )
        if r.succeeded:
            info = decode_leader(current.value)
            log.warning(
                "ended the term of a silent active controller: no heartbeat for its TTL",
                active=info.node if info is not None else "?",
                token=token,
                silent_s=round(time.monotonic() - seen_at, 3),
            )
            return


async def await_release(etcd: Etcd, key: bytes, from_revision: int) -> None:
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
