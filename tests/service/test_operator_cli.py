"""The operator commands against a live controller (real TCP) and offline on its data dir."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)


async def register(conn: RpcClient, broker_id: int, incarnation_id: str) -> RegisterBrokerResponse:
    """Register `broker_id` and heartbeat it once, caught up (it is then unfenced)."""
    r = await conn.request(RegisterBroker(broker_id=broker_id, incarnation_id=incarnation_id))
    assert isinstance(r, RegisterBrokerResponse)
    await conn.request(
        BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
        )
    )
    return r


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    # The brokers heartbeat once and then never again: a long session keeps them live for
    # however long the CLI subprocesses take on a loaded machine (this tests the CLI, not
    # sessions; tests/service covers expiry).
    svc = ControllerService(
        tmp_path, "127.0.0.1:0", config=ControllerConfig(broker_session_timeout_ms=3_600_000)
    )
    await svc.start()
    host, port = parse_address(svc.address)
    conn = await RpcClient.open(host, port)
    for b in (1, 2, 3):
        await register(conn, b, f"i{b}")
    await conn.close()
    yield svc
    await svc.stop()


async def metactl(*args: str) -> tuple[int, str, str]:
    # The service runs without TLS: say so (the CLI is secure by default).
    at = next(i for i, a in enumerate(args) if a.startswith("--"))
    args = (*args[:at], "--insecure", *args[at:])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`metactl` in this process, for input refused before anything is sent (or run):
    its status and stderr."""
    from ops.cli import main

    capsys.readouterr()
    status = main([*args, "--insecure"])
    return status, capsys.readouterr().err


async def test_create_describe_brokers_and_elect(
    service: ControllerService, tmp_path: Path
) -> None:
    ctl = service.address
    rc, out, _ = await metactl(
        "topics", "create", "--controller", ctl, "--topic", "orders",
        "--replica-assignment", "1:2:3,2:3:1", "--min-isr", "2",
    )  # fmt: skip
    assert rc == 0 and "Created topic orders" in out

    rc, out, _ = await metactl("describe", "--controller", ctl, "--json")
    assert rc == 0
    parts = json.loads(out)["partitions"]
    assert [(p["partition"], p["leader"], p["isr"]) for p in parts] == [
        (0, 1, [1, 2, 3]),
        (1, 2, [1, 2, 3]),
    ]
    assert parts[0]["elr"] == [] and parts[0]["recovery_pending"] is None

    rc, out, _ = await metactl("describe", "--controller", ctl, "--topic", "orders")
    assert rc == 0
    summary, first = out.splitlines()[:2]
    assert summary.startswith("Topic: orders\tTopicId: ")
    assert summary.endswith(
        "\tPartitionCount: 2\tReplicationFactor: 3\tConfigs: min.insync.replicas=2"
    )
    assert first.startswith(
        "\tTopic: orders\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3\t"
    )
    assert "Elr: \tLastKnownElr: \tLeaderEpoch: 0" in out

    rc, out, _ = await metactl("brokers", "--controller", ctl, "--json")
    brokers = json.loads(out)["brokers"]
    assert rc == 0 and [b["broker_id"] for b in brokers] == [1, 2, 3]
    assert all(not b["fenced"] and b["last_registration_clean"] for b in brokers)
    assert all(b["last_heartbeat_age_ms"] is not None for b in brokers)

    # Already led by its preferred replica: no election needed, which is success (Kafka's
    # kafka-leader-election.sh), with a line saying so. Both spellings of the flags work.
    rc, out, err = await metactl(
        "elect", "--controller", ctl, "--partition", "orders-0", "--type", "preferred"
    )
    assert (rc, err) == (0, "") and out.startswith("orders-0: no election needed (")
    rc, out, err = await metactl(
        "elect", "--bootstrap-controller", ctl, "--topic", "orders", "--partition", "1",
        "--election-type", "PREFERRED",
    )  # fmt: skip
    assert (rc, err) == (0, "") and out.startswith("orders-1: no election needed (")
    rc, out, err = await metactl(
        "elect", "--bootstrap-controller", ctl, "--topic", "orders", "--partition", "0",
        "--election-type", "UNCLEAN", "--replica", "2",
    )  # fmt: skip
    assert (rc, err) == (0, "") and "no election needed" in out
    rc, _, err = await metactl(
        "topics", "create", "--controller", ctl, "--topic", "orders", "--partitions", "1"
    )
    assert rc == 1 and err.startswith("error: TOPIC_ALREADY_EXISTS: ") and err.count("\n") == 1

    # Offline, from the data directory, while the controller keeps writing it.
    rc, out, _ = await metactl("describe", "--data-dir", str(tmp_path), "--json")
    assert rc == 0 and len(json.loads(out)["partitions"]) == 2


