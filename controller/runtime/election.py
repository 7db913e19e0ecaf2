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

This module decides nothing about metadata: it only moves the service between roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Final

import structlog

from controller.runtime.dead_active import DeadActive
from controller.runtime.standby import Standby
from metactl.errors import MetactlError, StoreUnavailableError
from metadata_image.transactions import LogReplay
from metadata_log.etcd.client import Etcd, EtcdTarget
from metadata_log.etcd.layout import open_meta
from metadata_log.etcd.lease import Holder, LeaderInfo, Leadership, current_leader
from metadata_log.etcd.registry import ControllerEntry, Registration, registered
from metadata_log.etcd.store import EtcdLogStore

if TYPE_CHECKING:
    from controller.runtime.service import ControllerService

__all__ = ["Election"]

log = structlog.get_logger("metactl.controller.election")

RETRY_S: Final = 0.5


class Election:
    """One controller's campaign loop. Create with `Election.start`."""

    def __init__(self, service: ControllerService, url: str, etcd: Etcd) -> None:
        self.service = service
        self.url = url
        self.etcd = etcd
        self.settings = service.ha
        self._last_warning = 0.0
        self.dead_active = (
            DeadActive(
                etcd,
                node=self.node,
                own_address=lambda: service.advertised,
                ssl=service.client_ssl,
                revoked=service.role_metrics.dead_active_revocations.inc,
            )
            if self.settings.dead_active_detection
            else None
        )
        self.registration = Registration(etcd, self.node, service.advertised)
        self._registration_task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, service: ControllerService, url: str, *, verify_all: bool) -> Election:
        """Connect, create the log if its prefix is empty (or check that it is this
        cluster's), and become a standby. With `verify_all` (`--verify-log full`) the
        standby's store checks every batch and snapshot first, once: a later standby or
        takeover checks the tail only. An unreachable etcd, another cluster's log or a
        damaged one is raised here, before the controller says it is ready."""
        etcd = await Etcd.connect(EtcdTarget.parse(url, tls=service.ha.etcd_tls))
        try:
            await open_meta(etcd, create=True, cluster_id=service.ha.cluster_id)
            election = cls(service, url, etcd)
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
        return self.settings.node_id or self.service.advertised

    async def run(self) -> None:
        while True:
            try:
                if self.service.standby is None:
                    await self._start_standby()
                leadership = await Leadership.acquire(
                    self.etcd,
                    LeaderInfo(node=self.node, address=self.service.advertised),
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
                await self._take_over(leadership)
            except MetactlError as exc:
                self._warn("taking over failed; resigning", exc)
                await leadership.resign()
                await asyncio.sleep(RETRY_S)
                continue
            reason = await self._until_lost(leadership)
            await leadership.resign()
            await self.service._deactivate(reason)

    async def _start_standby(self, *, verify_all: bool = False) -> None:
        store = await EtcdLogStore.open(
            self.url,
            read_only=True,
            cluster_id=self.settings.cluster_id,
            verify_all=verify_all,
            client=self.etcd,
        )
        # After stepping down, replay from the last term's committed image, not the log's.
        last = self.service.last_image
        try:
            self.service.standby = await Standby.open(
                store, start=LogReplay(last) if last is not None else None
            )
        except BaseException:
            await store.close()
            raise
        self.service.last_image = None  # the standby's image answers reads now
        if self.service.role == "starting":
            self.service.role = "standby"

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
        self.service.leader_hint = _address(holder.info)
        if self.dead_active is not None:
            self.dead_active.follow(holder)

    async def _take_over(self, leadership: Leadership) -> None:
        started = time.monotonic()
        writer = await EtcdLogStore.open(
            self.url,
            leadership=leadership,
            cluster_id=self.settings.cluster_id,
            client=self.etcd,
        )
        standby, self.service.standby = self.service.standby, None
        try:
            replayed = standby.state if standby is not None else None
            if standby is not None:
                await standby.close()
            await self.service._activate(writer, replayed=replayed, leadership=leadership)
        except BaseException:
            await writer.close()
            raise
        self.service.role_metrics.failovers.inc()
        log.warning(
            "active controller: took over the metadata log",
            node=self.node,
            token=leadership.token,
            end_offset=writer.end_offset,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _until_lost(self, leadership: Leadership) -> str:
        store = self.service.store
        assert store is not None
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
        leadership = self.service.leadership
        if leadership is not None:
            await leadership.resign()
        standby, self.service.standby = self.service.standby, None
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
