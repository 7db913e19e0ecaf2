"""`LocalEtcd` restarts on its data directory (issue 21 item 1): the ports are chosen on
the first start, kept in ports.json and reused, since a member's data remembers its peer
URLs; other ports or another member count there are named errors, and a kept port taken
by another process is LISTEN_FAILED before any member starts."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from localcluster.etcd import PORTS_FILE, LocalEtcd
from metactl.errors import InvalidConfigurationError, ListenError
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.target import EtcdTarget
from metadata_log.etcd.txn import op_put
from tests.e2e.cluster import free_block


async def put_get(cluster: LocalEtcd, value: bytes | None) -> bytes | None:
    client = await Etcd.connect(EtcdTarget.parse(cluster.url("restart")))
    try:
        key = client.target.key("k")
        if value is not None:
            await client.txn("put", [], [op_put(key, value)])
        kv, _ = await client.get(key)
        return None if kv is None else bytes(kv.value)
    finally:
        await client.close()


def test_a_three_member_cluster_restarts_on_its_directory(tmp_path: Path) -> None:
    first = LocalEtcd(tmp_path, 3).start()
    try:
        assert asyncio.run(put_get(first, b"kept")) == b"kept"
        ports = json.loads((tmp_path / PORTS_FILE).read_text())["ports"]
    finally:
        first.stop()
    again = LocalEtcd(tmp_path, 3)
    assert [p for m in again.members for p in (m.client_port, m.peer_port)] == ports
    again.start()  # healthy, as one cluster: its members rejoin on the same URLs
    try:
        assert asyncio.run(put_get(again, None)) == b"kept"
    finally:
        again.stop()


def test_other_ports_or_member_counts_on_a_directory_are_refused(tmp_path: Path) -> None:
    base = free_block(2)
    cluster = LocalEtcd(tmp_path, 1, base_port=base)
    assert (cluster.members[0].client_port, cluster.members[0].peer_port) == (base, base + 1)
    cluster.start()
    cluster.stop()
    with pytest.raises(InvalidConfigurationError, match="has 1 member"):
        LocalEtcd(tmp_path, 3)
    with pytest.raises(InvalidConfigurationError, match=f"--etcd-base-port {base}"):
        LocalEtcd(tmp_path, 1, base_port=base + 10)
    assert LocalEtcd(tmp_path, 1, base_port=base).members[0].client_port == base
    with pytest.raises(InvalidConfigurationError, match=r"within 1024\.\.65535"):
        LocalEtcd(tmp_path / "other", 1, base_port=80)
    (tmp_path / PORTS_FILE).write_text("{not json")
    with pytest.raises(InvalidConfigurationError, match="unreadable"):
        LocalEtcd(tmp_path, 1)


def test_a_kept_port_in_use_is_named_before_anything_starts(tmp_path: Path) -> None:
    cluster = LocalEtcd(tmp_path, 1)
    cluster.start()
    cluster.stop()
    taken = LocalEtcd(tmp_path, 1).members[0].client_port
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        blocked = LocalEtcd(tmp_path, 1)
        with pytest.raises(ListenError, match=f"127.0.0.1:{taken}"):
            blocked.start()
        assert not blocked.members[0].running
