"""A standby's quick verdict on a dead active controller: end its term rather than wait
out the TTL (issue 21; docs/ha.md, "A killed active controller").

A SIGKILLed active controller leaves the leadership key in etcd until a standby has seen
it silent (no heartbeat) for the TTL (`metadata_log.etcd.lease`). Its host's kernel
knows at once: it closes the dead process's connections and refuses new ones on its
port. So while its campaign waits, a standby (`DeadActive`) holds one idle connection
to the holder's advertised listener (mutual TLS as the `controller` principal when the
cluster has TLS; nothing is ever sent on it). When that connection ends (or cannot be
made because it is refused), it probes the port with plain TCP connects (`_dead`): one
that is refused (ECONNREFUSED: nothing listens on that port) counts; one accepted and
held open is a live listener (a live controller closed an idle connection, say), and
the watch goes on; one reset or closed at once says nothing (a dying process's
listener can still accept for a moment while the kernel tears it down), and is tried
again shortly. `CONFIRMATIONS` refusals, `CONFIRM_INTERVAL_S` apart, while the
leadership key is still held under the same create revision as the campaign saw, make
the holder dead: the standby deletes the key by a transaction that compares its create
revision (an older controller's key: revokes its etcd lease), and every standby's
campaign runs at once. Each revocation is logged
(WARNING) and counted (`metactl_controller_dead_active_revocations_total`).

Only a listener this standby has reached during the holder's term counts: refusals from
one it has not connected to (a firewall that rejects the standby, or began to, a wrong
advertised address, a holder that died before the standby started) are not evidence of
death, and revoking on them would depose every new active controller in turn. Such a
holder waits out its TTL. A graceful stop keeps its port bound until it has resigned
(`FrameServer.close(keep_bound=True)`), so it is not taken for a death either.

What it cannot see, and leaves to the TTL: a frozen controller (SIGSTOP, a stalled
machine) still accepts connections, and a partitioned or powered-off host times them
out. Safety never rests on it: every append is fenced by the leadership key's create
revision (`metadata_log.etcd.store`), so a live controller's term ended by mistake
(its port refusing for a moment, an address another host answers) costs a failover,
never data. `--dead-active-detection disabled` turns it off.

This module decides nothing about metadata and never writes the log: it only watches a
listener and ends a term.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections.abc import Callable
from typing import Any, Final, Literal

import structlog

from metactl.errors import InvalidRequestError, MetactlError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import DEAD_ACTIVE, LEADER_KEY, Holder, TermEnd, end_term
from protocol.address import parse_address

__all__ = ["CONFIRMATIONS", "CONFIRM_INTERVAL_S", "DeadActive"]

log = structlog.get_logger("metactl.controller.dead_active")

CONFIRMATIONS: Final = 2
"""Refused connections that make the holder dead."""
CONFIRM_INTERVAL_S: Final = 0.1
"""Between two of them: a process restarting on the port has time to listen again."""
PROBE_RETRY_S: Final = 0.02
"""After a probe that said nothing (reset, closed at once, timed out)."""
MAX_PROBES: Final = 8
"""Probes after a lost connection before the watch goes back to holding one."""
CONNECT_TIMEOUT_S: Final = 1.0
"""A connection (with its TLS handshake) not made in this long: the host may be away."""
RECONNECT_S: Final = 1.0
"""Pause before connecting again after a connection that could not be made, or that the
holder closed less than this long after it was made (so a listener that accepts and
closes at once is not hammered)."""
ETCD_TIMEOUT_S: Final = 1.0
"""The leadership key's read and the revocation, each."""

