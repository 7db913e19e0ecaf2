"""DescribeQuorum: one controller's view of the controller quorum, for `metactl quorum
describe` (kafka-metadata-quorum's ``describe --status`` and ``--replication``).

Any controller answers, whatever its role, and never redirects: the tool asks each
controller it knows and puts the answers side by side. Each says who it is, its role,
how far it has applied the log and the log end it knows; who the active controller is
and its term (on etcd: the leadership key's holder and create revision, the fencing
token; read by a standby within a second, and when etcd does not answer, why); and, if
asked, each etcd member's own status (`metadata_log.etcd.health.member_health`, read at
most twice a second); and, on etcd, every controller recorded there
(`metadata_log.etcd.registry`), so that the tool can ask those it was not given. A
single controller on a SQLite log has no election and no term: it says so by leaving
them out, and is its own leader.

This module only reads the service's state (`QuorumView`: it imports no service) and
asks etcd; it decides nothing and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from controller.runtime.ha_settings import HaSettings
from controller.runtime.service_role import ServiceRole
from metactl.errors import MetactlError
from metadata_log.backends import is_etcd_url
from protocol.messages.admin import (
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    EtcdMemberState,
    RegisteredController,
)

if TYPE_CHECKING:  # the etcd client library (and gRPC) loads only for an etcd log
    from controller.runtime.election import Election
    from metadata_log.etcd.lease import Leadership

__all__ = ["QuorumView", "describe_quorum"]

READ_CACHE_S: Final = 0.5
"""How long one reading from etcd (the members' health, the recorded controllers)
answers DescribeQuorum: any known principal may ask, as often as it likes, and the
members' health opens a channel to every member."""

# (what, id(etcd client)) -> (read at, reading)
_read_cache: dict[tuple[str, int], tuple[float, Any]] = {}


async def _cached(what: str, etcd: Any, read: Callable[[], Awaitable[Any]]) -> Any:
    """`read()`, or the reading of `what` from this etcd client under `READ_CACHE_S` ago."""
    key = (what, id(etcd))
    cached = _read_cache.get(key)
    if cached is not None and time.monotonic() - cached[0] < READ_CACHE_S:
        return cached[1]
    found = await read()
    for stale in [k for k in _read_cache if k[1] != id(etcd)]:
        del _read_cache[stale]  # one client per process: no entry outlives its client
    _read_cache[key] = (time.monotonic(), found)
    return found


def _backend(metadata_log: str | None) -> str:
    if metadata_log is not None and is_etcd_url(metadata_log):
        return "etcd"
    if metadata_log in ("memory:", "memory://"):
        return "memory"
    return "sqlite"


class QuorumView(ServiceRole, Protocol):
    """What DescribeQuorum reads of one controller service (its role, its log, its
    election); `controller.runtime.service.ControllerService` is one."""

    @property
    def ha(self) -> HaSettings: ...
    @property
    def leadership(self) -> Leadership | None: ...
    @property
    def active_since_ms(self) -> int | None: ...
    @property
    def election(self) -> Election | None: ...
    @property
    def metadata_log(self) -> str | None: ...
    @property
    def data_dir(self) -> Path: ...


async def describe_quorum(
    service: QuorumView, request: DescribeQuorumRequest
) -> DescribeQuorumResponse:
    node_id = service.ha.node_id or service.advertised
    active = service.acting
    if active:
        role = "active"
    elif service.role == "starting":
        role = "starting"
    else:
        role = "standby" if service.replicated else "inactive"
    store = service.store if active else None
    location = store.location if store is not None else None
    if store is not None:
        applied = end = store.end_offset
    elif service.standby is not None:
        applied = service.standby.state.next_offset
        end = max(applied, service.standby.store.end_offset)
        location = service.standby.store.location
    elif service.last_image is not None:
        applied = end = service.last_image.end_offset
    else:
        applied = end = 0
    leader_id: str | None = None
    leader_address: str | None = None
    term: int | None = None
    since: int | None = None
    problem: str | None = None
    leadership = service.leadership
    if active:
        leader_id, leader_address = node_id, service.advertised
        if leadership is not None:
            term, since = leadership.token, leadership.info.since_ms or None
        else:
            since = service.active_since_ms
    elif service.election is not None:
        info, token, problem = await service.election.holder()
        if info is not None:
            leader_id, leader_address = info.node, info.address or None
            term, since = token, info.since_ms or None
        elif problem is None:
            problem = "no controller holds the leadership (an election is under way)"
    elif not service.replicated:
        problem = "the metadata log stopped taking writes; reopening it"
    controllers: list[RegisteredController] = []
    controllers_error: str | None = None
    if service.election is not None:
        election = service.election
        entries, controllers_error = await _cached(
            "controllers", election.etcd, election.controllers
        )
        controllers = [
            RegisteredController(
                node_id=e.node,
                address=e.address,
                started_ms=e.started_ms,
                last_seen_ms=e.last_seen_ms,
            )
            for e in entries
        ]
    members: list[EtcdMemberState] = []
    etcd_error: str | None = None
    if request.etcd_members and service.election is not None:
        from metadata_log.etcd.health import member_health  # the etcd client is loaded

        try:
            etcd = service.election.etcd
            found = await _cached("members", etcd, lambda: member_health(etcd))
        except MetactlError as exc:
            etcd_error = exc.message
        else:
            members = [
                EtcdMemberState(
                    name=m.name,
                    client_url=m.client_url,
                    healthy=m.healthy,
                    leader=m.leader,
                    raft_role=m.raft_role,
                    member_id=m.member_id,
                    raft_index=m.raft_index,
                    raft_term=m.raft_term,
                    version=m.version,
                    error=m.error,
                )
                for m in found
            ]
    return DescribeQuorumResponse(
        cluster_id=service.ha.cluster_id or "",
        node_id=node_id,
        address=service.advertised,
        role=role,
        backend=_backend(service.metadata_log),
        log=service.metadata_log or location or str(service.data_dir),
        applied_offset=applied,
        log_end_offset=end,
        leader_id=leader_id,
        leader_address=leader_address,
        term=term,
        leader_since_ms=since,
        lease_ttl_s=service.ha.lease_ttl_s if service.replicated else None,
        leader_problem=problem,
        etcd_members=members,
        etcd_error=etcd_error,
        controllers=controllers,
        controllers_error=controllers_error,
    )