async def test_alter_partition_over_the_wire_returns_the_committed_state(
    service: ControllerService,
) -> None:
    from protocol.messages.admin import (
        CreateTopic,
        CreateTopicsRequest,
        DescribeClusterRequest,
        DescribeClusterResponse,
        PartitionState,
    )
    from protocol.messages.broker_controller import AlterPartition, IsrMember

    host, port = parse_address(service.address)
    conn = await RpcClient.open(host, port)
    try:
        await conn.request(
            CreateTopicsRequest(topics=[CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=2)])
        )
        d = await conn.request(DescribeClusterRequest())
        assert isinstance(d, DescribeClusterResponse)
        epochs = {b.broker_id: b.epoch for b in d.brokers}
        r = await conn.request(
            AlterPartition(
                topic="t", partition=0, leader=1, broker_epoch=epochs[1], partition_epoch=0,
                isr=[IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2)],
            )
        )  # fmt: skip
        assert isinstance(r, PartitionState)
        assert (r.leader, r.isr, r.partition_epoch, r.replicas) == (1, [1, 2], 1, [1, 2, 3])
    finally:
        await conn.close()


async def outage_and_operator_recovery(svc: ControllerService) -> None:
    """Topic t (replicas 1,2,3, MinISR 2) loses every broker (sessions expire), broker 3
    comes back without a clean-shutdown epoch, and the operator elects it: an unclean
    recovery, committed."""
    from protocol.messages.admin import CreateTopic, CreateTopicsRequest, ElectLeader
    from protocol.messages.internal import FenceBroker

    async with RpcClient(svc.address) as conn:
        await conn.request(
            CreateTopicsRequest(topics=[CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=2)])
        )
        for b in (3, 2, 1):
            await svc.controller.submit(FenceBroker(broker_id=b, reason="session_timeout"))
        r = await register(conn, 3, "i3-again")
        assert not r.clean
        elected = await conn.request(
            ElectLeader(topic="t", partition=0, election_type="unclean", replica=3)
        )
        assert getattr(elected, "leader", None) == 3


async def test_describe_shows_a_recent_unclean_recovery_and_brokers_why_fenced(
    service: ControllerService, tmp_path: Path
) -> None:
    await outage_and_operator_recovery(service)
    ctl = service.address
    rc, out, err = await metactl("describe", "--bootstrap-controller", ctl, "--json")
    assert rc == 0, err
    (p,) = json.loads(out)["partitions"]
    recovery = p["last_unclean_recovery"]
    assert (recovery["chosen"], recovery["strategy"], recovery["trigger"]) == (
        3,
        "manual",
        "operator",
    )
    assert recovery["age_ms"] >= 0 and recovery["offline_since_ms"] is not None
    rc, out, _ = await metactl("describe", "--bootstrap-controller", ctl)
    line = out.splitlines()[1]
    assert "\tLastUncleanRecovery: chose 3 (manual, operator) " in line
    assert line.endswith(" ago — potential data loss")
    # Outside the window (0: never), it is not shown.
    rc, out, _ = await metactl(
        "describe", "--bootstrap-controller", ctl, "--recent-recoveries", "0"
    )
    assert rc == 0 and "LastUncleanRecovery" not in out
    # Offline, from the log: the same recovery, from the record's commit time.
    rc, out, _ = await metactl("describe", "--data-dir", str(tmp_path))
    assert rc == 0 and "\tLastUncleanRecovery: chose 3 (manual, operator) " in out

    rc, out, _ = await metactl("brokers", "--bootstrap-controller", ctl)
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rc == 0 and set(rows) == {"1", "2", "3"}
    for b in ("1", "2"):  # killed: fenced, and why, though the last registration was clean
        assert rows[b].split()[2:3] == ["yes"] and "fenced: session expired" in rows[b]
        assert " clean " in rows[b]
    assert rows["3"].split()[2:3] == ["no"] and "UNCLEAN" in rows["3"] and "active" in rows["3"]
    assert "True" not in out and "False" not in out
    rc, out, _ = await metactl("brokers", "--data-dir", str(tmp_path))
    assert rc == 0 and out.count("fenced: session expired") == 2


