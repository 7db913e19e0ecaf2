"""`metactl reassign`: move partitions' replicas (KIP-455), as
`kafka-reassign-partitions.sh` spells it.

`--reassignment-json-file F` with `--execute`, `--verify` or `--cancel`, and `--list`,
with Kafka's file: `{"version": 1, "partitions": [{"topic": "t", "partition": 0,
"replicas": [2, 3, 4]}]}` (`log_dirs`, if present, must be `"any"`: a metactl broker has
one log directory). The file's format and `--verify`'s verdicts are `ops.reassign_plan`'s.

- `--execute` first prints the current assignment of the named partitions, in the same
  format, to roll back with, then asks the controller to start the reassignments (in
  requests of `clients.admin.CHUNK` partitions). As in Kafka, it refuses while any
  reassignment is in progress unless `--additional`.
- `--verify` says, per partition, whether its reassignment is completed (the replicas
  are the file's, in order), still in progress, or not running with other replicas. Its
  status is 0 when all are completed and 3 (the command's own verdict, docs/cli.md)
  otherwise, so `until metactl reassign --verify ...` waits for the end.
- `--cancel` asks the controller to restore each partition's original replicas.
- `--generate --topics-to-move-json-file F --broker-list 1,2,3` prints, as Kafka's tool
  does, the current assignment of F's topics and a proposal that moves them onto the
  listed brokers (the active ones; `--disable-rack-aware` disregards racks), placed as
  the controller places a new topic (`ops.reassign_plan.propose`); the proposal is a
  `--reassignment-json-file` for `--execute`. It only reads the cluster, describe's way.
- `--list` prints every partition being reassigned, with its adding and removing
  replicas. Like `--verify` and `--execute`'s check, it reads them page by page
  (ListPartitionReassignments v2, each page within the client's frame limit), falling
  back to one v1 answer from a controller older than paging.

Each partition succeeds or fails alone: a failure is its own `error:` line and the
status is the first failure's. This module owns the arguments and the output; the paged
and chunked requests are `clients.admin`'s, and the controller decides every
reassignment (KIP-455's adding/removing replicas, when it completes, where leadership
goes) and writes its records. The client, the messages and the plan's file format are
imported when the command runs, not to build its parser (issue 34).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import (
    BrokerIdNotRegisteredError,
    InvalidConfigurationError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments, controller_address, security_from
from ops.lifecycle_cmds import Failures

if TYPE_CHECKING:
    from metadata_image.state import TopicPartition
    from ops.reassign_plan import JsonPartition
    from protocol.client import RpcClient
    from protocol.messages.admin import OngoingReassignment, ReassignmentResult

# Partitions per AlterPartitionReassignments request: well inside any frame limit the
# controller may be given (about 40 bytes each), and each request answers promptly.
# `--verify`'s verdict when some partition is not (yet) where the file says.
EXIT_NOT_COMPLETE: Final = 3


def register(sub: Any) -> None:
    r = sub.add_parser(
        "reassign",
        help="move partitions' replicas, like kafka-reassign-partitions.sh",
        description="Reassign partitions (KIP-455, kafka-reassign-partitions.sh). The "
        "controller adds the new replicas, which copy the data and join the ISR when "
        "caught up; once every target replica is in the ISR it moves leadership off the "
        "removed replicas and drops them (from the ISR, the ELR and the LastKnownELR). "
        "--cancel restores the original replicas.",
        epilog=examples(
            "metactl reassign --reassignment-json-file move.json --execute",
            "metactl reassign --reassignment-json-file move.json --verify",
            "metactl reassign --reassignment-json-file move.json --cancel",
            "metactl reassign --list",
            "metactl reassign --generate --topics-to-move-json-file topics.json "
            "--broker-list 2,3,4",
            'move.json: {"version": 1, "partitions": '
            '[{"topic": "demo", "partition": 0, "replicas": [2, 3, 4]}]}',
            'topics.json: {"version": 1, "topics": [{"topic": "demo"}]}',
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(r)
    mode = r.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--execute", action="store_true", help="start the file's reassignments (one mode)"
    )
    mode.add_argument(
        "--verify",
        action="store_true",
        help="whether the file's reassignments are complete; status 3 if not (one mode)",
    )
    mode.add_argument(
        "--cancel", action="store_true", help="cancel the file's reassignments (one mode)"
    )
    mode.add_argument(
        "--list", action="store_true", help="every partition being reassigned (one mode)"
    )
    mode.add_argument(
        "--generate",
        action="store_true",
        help="propose a reassignment of whole topics onto --broker-list, to --execute "
        "later (one mode; it changes nothing)",
    )
    r.add_argument(
        "--reassignment-json-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the partitions and their target replicas (required but for --list)",
    )
    r.add_argument(
        "--additional",
        action="store_true",
        help="--execute although reassignments are in progress (default: refuse, as Kafka)",
    )
    r.add_argument("--json", action="store_true", help="--list as one JSON object")
    g = r.add_argument_group("--generate")
    g.add_argument(
        "--topics-to-move-json-file",
        type=Path,
        default=None,
        metavar="FILE",
        help='the topics to move, {"version": 1, "topics": [{"topic": "t"}]} (required '
        "with --generate)",
    )
    g.add_argument(
        "--broker-list",
        default=None,
        metavar="ID,ID,...",
        help="the brokers to move them onto (required with --generate)",
    )
    g.add_argument(
        "--disable-rack-aware",
        action="store_true",
        help="place without regard to the brokers' racks (default: racks alternate, as "
        "for a new topic)",
    )
    r.set_defaults(func=cmd_reassign)


# --- reading the cluster ----------------------------------------------------------------


def report(results: list[ReassignmentResult], done: str) -> int:
    """Each failure's `error:` line, then `done` and the partitions that succeeded; the
    first failure's status."""
    from ops.reassign_plan import tp_name

    failures = Failures()
    ok: list[str] = []
    for res in results:
        name = tp_name((res.topic, res.partition))
        if res.error_code:
            failures.add(res.error_code, res.message, name)
        else:
            ok.append(name)
    if ok:
        print(f"{done} {','.join(ok)}", flush=True)
    return failures.status


