"""A Kafka operator's habits in `metactl` (issue 34, items 3 and 6), through the real CLI
parser (`ops.cli.main`, in this process or as `python -m ops.cli`).

Every entry of the one table of Kafka spellings (`ops.cli.KAFKA_FLAGS`) is tried on its
own: one line naming what to use instead, INVALID_CONFIG, status 2, never argparse's
usage; and docs/cli.md's Coming from Kafka section lists each. Kafka's argument orders
are rewritten before parsing (`topics --describe`, options before a sub-command). Then,
against a real controller (its SQLite log in tmp_path, brokers registered over TCP, with
racks), what the new forms print: `topics --list`, `topics --describe` (describe's own
output), `reassign --generate` (Kafka's two documents, placed as the controller places a
new topic, and usable by `--execute`), `elect --all-topic-partitions` with nothing to
elect, `quorum --bootstrap-controller H:P describe`, and the NODE column of `quorum
describe --replication` on a node id longer than it was. Offline: `log dump --files`,
`storage format -t ID -g` and `-c`, and the certificate advice of a CLI run away from
its cluster's data directory."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients.quorum import QuorumView, Summary
from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metactl.errors import NetworkError
from metadata_log.identity import new_id, read_identity
from ops import cli
from ops.cli import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, KAFKA_FLAGS, kafka_order
from ops.quorum_cmds import replication_lines
from ops.reassign_plan import file_text
from protocol.client import RpcClient
from protocol.flags import ENV_TLS_DIR
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeQuorumResponse,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import FenceBroker

REPO = Path(__file__).resolve().parents[2]
RACKS = {1: "r1", 2: "r1", 3: "r2", 4: "r2"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`metactl ARGV` in this process: its status (argparse's too), stdout and stderr."""
    capsys.readouterr()
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str, code: str) -> str:
    assert err.count("\n") == 1 and err.startswith(f"error: {code}: "), err
    assert "usage:" not in err and "Traceback" not in err
    return err


# --- the table of Kafka spellings ---------------------------------------------------------


@pytest.mark.parametrize(("scope", "flag"), sorted(KAFKA_FLAGS), ids=lambda x: x or "any")
def test_each_kafka_spelling_gets_one_line_saying_what_to_use(
    scope: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = scope.split() or ["describe"]
    status, out, err = run(capsys, *command, flag, "x")
    assert status == EXIT_USAGE and out == ""
    line = one_line(err, "INVALID_CONFIG")
    assert line.startswith(f"error: INVALID_CONFIG: {flag} is Kafka's; "), line
    assert line.strip().endswith(KAFKA_FLAGS[(scope, flag)])


def test_the_table_is_docs_cli_md_s_coming_from_kafka_section() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text[text.index("## Coming from Kafka") :]
    section = section[: section.index("\n## ", 1)]
    missing = {flag for _, flag in KAFKA_FLAGS if f"`{flag}`" not in section}
    assert not missing, f"docs/cli.md, Coming from Kafka, does not list {sorted(missing)}"


def test_a_flag_the_command_takes_keeps_argparse_s_own_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `topics create` takes --config: a missing value is argparse's, with create's usage.
    status, _, err = run(capsys, "topics", "create", "--topic", "t", "--config")
    assert status == EXIT_USAGE
    assert err.startswith("usage: metactl topics create ") and "--config: expected one" in err
    # The hint names the flag, not whatever else is wrong on the line.
    status, _, err = run(capsys, "topics", "create", "--partitions", "1_0", "--zookeeper", "z")
    assert status == EXIT_USAGE and one_line(err, "INVALID_CONFIG").startswith(
        "error: INVALID_CONFIG: --zookeeper is Kafka's; "
    )


# --- Kafka's argument orders --------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "ordered"),
    [
        (
            ["quorum", "--bootstrap-controller", "h:1", "describe", "--status"],
            ["quorum", "describe", "--bootstrap-controller", "h:1", "--status"],
        ),
        (
            ["quorum", "--bootstrap-controller=h:1", "--insecure", "describe", "--replication"],
            ["quorum", "describe", "--bootstrap-controller=h:1", "--insecure", "--replication"],
        ),
        (["topics", "--describe", "--topic", "demo"], ["topics", "describe", "--topic", "demo"]),
        (
            ["topics", "--bootstrap-controller", "h:1", "--list", "--json"],
            ["topics", "list", "--bootstrap-controller", "h:1", "--json"],
        ),
        (
            ["topics", "--create", "--topic", "t", "--partitions", "3"],
            ["topics", "create", "--topic", "t", "--partitions", "3"],
        ),
        (["log", "--data-dir", "d", "dump"], ["log", "dump", "--data-dir", "d"]),
        (
            ["features", "--bootstrap-controller", "h:1", "describe"],
            ["features", "describe", "--bootstrap-controller", "h:1"],
        ),
        # The group's own flags stay (brokers keeps them for its sub-command itself).
        (
            ["brokers", "--bootstrap-controller", "h:1", "unregister", "--id", "4"],
            ["brokers", "--bootstrap-controller", "h:1", "unregister", "--id", "4"],
        ),
        # What it cannot place, argparse (and the table) reports, as given.
        (
            ["quorum", "--bootstrap-server", "h:1", "describe"],
            ["quorum", "--bootstrap-server", "h:1", "describe"],
        ),
        (["topics", "--", "--list"], ["topics", "--", "--list"]),  # after --: as given
        (["describe", "--topic", "t"], ["describe", "--topic", "t"]),
    ],
)
def test_kafka_s_orders_become_metactl_s(given: list[str], ordered: list[str]) -> None:
    assert kafka_order(cli.build_parser(given), given) == ordered