Connected = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class DeadActive:
    """Watches the listener of the leadership's holder while this controller campaigns
    (`follow`), and ends the holder's term once it finds it dead."""

    def __init__(
        self,
        etcd: Etcd,
        *,
        node: str,
        own_address: Callable[[], str],
        ssl: _ssl.SSLContext | None,
        revoked: Callable[[], None],
    ) -> None:
        self.etcd = etcd
        self.node = node
        self.own_address = own_address
        self.ssl = ssl
        self.revoked = revoked  # called once per term this controller ended
        self._holder: Holder | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # ended ones still cleaning up
        self.attempts = 0  # connections tried to holders' listeners
        self.attempted = asyncio.Event()  # set at each (tests await these)

    def follow(self, holder: Holder | None) -> None:
        """Watch `holder` (the leadership key as this controller's campaign saw it), or
        nobody (None: this controller holds it, or nobody does). The same holder seen
        again (same create revision and lease) keeps the watch it has."""
        if holder is not None and holder == self._holder:
            return
        self._stop()
        self._holder = holder
        if holder is None or holder.info is None:
            return
        address = holder.info.address
        if not address or address == self.own_address():
            return  # a tool without a listener, or this controller's own stale key
        try:
            host, port = parse_address(address)
        except InvalidRequestError:
            return
        self._task = asyncio.create_task(self._watch(holder, host, port), name="dead-active")
        self._tasks.add(self._task)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "watching the active controller's listener failed",
                node=self.node,
                exc_info=task.exception(),
            )

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        self._stop()
        self._holder = None
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, holder: Holder, host: str, port: int) -> None:
        """Until the holder is found dead and its term ended (or it is gone from the
        key): hold a connection to its listener, and probe whenever it ends. Only once
        a connection was made during this holder's term do refusals count."""
        reached = False
        warned = False
        while True:
            found = await self._connect(host, port, tls=True)
            if found is None:
                # Never reached this term: unreachable, timed out, or TLS refused (a wrong
                # CA, a name mismatch): detection cannot work for this holder; say so once.
                # (Once reached, this is a holder going away, gracefully or not.)
                if not warned and not reached:
                    warned = True
                    log.warning(
                        "cannot reach the active controller's listener; a death will be "
                        "noticed by its heartbeats stopping (the TTL)",
                        node=self.node,
                        address=f"{host}:{port}",
                    )
                await asyncio.sleep(RECONNECT_S)
                continue
            lived = 0.0
            if found == "refused" and not reached:
                # Never reached: a refusal says nothing of the holder (see the module).
                await asyncio.sleep(RECONNECT_S)
                continue
            if found != "refused":
                reached = True
                reader, writer = found
                opened = time.monotonic()
                log.debug("watching the active controller's listener", node=self.node)
                try:
                    while await reader.read(4096):
                        pass  # nothing is expected: the controller speaks when spoken to
                except (OSError, _ssl.SSLError):
                    pass
                finally:
                    writer.close()
                lived = time.monotonic() - opened
            log.debug(
                "probing the active controller's listener", node=self.node, lived_s=round(lived, 3)
            )
            if await self._dead(host, port):
                if await self._revoke(holder):
                    return
                await asyncio.sleep(RECONNECT_S)  # etcd did not answer: look again
            elif found != "refused" and lived < RECONNECT_S:
                await asyncio.sleep(RECONNECT_S)  # a listener that closes at once

    async def _dead(self, host: str, port: int) -> bool:
        """Whether the listener refuses `CONFIRMATIONS` plain TCP connects,
        `CONFIRM_INTERVAL_S` apart (False as soon as one is accepted and held open, or
        after `MAX_PROBES` probes without a verdict)."""
        refusals = 0
        for _ in range(MAX_PROBES):
            found = await self._connect(host, port, tls=False)
            if found == "refused":
                refusals += 1
                if refusals >= CONFIRMATIONS:
                    return True
                await asyncio.sleep(CONFIRM_INTERVAL_S)
                continue
            if found is not None:
                reader, writer = found
                try:
                    async with asyncio.timeout(PROBE_RETRY_S):
                        await reader.read(1)  # EOF or a reset: a listener torn down
                except TimeoutError:
                    return False  # accepted and held open: a live listener
                except OSError:
                    pass
                finally:
                    writer.close()
            await asyncio.sleep(PROBE_RETRY_S)
        return False

    async def _connect(
        self, host: str, port: int, *, tls: bool
    ) -> Connected | Literal["refused"] | None:
        """A connection to the listener; "refused" when nothing listens on the port;
        None when it could not be made otherwise (timed out, unreachable, TLS failed)."""
        ssl = self.ssl if tls else None
        if tls:
            self.attempts += 1
            self.attempted.set()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(
                    host, port, ssl=ssl, server_hostname=host if ssl is not None else None
                )
        except ConnectionRefusedError:
            return "refused"
        except (OSError, TimeoutError, _ssl.SSLError):
            return None

    async def _revoke(self, holder: Holder) -> bool:
        """`_end_term` in a task of its own, so that it logs and counts what it did even
        when the watch is cancelled meanwhile: the deletion wakes this controller's own
        campaign, whose win stops the watch, often before etcd's answer is read here."""
        task = asyncio.create_task(self._end_term(holder), name="dead-active-end-term")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    async def _end_term(self, holder: Holder) -> bool:
        """End the dead holder's term if the leadership key is still its own: delete the
        key if it is still that term's (compare on its create revision), or revoke its
        etcd lease for an older controller's key. True: the watch is over (ended here, or
        the key is gone or held by another term already); False: etcd did not answer."""
        assert holder.info is not None
        key = self.etcd.target.key(LEADER_KEY)
        try:
            if holder.lease_id:
                kv, _ = await self.etcd.get(key, timeout_s=ETCD_TIMEOUT_S)
                if (
                    kv is None
                    or int(kv.create_revision) != holder.token
                    or int(kv.lease) != holder.lease_id
                ):
                    return True  # it expired or resigned meanwhile: the campaign runs anyway
                ended = await self.etcd.revoke(holder.lease_id, timeout_s=ETCD_TIMEOUT_S)
            else:
                ended = await end_term(
                    self.etcd,
                    holder.token,
                    "ending a dead active controller's term",
                    timeout_s=ETCD_TIMEOUT_S,
                    hedge_s=ETCD_TIMEOUT_S / 4,
                    ended=TermEnd(
                        node=holder.info.node, token=holder.token, reason=DEAD_ACTIVE, by=self.node
                    ),
                )
        except MetactlError as exc:
            log.warning(
                "could not end the term of a dead active controller; watching on",
                node=self.node,
                active=holder.info.node,
                code=exc.code,
                error=exc.message,
            )
            return False
        if ended:
            self.revoked()
            log.warning(
                "ended the term of a dead active controller",
                node=self.node,
                active=holder.info.node,
                address=holder.info.address,
                token=holder.token,
                refusals=CONFIRMATIONS,
                interval_s=CONFIRM_INTERVAL_S,
            )
        return True
