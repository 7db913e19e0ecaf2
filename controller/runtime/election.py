"""The controller's campaign for an etcd metadata log: standby, elected, active, stepped
down, and again.

`Election.run` is one loop per controller service:

1. **Standby.** Tail the log read-only (`controller.runtime.standby`), so the image is
   current, and answer reads from it.
2. **Campaign** for the log's leadership key (`metadata_log.etcd.lease`), waiting while
   another controller holds it; each holder seen becomes the service's NOT_CONTROLLER
   hint, and has its listener watched meanwhile (`controller.runtime.dead_active`,
   unless `--dead-active-detection disabled`): a holder found dead (its port refuses
   connections) has its term ended, so the campaign need not wait out the TTL.
3. **Take over.** Open the log for writing under the won leadership (its appends are
   fenced by it), replay what the standby image has not seen yet (up to the log end,
   which nobody else can move now), abort a transaction the previous controller left
   open, and start the driver. Pending recoveries start over, as after a restart.
4. **Step down** when the leadership is lost (no heartbeat landed in time, or one
   found the key gone or another term's) or the store stops taking writes (an append
   fenced by a newer leadership, or one whose outcome is unknown): resign at once
   (delete the key, so a standby takes over without waiting for the TTL), close the
   driver, and go back to 1.

Whatever its role, the controller records itself in etcd (``controllers/<node id>``:
its address, start and last-seen times) when it starts and every few seconds after
(`metadata_log.etcd.registry`), so that `metactl quorum describe` lists every controller,
a gone one with when it was last seen; a failed write is only logged.

An etcd that cannot be reached is waited out (retried, logged at most once a second); at
start-up it is an error instead (`Election.start`), so a misconfigured controller exits.

It talks to its service through `RoleChanges` (the service's role: become a standby,
activate on a won log, step down), never through the service's internals, and its
service creates it (`Election.start`): this module imports no service.

This module decides nothing about metadata: it only moves the service between roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Final, Protocol

import structlog

from controller.runtime.dead_active import DeadActive
from controller.runtime.ha_settings import HaSettings
from controller.runtime.metrics_server import RoleMetrics
from controller.runtime.service_role import ServiceRole
from controller.runtime.standby import Standby
from metactl.errors import MetactlError, StoreUnavailableError
from metadata_image.transactions import LogReplay
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.layout import open_meta
from metadata_log.etcd.lease import Holder, LeaderInfo, Leadership, current_leader
from metadata_log.etcd.registry import ControllerEntry, Registration, registered
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.etcd.target import EtcdTarget
from metadata_log.store import LogStore

__all__ = ["Election", "RoleChanges"]

log = structlog.get_logger("metactl.controller.election")

RETRY_S: Final = 0.5


class RoleChanges(ServiceRole, Protocol):
    """The role of the controller service this election campaigns for: what the campaign
    reads of it (its address, its standby, the last term's image a new standby starts
    from) and the changes it makes (`controller.runtime.service.ControllerService` is
    one)."""

    def stand_by(self, standby: Standby) -> None:
        """Serve reads from `standby` (the last term's image is no longer needed)."""
        ...

    def release_standby(self) -> Standby | None:
        """Take the standby away (to close it: a takeover, or the end)."""
        ...

    def leader_seen(self, address: str | None) -> None:
        """The active controller's address (None: nobody), for NOT_CONTROLLER answers."""
        ...

    async def activate(
        self, store: LogStore, replayed: LogReplay | None, leadership: Leadership
    ) -> None:
        """Become the active controller on `store`, open for writing under `leadership`."""
        ...

    async def deactivate(self, reason: str) -> None:
        """Step down: refuse writes at once, then close the driver and the store."""
        ...


class Election:
    """One controller's campaign loop. Create with `Election.start`."""

    def __init__(
        self,
        roles: RoleChanges,
        url: str,
        etcd: Etcd,
        settings: HaSettings,
        *,
        client_ssl: ssl.SSLContext | None,
        metrics: RoleMetrics,
    ) -> None:
        self.roles = roles
        self.url = url
        self.etcd = etcd
        self.settings = settings
        self.metrics = metrics
        self._last_warning = 0.0
        # The leadership this controller holds while active (resigned on close).
        self.held: Leadership | None = None
        self.dead_active = (
            DeadActive(
                etcd,
                node=self.node,
                own_address=lambda: roles.advertised,
                ssl=client_ssl,
                revoked=metrics.dead_active_revocations.inc,
            )
            if self.settings.dead_active_detection
            else None
        )
        self.registration = Registration(etcd, self.node, roles.advertised)
        self._registration_task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        roles: RoleChanges,
        url: str,
        settings: HaSettings,
        *,
        client_ssl: ssl.SSLContext | None,
        metrics: RoleMetrics,
        verify_all: bool,
    ) -> Election:
        """Connect, create the log if its prefix is empty (or check that it is this
        cluster's), and become a standby. With `verify_all` (`--verify-log full`) the
        standby's store checks every batch and snapshot first, once: a later standby or
        takeover checks the tail only. An unreachable etcd, another cluster's log or a
        damaged one is raised here, before the controller says it is ready."""
        etcd = await Etcd.connect(EtcdTarget.parse(url, tls=settings.etcd_tls))
        try:
            await open_meta(etcd, create=True, cluster_id=settings.cluster_id)
            election = cls(roles, url, etcd, settings, client_ssl=client_ssl, metrics=metrics)
            await election._start_standby(verify_all=verify_all)
            # Recorded before serving (a failure is only logged), refreshed from then on.
            await election.registration.write()
        except BaseException:
            await etcd.close()
            raise
        election._registration_task = asyncio.create_task(
            election.registration.run(), name="controller-registration"
        )
        return election

    @property
    def node(self) -> str:
        return self.settings.node_id or self.roles.advertised

    async def run(self) -> None:
        while True:
            try:
                if self.roles.standby is None:
                    await self._start_standby()
                leadership = await Leadership.acquire(
                    self.etcd,
                    LeaderInfo(node=self.node, address=self.roles.advertised),
                    ttl_s=self.settings.lease_ttl_s,
                    on_leader=self._seen,
                )
            except MetactlError as exc:
                self._warn("campaign failed; retrying", exc)
                await asyncio.sleep(RETRY_S)  # etcd reconnects by itself meanwhile
                continue
            if self.dead_active is not None:
                self.dead_active.follow(None)
            try:
                writer = await self._take_over(leadership)
            except MetactlError as exc:
                self._warn("taking over failed; resigning", exc)
                await leadership.resign(f"taking over failed: {exc.message}")
                await asyncio.sleep(RETRY_S)
                continue
            self.held = leadership
            reason = await self._until_lost(leadership, writer)
            await leadership.resign(reason)
            await self.roles.deactivate(reason)
            self.held = None

    async def _start_standby(self, *, verify_all: bool = False) -> None:
        store = await EtcdLogStore.open(
            self.url,
            read_only=True,
            cluster_id=self.settings.cluster_id,
            verify_all=verify_all,
            client=self.etcd,
        )
        # After stepping down, replay from the last term's committed image, not the log's.
        last = self.roles.last_image
        try:
            standby = await Standby.open(store, start=LogReplay(last) if last is not None else None)
        except BaseException:
            await store.close()
            raise
        self.roles.stand_by(standby)

    async def leader_address(self) -> str | None:
        """The active controller's address from the leadership key (None: no holder, or
        etcd did not answer within a second)."""
        address, _ = await self.leader_or_problem()
        return address

    async def leader_or_problem(self) -> tuple[str | None, str | None]:
        """(the active controller's address, None), or (None, why none is known): no
        holder of the leadership, or etcd not answering within a second, which names the
        members that accept a connection (fewer than a majority: etcd lost quorum)."""
        info, _, problem = await self.holder()
        if problem is not None:
            return None, problem
        address = _address(info)
        if address is None:
            return None, "no controller holds the leadership (an election is under way)"
        return address, None

    async def holder(self) -> tuple[LeaderInfo | None, int, str | None]:
        """The leadership key's holder and its token (the term), read within a second;
        or (None, 0, why etcd did not say): the members that accept a connection."""
        try:
            async with asyncio.timeout(1.0):
                info, token = await current_leader(self.etcd)
        except (TimeoutError, MetactlError):
            endpoints = self.etcd.target.endpoints
            reachable = await _reachable(endpoints)
            majority = len(endpoints) // 2 + 1
            verdict = "etcd has lost quorum" if len(reachable) < majority else "etcd is slow"
            why = (
                f"{verdict}: it did not answer within 1 s; members accepting connections: "
                f"{', '.join(reachable) or 'none'} of {len(endpoints)}"
            )
            return None, 0, why
        return info, token, None

    async def controllers(self) -> tuple[list[ControllerEntry], str | None]:
        """Every controller recorded in etcd (`metadata_log.etcd.registry`), read within
        a second; or ([], why not)."""
        try:
            async with asyncio.timeout(1.0):
                return await registered(self.etcd), None
        except TimeoutError:
            return [], "etcd did not answer within 1 s"
        except MetactlError as exc:
            return [], exc.message

    def _seen(self, holder: Holder) -> None:
        self.roles.leader_seen(_address(holder.info))
        if self.dead_active is not None:
            self.dead_active.follow(holder)

    async def _take_over(self, leadership: Leadership) -> EtcdLogStore:
        """Activate on the log opened for writing under `leadership`: the writer."""
        started = time.monotonic()
        writer = await EtcdLogStore.open(
            self.url,
            leadership=leadership,
            cluster_id=self.settings.cluster_id,
            client=self.etcd,
        )
        standby = self.roles.release_standby()
        try:
            replayed = standby.state if standby is not None else None
            if standby is not None:
                await standby.close()
            await self.roles.activate(writer, replayed, leadership)
        except BaseException:
            await writer.close()
            raise
        self.metrics.failovers.inc()
        log.warning(
            "active controller: took over the metadata log",
            node=self.node,
            token=leadership.token,
            end_offset=writer.end_offset,
            seconds=round(time.monotonic() - started, 3),
        )
        return writer

    async def _until_lost(self, leadership: Leadership, store: LogStore) -> str:
        lost = asyncio.ensure_future(leadership.lost.wait())
        failed = asyncio.ensure_future(store.write_failed.wait())
        try:
            await asyncio.wait({lost, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            failed.cancel()
        if leadership.lost.is_set():
            return leadership.lost_reason
        return "the metadata log stopped taking writes (fenced, or an append's outcome unknown)"

    def _warn(self, event: str, exc: MetactlError) -> None:
        now = time.monotonic()
        if isinstance(exc, StoreUnavailableError) and now - self._last_warning < 1.0:
            return
        self._last_warning = now
        log.warning(event, node=self.node, code=exc.code, error=exc.message)

    async def close(self) -> None:
        """Resign if leading, stop the standby, close the etcd client."""
        if self._registration_task is not None:
            self._registration_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._registration_task
        if self.dead_active is not None:
            await self.dead_active.close()
        if self.held is not None:
            await self.held.resign("shutting down")
        standby = self.roles.release_standby()
        if standby is not None:
            with contextlib.suppress(MetactlError):
                await standby.close()
        await self.etcd.close()


async def _reachable(endpoints: tuple[str, ...]) -> list[str]:
    """The endpoints that accept a TCP connection within 0.2 s (probed together)."""

    async def accepts(endpoint: str) -> bool:
        host, _, port = endpoint.rpartition(":")
        try:
            async with asyncio.timeout(0.2):
                _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except (OSError, TimeoutError, ValueError):
            return False
        writer.close()
        return True

    answers = await asyncio.gather(*(accepts(e) for e in endpoints))
    return [e for e, ok in zip(endpoints, answers, strict=True) if ok]


def _address(holder: LeaderInfo | None) -> str | None:
    """Where to send clients, from the leadership key (None: nobody, or no listener)."""
    return holder.address or None if holder is not None else None
