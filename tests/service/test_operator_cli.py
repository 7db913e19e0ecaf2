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
from protocol.client import RpcClient
from protocol.codec import parse_address
from protocol.messages import BrokerHeartbeatRequest, RegisterBroker, RegisterBrokerResponse


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
        r = await conn.request(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        await conn.request(
            BrokerHeartbeatRequest(
                broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
            )
        )
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


async def test_unreachable_controller_is_a_clear_error() -> None:
    rc, _, err = await metactl("describe", "--controller", "127.0.0.1:1")
    assert rc == 5 and err.startswith("error: NETWORK_EXCEPTION: ") and err.count("\n") == 1


async def test_alter_partition_over_the_wire_returns_the_committed_state(
    service: ControllerService,
) -> None:
    from protocol.messages import (
        AlterPartition,
        CreateTopic,
        CreateTopicsRequest,
        DescribeClusterRequest,
        DescribeClusterResponse,
        IsrMember,
        PartitionState,
    )

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
