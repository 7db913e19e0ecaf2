"""Each etcd member's own status (`member_health`): `Maintenance.Status` asked of that
member alone, on a channel of its own: whether it is the Raft leader, its Raft index and
term, and whether it is healthy (it answered, knows a leader and reports no errors), for
`metactl quorum describe --replication` and the controller's DescribeQuorum.

Reads only; never changes the cluster.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc.aio
from etcd3aio import EtcdError

from metactl.errors import MetactlError
from metadata_log.etcd.channels import connect_member
from metadata_log.etcd.client import MEMBER_STATUS_TIMEOUT_S, Etcd
from metadata_log.etcd.errors import cause
from metadata_log.etcd.target import EtcdTarget


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
        *(one_member(etcd.target, name, url, timeout_s) for name, url in members)
    )
    return sorted(found, key=lambda m: m.name)


async def one_member(target: EtcdTarget, name: str, url: str, timeout_s: float) -> MemberHealth:
    endpoint = urlsplit(url).netloc or url
    try:
        client = await connect_member(endpoint, target.tls, url)
    except MetactlError as exc:
        return MemberHealth(name, url, healthy=False, error=exc.message)
    try:
        assert client.maintenance is not None
        async with asyncio.timeout(timeout_s):
            s = await client.maintenance.status(timeout=timeout_s)
    except (TimeoutError, EtcdError, grpc.aio.AioRpcError) as exc:
        detail = (
            f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else cause(exc)
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