# --- the modes --------------------------------------------------------------------------


def cmd_reassign(args: argparse.Namespace) -> int:
    if args.additional and not args.execute:
        raise InvalidConfigurationError("--additional goes with --execute")
    if args.json and not args.list:
        raise InvalidConfigurationError("--json goes with --list")
    generating = (args.topics_to_move_json_file, args.broker_list, args.disable_rack_aware)
    if args.generate:
        if args.reassignment_json_file is not None:
            raise InvalidConfigurationError(
                "--generate takes --topics-to-move-json-file, not --reassignment-json-file"
            )
        if args.topics_to_move_json_file is None or args.broker_list is None:
            raise InvalidConfigurationError(
                "--generate needs --topics-to-move-json-file FILE and --broker-list ID,ID,..."
            )
        return generate_mode(args)
    if any(x not in (None, False) for x in generating):
        raise InvalidConfigurationError(
            "--topics-to-move-json-file, --broker-list and --disable-rack-aware go with --generate"
        )
    if args.list:
        if args.reassignment_json_file is not None:
            raise InvalidConfigurationError("--list takes no --reassignment-json-file")
        return list_mode(args)
    if args.reassignment_json_file is None:
        raise InvalidConfigurationError(
            "--execute, --verify and --cancel need --reassignment-json-file FILE"
        )
    import asyncio

    from clients.admin import alter
    from ops.reassign_plan import read_file, reassignments

    entries = read_file(args.reassignment_json_file, need_replicas=not args.cancel)
    address = controller_address(args)
    security = security_from(args)

    async def run() -> int:
        async with security.controller_client(address) as client:
            if args.execute:
                return await execute(client, args, entries)
            if args.verify:
                return await verify_mode(client, args, entries)
            results = await alter(client, reassignments(entries, cancel=True), args.timeout)
            return report(results, "Successfully cancelled partition reassignments for:")

    return asyncio.run(run())


