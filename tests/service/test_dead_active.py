"""A standby's watch of the active controller's listener (`controller.runtime.dead_active`)
against a real etcd member and real sockets: a port that refuses connections gets the
holder's term ended (its key deleted); a live listener, or a key that another term holds
by now, does not. Waits are on observable events (connections accepted, the watch
ending), never on timing. The whole controller is in tests/service/test_ha.py and
tests/e2e/test_ha.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from controller.runtime.dead_active import DeadActive
from localcluster.etcd import LocalEtcd
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import Holder, LeaderInfo, Leadership, current_leader
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import op_delete
from tests.e2e.cluster import free_port

BOUND_S = 30.0  # bounds a hang; no test times anything


@pytest.fixture
async def client(etcd: LocalEtcd) -> AsyncIterator[Etcd]:
    c = await Etcd.connect(EtcdTarget.parse(etcd.url(f"dead/{uuid.uuid4().hex[:10]}")))
    try:
        yield c
    finally:
        await c.close()


class Listener:
    """A TCP listener on loopback standing for the holder's: it queues every connection
    it accepts (the watch's, and the probes'), and can die."""

    server: asyncio.Server
    address: str

    def __init__(self) -> None:
        self.accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    @classmethod
    async def start(cls) -> Listener:
        listener = cls()
        listener.server = await asyncio.start_server(listener._on_connect, "127.0.0.1", 0)
        listener.address = f"127.0.0.1:{listener.server.sockets[0].getsockname()[1]}"
        return listener

    async def _on_connect(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.accepted.put(writer)

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def die(self, conn: asyncio.StreamWriter) -> None:
        """The holder dies: nothing listens on its port any more, and `conn` (the
        watch's connection) closes, as a killed process's kernel does both."""
        await self.close()
        conn.close()


async def holding(etcd: Etcd, address: str) -> tuple[Leadership, Holder]:
    """A leadership held under `address` (heartbeating), as a campaign sees it."""
    leadership = await Leadership.acquire(etcd, LeaderInfo(node="dead", address=address), ttl_s=30)
    kv, _ = await etcd.get(etcd.target.key("leader"))
    assert kv is not None
    return leadership, Holder(leadership.info, int(kv.create_revision), int(kv.lease))


def detector(etcd: Etcd, revoked: list[int]) -> DeadActive:
    return DeadActive(
        etcd, node="standby", own_address=lambda: "", ssl=None, revoked=lambda: revoked.append(1)
    )


async def test_a_holder_whose_port_refuses_has_its_term_ended(client: Etcd) -> None:
    """The watch holds a connection to the holder's listener; the holder dies (its
    listener and the connection close, the port refuses): its key is deleted."""
    listener = await Listener.start()
    leadership, holder = await holding(client, listener.address)
    revoked: list[int] = []
    watch = detector(client, revoked)
    try:
        watch.follow(holder)
        assert watch._task is not None
        async with asyncio.timeout(BOUND_S):
            conn = await listener.accepted.get()  # the watch reached the listener
            await listener.die(conn)
            await watch._task  # the watch ends once it has ended the term
        info, _ = await current_leader(client)
        assert info is None and revoked == [1]
    finally:
        await watch.close()
        await leadership.resign()


async def test_a_listener_never_reached_is_not_revoked_for_its_refusals(client: Etcd) -> None:
    """A holder whose port refuses this standby from the first try (a firewall's
    rejection, a wrong advertised address, a holder dead before the standby came): the
    refusals are no evidence, so nothing is revoked however often it tries; the TTL
    decides."""
    leadership, holder = await holding(client, f"127.0.0.1:{free_port()}")
    revoked: list[int] = []
    watch = detector(client, revoked)
    try:
        watch.follow(holder)
        async with asyncio.timeout(BOUND_S):
            while watch.attempts < 3:  # three refused tries, a second apart
                watch.attempted.clear()
                await watch.attempted.wait()
        assert revoked == [] and leadership.valid
        info, token = await current_leader(client)
        assert info == holder.info and token == holder.token
    finally:
        await watch.close()
        await leadership.resign()


async def test_a_live_listener_that_drops_the_connection_is_not_revoked(client: Etcd) -> None:
    """The listener closes the watch's first connection (as after an idle timeout): the
    probes find it accepting, the watch connects again, and the term goes on."""
    listener = await Listener.start()
    leadership, holder = await holding(client, listener.address)
    revoked: list[int] = []
    watch = detector(client, revoked)
    held: list[asyncio.StreamWriter] = []
    try:
        watch.follow(holder)
        async with asyncio.timeout(BOUND_S):
            (await listener.accepted.get()).close()  # the watch's connection, dropped
            while len(held) < 2:  # a probe held open, then the watch's new connection
                held.append(await listener.accepted.get())
        assert revoked == [] and leadership.valid
        info, token = await current_leader(client)
        assert info == holder.info and token == holder.token
    finally:
        for w in held:
            w.close()
        await watch.close()
        await listener.close()
        await leadership.resign()


async def test_a_key_held_by_another_term_by_now_is_left_alone(client: Etcd) -> None:
    """The campaign saw a holder that is gone since, and another holds the key: the dead
    one's port refuses once the watch has reached it, but the key is another term's by
    now, so nothing is deleted."""
    listener = await Listener.start()
    old, holder = await holding(client, listener.address)
    # The key is taken from the old term behind its back: only the compare on the
    # create revision stops the watch from deleting the new term's key.
    await client.txn("delete", [], [op_delete(client.target.key("leader"))])
    new, _ = await holding(client, "127.0.0.1:1")
    revoked: list[int] = []
    watch = detector(client, revoked)
    try:
        watch.follow(holder)
        assert watch._task is not None
        async with asyncio.timeout(BOUND_S):
            await listener.die(await listener.accepted.get())  # reached, then dead
            await watch._task  # the watch ends, its holder gone from the key
        assert revoked == [] and new.valid
        _, token = await current_leader(client)
        assert token == new.token
    finally:
        await watch.close()
        await new.resign()
        await old.resign()
