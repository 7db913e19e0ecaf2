"""The controller quorum as its controllers describe it (`metactl quorum describe`, as
`kafka-metadata-quorum.sh describe`).

`gather` asks every given controller `DescribeQuorum` at once (each answers for itself,
active or standby, and is never redirected), and then, at once, every controller the
answers name that was not asked yet: the active one, and on etcd every controller
recorded there (`metadata_log.etcd.registry`), so asking one controller lists them all.
A controller that does not answer within `ASK_S` (or the caller's timeout, if shorter)
is a `QuorumView` with its error and, if recorded, its record. `Summary` reads the views:
the active controller (of two, across a failover, the newer term), the high watermark,
each controller's lag and role, and whose etcd members to show.

It asks and concludes; printing is the command's (ops/quorum_cmds.py). It must not import
the CLI (`ops`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Final

from clients.controller import Security, ask
from metactl.errors import InvalidRequestError, MetactlError
from protocol.client import RetryPolicy
from protocol.messages.admin import (
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    RegisteredController,
)

__all__ = ["ASK_S", "QuorumView", "Summary", "gather", "registered_controllers"]

ASK_S: Final = 5.0
"""The most one controller's answer may take: a paused one is unreachable, not a hang."""
ONCE: Final = RetryPolicy(attempts=2, base_s=0.05, cap_s=0.1)


@dataclass(frozen=True)
class QuorumView:
    """What one controller answered (`view`), or why it did not (`error`); and how it
    recorded itself in etcd (`registered`), if it did."""

    asked: str  # the address asked
    view: DescribeQuorumResponse | None = None
    error: MetactlError | None = None
    registered: RegisteredController | None = None

    @property
    def address(self) -> str:
        return self.view.address if self.view is not None else self.asked

    @property
    def node_id(self) -> str | None:
        if self.view is not None:
            return self.view.node_id
        return self.registered.node_id if self.registered is not None else None


async def _ask_one(
    address: str, security: Security, timeout_s: float, etcd_members: bool
) -> QuorumView:
    try:
        async with security.controller_client(address, connect_timeout=timeout_s) as client:
            r = await ask(
                client, DescribeQuorumRequest(etcd_members=etcd_members), timeout_s, retry=ONCE
            )
    except MetactlError as exc:
        return QuorumView(address, error=exc)
    if not isinstance(r, DescribeQuorumResponse):
        return QuorumView(
            address, error=InvalidRequestError(f"{address} answered {type(r).__name__}")
        )
    return QuorumView(address, view=r)


async def gather(
    addresses: list[str], security: Security, timeout_s: float, *, etcd_members: bool
) -> list[QuorumView]:
    """Every controller's answer (or error): the bootstrap's in order, then the active
    controller's if no bootstrap address reached it, then those of the controllers
    recorded in etcd that were not asked yet (by node id). Two addresses that reach the
    same controller count once. Each view carries its controller's record, if any."""
    per = min(ASK_S, timeout_s)
    views = list(
        await asyncio.gather(*(_ask_one(a, security, per, etcd_members) for a in addresses))
    )
    known = {v.address for v in views} | set(addresses)
    leaders = {v.view.leader_address for v in views if v.view is not None}
    extra = sorted(a for a in leaders if a and a not in known)
    records = registered_controllers(views)
    answered_ids = {v.view.node_id for v in views if v.view is not None}
    extra += [
        r.address
        for r in records.values()
        if r.node_id not in answered_ids and r.address not in known and r.address not in extra
    ]
    if extra:
        views += await asyncio.gather(*(_ask_one(a, security, per, etcd_members) for a in extra))
    by_address = {r.address: r for r in records.values()}
    out: list[QuorumView] = []
    seen: set[tuple[str, str]] = set()
    for v in views:
        key = (v.view.node_id, v.view.address) if v.view is not None else ("", v.asked)
        if key not in seen:
            seen.add(key)
            record = records.get(v.view.node_id) if v.view is not None else None
            out.append(replace(v, registered=record or by_address.get(v.address)))
    return out


def registered_controllers(views: list[QuorumView]) -> dict[str, RegisteredController]:
    """The controllers recorded in etcd, as the answers list them, by node id (sorted);
    of two records of one node, the one seen last."""
    found: dict[str, RegisteredController] = {}
    for v in views:
        for r in v.view.controllers if v.view is not None else ():
            if r.node_id not in found or r.last_seen_ms > found[r.node_id].last_seen_ms:
                found[r.node_id] = r
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Summary:
    views: list[QuorumView]
    active: DescribeQuorumResponse | None
    source: DescribeQuorumResponse  # whose account of the leader is shown
    high_watermark: int

    @classmethod
    def of(cls, views: list[QuorumView]) -> Summary:
        answered = [v.view for v in views if v.view is not None]
        actives = [a for a in answered if a.role == "active"]
        # Two claim to be active only across a failover: the newer term is the leader.
        active = max(actives, key=lambda a: a.term or 0) if actives else None
        with_leader = [a for a in answered if a.leader_id is not None]
        source = active or max(with_leader, key=lambda a: a.term or 0, default=answered[0])
        if active is not None:
            hw = active.log_end_offset
        else:
            hw = max(a.log_end_offset for a in answered)
        return cls(views, active, source, hw)

    def lag(self, v: DescribeQuorumResponse) -> int:
        return max(0, self.high_watermark - v.applied_offset)

    def role(self, qv: QuorumView) -> str:
        return qv.view.role if qv.view is not None else "unreachable"

    @property
    def max_follower_lag(self) -> int:
        lags = [
            self.lag(v.view) for v in self.views if v.view is not None and v.view.role != "active"
        ]
        return max(lags, default=0)

    @property
    def controllers_error(self) -> str | None:
        """Why the controllers recorded in etcd are unknown: no answer listed any and one
        said why (None: known, or not on etcd)."""
        answered = [v.view for v in self.views if v.view is not None]
        if any(a.controllers for a in answered):
            return None
        return next((a.controllers_error for a in answered if a.controllers_error), None)

    @property
    def etcd(self) -> DescribeQuorumResponse | None:
        """The answer whose etcd members are shown: the active's, else the first's."""
        answered = [v.view for v in self.views if v.view is not None]
        with_members = [a for a in answered if a.etcd_members or a.etcd_error]
        if self.active is not None and self.active in with_members:
            return self.active
        return with_members[0] if with_members else None