async def execute(client: RpcClient, args: argparse.Namespace, entries: list[JsonPartition]) -> int:
    from clients.admin import alter, current_replicas, ongoing
    from ops.reassign_plan import file_text, reassignments, rollback, tp_name

    topics = {e.topic for e in entries}
    if not args.additional:
        running = await ongoing(client, None, args.timeout)
        if running:
            some = ", ".join(tp_name(tp) for tp in sorted(running)[:3])
            raise InvalidRequestError(
                f"Cannot execute because there is an existing partition reassignment "
                f"({len(running)} partition(s): {some}{', ...' if len(running) > 3 else ''}). "
                "Use --additional to add these to it, or --verify / --cancel it first."
            )
        moving: dict[TopicPartition, OngoingReassignment] = {}
    else:
        moving = await ongoing(client, topics, args.timeout)
    before = rollback(entries, await current_replicas(client, topics, args.timeout), moving)
    if before:
        print("Current partition replica assignment\n")
        print(file_text(before))
        print("\nSave this to use as the --reassignment-json-file option during rollback")
    results = await alter(client, reassignments(entries, cancel=False), args.timeout)
    return report(results, "Successfully started partition reassignments for")


async def verify_mode(
    client: RpcClient, args: argparse.Namespace, entries: list[JsonPartition]
) -> int:
    from clients.admin import current_replicas, ongoing
    from ops.reassign_plan import Status, tp_name, verify

    topics = {e.topic for e in entries}
    # In progress first, replicas second (ops.reassign_plan.verify says why).
    moving = await ongoing(client, topics, args.timeout)
    now = await current_replicas(client, topics, args.timeout)
    failures = Failures()
    pending = 0
    for c in verify(entries, moving, now):
        name = tp_name(c.tp)
        if c.status is Status.UNKNOWN:
            failures.add(UnknownTopicOrPartitionError.code, "unknown partition", name)
        elif c.status is Status.COMPLETED:
            print(f"Reassignment of partition {name} is completed.")
        elif c.status is Status.IN_PROGRESS:
            pending += 1
            print(f"Reassignment of partition {name} is still in progress.")
        else:
            pending += 1
            print(
                f"There is no active reassignment of partition {name}, but replica set is "
                f"{ids(c.current or [])} rather than {ids(c.target)}."
            )
    if failures.statuses:
        return failures.status
    return EXIT_NOT_COMPLETE if pending else EXIT_OK


def ids(xs: list[int]) -> str:
    return ",".join(map(str, xs))


def ongoing_line(o: OngoingReassignment) -> str:
    """Kafka's --list line: the adding and removing parts only when there are any."""
    from ops.reassign_plan import tp_name

    line = f"{tp_name((o.topic, o.partition))}: replicas: {ids(o.replicas)}."
    if o.adding_replicas:
        line += f" adding: {ids(o.adding_replicas)}."
    if o.removing_replicas:
        line += f" removing: {ids(o.removing_replicas)}."
    return line


def list_mode(args: argparse.Namespace) -> int:
    import asyncio

    from clients.admin import ongoing
    from ops.lifecycle_cmds import plain

    address = controller_address(args)
    security = security_from(args)

    async def run() -> dict[TopicPartition, OngoingReassignment]:
        async with security.controller_client(address) as client:
            return await ongoing(client, None, args.timeout)

    running = asyncio.run(run())
    if args.json:
        items = [running[tp] for tp in sorted(running)]
        print(json.dumps({"reassignments": plain(items)}, indent=2))
        return EXIT_OK
    if not running:
        print("No partition reassignments found.")
        return EXIT_OK
    print("Current partition reassignments:")
    for tp in sorted(running):
        print(ongoing_line(running[tp]))
    return EXIT_OK