async def test_events_tell_the_outage_and_the_recovery(
    service: ControllerService, tmp_path: Path
) -> None:
    await outage_and_operator_recovery(service)
    wanted = [
        "broker 3 fenced (session expired)",
        "broker 1 fenced (session expired)",
        "t-0 OFFLINE: leader 1→none (fence)",
        "broker 3 registered at epoch ",  # ... (UNCLEAN restart: out of ISR and ELR)
        "t-0 UNCLEAN RECOVERY: operator elected 3 (manual) — potential data loss",
        "t-0 leader none→3 (manual)",
    ]
    for source in (("--bootstrap-controller", service.address), ("--data-dir", str(tmp_path))):
        rc, out, err = await metactl("events", *source)
        assert rc == 0, err
        texts = [line.split("  ", 1)[1] for line in out.splitlines()]
        at = [
            next(i for i, t in enumerate(texts) if t.startswith(w) and "first" not in t)
            for w in wanted
        ]
        assert at == sorted(at), texts  # each once, in log order
    rc, out, _ = await metactl("events", "--data-dir", str(tmp_path), "--json", "--since", "1h")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and any(r["type"] == "UncleanRecovery" for r in rows)
    assert all(r["record"]["type"] == r["type"] for r in rows)
    rc, out, _ = await metactl("events", "--data-dir", str(tmp_path), "--since", "2999-01-01")
    assert rc == 0 and out == ""


async def test_events_follow_prints_what_commits_until_ctrl_c(service: ControllerService) -> None:
    import signal

    from protocol.messages.admin import CreateTopic
    from protocol.messages.internal import FenceBroker

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", "events", "--follow", "--insecure",
        "--bootstrap-controller", service.address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        # Create topics until one is told (the command may still be starting), then fence
        # a broker and see it told.
        line = b""
        lines: list[bytes] = []
        async with asyncio.timeout(60):
            for n in range(1000):
                await service.controller.submit(CreateTopic(name=f"f{n}", partitions=1))
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), 1)
                except TimeoutError:
                    continue
                break
            lines.append(line)
            await service.controller.submit(FenceBroker(broker_id=2, reason="operator"))
            while b"broker 2 fenced" not in line:
                line = await proc.stdout.readline()
                assert line, "events --follow ended"
                lines.append(line)
        assert line.decode().rstrip().endswith("broker 2 fenced (operator)")
        # Whatever committed before the follow began is not shown: the brokers registered
        # before the command started; the first line told is one of the topics created since.
        assert b"topic f" in lines[0], lines
        assert not any(b"registered" in x for x in lines), lines
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            err = await proc.stderr.read()
            await proc.wait()
    assert proc.returncode == 130 and b"Traceback" not in err


async def test_a_feed_followed_again_continues_where_it_stopped(
    service: ControllerService,
) -> None:
    # As `cluster up`'s event feed does after an error: the same Feed, a new connection.
    from eventfeed.feed import Event, Feed
    from eventfeed.follow import follow_events
    from protocol.messages.internal import FenceBroker

    feed = Feed()
    told: list[Event] = []
    async with RpcClient(service.address) as client:
        await follow_events(client, feed, told.extend, follow=False, timeout_s=10)
    assert [e.text for e in told] == [
        # What a new cluster's controller writes first (docs/lifecycle.md, bootstrap).
        "feature eligible.leader.replicas.version finalized at level 1 (ELR on)",
        "cluster default min.insync.replicas=1",
    ] + [
        line
        for b, epoch in ((1, 2), (2, 4), (3, 6))
        for line in (
            f"broker {b} registered at epoch {epoch} (first registration)",
            f"broker {b} unfenced (caught up with the log)",
        )
    ]
    told.clear()
    await service.controller.submit(FenceBroker(broker_id=2, reason="operator"))
    async with RpcClient(service.address) as client:
        await follow_events(client, feed, told.extend, follow=False, timeout_s=10)
    assert [e.text for e in told] == ["broker 2 fenced (operator)"]


