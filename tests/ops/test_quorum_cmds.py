"""`metactl quorum describe --status|--replication` (issue 21 item 8) against real
processes, and etcd over TLS end to end (item 9):

* `cluster up --controllers 3 --etcd 3` (secure by default) runs etcd with TLS and
  client-certificate auth; the controllers write and read the log over it; the offline
  command it prints carries the etcd flags, and without them is refused by name.
* The quorum tool shows the active controller, its term, the two standbys caught up,
  and three healthy etcd members with one Raft leader; a paused standby is listed as
  unreachable and a killed etcd member as unhealthy, and the command still succeeds.
* On a single SQLite controller it says there is no term; an address that does not
  answer is a row, and only when none answers does the command fail (status 5).
* Every controller records itself in etcd: asked only one of three controllers, the
  tool lists all three; a killed standby stays listed, unreachable, with its node id and
  when it was last seen.
* `quorum remove` forgets a killed standby (describe stops listing it) and refuses the
  active controller (even with --force), a live standby (without --force: one removed
  with it records itself again) and an unknown node, each by name with status 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.quorum import READ_CACHE_S
from ops.cli import main
from tests.e2e.cluster import Process, free_port
from tests.e2e.ha import HaCluster
from tests.ops.test_cluster_supervision import pids
from tests.ops.test_cluster_up import Up, metactl

pytestmark = pytest.mark.slow

BOUND_S = 30.0


def quorum(cwd: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    r = metactl("quorum", "describe", *args, "--json", cwd=cwd)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else {}), r.stderr


def await_dead(pid: int) -> None:
    """Until `pid` has exited (a zombie, or gone), bounded by BOUND_S."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)  # polling the process's state, an observable condition
    raise AssertionError(f"pid {pid} still running {BOUND_S} s after SIGKILL")