def test_the_reordered_line_parses_as_metactl_s(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["quorum", "--bootstrap-controller", "127.0.0.1:1", "describe", "--status"]
    args = cli.build_parser(argv).parse_args(kafka_order(cli.build_parser(argv), argv))
    assert args.controller == "127.0.0.1:1" and args.status and args.func.__name__ == "cmd_describe"
    argv = ["topics", "--describe", "--topic", "demo", "--under-replicated-partitions"]
    args = cli.build_parser(argv).parse_args(kafka_order(cli.build_parser(argv), argv))
    assert args.topic == "demo" and args.under_replicated_partitions
    assert args.func.__module__ == "ops.describe_cmds" and args.func.__name__ == "cmd_describe"
    # Two of Kafka's actions at once: one named line.
    status, _, err = run(capsys, "topics", "--create", "--delete", "--topic", "t")
    assert status == EXIT_USAGE
    assert "--create and --delete: give one of --list" in one_line(err, "INVALID_CONFIG")


def test_quorum_in_kafka_s_order_reaches_the_controller(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Nothing listens: the command ran (its own error, not argparse's "invalid choice").
    closed = "127.0.0.1:9"
    status, _, err = run(
        capsys, "quorum", "--bootstrap-controller", closed, "describe", "--status",
        "--insecure", "--timeout", "0.5",
    )  # fmt: skip
    assert status == cli.EXIT_UNAVAILABLE and one_line(err, NetworkError.code)


# --- offline: log dump --files, storage format -t/-g/-c, certificates ---------------------


def test_storage_format_takes_kafka_s_short_flags_and_says_what_to_use_for_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = new_id()
    d = tmp_path / "controller"
    status, out, err = run(capsys, "storage", "format", "-t", cluster, "--data-dir", str(d))
    assert status == EXIT_OK, err
    identity = read_identity(d)
    assert identity is not None and identity.cluster_id == cluster
    assert out.startswith(f"cluster.id: {cluster}\n")
    status, out, _ = run(capsys, "storage", "format", "-t", cluster, "--data-dir", str(d), "-g")
    assert status == EXIT_OK and "already formatted" in out
    # Kafka's own line: -c names a server.properties metactl does not have.
    status, out, err = run(capsys, "storage", "format", "-t", cluster, "-c", "server.properties")
    assert status == EXIT_USAGE and out == ""
    line = one_line(err, "INVALID_CONFIG")
    assert line.startswith("error: INVALID_CONFIG: -c is Kafka's; ")
    assert "--data-dir D" in line and "--node-id N" in line


def test_a_cli_away_from_its_cluster_says_to_pass_tls_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # not where `make run` ran: no ./data/certs
    monkeypatch.delenv(ENV_TLS_DIR, raising=False)
    status, _, err = run(capsys, "describe", "--bootstrap-controller", "127.0.0.1:9")
    assert status == EXIT_USAGE
    line = one_line(err, "INVALID_CONFIG")
    running = line.index("for a running cluster pass its certificate directory, --tls-dir DIR")
    assert f"export {ENV_TLS_DIR}=DIR" in line
    assert str(tmp_path / "data" / "certs") in line  # where it looked, in full
    # `certs init` comes after, and only for new certificates.
    assert line.index("`metactl certs init --data-dir D` only makes new ones") > running
    monkeypatch.setenv(ENV_TLS_DIR, str(tmp_path / "gone"))
    status, _, err = run(capsys, "topics", "--list", "--bootstrap-controller", "127.0.0.1:9")
    line = one_line(err, "INVALID_CONFIG")
    assert f"TLS directory {tmp_path / 'gone'} (${ENV_TLS_DIR}) does not exist" in line
    assert "--tls-dir DIR" in line and status == EXIT_USAGE


def test_replication_sizes_the_node_column_to_its_contents() -> None:
    def answer(node: str, address: str, role: str, applied: int) -> DescribeQuorumResponse:
        return DescribeQuorumResponse(
            cluster_id="c", node_id=node, address=address, role=role, backend="sqlite",
            log="/l", applied_offset=applied, log_end_offset=12, leader_id=node,
        )  # fmt: skip

    long_node = "controller-east-1.example.com:9093"
    views = [
        QuorumView(asked="127.0.0.1:9093", view=answer(long_node, "127.0.0.1:9093", "active", 12)),
        QuorumView(asked="h:2", view=answer("c2", "h:2", "standby", 7)),
        QuorumView(asked="h:3", error=NetworkError("h:3: refused")),
    ]
    lines = replication_lines(Summary.of(views))
    header, rows = lines[0], lines[1:4]
    assert header.split()[:2] == ["NODE", "ADDRESS"]
    # Every column starts where its header does, whatever the node id's length.
    for title in ("ADDRESS", "ROLE"):
        at = header.index(title)
        for row in rows:
            assert row[at - 2 : at] == "  " and row[at] != " ", (title, row)
    assert rows[0].startswith(long_node + "  ") and rows[1].startswith("c2 ")
    offsets = header.index("APPLIED OFFSET") + len("APPLIED OFFSET")
    assert rows[0][:offsets].endswith(" 12") and rows[1][:offsets].endswith(" 7")
    assert rows[2].split()[:2] == ["-", "h:3"] and "unreachable (NETWORK_EXCEPTION" in rows[2]


# --- against a real controller ------------------------------------------------------------


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    """A controller on its SQLite log in tmp_path with four brokers, two racks (r1: 1, 2;
    r2: 3, 4): a new topic's replicas alternate racks, 1, 3, 2, 4."""
    svc = ControllerService(
        tmp_path, "127.0.0.1:0", config=ControllerConfig(broker_session_timeout_ms=3_600_000)
    )
    await svc.start()
    try:
        async with RpcClient(svc.address) as conn:
            for b, rack in RACKS.items():
                r = await conn.request(
                    RegisterBroker(broker_id=b, incarnation_id=f"i{b}", rack=rack)
                )
                assert isinstance(r, RegisterBrokerResponse)
                await conn.request(
                    BrokerHeartbeatRequest(
                        broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                    )
                )
        yield svc
    finally:
        await svc.stop()


async def create(svc: ControllerService, *topics: CreateTopic) -> None:
    async with RpcClient(svc.address) as conn:
        r = await conn.request(CreateTopicsRequest(topics=list(topics)))
    assert isinstance(r, CreateTopicsResponse), r
    assert all(res.error_code is None for res in r.results), r


async def metactl(svc: ControllerService | None, *args: str) -> tuple[int, str, str]:
    """`metactl ARGS --bootstrap-controller <svc> --insecure` as a real process."""
    argv = args if svc is None else (*args, "--bootstrap-controller", svc.address, "--insecure")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None and b"Traceback" not in err
    return proc.returncode, out.decode(), err.decode()


def assignment(text: str) -> dict[tuple[str, int], list[int]]:
    doc = json.loads(text)
    assert doc["version"] == 1
    return {(p["topic"], p["partition"]): p["replicas"] for p in doc["partitions"]}


async def test_topics_list_and_describe_as_kafka_topics_spells_them(
    service: ControllerService, tmp_path: Path
) -> None:
    rc, out, err = await metactl(service, "topics", "--list")
    assert (rc, out) == (EXIT_OK, ""), err
    await create(
        service,
        CreateTopic(name="orders", partitions=3, replication_factor=3),
        CreateTopic(name="audit-log", partitions=1, replication_factor=2),
    )
    for argv in (("topics", "--list"), ("topics", "list")):
        rc, out, err = await metactl(service, *argv)
        assert (rc, out) == (EXIT_OK, "audit-log\norders\n"), err
    rc, out, _ = await metactl(service, "topics", "--list", "--json", "--page-size", "1")
    assert rc == EXIT_OK and json.loads(out) == {"topics": ["audit-log", "orders"]}
    rc, out, _ = await metactl(None, "topics", "list", "--data-dir", str(tmp_path))
    assert (rc, out) == (EXIT_OK, "audit-log\norders\n")

    # --describe is describe's own output, filters included.
    for extra in ((), ("--topic", "orders"), ("--under-replicated-partitions",)):
        rc, kafka_way, _ = await metactl(service, "topics", "--describe", *extra)
        rc2, ours, _ = await metactl(service, "describe", *extra)
        assert rc == rc2 == EXIT_OK and kafka_way == ours
    assert kafka_way == ""  # nothing under-replicated (a filter prints no topic lines)
    rc, out, _ = await metactl(service, "topics", "describe", "--topic", "orders")
    assert out.splitlines()[0].startswith("Topic: orders\tTopicId: ")
    assert len(out.splitlines()) == 4
    rc, _, err = await metactl(service, "topics", "--describe", "--topic", "nosuch")
    assert rc == EXIT_NOT_FOUND and one_line(err, "UNKNOWN_TOPIC_OR_PARTITION")

    # --create maps to `topics create`; Kafka's --if-not-exists is taken.
    rc, out, err = await metactl(
        service, "topics", "--create", "--topic", "orders", "--partitions", "1", "--if-not-exists"
    )
    assert (rc, out) == (
        EXIT_OK,
        "Topic orders already exists: nothing to create (--if-not-exists)\n",
    ), err
    rc, _, err = await metactl(service, "topics", "--create", "--topic", "orders")
    assert rc == EXIT_REFUSED and one_line(err, "TOPIC_ALREADY_EXISTS")


async def test_elect_all_partitions_with_nothing_to_elect_says_so(
    service: ControllerService,
) -> None:
    elect = ("elect", "--election-type", "preferred", "--all-topic-partitions")
    rc, out, err = await metactl(service, *elect)
    assert (rc, out) == (
        EXIT_OK,
        "PREFERRED: no elections needed: the cluster has no partitions\n",
    ), err
    await create(service, CreateTopic(name="t", partitions=5, replication_factor=3))
    rc, out, err = await metactl(service, *elect)
    assert rc == EXIT_OK and err == ""
    assert out == (
        "PREFERRED: no elections needed: every partition (5) is led by its preferred replica\n"
    )
    assert "0 of 0" not in out


async def test_reassign_generate_prints_kafka_s_documents_from_the_controller_s_placement(
    service: ControllerService, tmp_path: Path
) -> None:
    # "placed" was placed by the controller itself (racks alternate: 1, 3, 2, 4).
    await create(
        service,
        CreateTopic(name="placed", partitions=4, replication_factor=3),
        CreateTopic(name="pinned", assignments=[[1, 2], [2, 1]]),
    )
    topics = tmp_path / "topics.json"
    topics.write_text(
        json.dumps({"version": 1, "topics": [{"topic": "placed"}, {"topic": "pinned"}]})
    )
    generate = ("reassign", "--generate", "--topics-to-move-json-file", str(topics))

    rc, out, err = await metactl(service, *generate, "--broker-list", "1,2,3,4")
    assert rc == EXIT_OK, err
    lines = out.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert lines[2] == ""
    assert lines[3] == "Proposed partition reassignment configuration"
    assert len(lines) == 5
    current, proposed = assignment(lines[1]), assignment(lines[4])
    # Kafka's format exactly: compact, sorted, log_dirs "any".
    assert lines[1] == file_text(current) and lines[4] == file_text(proposed)
    assert lines[1].startswith(
        '{"version":1,"partitions":[{"topic":"pinned","partition":0,"replicas":[1,2],'
        '"log_dirs":["any","any"]},'
    )
    assert current[("pinned", 1)] == [2, 1] and set(current) == set(proposed)
    # On every broker, the proposal is where the controller put the topic it placed.
    assert {tp: r for tp, r in proposed.items() if tp[0] == "placed"} == {
        tp: r for tp, r in current.items() if tp[0] == "placed"
    }
    assert proposed[("placed", 0)] == [1, 3, 2]
    assert proposed[("pinned", 0)] == [1, 3] and proposed[("pinned", 1)] == [3, 2]

    rc, out, _ = await metactl(
        service, *generate, "--broker-list", "1,2,3,4", "--disable-rack-aware"
    )
    assert rc == EXIT_OK and assignment(out.splitlines()[4])[("placed", 0)] == [1, 2, 3]

    # Onto brokers 4 and 3 (one rack, r2): a plan --execute takes as it is.
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "pinned"}]}))
    rc, out, err = await metactl(service, *generate, "--broker-list", "4,3")
    assert rc == EXIT_OK, err
    onto = assignment(out.splitlines()[4])
    assert onto == {("pinned", 0): [3, 4], ("pinned", 1): [4, 3]}
    plan = tmp_path / "plan.json"
    plan.write_text(out.splitlines()[4])
    execute = ("reassign", "--reassignment-json-file", str(plan), "--execute")
    rc, out, err = await metactl(service, *execute)
    assert rc == EXIT_OK, err
    assert out.splitlines()[-1] == (
        "Successfully started partition reassignments for pinned-0,pinned-1"
    )
    rc, out, _ = await metactl(service, "reassign", "--list")
    assert out.startswith("Current partition reassignments:\npinned-0: replicas: 3,4,1,2.")

    # What it refuses, by name.
    await service.controller.submit(FenceBroker(broker_id=4, reason="operator"))
    rc, _, err = await metactl(service, *generate, "--broker-list", "3,4")
    assert rc == EXIT_REFUSED
    note, error = err.splitlines()
    assert note.startswith("note: broker 4 is fenced: left out of the proposal")
    assert error.startswith(
        "error: INVALID_REPLICATION_FACTOR: topic pinned has replication factor 2"
    )
    rc, _, err = await metactl(service, *generate, "--broker-list", "1,9")
    assert rc == EXIT_NOT_FOUND and "broker 9 is not registered" in one_line(
        err, "BROKER_ID_NOT_REGISTERED"
    )
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "nosuch"}]}))
    rc, _, err = await metactl(service, *generate, "--broker-list", "1,2")
    assert rc == EXIT_NOT_FOUND and "topic nosuch not found" in one_line(
        err, "UNKNOWN_TOPIC_OR_PARTITION"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--broker-list", "1,2,1"), "contains duplicate entries: 1"),
        (("--broker-list", "1,x"), "expected broker ids"),
        ((), "--generate needs --topics-to-move-json-file FILE and --broker-list"),
        (("--broker-list", "1", "--reassignment-json-file", "f"), "not --reassignment-json-file"),
    ],
)
def test_reassign_generate_input_is_refused_before_anything_is_sent(
    argv: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topics = tmp_path / "topics.json"
    topics.write_text('{"version": 1, "topics": [{"topic": "t"}]}')
    status, _, err = run(
        capsys, "reassign", "--generate", "--topics-to-move-json-file", str(topics), *argv,
        "--insecure", "--bootstrap-controller", "127.0.0.1:9",
    )  # fmt: skip
    assert status == EXIT_USAGE and message in one_line(err, "INVALID_CONFIG")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('{"version": 1, "topics": [{"topic": "t"}, {"topic": "t"}]}', "duplicate entries: t"),
        ('{"version": 2, "topics": [{"topic": "t"}]}', "version 2 is not supported"),
        ('{"version": 1, "topics": []}', "no topics"),
        ('{"topics": [{"topics": "t"}]}', "expected {"),
        ("not json", "expected {"),
    ],
)
def test_a_bad_topics_to_move_file_is_named(
    doc: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topics = tmp_path / "topics.json"
    topics.write_text(doc)
    status, _, err = run(
        capsys, "reassign", "--generate", "--topics-to-move-json-file", str(topics),
        "--broker-list", "1", "--insecure", "--bootstrap-controller", "127.0.0.1:9",
    )  # fmt: skip
    line = one_line(err, "INVALID_CONFIG")
    assert status == EXIT_USAGE and f"--topics-to-move-json-file {topics}: " in line
    assert message in line
    status, _, err = run(
        capsys, "reassign", "--list", "--broker-list", "1", "--insecure",
    )  # fmt: skip
    assert status == EXIT_USAGE and "go with --generate" in one_line(err, "INVALID_CONFIG")


async def test_quorum_in_kafka_s_order_and_log_dump_files(
    service: ControllerService, tmp_path: Path
) -> None:
    at = service.address
    rc, out, err = await metactl(
        None, "quorum", "--bootstrap-controller", at, "--insecure", "describe", "--status"
    )
    assert rc == EXIT_OK, err
    assert f"LeaderAddress:     {at}" in out
    rc, out, err = await metactl(
        None, "quorum", "--bootstrap-controller", at, "describe", "--replication", "--insecure"
    )
    assert rc == EXIT_OK, err
    header, row = out.splitlines()[:2]
    # The node id is the address here (no --node-id): longer than the old 12 columns.
    assert row.startswith(f"{at}  {at}") and len(at) > 12
    assert row.index("active") == header.index("ROLE")

    # kafka-dump-log's --files: the log file itself, as --data-dir takes it.
    log = tmp_path / "metadata.log.sqlite"
    rc, files, err = await metactl(None, "log", "dump", "--files", str(log))
    assert rc == EXIT_OK, err
    rc, data_dir, _ = await metactl(None, "log", "dump", "--data-dir", str(log))
    assert files == data_dir and len(files.splitlines()) > len(RACKS)


def test_fixture_racks_are_what_the_placement_assertions_assume() -> None:
    # Brokers 1, 2 on r1 and 3, 4 on r2: the controller's order alternates racks.
    import immutables

    from controller.core.topic_handlers import broker_order
    from metadata_image.image import ClusterImage
    from metadata_image.state import BrokerState

    brokers = {
        b: BrokerState(broker_id=b, epoch=1, incarnation_id="", rack=r, fenced=False)
        for b, r in RACKS.items()
    }
    image = ClusterImage(brokers=immutables.Map(brokers), active=frozenset(brokers))
    assert broker_order(image) == (1, 3, 2, 4)
