"""Forgetting a controller's record in etcd (`metadata_log.etcd.registry.unregister` and
`metadata_log.etcd.retire.remove_controller`, behind `metactl quorum remove`), against a
real etcd member: the delete is one transaction that keeps a record written again since
it was read, and the checks refuse an unknown node, the active controller (even with
force) and a controller seen recently (unless force). "Recently" is judged with an
injected clock, so nothing here waits for time to pass.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from localcluster.etcd import LocalEtcd
from metactl.errors import ControllerInUseError, ControllerIsActiveError, VoterNotFoundError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LEADER_KEY, LeaderInfo
from metadata_log.etcd.registry import (
    CONTROLLERS_PREFIX,
    Registration,
    recorded,
    registered,
    unregister,
)
from metadata_log.etcd.retire import RECENT_S, remove_controller
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import compare_create_revision, op_put


@pytest.fixture
async def client(etcd: LocalEtcd) -> AsyncIterator[Etcd]:
    c = await Etcd.connect(EtcdTarget.parse(etcd.url(f"registry/{uuid.uuid4().hex[:10]}")))
    yield c
    await c.close()


async def nodes(etcd: Etcd) -> list[str]:
    return sorted(e.node for e in await registered(etcd))


async def hold_leadership(etcd: Etcd, node: str) -> int:
    """Write the leadership key as `node`'s term (its value, as a campaign writes it) and
    return its create revision."""
    key = etcd.target.key(LEADER_KEY)
    value = msgspec.msgpack.encode(LeaderInfo(node=node, address="127.0.0.1:1"))
    await etcd.txn("a test's leadership", [], [op_put(key, value)])
    kv, _ = await etcd.get(key)
    assert kv is not None
    return int(kv.create_revision)


def later(seconds: float) -> int:
    """Epoch ms `seconds` from now: the removal's clock, to judge a record as old."""
    return time.time_ns() // 1_000_000 + int(seconds * 1000)


async def test_a_record_written_again_between_read_and_delete_is_kept(client: Etcd) -> None:
    c1 = Registration(client, "c1", "127.0.0.1:9093")
    assert await c1.write()
    read = await recorded(client, "c1")
    assert read is not None and read.entry is not None and read.entry.address == c1.address
    assert await c1.write()  # the controller came back and recorded itself again

    stale = await unregister(client, read)
    assert not stale.deleted
    assert stale.now is not None and stale.now.mod_revision > read.mod_revision
    assert await nodes(client) == ["c1"]

    fresh = await recorded(client, "c1")
    assert fresh is not None
    done = await unregister(client, fresh)
    assert done.deleted and done.revision > fresh.mod_revision
    assert await recorded(client, "c1") is None and await nodes(client) == []
    gone = await unregister(client, fresh)  # deleted meanwhile: nothing to delete
    assert not gone.deleted and gone.now is None


async def test_a_failed_extra_compare_keeps_the_record(client: Etcd) -> None:
    """`also`: the caller's conditions (remove_controller's: the leadership read) are
    part of the same transaction."""
    assert await Registration(client, "c2", "127.0.0.1:9094").write()
    read = await recorded(client, "c2")
    assert read is not None
    token = await hold_leadership(client, "c1")
    leader_key = client.target.key(LEADER_KEY)
    changed = await unregister(client, read, also=[compare_create_revision(leader_key, 0)])
    assert not changed.deleted and changed.now == read
    assert await nodes(client) == ["c2"]
    done = await unregister(client, read, also=[compare_create_revision(leader_key, token)])
    assert done.deleted and await nodes(client) == []


async def test_an_old_record_is_removed_and_the_others_stay(client: Etcd) -> None:
    for node, port in (("c1", 9093), ("c2", 9094), ("c3", 9095)):
        assert await Registration(client, node, f"127.0.0.1:{port}").write()
    await hold_leadership(client, "c1")
    removed = await remove_controller(client, "c3", now_ms=lambda: later(RECENT_S + 1))
    assert removed is not None and removed.node == "c3" and not removed.forced
    assert removed.entry is not None and removed.entry.address == "127.0.0.1:9095"
    assert removed.seen_ago_s is not None and removed.seen_ago_s >= RECENT_S
    assert await nodes(client) == ["c1", "c2"]


async def test_the_active_controller_is_refused_even_with_force(client: Etcd) -> None:
    assert await Registration(client, "c1", "127.0.0.1:9093").write()
    token = await hold_leadership(client, "c1")
    for force in (False, True):
        with pytest.raises(ControllerIsActiveError, match=f"active controller .*term {token}"):
            await remove_controller(client, "c1", force=force, now_ms=lambda: later(RECENT_S + 1))
    assert await nodes(client) == ["c1"]


async def test_a_controller_seen_recently_is_refused_unless_forced(client: Etcd) -> None:
    assert await Registration(client, "c2", "127.0.0.1:9094").write()
    read = await recorded(client, "c2")
    assert read is not None and read.entry is not None
    seen = read.entry.last_seen_ms

    def soon() -> int:  # just under three refreshes after it was last seen
        return seen + int(RECENT_S * 1000) - 1

    with pytest.raises(ControllerInUseError, match="records itself again within 5 s") as exc:
        await remove_controller(client, "c2", now_ms=soon)
    assert exc.value.code == "CONTROLLER_IN_USE" and "--force" in exc.value.message
    assert not isinstance(exc.value, ControllerIsActiveError)
    assert await nodes(client) == ["c2"]
    removed = await remove_controller(client, "c2", force=True, now_ms=soon)
    assert removed is not None and removed.forced
    assert await nodes(client) == []


async def test_an_unknown_node_is_refused_naming_the_recorded_ones(client: Etcd) -> None:
    with pytest.raises(VoterNotFoundError, match=r"recorded: none"):
        await remove_controller(client, "c9")
    assert await Registration(client, "c1", "127.0.0.1:9093").write()
    with pytest.raises(VoterNotFoundError, match=r"no controller 'c9' .*\(recorded: c1\)"):
        await remove_controller(client, "c9", force=True)
    assert await remove_controller(client, "c9", if_exists=True) is None
    assert await nodes(client) == ["c1"]


async def test_an_undecodable_record_can_be_removed(client: Etcd) -> None:
    key = client.target.key(CONTROLLERS_PREFIX + "junk")
    await client.txn("a test's bad record", [], [op_put(key, b"\xc1 not msgpack")])
    assert await nodes(client) == []  # never listed
    removed = await remove_controller(client, "junk")
    assert removed is not None and removed.entry is None and removed.seen_ago_s is None
    kv, _ = await client.get(key)
    assert kv is None
