"""The lifecycle commands (`configs`, `features`, `topics delete|alter`, `reassign`,
`brokers unregister`) as real subprocesses against a real controller over TCP (its
SQLite log in tmp_path), checking both what they print and what the controller's
committed image then holds; input that is refused before anything is sent is checked
in-process. Then what `describe` (Kafka's Adding/Removing Replicas columns) and `events`
(a line per lifecycle record) make of them, online and offline. Brokers are registered
over the wire and never heartbeat again: a one-hour session keeps them live
(tests/service covers expiry); a fence is the controller's own FenceBroker event, as a
session timeout submits it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metadata_image.image import ClusterImage
from metadata_log.records import ELR_FEATURE
from ops import cli
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    OngoingReassignment,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    IsrMember,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker
from tests.ops.test_cli_help import problems


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(
        tmp_path, "127.0.0.1:0", config=ControllerConfig(broker_session_timeout_ms=3_600_000)
    )
    await svc.start()
    async with RpcClient(svc.address) as conn:
        for b in (1, 2, 3, 4):
            r = await conn.request(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            await conn.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
            )
    try:
        yield svc
    finally:
        await svc.stop()


def image(svc: ControllerService) -> ClusterImage:
    return svc.controller.committed_image


async def create(svc: ControllerService, name: str, assignments: list[list[int]], **kw: Any) -> str:
    async with RpcClient(svc.address) as conn:
        spec = CreateTopic(name=name, assignments=assignments, **kw)
        r = await conn.request(CreateTopicsRequest(topics=[spec]))
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
    topic_id = r.results[0].topic_id
    assert topic_id is not None
    return topic_id


async def metactl(svc: ControllerService | None, *args: str) -> tuple[int, str, str]:
    """`metactl ARGS --bootstrap-controller <svc> --insecure`, a real subprocess (without
    a service: ARGS alone, e.g. an offline `--data-dir` command)."""
    argv = args if svc is None else (*args, "--bootstrap-controller", svc.address, "--insecure")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_error(err: str, code: str) -> str:
    """The one `error: CODE: ...` line of `err` (and nothing else)."""
    assert err.count("\n") == 1 and err.startswith(f"error: {code}: "), err
    return err


@pytest.fixture
def offline(capsys: pytest.CaptureFixture[str]) -> Any:
    """`metactl` in this process, for input refused before anything is sent: its status
    and stderr (the controller address is a closed port: nothing may reach it)."""

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            status = cli.main([*args, "--insecure", "--bootstrap-controller", "127.0.0.1:9"])
        except SystemExit as exc:  # argparse's own refusal: its usage and status 2
            status = int(exc.code or 0)
        return status, capsys.readouterr().err

    return run


# --- configs ----------------------------------------------------------------------------


async def test_configs_alter_and_describe_a_topic_and_the_cluster_default(
    service: ControllerService,
) -> None:
    await create(service, "a", [[1, 2, 3]])
    await create(service, "b", [[2, 3, 4]])
    topic = ("configs", "--entity-type", "topics", "--entity-name", "a")
    default = ("configs", "--entity-type", "brokers", "--entity-default")

    rc, out, err = await metactl(service, *topic, "--describe")
    assert (rc, err) == (0, "")
    # Bootstrap pinned the static default (1) as the cluster default; the topic inherits it.
    assert out == (
        "Configs for topic a are:\n  min.insync.replicas=1 source=DYNAMIC_DEFAULT_BROKER_CONFIG\n"
    )

    # Above the replication factor (3) is accepted: the effective MinISR is 3.
    rc, out, err = await metactl(
        service, *topic, "--alter", "--add-config", "min.insync.replicas=5"
    )
    assert (rc, err) == (0, "")
    assert out == (
        "Completed updating config for topic a.\n"
        "Cleared the ELR and LastKnownELR of 1 topic(s) (KIP-966).\n"
    )
    assert image(service).topics["a"].min_isr == 5
    assert image(service).topics["b"].min_isr is None
    rc, out, _ = await metactl(service, *topic, "--describe")
    assert out.splitlines()[1] == "  min.insync.replicas=5 source=DYNAMIC_TOPIC_CONFIG"

    # The cluster default, to the value it already has: every topic's ELR is cleared.
    rc, out, err = await metactl(
        service, *default, "--alter", "--add-config", "min.insync.replicas=1"
    )
    assert (rc, err) == (0, "")
    assert out == (
        "Completed updating default config for brokers in the cluster.\n"
        "Cleared the ELR and LastKnownELR of 2 topic(s) (KIP-966).\n"
    )
    rc, out, err = await metactl(
        service, *default, "--alter", "--add-config", "min.insync.replicas=2"
    )
    assert rc == 0 and image(service).cluster_min_isr(1) == 2
    rc, out, _ = await metactl(service, *default, "--describe")
    assert out == (
        "Default configs for brokers in the cluster are:\n"
        "  min.insync.replicas=2 source=DYNAMIC_DEFAULT_BROKER_CONFIG\n"
    )

    # The cluster default cannot be deleted; a topic's own value can (it then inherits).
    rc, _, err = await metactl(
        service, *default, "--alter", "--delete-config", "min.insync.replicas"
    )
    assert rc == 2 and "cannot be deleted" in one_error(err, "INVALID_CONFIG")
    assert image(service).cluster_min_isr(1) == 2
    rc, out, err = await metactl(
        service, *topic, "--alter", "--delete-config", "min.insync.replicas"
    )
    assert (rc, err) == (0, "") and out.startswith("Completed updating config for topic a.\n")
    assert image(service).topics["a"].min_isr is None

    # Every topic, as JSON.
    rc, out, err = await metactl(
        service, "configs", "--entity-type", "topics", "--describe", "--json"
    )
    assert (rc, err) == (0, "")
    resources = json.loads(out)["resources"]
    assert [(r["resource_name"], r["configs"][0]["value"], r["configs"][0]["source"])
            for r in resources] == [
        ("a", "2", "DYNAMIC_DEFAULT_BROKER_CONFIG"), ("b", "2", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    ]  # fmt: skip

    # The controller's refusals, one line each, with the table's status.
    rc, _, err = await metactl(
        service, "configs", "--entity-type", "topics", "--entity-name", "nope", "--alter",
        "--add-config", "min.insync.replicas=2",
    )  # fmt: skip
    assert rc == 4 and one_error(err, "UNKNOWN_TOPIC_OR_PARTITION")
    rc, _, err = await metactl(service, *topic, "--alter", "--add-config", "min.insync.replicas=x")
    assert rc == 2 and one_error(err, "INVALID_CONFIG")
    rc, _, err = await metactl(service, *topic, "--alter", "--add-config", "retention.ms=1")
    assert rc == 2 and "retention.ms" in one_error(err, "INVALID_CONFIG")
    rc, _, err = await metactl(
        service, "configs", "--entity-type", "brokers", "--entity-name", "1", "--alter",
        "--add-config", "min.insync.replicas=2",
    )  # fmt: skip
    assert rc == 2 and one_error(err, "INVALID_CONFIG")  # as Kafka refuses it under ELR


async def fence(svc: ControllerService, *brokers: int) -> None:
    for b in brokers:
        await svc.controller.submit(FenceBroker(broker_id=b, reason="session_timeout"))


async def test_raising_min_isr_with_configs_clears_the_elr(service: ControllerService) -> None:
    await create(service, "e", [[1, 2, 3]], min_isr=2)
    await fence(service, 3, 2)  # the ISR shrinks below MinISR: 2 is kept as an ELR member
    p = image(service).partitions[("e", 0)]
    assert p.isr == frozenset({1}) and 2 in p.elr, p
    rc, out, err = await metactl(
        service, "configs", "--entity-type", "topics", "--entity-name", "e", "--alter",
        "--add-config", "min.insync.replicas=3",
    )  # fmt: skip
    assert (rc, err) == (0, "") and "Cleared the ELR and LastKnownELR of 1 topic(s)" in out
    p = image(service).partitions[("e", 0)]
    assert (p.elr, p.last_known_elr) == (frozenset(), frozenset()), p


def test_configs_input_is_refused_before_anything_is_sent(offline: Any) -> None:
    t = ("configs", "--entity-type", "topics", "--entity-name", "t")
    for args, says in [
        ((*t, "--alter"), "--alter needs --add-config or --delete-config"),
        ((*t, "--alter", "--add-config", "min.insync.replicas"), "expected KEY=VALUE"),
        ((*t, "--alter", "--add-config", "=2"), "expected KEY=VALUE"),
        (
            (*t, "--alter", "--add-config", "min.insync.replicas=2,min.insync.replicas=3"),
            "given twice",
        ),
        ((*t, "--alter", "--add-config", "k=[a,b"), "unbalanced"),
        (
            (*t, "--alter", "--add-config", "min.insync.replicas=2", "--delete-config",
             "min.insync.replicas"),
            "both added and deleted",
        ),
        ((*t, "--describe", "--add-config", "min.insync.replicas=2"), "go with --alter"),
        ((*t, "--alter", "--json", "--add-config", "min.insync.replicas=2"), "--json goes"),
        (("configs", "--entity-type", "topics", "--entity-default", "--describe"), "brokers"),
        (("configs", "--entity-type", "topics", "--alter", "--add-config", "a=1"),
         "name the topic"),
        (("configs", "--entity-type", "brokers", "--describe"), "--entity-default"),
    ]:  # fmt: skip
        status, err = run_and_check(offline, args, "INVALID_CONFIG")
        assert status == 2 and says in err, (args, err)
    # argparse's own: no action, or two.
    assert offline(*t)[0] == 2
    assert offline(*t, "--alter", "--describe")[0] == 2


def run_and_check(offline: Any, args: tuple[str, ...], code: str) -> tuple[int, str]:
    status, err = offline(*args)
    return status, one_error(err, code)


# --- features ---------------------------------------------------------------------------


async def test_features_describe_downgrade_and_upgrade(service: ControllerService) -> None:
    await create(service, "f", [[1, 2, 3]], min_isr=2)
    await fence(service, 3, 2)
    assert image(service).partitions[("f", 0)].elr

    line = f"Feature: {ELR_FEATURE}\tSupportedMinVersion: 0\tSupportedMaxVersion: 1\t"
    rc, out, err = await metactl(service, "features", "describe")
    assert (rc, err, out) == (0, "", line + "FinalizedVersionLevel: 1\n")

    rc, out, err = await metactl(service, "features", "downgrade", "--feature", f"{ELR_FEATURE}=0")
    assert (rc, err) == (0, "")
    assert out == (
        f"{ELR_FEATURE} was downgraded to 0.\n"
        "Cleared the ELR and LastKnownELR of 1 topic(s) (KIP-966).\n"
    )
    assert image(service).features[ELR_FEATURE] == 0
    p = image(service).partitions[("f", 0)]
    assert (p.elr, p.last_known_elr) == (frozenset(), frozenset())
    rc, out, _ = await metactl(service, "features", "describe", "--json")
    (feature,) = json.loads(out)["features"]
    assert (feature["name"], feature["finalized"], feature["effective"]) == (ELR_FEATURE, 0, 0)

    # An "upgrade" that lowers, or a "downgrade" that raises, is refused by the controller.
    rc, _, err = await metactl(service, "features", "downgrade", "--feature", f"{ELR_FEATURE}=1")
    assert rc == 1 and "is an upgrade" in one_error(err, "INVALID_REQUEST")
    rc, out, err = await metactl(service, "features", "upgrade", "--feature", f"{ELR_FEATURE}=1")
    assert (rc, err, out) == (0, "", f"{ELR_FEATURE} was upgraded to 1.\n")
    assert image(service).features[ELR_FEATURE] == 1
    rc, _, err = await metactl(service, "features", "upgrade", "--feature", f"{ELR_FEATURE}=0")
    assert rc == 1 and "is a downgrade" in one_error(err, "INVALID_REQUEST")
    rc, _, err = await metactl(service, "features", "upgrade", "--feature", "nope=1")
    assert rc == 1 and "unknown feature" in one_error(err, "INVALID_REQUEST")
    assert image(service).features[ELR_FEATURE] == 1


def test_features_input_is_refused_before_anything_is_sent(offline: Any) -> None:
    for feature, says in [
        (ELR_FEATURE, "expected NAME=LEVEL"),
        (f"{ELR_FEATURE}=one", "must be an integer"),
        ("=1", "expected NAME=LEVEL"),
    ]:
        status, err = run_and_check(
            offline, ("features", "upgrade", "--feature", feature), "INVALID_CONFIG"
        )
        assert status == 2 and says in err
    status, err = offline(
        "features", "upgrade", "--feature", f"{ELR_FEATURE}=1", "--feature", f"{ELR_FEATURE}=0"
    )
    assert status == 2 and "given twice" in one_error(err, "INVALID_CONFIG")
    assert offline("features", "upgrade")[0] == 2  # --feature is required


# --- topics delete / alter --------------------------------------------------------------


async def test_topics_delete_then_create_again_gives_a_new_id(service: ControllerService) -> None:
    old_id = await create(service, "t", [[1, 2, 3]])
    rc, out, err = await metactl(service, "topics", "delete", "--topic", "t")
    assert (rc, err, out) == (0, "", f"Deleted topic t ({old_id})\n")
    assert "t" not in image(service).topics and ("t", 0) not in image(service).partitions

    rc, _, err = await metactl(service, "topics", "delete", "--topic", "t")
    assert rc == 4 and one_error(err, "UNKNOWN_TOPIC_OR_PARTITION")
    rc, out, err = await metactl(service, "topics", "delete", "--topic", "t", "--if-exists")
    assert (rc, err) == (0, "") and "does not exist: nothing to delete" in out

    rc, out, err = await metactl(
        service, "topics", "create", "--topic", "t", "--replica-assignment", "2:3:4"
    )
    assert rc == 0, err
    new_id = image(service).topics["t"].topic_id
    assert new_id != old_id and new_id in out

    # Several topics: each alone; the missing one is one error line, the status its own.
    await create(service, "x", [[1, 2, 3]])
    rc, out, err = await metactl(service, "topics", "delete", "--topic", "t,missing,x")
    assert rc == 4 and "missing" in one_error(err, "UNKNOWN_TOPIC_OR_PARTITION")
    assert out.startswith("Deleted topic t (") and "\nDeleted topic x (" in out
    assert not image(service).topics


async def test_topics_alter_adds_partitions_and_refuses_a_decrease(
    service: ControllerService,
) -> None:
    await create(service, "g", [[1, 2, 3], [2, 3, 4]], min_isr=2)
    rc, out, err = await metactl(service, "topics", "alter", "--topic", "g", "--partitions", "4")
    assert (rc, err) == (0, "")
    assert out.startswith("Topic g now has 4 partitions (was 2); new: 2: ")
    img = image(service)
    assert img.topics["g"].partitions == 4
    for i in (2, 3):
        p = img.partitions[("g", i)]
        assert len(p.replicas) == 3 and p.min_isr == 2, p  # the topic's RF and MinISR
        assert f"{i}: {','.join(map(str, p.replicas))}" in out

    rc, out, err = await metactl(
        service, "topics", "alter", "--topic", "g", "--partitions", "5",
        "--replica-assignment", "4:1:2",
    )  # fmt: skip
    assert (rc, err) == (0, "") and out.endswith("new: 4: 4,1,2\n")
    assert image(service).partitions[("g", 4)].replicas == (4, 1, 2)

    for count in ("5", "3"):
        rc, _, err = await metactl(
            service, "topics", "alter", "--topic", "g", "--partitions", count
        )
        assert rc == 1 and one_error(err, "INVALID_PARTITIONS")
    assert image(service).topics["g"].partitions == 5
    rc, _, err = await metactl(service, "topics", "alter", "--topic", "h", "--partitions", "2")
    assert rc == 4 and one_error(err, "UNKNOWN_TOPIC_OR_PARTITION")
    rc, out, err = await metactl(
        service, "topics", "alter", "--topic", "h", "--partitions", "2", "--if-exists"
    )
    assert (rc, err) == (0, "") and "nothing to alter" in out


def test_brokers_unregister_is_an_online_command(offline: Any, tmp_path: Path) -> None:
    status, err = offline("brokers", "--data-dir", str(tmp_path), "unregister", "--id", "1")
    assert status == 2 and "--data-dir is for listing" in one_error(err, "INVALID_CONFIG")
    assert offline("brokers", "unregister")[0] == 2  # --id is required


def test_topics_input_is_refused_before_anything_is_sent(offline: Any) -> None:
    status, err = offline("topics", "delete", "--topic", "a,,b")
    assert status == 2 and "empty topic name" in one_error(err, "INVALID_CONFIG")
    status, err = offline(
        "topics", "alter", "--topic", "a", "--partitions", "3", "--replica-assignment", "1:x"
    )
    assert status == 2 and one_error(err, "INVALID_CONFIG")
    assert offline("topics", "alter", "--topic", "a")[0] == 2  # --partitions is required


# --- reassign ---------------------------------------------------------------------------


def plan(tmp_path: Path, name: str, partitions: list[dict[str, Any]], **extra: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"version": 1, "partitions": partitions, **extra}))
    return str(path)


async def catch_up(svc: ControllerService, topic: str, partition: int, joining: int) -> None:
    """The leader of topic-partition reports `joining` caught up: it joins the ISR."""
    async with RpcClient(svc.address) as conn:
        d = await conn.request(DescribeClusterRequest(topic=topic))
        assert isinstance(d, DescribeClusterResponse)
        epochs = {b.broker_id: b.epoch for b in d.brokers}
        (p,) = [p for p in d.partitions if p.partition == partition]
        isr = sorted({*p.isr, joining})
        await conn.request(
            AlterPartition(
                topic=topic, partition=partition, leader=p.leader,
                broker_epoch=epochs[p.leader], partition_epoch=p.partition_epoch,
                isr=[IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in isr],
            )
        )  # fmt: skip


async def test_reassign_execute_list_verify_complete_and_cancel(
    service: ControllerService, tmp_path: Path
) -> None:
    await create(service, "m", [[1, 2, 3], [2, 3, 1]], min_isr=2)
    move = plan(tmp_path, "move.json", [{"topic": "m", "partition": 0, "replicas": [2, 3, 4]}])
    more = plan(tmp_path, "more.json", [{"topic": "m", "partition": 1, "replicas": [3, 1, 4]}])

    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", move, "--execute")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert json.loads(lines[2]) == {
        "version": 1,
        "partitions": [
            {"topic": "m", "partition": 0, "replicas": [1, 2, 3], "log_dirs": ["any"] * 3}
        ],
    }
    assert lines[-1] == "Successfully started partition reassignments for m-0"
    p = image(service).partitions[("m", 0)]
    assert (p.replicas, p.adding, p.removing) == ((2, 3, 4, 1), (4,), (1,))

    rc, out, err = await metactl(service, "reassign", "--list")
    assert (rc, err) == (0, "")
    assert (
        out == "Current partition reassignments:\nm-0: replicas: 2,3,4,1. adding: 4. removing: 1.\n"
    )
    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", move, "--verify")
    assert (rc, err, out) == (3, "", "Reassignment of partition m-0 is still in progress.\n")

    # Another reassignment while one runs: refused unless --additional, as in Kafka.
    rc, _, err = await metactl(service, "reassign", "--reassignment-json-file", more, "--execute")
    assert rc == 1 and "--additional" in one_error(err, "INVALID_REQUEST")
    assert set(image(service).reassigning) == {("m", 0)}
    rc, out, err = await metactl(
        service, "reassign", "--reassignment-json-file", more, "--execute", "--additional"
    )
    assert (rc, err) == (0, "") and out.endswith("reassignments for m-1\n")
    assert set(image(service).reassigning) == {("m", 0), ("m", 1)}
    rollback = tmp_path / "rollback.json"
    rollback.write_text(out.splitlines()[2])

    # Broker 4 catches up on m-0: the controller completes it, leadership off broker 1.
    await catch_up(service, "m", 0, 4)
    p = image(service).partitions[("m", 0)]
    assert (p.replicas, p.adding, p.removing, p.leader) == ((2, 3, 4), (), (), 2), p
    assert 1 not in p.isr | p.elr | p.last_known_elr
    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", move, "--verify")
    assert (rc, err, out) == (0, "", "Reassignment of partition m-0 is completed.\n")

    # --verify is a checker: replicas other than the file's (here, only their order: the
    # first is the preferred leader) are not "completed".
    planted = plan(
        tmp_path, "planted.json", [{"topic": "m", "partition": 0, "replicas": [2, 4, 3]}]
    )
    rc, out, err = await metactl(
        service, "reassign", "--reassignment-json-file", planted, "--verify"
    )
    assert (rc, err) == (3, "")
    assert out == (
        "There is no active reassignment of partition m-0, but replica set is 2,3,4 rather "
        "than 2,4,3.\n"
    )

    # Cancel m-1: its original replicas come back. A second cancel has nothing to cancel.
    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", more, "--cancel")
    assert (rc, err, out) == (0, "", "Successfully cancelled partition reassignments for: m-1\n")
    # The original replicas come back in the reassignment's order, the replicas minus the
    # adding ones (Kafka's PartitionReassignmentRevert does the same): the preferred leader
    # may change. The rollback file --execute printed keeps the original order.
    p = image(service).partitions[("m", 1)]
    assert (p.replicas, p.reassigning) == ((3, 1, 2), False)
    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", more, "--cancel")
    assert (rc, out) == (1, "") and "m-1" in one_error(err, "NO_REASSIGNMENT_IN_PROGRESS")
    # The rollback file restores the order too (a reorder completes at once).
    rc, out, err = await metactl(
        service, "reassign", "--reassignment-json-file", str(rollback), "--execute"
    )
    assert (rc, err) == (0, "") and image(service).partitions[("m", 1)].replicas == (2, 3, 1)
    rc, out, err = await metactl(service, "reassign", "--list")
    assert (rc, err, out) == (0, "", "No partition reassignments found.\n")


async def test_reassign_reports_each_partition_alone(
    service: ControllerService, tmp_path: Path
) -> None:
    await create(service, "n", [[1, 2, 3]])
    mixed = plan(
        tmp_path,
        "mixed.json",
        [
            {"topic": "n", "partition": 0, "replicas": [4, 2, 3], "log_dirs": ["any"] * 3},
            {"topic": "n", "partition": 7, "replicas": [1, 2, 3]},
            {"topic": "gone", "partition": 0, "replicas": [1, 2, 3]},
            {"topic": "n", "partition": 1, "replicas": [1, 9]},
        ],
    )  # fmt: skip
    rc, out, err = await metactl(
        service, "reassign", "--reassignment-json-file", mixed, "--execute"
    )
    assert rc == 4  # the first failure's status: n-7 is unknown
    lines = err.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION",
    ]  # fmt: skip
    assert ["n-7" in lines[0], "gone-0" in lines[1], "n-1" in lines[2]] == [True] * 3
    # Only what exists is in the rollback file; only n-0 started.
    assert json.loads(out.splitlines()[2])["partitions"] == [
        {"topic": "n", "partition": 0, "replicas": [1, 2, 3], "log_dirs": ["any"] * 3}
    ]
    assert out.endswith("Successfully started partition reassignments for n-0\n")
    assert set(image(service).reassigning) == {("n", 0)}
    rc, out, err = await metactl(service, "reassign", "--reassignment-json-file", mixed, "--verify")
    assert rc == 4 and "still in progress" in out and err.count("error: ") == 3


async def test_reassign_refuses_unregistered_target_brokers(
    service: ControllerService, tmp_path: Path
) -> None:
    await create(service, "r", [[1, 2, 3]])
    bad = plan(tmp_path, "bad.json", [{"topic": "r", "partition": 0, "replicas": [1, 2, 9]}])
    rc, _, err = await metactl(service, "reassign", "--reassignment-json-file", bad, "--execute")
    assert rc == 1 and "r-0" in one_error(err, "INVALID_REPLICA_ASSIGNMENT")
    assert not image(service).reassigning


def test_reassign_file_and_mode_are_checked_before_anything_is_sent(
    offline: Any, tmp_path: Path
) -> None:
    p0 = {"topic": "t", "partition": 0, "replicas": [1, 2]}
    cases: list[tuple[tuple[str, ...], str]] = [
        (("--reassignment-json-file", str(tmp_path / "none.json"), "--execute"), ""),
        (("--reassignment-json-file", plan(tmp_path, "dup.json", [p0, p0]), "--execute"),
         "listed twice"),
        (("--reassignment-json-file", plan(tmp_path, "empty.json", []), "--verify"),
         "no partitions"),
        (("--reassignment-json-file", plan(tmp_path, "v2.json", [p0], version=2), "--execute"),
         "version 2"),
        (("--reassignment-json-file",
          plan(tmp_path, "noreps.json", [{"topic": "t", "partition": 0}]), "--execute"),
         "has no replicas"),
        (("--reassignment-json-file",
          plan(tmp_path, "dirs.json", [{**p0, "log_dirs": ["/d1", "any"]}]), "--execute"),
         'must be "any"'),
        (("--reassignment-json-file",
          plan(tmp_path, "ndirs.json", [{**p0, "log_dirs": ["any"]}]), "--execute"),
         "1 log_dirs for 2 replicas"),
        (("--reassignment-json-file",
          plan(tmp_path, "extra.json", [{**p0, "leader": 1}]), "--execute"), "leader"),
        (("--reassignment-json-file", str(tmp_path / "dup.json"), "--list"), "--list takes no"),
        (("--execute",), "need --reassignment-json-file"),
        (("--list", "--additional"), "--additional goes with --execute"),
        (("--reassignment-json-file", str(tmp_path / "dup.json"), "--verify", "--json"),
         "--json goes with --list"),
    ]  # fmt: skip
    (tmp_path / "bad.json").write_text("{not json")
    cases.append((("--reassignment-json-file", str(tmp_path / "bad.json"), "--cancel"), "expected"))
    for args, says in cases:
        status, err = offline("reassign", *args)
        if not says:  # a missing file: the table's not-found status, named by errno
            assert status == 4 and one_error(err, "ENOENT")
            continue
        assert status == 2 and says in one_error(err, "INVALID_CONFIG"), (args, err)
    # A cancel needs no replicas.
    cancel_only = plan(tmp_path, "cancel.json", [{"topic": "t", "partition": 0}])
    status, err = offline("reassign", "--reassignment-json-file", cancel_only, "--cancel")
    assert status == 5 and one_error(err, "NETWORK_EXCEPTION")  # it got as far as sending
    assert offline("reassign")[0] == 2  # no mode


def test_verify_and_list_read_the_cluster_as_kafka_does() -> None:
    from ops.reassign_cmds import ongoing_line
    from ops.reassign_plan import JsonPartition, Status, rollback, verify

    entries = [JsonPartition(topic="t", partition=i, replicas=[1, 2]) for i in range(4)]
    shrinking = OngoingReassignment(
        topic="t", partition=1, replicas=[1, 2, 3], adding_replicas=[], removing_replicas=[3]
    )
    moving = {("t", 1): shrinking}
    current = {("t", 0): [1, 2], ("t", 1): [1, 2, 3], ("t", 2): [2, 1]}
    checks = verify(entries, moving, current)
    assert [c.status for c in checks] == [
        Status.COMPLETED,
        Status.IN_PROGRESS,
        Status.DIFFERENT,  # the same brokers in another order: another preferred leader
        Status.UNKNOWN,
    ]
    assert (checks[2].current, checks[2].target) == ([2, 1], [1, 2])
    # Kafka's --list line leaves out an empty adding or removing part.
    assert ongoing_line(shrinking) == "t-1: replicas: 1,2,3. removing: 3."
    growing = OngoingReassignment(
        topic="t", partition=0, replicas=[4, 1, 2], adding_replicas=[4], removing_replicas=[]
    )
    assert ongoing_line(growing) == "t-0: replicas: 4,1,2. adding: 4."
    # The rollback: what exists, without the replicas a running reassignment is adding.
    assert rollback(entries, {("t", 0): [4, 1, 2], ("t", 2): [2, 1]}, {("t", 0): growing}) == {
        ("t", 0): [1, 2],
        ("t", 2): [2, 1],
    }


# --- brokers unregister -----------------------------------------------------------------


async def test_brokers_unregister_only_a_fenced_broker(service: ControllerService) -> None:
    await create(service, "u", [[4, 1, 2]], min_isr=3)
    rc, _, err = await metactl(service, "brokers", "unregister", "--id", "4")
    assert rc == 1 and "active" in one_error(err, "INVALID_REQUEST")
    rc, _, err = await metactl(service, "brokers", "unregister", "--id", "9")
    assert rc == 4 and one_error(err, "BROKER_ID_NOT_REGISTERED")
    assert 4 in image(service).brokers

    await fence(service, 4)  # ISR [1,2] is below MinISR 3: 4 is kept in the ELR
    p = image(service).partitions[("u", 0)]
    assert 4 in p.elr | p.last_known_elr, p
    rc, out, err = await metactl(service, "brokers", "unregister", "--id", "4")
    assert (rc, err, out) == (0, "", "Broker 4 is no longer registered.\n")
    img = image(service)
    assert 4 not in img.brokers
    p = img.partitions[("u", 0)]
    assert 4 not in p.isr | p.elr | p.last_known_elr and 4 in p.replicas, p

    # The flags may come before the sub-command too: they are not lost to its defaults
    # (the request reaches this controller, not the default address).
    rc, _, err = await metactl(
        None, "brokers", "--bootstrap-controller", service.address, "--insecure",
        "unregister", "--id", "9",
    )  # fmt: skip
    assert rc == 4 and one_error(err, "BROKER_ID_NOT_REGISTERED")

    # `brokers` alone still lists (the group only gained a sub-command).
    rc, out, err = await metactl(service, "brokers", "--json")
    assert (rc, err) == (0, "") and [b["broker_id"] for b in json.loads(out)["brokers"]] == [
        1,
        2,
        3,
    ]


# --- describe ---------------------------------------------------------------------------


async def test_describe_shows_the_replicas_a_reassignment_adds_and_removes(
    service: ControllerService, tmp_path: Path
) -> None:
    await create(service, "d", [[1, 2, 3], [2, 3, 1]], min_isr=2)
    move = plan(tmp_path, "move.json", [{"topic": "d", "partition": 0, "replicas": [2, 3, 4]}])
    rc, _, err = await metactl(service, "reassign", "--reassignment-json-file", move, "--execute")
    assert rc == 0, err

    moving = (
        "\tTopic: d\tPartition: 0\tLeader: 1\tReplicas: 2,3,4,1\tIsr: 1,2,3\t"
        "Adding Replicas: 4\tRemoving Replicas: 1\tElr: \tLastKnownElr: \tLeaderEpoch: 0\t"
        "Recovery: ok"
    )
    rc, out, err = await metactl(service, "describe", "--topic", "d")
    assert (rc, err) == (0, "")
    summary, first, second = out.splitlines()
    # Kafka's columns, after Isr, only on the partition being reassigned; the topic's
    # replication factor is the target's.
    assert first == moving
    assert "Adding Replicas" not in second and "\tReplicas: 2,3,1\tIsr: 1,2,3\tElr: " in second
    assert "\tReplicationFactor: 3\tConfigs: min.insync.replicas=2" in summary
    # Offline, from the log: the same line.
    rc, out, err = await metactl(None, "describe", "--data-dir", str(tmp_path), "--topic", "d")
    assert (rc, err) == (0, "") and out.splitlines()[1] == moving

    rc, out, err = await metactl(service, "describe", "--topic", "d", "--json")
    assert (rc, err) == (0, "")
    parts = json.loads(out)["partitions"]
    assert [(p["adding_replicas"], p["removing_replicas"]) for p in parts] == [
        ([4], [1]),
        ([], []),
    ]
    # Under-replicated as Kafka counts it: the ISR (3) against the replicas not being added
    # (3), not against all four.
    rc, out, err = await metactl(service, "describe", "--under-replicated-partitions")
    assert (rc, err, out) == (0, "", "")

    # Broker 4 catches up: the move completes and the columns go.
    await catch_up(service, "d", 0, 4)
    rc, out, err = await metactl(service, "describe", "--topic", "d")
    assert (rc, err) == (0, "") and "Adding Replicas" not in out
    assert "\tTopic: d\tPartition: 0\tLeader: 2\tReplicas: 2,3,4\tIsr: 2,3,4\tElr: " in out


# --- events -----------------------------------------------------------------------------


def in_log_order(texts: list[str], wanted: list[str]) -> None:
    """Each of `wanted` begins a line of `texts`, in this order (later lines may come in
    between)."""
    at = 0
    for w in wanted:
        found = next((i for i in range(at, len(texts)) if texts[i].startswith(w)), None)
        assert found is not None, (w, texts[at:])
        at = found + 1


async def test_events_tell_each_lifecycle_step(service: ControllerService, tmp_path: Path) -> None:
    await create(service, "ev", [[1, 2, 3]], min_isr=2)
    await create(service, "gone", [[1, 2, 3]])
    move = plan(tmp_path, "move.json", [{"topic": "ev", "partition": 0, "replicas": [2, 3, 4]}])
    back = plan(tmp_path, "back.json", [{"topic": "gone", "partition": 0, "replicas": [4, 1, 2]}])
    topic = ("configs", "--entity-type", "topics", "--entity-name", "ev", "--alter")
    default = ("configs", "--entity-type", "brokers", "--entity-default", "--alter")
    for args in (
        (*topic, "--add-config", "min.insync.replicas=3"),
        (*default, "--add-config", "min.insync.replicas=2"),
        ("features", "downgrade", "--feature", f"{ELR_FEATURE}=0"),
        ("features", "upgrade", "--feature", f"{ELR_FEATURE}=1"),
        ("reassign", "--reassignment-json-file", move, "--execute"),
        ("reassign", "--reassignment-json-file", back, "--execute", "--additional"),
        ("reassign", "--reassignment-json-file", back, "--cancel"),
    ):
        rc, _, err = await metactl(service, *args)
        assert rc == 0, (args, err)
    await catch_up(service, "ev", 0, 4)
    for args in (
        ("topics", "alter", "--topic", "ev", "--partitions", "2", "--replica-assignment", "1:2:3"),
        ("topics", "delete", "--topic", "gone"),
    ):
        rc, _, err = await metactl(service, *args)
        assert rc == 0, (args, err)
    await fence(service, 4)  # ev-0's ISR 2,3 is below its MinISR 3: 4 stays in the ELR
    rc, _, err = await metactl(service, "brokers", "unregister", "--id", "4")
    assert rc == 0, err

    wanted = [
        # What the controller pinned when it started on an empty log.
        f"feature {ELR_FEATURE} finalized at level 1 (ELR on)",
        "cluster default min.insync.replicas=1",
        "topic ev created: 1 partition(s), MinISR 2 (id ",
        "topic gone created: 1 partition(s), MinISR 1 (cluster default) (id ",
        "topic ev: min.insync.replicas=3 (was 2)",
        "topic ev: ELR and LastKnownELR cleared on all 1 partition(s), MinISR 3 "
        "(min.insync.replicas updated)",
        "cluster default min.insync.replicas=2 (was 1)",
        "topic ev: ELR and LastKnownELR cleared on all 1 partition(s), MinISR 3 ",
        "topic gone: ELR and LastKnownELR cleared on all 1 partition(s), MinISR 2 ",
        f"feature {ELR_FEATURE} level 1→0 (ELR off: every ELR and LastKnownELR cleared)",
        "topic ev: ELR and LastKnownELR cleared on all 1 partition(s)",
        f"feature {ELR_FEATURE} level 0→1 (ELR on: tracked from the current ISRs)",
        "ev-0 replicas [1,2,3]→[2,3,4,1], adding [4], removing [1] (reassignment)",
        "gone-0 replicas [1,2,3]→[4,1,2,3], adding [4], removing [3] (reassignment)",
        "gone-0 replicas [4,1,2,3]→[1,2,3], reassignment cancelled (reassignment)",
        "ev-0 isr [1,2,3]→[1,2,3,4] (alter_partition of broker 1)",
        "ev-0 leader 1→2 (isr), replicas [2,3,4,1]→[2,3,4], reassignment complete, "
        "isr [1,2,3,4]→[2,3,4]",
        "topic ev grown: 1→2 partition(s)",
        "topic gone deleted (1 partition(s), id ",
        "broker 4 fenced (session expired)",
        "ev-0 isr [2,3,4]→[2,3], elr []→[4] (fence of broker 4)",
        "broker 4 unregistered (epoch ",
        "ev-0 elr [4]→[] (unregister of broker 4)",
    ]
    for source in ((), ("--data-dir", str(tmp_path))):
        rc, out, err = await metactl(service if not source else None, "events", *source)
        assert (rc, err) == (0, "")
        in_log_order([line.split("  ", 1)[1] for line in out.splitlines()], wanted)
    rc, out, _ = await metactl(None, "events", "--data-dir", str(tmp_path), "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    types = {r["type"] for r in rows}
    assert {"Config", "FeatureLevel", "ClearElr", "RemoveTopic", "UnregisterBroker"} <= types
    clear = next(r for r in rows if r["type"] == "ClearElr")
    assert clear["record"]["topic"] == "ev" and clear["record"]["min_isr"] == 3


# --- help -------------------------------------------------------------------------------


def test_every_lifecycle_command_has_examples_and_states_its_defaults() -> None:
    root = cli.build_parser()

    def find(path: str) -> argparse.ArgumentParser:
        p = root
        for name in path.split():
            (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
            p = action.choices[name]
        return p

    for path in (
        "configs", "features", "features describe", "features upgrade", "features downgrade",
        "topics delete", "topics alter", "reassign", "brokers unregister",
    ):  # fmt: skip
        assert problems(find(path)) == [], path
    # The groups they extend keep their own commands.
    assert find("topics create") and find("brokers")