# --- --generate ---------------------------------------------------------------------------


async def _assignment(
    client: RpcClient, topics: list[str], timeout_s: float
) -> tuple[dict[TopicPartition, list[int]], dict[str, int]]:
    """Each topic's partitions' replicas (without the ones a reassignment is adding: the
    replicas a cancel would restore) and its replication factor (Kafka's: its first
    partition's), read page by page as `describe` reads them. An unknown topic is
    UNKNOWN_TOPIC_OR_PARTITION."""
    from clients.admin import pages
    from ops.describe_cmds import replication_factor
    from protocol.messages.admin import DescribeClusterRequest

    current: dict[TopicPartition, list[int]] = {}
    factors: dict[str, int] = {}
    for topic in topics:
        request = DescribeClusterRequest(v=2, topic=topic, broker_limit=0)
        try:
            async for page in pages(client, request, timeout_s=timeout_s):
                for p in page.partitions:
                    current[(p.topic, p.partition)] = [
                        b for b in p.replicas if b not in p.adding_replicas
                    ]
                    factors.setdefault(p.topic, replication_factor(p))
        except UnknownTopicOrPartitionError:
            raise UnknownTopicOrPartitionError(f"topic {topic} not found") from None
        if topic not in factors:  # a controller older than paging: no error, no partitions
            raise UnknownTopicOrPartitionError(f"topic {topic} not found")
    return current, factors


async def _racks(
    client: RpcClient, wanted: list[int], timeout_s: float, *, racks: bool
) -> dict[int, str | None]:
    """The listed brokers the proposal may use, with their racks (None without `racks`):
    the active ones, as the controller places a new topic on; a fenced one is left out
    with a note. One not registered is BROKER_ID_NOT_REGISTERED."""
    import sys

    from clients.admin import pages
    from protocol.messages.admin import BrokerDescription, DescribeClusterRequest

    known: dict[int, BrokerDescription] = {}
    request = DescribeClusterRequest(v=2, partition_limit=0)
    async for page in pages(client, request, timeout_s=timeout_s):
        known.update((b.broker_id, b) for b in page.brokers)
    out: dict[int, str | None] = {}
    for b in wanted:
        if b not in known:
            raise BrokerIdNotRegisteredError(f"--broker-list: broker {b} is not registered")
        d = known[b]
        if d.fenced or d.controlled_shutdown:
            why = "in controlled shutdown" if d.controlled_shutdown else "fenced"
            print(
                f"note: broker {b} is {why}: left out of the proposal (only active brokers "
                "are placed on, as for a new topic)",
                file=sys.stderr,
                flush=True,
            )
            continue
        out[b] = d.rack if racks else None
    return out


def generate_mode(args: argparse.Namespace) -> int:
    """Kafka's --generate: the current assignment of the file's topics and the proposed
    one, each as a reassignment file on one line; nothing is changed."""
    import asyncio

    from ops.reassign_plan import broker_list, file_text, propose, read_topics_file

    topics = read_topics_file(args.topics_to_move_json_file)
    wanted = broker_list(args.broker_list)
    address = controller_address(args)
    security = security_from(args)

    async def run() -> tuple[dict[TopicPartition, list[int]], dict[TopicPartition, list[int]]]:
        async with security.controller_client(address) as client:
            current, factors = await _assignment(client, topics, args.timeout)
            racks = await _racks(client, wanted, args.timeout, racks=not args.disable_rack_aware)
        return current, propose(current, factors, racks)

    current, proposed = asyncio.run(run())
    print(f"Current partition replica assignment\n{file_text(current)}\n")
    print(f"Proposed partition reassignment configuration\n{file_text(proposed)}")
    return EXIT_OK