def test_an_ha_quorum_on_etcd_over_tls(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, "--controllers", "3", "--etcd", "3", "--listen", "127.0.0.1:0")
    stopped: list[int] = []
    try:
        banner = up.await_banner()
        children = pids(banner)
        assert json.loads((data / "etcd" / "ports.json").read_text())["tls"] is True
        # The controllers created the demo topic through the TLS etcd log.
        describe = up.command("describe")
        r = metactl(*describe, cwd=tmp_path)
        assert r.returncode == 0 and "Topic: demo" in r.stdout, r.stderr
        target = describe[1:]  # --bootstrap-controller A,B,C --tls-dir D
        # The printed offline command reaches etcd with the admin's etcd certificate.
        tail = up.command("log")
        assert "--etcd-cert" in tail and tail[tail.index("--etcd-cert") + 1].endswith(
            "etcd/admin.pem"
        )
        url = tail[tail.index("--data-dir") + 1]
        r = metactl("log", "verify", *tail[2:], cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("ok: etcd://"), r.stderr
        r = metactl("log", "verify", "--data-dir", url, cwd=tmp_path)
        assert r.returncode == 1 and r.stderr.startswith("error: SSL_AUTHENTICATION_FAILED")
        assert "Traceback" not in r.stderr
        storage = next(x for x in banner if x.startswith("  storage:"))
        info = shlex.split(storage.split("(metactl ", 1)[1].rstrip(")"))
        assert "--etcd-key" in info
        r = metactl(*info, cwd=tmp_path)
        assert r.returncode == 0 and "status: ok" in r.stdout, r.stderr

        status, s, err = quorum(tmp_path, "--status", *target, "--principal", "viewer")
        assert status == 0, err
        assert s["backend"] == "etcd" and s["metadata_log"] == url and s["cluster_id"]
        leader = s["leader"]
        assert leader["term"] > 0 and leader["lease_ttl_s"] == 2 and leader["since_ms"] > 0
        roles = sorted(c["role"] for c in s["controllers"])
        assert roles == ["active", "standby", "standby"], s
        active = next(c for c in s["controllers"] if c["role"] == "active")
        assert (active["node_id"], active["address"]) == (leader["id"], leader["address"])
        assert s["high_watermark"] == active["log_end_offset"] > 0

        # --replication: the standbys catch up with the active controller's log end.
        deadline = time.monotonic() + BOUND_S
        while True:
            status, rep, err = quorum(tmp_path, "--replication", *target)
            assert status == 0, err
            lags = [c["lag"] for c in rep["controllers"]]
            if lags == [0, 0, 0] or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # polling interval of an observable condition
        assert lags == [0, 0, 0], rep
        assert {c["applied_offset"] for c in rep["controllers"]} == {rep["high_watermark"]}
        members = rep["etcd_members"]
        assert sorted(m["name"] for m in members) == ["etcd-1", "etcd-2", "etcd-3"]
        assert all(m["healthy"] and m["client_url"].startswith("https://") for m in members)
        assert [m["raft_role"] for m in members].count("leader") == 1
        assert len({m["raft_term"] for m in members}) == 1

        r = metactl("quorum", "describe", "--replication", *target, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        text = r.stdout
        assert text.startswith("NODE ") and " active" in text and " standby" in text
        assert "etcd members (asked by " in text and "https://127.0.0.1:" in text

        # Faults: a paused standby and a killed etcd follower are rows, not failures.
        standby = next(c for c in rep["controllers"] if c["role"] == "standby")
        paused = children[f"controller {standby['node_id'].removeprefix('c')}"]
        os.kill(paused, signal.SIGSTOP)
        stopped.append(paused)
        follower = next(m for m in members if m["raft_role"] == "follower")
        os.kill(children[follower["name"]], signal.SIGKILL)
        # kill() returns before the process is gone: await its end (a zombie of cluster
        # up's, or reaped). The controller answers the members' health from a reading up
        # to READ_CACHE_S old (controller.runtime.quorum), so a CLI that starts at once
        # can still be told the reading from before the kill: ask until it is newer.
        await_dead(children[follower["name"]])
        deadline = time.monotonic() + BOUND_S
        while True:
            started = time.monotonic()
            status, rep, err = quorum(tmp_path, "--replication", *target)
            assert status == 0, err
            assert time.monotonic() - started < 15
            ill = [m["name"] for m in rep["etcd_members"] if not m["healthy"]]
            if follower["name"] in ill or time.monotonic() > deadline:
                break
            time.sleep(READ_CACHE_S)  # the cache's age: the next reading is a new one
        rows = {c["address"]: c for c in rep["controllers"]}
        row = rows[standby["address"]]
        assert row["role"] == "unreachable" and row["error"]["code"] == "REQUEST_TIMED_OUT"
        assert sorted(c["role"] for c in rep["controllers"]) == [
            "active",
            "standby",
            "unreachable",
        ]
        dead = next(m for m in rep["etcd_members"] if m["name"] == follower["name"])
        assert not dead["healthy"] and dead["error"], dead
        assert sum(m["healthy"] for m in rep["etcd_members"]) == 2
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        up.stop()


@pytest.fixture
def sqlite_controller(tmp_path: Path) -> Iterator[str]:
    address = f"127.0.0.1:{free_port()}"
    p = Process(
        "controller",
        [sys.executable, "-m", "controller", "--data-dir", str(tmp_path / "c"),
         "--listen", address, "--insecure"],
        tmp_path / "controller.log",
    )  # fmt: skip
    try:
        p.await_ready()
        yield address
    finally:
        p.signal(signal.SIGTERM)
        p.wait()
        p.close()


def test_a_single_sqlite_controller_has_no_term(
    sqlite_controller: str, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    flags = ["--bootstrap-controller", f"{sqlite_controller},{closed}", "--insecure"]
    assert main(["quorum", "describe", "--status", *flags]) == 0
    out = capsys.readouterr().out
    assert "LeaderEpoch:       none (one controller on a SQLite log" in out
    assert f"LeaderAddress:     {sqlite_controller}" in out
    assert "(sqlite)" in out and f"{closed} (unreachable)" in out
    assert main(["quorum", "describe", "--replication", *flags, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ok, gone = rep["controllers"]
    assert ok["role"] == "active" and ok["lag"] == 0 and ok["applied_offset"] > 0
    assert gone == {
        "address": closed,
        "role": "unreachable",
        "error": {"code": "NETWORK_EXCEPTION", "message": gone["error"]["message"]},
    }
    assert rep["leader"]["term"] is None and rep["etcd_members"] == []
    assert main(["quorum", "describe", "--replication", *flags]) == 0
    assert "etcd members" not in capsys.readouterr().out


def test_no_controller_answering_fails_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"127.0.0.1:{free_port()}"
    status = main(
        ["quorum", "describe", "--status", "--bootstrap-controller", closed, "--insecure"]
    )
    assert status == 5
    err = capsys.readouterr().err
    assert err.startswith("error: NETWORK_EXCEPTION:") and "Traceback" not in err
    with pytest.raises(SystemExit) as usage:  # --status or --replication: argparse's 2
        main(["quorum", "describe", "--insecure"])
    assert usage.value.code == 2


Quorum = tuple[HaCluster, str, dict[str, str]]


@pytest.fixture
def three_controllers(tmp_path: Path) -> Iterator[Quorum]:
    """Three controllers on a one-member etcd, each recorded in etcd before it says READY:
    the cluster, the active controller's address, and each address's node id (c1..c3)."""
    cluster = HaCluster(tmp_path, etcd_members=1, controllers=3)
    try:
        cluster.start()
        leader, _ = asyncio.run(cluster.wait_leader())
        yield cluster, leader.address, {a: f"c{i}" for i, a in enumerate(cluster.addresses, 1)}
    finally:
        cluster.stop()


def kill(cluster: HaCluster, address: str) -> None:
    """SIGKILL the controller at `address` and reap it."""
    p = cluster.controllers[address]
    p.signal(signal.SIGKILL)
    p.wait()


def test_asking_one_controller_lists_every_controller_recorded_in_etcd(
    three_controllers: Quorum, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, active, node_of = three_controllers
    standby = next(a for a in cluster.addresses if a != active)
    asked = next(a for a in cluster.addresses if a not in (active, standby))
    flags = ["--bootstrap-controller", asked, "--insecure"]

    assert main(["quorum", "describe", "--replication", *flags, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {c["address"]: c for c in rep["controllers"]}
    assert rows.keys() == set(cluster.addresses), rep
    assert {a: r["node_id"] for a, r in rows.items()} == node_of
    assert rows[active]["role"] == "active"
    assert rows[asked]["role"] == rows[standby]["role"] == "standby"
    assert all(r["last_seen_ms"] >= r["started_ms"] > 0 for r in rows.values())
    assert rep["controllers"][0]["address"] == asked  # the one asked comes first

    # A killed standby stays listed: unreachable, with its node id and last-seen age.
    kill(cluster, standby)
    assert main(["quorum", "describe", "--replication", *flags, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {c["address"]: c for c in rep["controllers"]}
    assert rows.keys() == set(cluster.addresses), rep
    gone = rows[standby]
    assert gone["role"] == "unreachable" and gone["node_id"] == node_of[standby], gone
    assert gone["error"]["code"] == "NETWORK_EXCEPTION" and gone["last_seen_ms"] > 0
    assert sorted(r["role"] for r in rows.values()) == ["active", "standby", "unreachable"]

    assert main(["quorum", "describe", "--replication", *flags]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if standby in x)
    assert line.startswith(node_of[standby] + " ") and "unreachable (last seen " in line
    assert main(["quorum", "describe", "--status", *flags]) == 0
    text = capsys.readouterr().out
    assert f"{node_of[standby]}@{standby} (unreachable, last seen " in text
    assert f"{node_of[active]}@{active} (active)" in text


async def _created_at(url: str, node: str, *, after: int = 0) -> int:
    """The create revision of controller `node`'s record, once it has one over `after`
    (a record deleted and written again is created anew)."""
    from metadata_log.etcd.client import Etcd
    from metadata_log.etcd.registry import CONTROLLERS_PREFIX
    from metadata_log.etcd.target import EtcdTarget

    etcd = await Etcd.connect(EtcdTarget.parse(url))
    try:
        async with asyncio.timeout(BOUND_S):
            while True:
                kv, _ = await etcd.get(etcd.target.key(CONTROLLERS_PREFIX + node))
                if kv is not None and kv.create_revision > after:
                    return int(kv.create_revision)
                await asyncio.sleep(0.2)  # polling interval of an observable condition
    finally:
        await etcd.close()


def test_quorum_remove_forgets_a_retired_controller_and_refuses_live_ones(
    three_controllers: Quorum, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, active, node_of = three_controllers
    dead, live = (a for a in cluster.addresses if a != active)
    describe = ["quorum", "describe", "--replication", "--bootstrap-controller", live,
                "--insecure", "--json"]  # fmt: skip
    remove = ["quorum", "remove", "--data-dir", cluster.url]

    def listed() -> set[str]:
        assert main(describe) == 0
        return {c["address"] for c in json.loads(capsys.readouterr().out)["controllers"]}

    def refused(*args: str) -> str:
        assert main([*remove, *args]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        return captured.err

    # The active controller: refused, even with --force.
    for force in ([], ["--force"]):
        err = refused("--node", node_of[active], *force)
        assert err.startswith("error: CONTROLLER_IS_ACTIVE:") and "leadership key" in err
    # A live standby: refused without --force, saying it would record itself again.
    err = refused("--node", node_of[live])
    assert err.startswith("error: CONTROLLER_IN_USE:") and "--force" in err
    assert "records itself again within 5 s" in err
    # An unknown node: refused, naming the recorded ones; --if-exists makes it a no-op.
    err = refused("--node", "c9")
    assert err.startswith("error: VOTER_NOT_FOUND:") and "(recorded: c1, c2, c3)" in err
    assert main([*remove, "--node", "c9", "--if-exists"]) == 0
    assert "is not recorded under" in capsys.readouterr().out
    assert listed() == set(cluster.addresses)  # nothing was removed

    # A SIGKILLed standby: seen seconds ago, so --force; then no longer listed.
    kill(cluster, dead)
    assert main([*remove, "--node", node_of[dead], "--force", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["removed"] and out["forced"] and out["node_id"] == node_of[dead]
    assert out["address"] == dead and out["metadata_log"] == cluster.url
    deadline = time.monotonic() + BOUND_S  # answers read etcd at most twice a second
    while dead in (rows := listed()) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval of an observable condition
    assert rows == {active, live}
    err = refused("--node", node_of[dead])  # gone: a second removal finds nothing
    assert err.startswith("error: VOTER_NOT_FOUND:") and "(recorded: " in err

    # A live standby removed with --force records itself again, as the line says.
    created = asyncio.run(_created_at(cluster.url, node_of[live]))
    assert main([*remove, "--node", node_of[live], "--force"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith(
        f"removed controller {node_of[live]} ({live}, last seen "
    )
    assert "if it is still running it records itself again within 5 s" in line
    assert asyncio.run(_created_at(cluster.url, node_of[live], after=created)) > created
