"""`metactl topics create` and `metactl elect`: the changes an operator asks of the controller.

Both follow Kafka's tools where Kafka has them. `topics create` takes topic configs as
`--config KEY=VALUE` (`kafka-topics.sh --create --config min.insync.replicas=2`);
`--min-isr` and `--unclean-recovery-strategy` stay as aliases; `--if-not-exists` makes an
existing topic a success (kafka-topics.sh's). `elect` takes
`kafka-leader-election.sh`'s options: `--election-type PREFERRED|UNCLEAN`, one partition
(`--topic T --partition N`, or `--partition T-N`), `--all-topic-partitions`, or
`--path-to-json-file` ({"partitions": [{"topic": "t", "partition": 0}]}). A partition
that needs no election (already led by its preferred replica, or led at all for an
unclean one) is success, with a line saying so, as in Kafka; an election that fails is
one `error:` line for that partition, and the command's status is the table's
(docs/cli.md) for the first failure. `--all-topic-partitions` ends with a count, or with
"no elections needed" when every partition is led by its preferred replica.

Changes always go through the controller: this module decides nothing and writes
nothing itself. The client and the messages are imported when a command runs, not to
build its parser (issue 34).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import (
    ElectionNotNeededError,
    InvalidConfigurationError,
    MetactlError,
    NetworkError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    error_for_code,
)
from metactl.numbers import NumberFormatError, int_arg, kafka_int
from ops.cli import EXIT_OK, EXIT_UNAVAILABLE, HELP_FORMAT, error_line, examples, exit_status
from ops.client import add_controller_arguments, controller_address, security_from

if TYPE_CHECKING:
    from metadata_image.state import TopicPartition
    from protocol.messages.admin import CreateTopicsResponse, PartitionState

# Topic configs `--config` accepts: Kafka's name, and the KIP-966 draft's for the strategy.
MIN_ISR: Final = "min.insync.replicas"
STRATEGY: Final = "unclean.recovery.strategy"
TOPIC_CONFIGS: Final = (MIN_ISR, STRATEGY)


def register(sub: Any) -> None:
    t = sub.add_parser(
        "topics",
        help="list, describe, create, alter and delete topics, like kafka-topics.sh",
        description="Topic administration through the controller. Kafka's action flags "
        "name the sub-commands too: `metactl topics --describe --topic demo` is `metactl "
        "topics describe --topic demo` (--list, --describe, --create, --alter, --delete).",
        epilog=examples(
            "metactl topics list",
            "metactl topics --describe --topic orders",
            "metactl topics create --topic orders --partitions 6 --replication-factor 3 "
            "--config min.insync.replicas=2",
            "metactl topics create --topic pinned --replica-assignment 1:2:3,2:3:1",
            "metactl topics alter --topic orders --partitions 12",
            "metactl topics delete --topic orders",
        ),
        formatter_class=HELP_FORMAT,
    )
    t.set_defaults(help_parser=t)
    tsub = t.add_subparsers(dest="topics_command", metavar="SUBCOMMAND")
    c = tsub.add_parser(
        "create",
        help="create a topic",
        description="Create a topic (kafka-topics.sh --create). Placement is the "
        "controller's striped round-robin over active brokers unless --replica-assignment "
        "names it.",
        epilog=examples(
            "metactl topics create --topic orders --partitions 6 --replication-factor 3 "
            "--config min.insync.replicas=2",
            "metactl topics create --topic pinned --replica-assignment 1:2:3,2:3:1 "
            "--config unclean.recovery.strategy=manual",
            "metactl topics create --topic t --partitions 1 --insecure "
            "--bootstrap-controller 127.0.0.1:9093",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(c)
    c.add_argument(
        "--topic", "--name", dest="name", required=True, help="the topic's name (required)"
    )
    c.add_argument(
        "--partitions",
        type=int_arg,
        default=None,
        metavar="N",
        help="partition count (default: the controller's, 1)",
    )
    c.add_argument(
        "--replication-factor",
        type=int_arg,
        default=None,
        metavar="R",
        help="replicas per partition (default: the controller's, 3)",
    )
    c.add_argument(
        "--replica-assignment",
        default=None,
        metavar="A:B:C,...",
        help="explicit placement, one colon-separated replica list per partition, the "
        "preferred leader first, e.g. 1:2:3,2:3:1 (default: the controller places)",
    )
    c.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a topic config, repeatable: {MIN_ISR}=M, {STRATEGY}=balanced|proactive|"
        "manual|<plugin> (default: the controller's)",
    )
    c.add_argument(
        "--min-isr",
        type=int_arg,
        default=None,
        metavar="M",
        help=f"alias of --config {MIN_ISR}=M (default: the controller's, 1)",
    )
    c.add_argument(
        "--unclean-recovery-strategy",
        default=None,
        metavar="NAME",
        help=f"alias of --config {STRATEGY}=NAME (default: the cluster's)",
    )
    c.add_argument(
        "--verbose",
        action="store_true",
        help="also print the assignment, one line per partition (default: a summary)",
    )
    c.add_argument(
        "--if-not-exists",
        action="store_true",
        help="a topic that exists already is a success, left as it is (default: "
        "TOPIC_ALREADY_EXISTS)",
    )
    c.set_defaults(func=cmd_topics_create)

    e = sub.add_parser(
        "elect",
        help="leader elections, like kafka-leader-election.sh",
        description="Elect leaders (kafka-leader-election.sh). PREFERRED moves leadership "
        "to each partition's first replica if it is an active ISR member; a partition it "
        "already leads needs no election, which is success. UNCLEAN elects the named "
        "--replica of a leaderless partition: an operator's unclean recovery, reported as "
        "a potential data-loss event.",
        epilog=examples(
            "metactl elect --election-type PREFERRED --all-topic-partitions",
            "metactl elect --election-type PREFERRED --topic demo --partition 0",
            "metactl elect --election-type UNCLEAN --topic demo --partition 3 --replica 2",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(e)
    e.add_argument(
        "--election-type",
        "--type",
        dest="election_type",
        type=str.lower,
        choices=["preferred", "unclean"],
        required=True,
        metavar="PREFERRED|UNCLEAN",
        help="the kind of election (required; either case; --type is an alias)",
    )
    which = e.add_mutually_exclusive_group()
    which.add_argument(
        "--all-topic-partitions",
        action="store_true",
        help="every partition of every topic (PREFERRED only)",
    )
    which.add_argument(
        "--path-to-json-file",
        type=Path,
        default=None,
        metavar="FILE",
        help='the partitions, as {"partitions": [{"topic": "t", "partition": 0}, ...]}',
    )
    e.add_argument(
        "--topic",
        default=None,
        help="the topic of the one partition to elect (with --partition N)",
    )
    e.add_argument(
        "--partition",
        default=None,
        metavar="N|TOPIC-N",
        help="the partition: its index with --topic, or TOPIC-N alone",
    )
    e.add_argument(
        "--replica",
        type=int_arg,
        default=None,
        metavar="ID",
        help="UNCLEAN: the replica to elect (required for UNCLEAN; no default: the "
        "operator chooses)",
    )
    e.set_defaults(func=cmd_elect)


# --- topics create --------------------------------------------------------------------------


def topic_configs(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """(min ISR, strategy) from --config and its aliases; INVALID_CONFIG for an unknown
    key, a bad value, or two different values for one key."""
    values: dict[str, str] = {}

    def put(key: str, value: str, flag: str) -> None:
        if key in values and values[key] != value:
            raise InvalidConfigurationError(
                f"{key} is given twice ({values[key]!r} and {value!r}, the second by {flag})"
            )
        values[key] = value

    for item in args.config:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidConfigurationError(f"--config {item!r}: expected KEY=VALUE")
        if key not in TOPIC_CONFIGS:
            raise InvalidConfigurationError(
                f"--config {key}: not a topic config metactl knows ({', '.join(TOPIC_CONFIGS)})"
            )
        put(key, value.strip(), "--config")
    if args.min_isr is not None:
        put(MIN_ISR, str(args.min_isr), "--min-isr")
    if args.unclean_recovery_strategy is not None:
        put(STRATEGY, args.unclean_recovery_strategy, "--unclean-recovery-strategy")
    min_isr: int | None = None
    if MIN_ISR in values:
        try:
            min_isr = kafka_int(values[MIN_ISR])
        except NumberFormatError as exc:
            raise InvalidConfigurationError(
                f"{MIN_ISR}={values[MIN_ISR]!r} is not a number ({exc})"
            ) from None
    return min_isr, values.get(STRATEGY)


def _assignments(text: str | None) -> list[list[int]] | None:
    if not text:
        return None
    try:
        return [[kafka_int(x) for x in part.split(":")] for part in text.split(",")]
    except NumberFormatError:
        raise InvalidConfigurationError(
            f"--replica-assignment {text!r}: expected broker ids like 1:2:3,2:3:1"
        ) from None


def cmd_topics_create(args: argparse.Namespace) -> int:
    import asyncio

    from clients.controller import ask
    from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse

    address = controller_address(args)
    min_isr, strategy = topic_configs(args)
    spec = CreateTopic(
        name=args.name,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        assignments=_assignments(args.replica_assignment),
        min_isr=min_isr,
        recovery_strategy=strategy,
    )
    security = security_from(args)

    async def run() -> CreateTopicsResponse:
        async with security.controller_client(address) as client:
            r = await ask(client, CreateTopicsRequest(topics=[spec]), args.timeout)
        if not isinstance(r, CreateTopicsResponse) or len(r.results) != 1:
            raise MetactlError(f"unexpected answer {type(r).__name__} from {address}")
        return r

    res = asyncio.run(run()).results[0]
    if res.error_code == TopicAlreadyExistsError.code and args.if_not_exists:
        print(f"Topic {args.name} already exists: nothing to create (--if-not-exists)")
        return EXIT_OK
    if res.error_code:
        raise error_for_code(res.error_code, res.message)
    print(creation_summary(res.name, res.topic_id, res.assignments or [], hint=not args.verbose))
    if args.verbose:
        for i, replicas in enumerate(res.assignments or []):
            print(f"  {i}: {','.join(map(str, replicas))}")
    return EXIT_OK


def creation_summary(
    name: str, topic_id: str | None, assignments: list[list[int]], *, hint: bool = True
) -> str:
    """One line, whatever the partition count (issue 22: 10k partitions printed 100 KB):
    the count, the replication factor and the brokers the replicas landed on."""
    sizes = sorted({len(a) for a in assignments})
    rf = "/".join(map(str, sizes)) or "0"
    brokers = sorted({b for a in assignments for b in a})
    on = _ranges(brokers)
    return (
        f"Created topic {name} ({topic_id}): {len(assignments)} partition(s), replication "
        f"factor {rf}, replicas on broker(s) {on}"
        + (" (--verbose prints the assignment)" if hint else "")
    )


def _ranges(ids: list[int]) -> str:
    """1,2,3,5,7,8,9 as 1-3,5,7-9 (sorted, distinct ids)."""
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if j - i < 2 else f"{ids[i]}-{ids[j]}")
        if j - i == 1:
            out.append(str(ids[j]))
        i = j + 1
    return ",".join(out) or "none"


# --- elect ----------------------------------------------------------------------------------


def _from_json(path: Path) -> list[tuple[TopicPartition, int | None]]:
    from ops.election_file import read_election_file

    return read_election_file(path)


def _one_partition(args: argparse.Namespace) -> TopicPartition:
    if args.partition is None:
        raise InvalidConfigurationError(
            "name the partitions: --topic T --partition N, --partition T-N, "
            "--all-topic-partitions or --path-to-json-file FILE"
        )
    if args.topic is not None:
        try:
            return args.topic, kafka_int(args.partition, 0)
        except NumberFormatError as exc:
            raise InvalidConfigurationError(
                f"--partition {args.partition!r}: with --topic, the partition's index ({exc})"
            ) from None
    from metadata_image.state import parse_tp

    try:
        return parse_tp(args.partition)
    except ValueError as exc:
        raise InvalidConfigurationError(f"--partition: {exc} (or give --topic)") from None


def _targets(args: argparse.Namespace) -> list[tuple[TopicPartition, int | None]] | None:
    """The partitions named (with each one's replica for UNCLEAN); None: all of them."""
    unclean = args.election_type == "unclean"
    listed = args.all_topic_partitions or args.path_to_json_file is not None
    if listed and (args.topic is not None or args.partition is not None):
        raise InvalidConfigurationError(
            "--topic/--partition cannot be combined with --all-topic-partitions or "
            "--path-to-json-file"
        )
    if args.all_topic_partitions:
        if unclean:
            raise InvalidConfigurationError(
                "an UNCLEAN election names its replica: give the partitions one by one "
                "(--topic/--partition or --path-to-json-file), not --all-topic-partitions"
            )
        return None
    if args.path_to_json_file is not None:
        targets = _from_json(args.path_to_json_file)
    else:
        targets = [(_one_partition(args), None)]
    if unclean:
        targets = [(tp, r if r is not None else args.replica) for tp, r in targets]
        missing = [f"{t}-{p}" for (t, p), r in targets if r is None]
        if missing:
            raise InvalidConfigurationError(
                f"an UNCLEAN election names the replica to elect (--replica ID): none for "
                f"{', '.join(missing)}"
            )
    elif args.replica is not None or any(r is not None for _, r in targets):
        raise InvalidConfigurationError(
            "--replica is for UNCLEAN elections (PREFERRED elects the first replica)"
        )
    return targets


def cmd_elect(args: argparse.Namespace) -> int:
    import asyncio

    from clients.controller import ask
    from protocol.messages.admin import (
        ElectLeader,
        ElectPreferredLeaders,
        ElectPreferredLeadersResponse,
        PartitionState,
    )

    address = controller_address(args)
    targets = _targets(args)
    security = security_from(args)
    kind = args.election_type.upper()
    statuses: list[int] = []

    def done(tp: TopicPartition, r: PartitionState) -> None:
        note = ""
        if args.election_type == "unclean":
            note = " — UNCLEAN: potential data loss, reported as an unclean recovery"
        print(
            f"{tp[0]}-{tp[1]}: elected {r.leader} (leader epoch {r.leader_epoch}){note}",
            flush=True,
        )

    def not_needed(tp: TopicPartition, why: str) -> None:
        print(f"{tp[0]}-{tp[1]}: no election needed ({why})", flush=True)

    async def elect(client: Any, tp: TopicPartition, replica: int | None) -> None:
        request = ElectLeader(
            topic=tp[0], partition=tp[1], election_type=args.election_type, replica=replica
        )
        try:
            r = await ask(client, request, args.timeout)
        except ElectionNotNeededError as exc:
            not_needed(tp, exc.message)
            return
        except (NetworkError, RequestTimedOutError):
            raise  # nothing answers: the rest would fail the same way
        except MetactlError as exc:
            if targets is not None and len(targets) == 1:
                raise  # one partition: main prints its one line
            # Several partitions: this one's line, and on with the others.
            statuses.append(exit_status(exc))
            print(error_line(exc), file=sys.stderr, flush=True)
            return
        if not isinstance(r, PartitionState):
            raise MetactlError(f"unexpected answer {type(r).__name__} from {address}")
        done(tp, r)

    async def run() -> None:
        async with security.controller_client(address) as client:
            if targets is not None:
                for tp, replica in targets:
                    await elect(client, tp, replica)
                return
            # Every partition, in one request: the controller works through them a work
            # budget per event (its heartbeats and writes go on in between).
            r = await ask(client, ElectPreferredLeaders(partitions=None), args.timeout)
            if not isinstance(r, ElectPreferredLeadersResponse):
                raise MetactlError(f"unexpected answer {type(r).__name__} from {address}")
            for f in r.failures:
                what = (
                    "the preferred replica is not an active ISR member"
                    if f.error_code == "PREFERRED_LEADER_NOT_AVAILABLE"
                    else "no such partition"
                )
                exc = error_for_code(f.error_code, f"{f.topic}-{f.partition}: {what}")
                statuses.append(exit_status(exc))
                print(error_line(exc), file=sys.stderr, flush=True)
            failed = r.not_available + r.unknown
            if failed > len(r.failures):
                statuses.append(statuses[0] if statuses else EXIT_UNAVAILABLE)
                print(f"... and {failed - len(r.failures)} more", file=sys.stderr, flush=True)
            print(all_partitions_summary(kind, r.elected, failed, r.not_needed), flush=True)

    asyncio.run(run())
    return statuses[0] if statuses else EXIT_OK


def all_partitions_summary(kind: str, elected: int, failed: int, not_needed: int) -> str:
    """`elect --all-topic-partitions`' last line: how many partitions needed an election
    and got one, and how many were led by their preferred replica already (Kafka's
    "Valid replica already elected"). With nothing to elect, it says so, not "0 of 0"."""
    if elected + failed == 0:
        if not_needed == 0:
            return f"{kind}: no elections needed: the cluster has no partitions"
        return (
            f"{kind}: no elections needed: every partition ({not_needed}) is led by its "
            "preferred replica"
        )
    return (
        f"{kind}: {elected} of {elected + failed} elections done"
        + (f", {failed} failed" if failed else "")
        + f"; {not_needed} partition(s) already led by their preferred replica"
    )