async def test_elect_every_partition_and_from_a_json_file(
    service: ControllerService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from protocol.messages.internal import FenceBroker

    ctl = service.address
    rc, _, err = await metactl(
        "topics", "create", "--bootstrap-controller", ctl, "--topic", "p",
        "--replica-assignment", "1:2:3,2:3:1,3:1:2", "--config", "min.insync.replicas=1",
    )  # fmt: skip
    assert rc == 0, err
    # Broker 1 leaves and comes back: partition 0 is led by 2 until a preferred election.
    await service.controller.submit(FenceBroker(broker_id=1, reason="operator"))
    async with RpcClient(ctl) as conn:
        await register(conn, 1, "i1-b")
    # Not yet in the ISR (no replica catches up here): the preferred replica is not available.
    file = tmp_path / "elect.json"
    file.write_text(json.dumps({"partitions": [{"topic": "p", "partition": 0}]}))
    rc, out, err = await metactl(
        "elect", "--bootstrap-controller", ctl, "--election-type", "preferred",
        "--path-to-json-file", str(file),
    )  # fmt: skip
    assert rc == 5 and err.startswith("error: PREFERRED_LEADER_NOT_AVAILABLE: ")
    rc, out, err = await metactl(
        "elect", "--bootstrap-controller", ctl, "--election-type", "PREFERRED",
        "--all-topic-partitions",
    )  # fmt: skip
    assert rc == 5 and err.count("\n") == 1 and "PREFERRED_LEADER_NOT_AVAILABLE" in err
    assert out.splitlines()[-1] == (
        "PREFERRED: 0 of 1 elections done, 1 failed; 2 partition(s) already led by their "
        "preferred replica"
    )
    # Bad input is a usage error, named, before anything is sent.
    file.write_text('{"partitions": [{"topic": "p"}]}')
    for args, message in (
        (["--path-to-json-file", str(file)], "--path-to-json-file"),
        (["--all-topic-partitions", "--topic", "p"], "cannot be combined"),
        (["--topic", "p", "--partition", "x"], "the partition's index"),
        (["--partition", "p-0", "--replica", "2"], "--replica is for UNCLEAN"),
    ):
        rc, err = usage_error(
            capsys, "elect", "--bootstrap-controller", ctl, "--election-type", "preferred", *args
        )
        assert rc == 2 and err.startswith("error: INVALID_CONFIG: ") and message in err, err
    rc, err = usage_error(
        capsys,
        "elect", "--bootstrap-controller", ctl, "--election-type", "unclean", "--partition", "p-0",
    )  # fmt: skip
    assert rc == 2 and "names the replica" in err


async def test_topic_configs_and_their_aliases(
    service: ControllerService, capsys: pytest.CaptureFixture[str]
) -> None:
    ctl = service.address
    rc, out, err = await metactl(
        "topics", "create", "--bootstrap-controller", ctl, "--topic", "c", "--partitions", "1",
        "--replication-factor", "3", "--config", "min.insync.replicas=2",
        "--config", "unclean.recovery.strategy=manual",
    )  # fmt: skip
    assert rc == 0, err
    rc, out, _ = await metactl("describe", "--bootstrap-controller", ctl, "--topic", "c")
    assert out.splitlines()[0].endswith(
        "\tConfigs: min.insync.replicas=2,unclean.recovery.strategy=manual"
    )
    for args, message in (
        (["--config", "retention.ms=1"], "not a topic config metactl knows"),
        (["--config", "min.insync.replicas=2", "--min-isr", "3"], "given twice"),
        (["--config", "min.insync.replicas"], "expected KEY=VALUE"),
        (["--config", "min.insync.replicas=two"], "is not a number"),
    ):
        rc, err = usage_error(
            capsys, "topics", "create", "--bootstrap-controller", ctl, "--topic", "d", *args
        )
        assert rc == 2 and err.startswith("error: INVALID_CONFIG: ") and message in err, err
    # --min-isr is an alias: the same value twice is fine.
    rc, _, err = await metactl(
        "topics", "create", "--bootstrap-controller", ctl, "--topic", "e", "--partitions", "1",
        "--config", "min.insync.replicas=2", "--min-isr", "2",
    )  # fmt: skip
    assert rc == 0, err
