"""`metactl topics delete`, `metactl topics alter` and `metactl brokers unregister`: the
lifecycle changes an operator asks of the controller, as Kafka's tools spell them.

`topics delete --topic T[,T...]` is `kafka-topics.sh --delete`; `topics alter --topic T
--partitions N` is `kafka-topics.sh --alter --partitions` (optionally with
`--replica-assignment` for the new partitions only); `brokers unregister --id N` is
`kafka-cluster.sh unregister`. `--if-exists` makes an unknown topic a success with a
line saying so, as in Kafka. With several topics each failure is its own `error:` line
and the command's status is the first failure's (docs/cli.md's table).

This module adds `delete` and `alter` to the `topics` group (registered by
`ops.admin_cmds`) and `unregister` to `brokers` (registered by `ops.describe_cmds`), so
it must come after both in `ops.cli.COMMAND_MODULES`; with them it adds `topics list`
and `topics describe`, which are `ops.describe_cmds`' (`add_topic_views`). It also holds
`Failures`, the per-item reporting that `ops.reassign_cmds` shares.

It only formats and calls: the controller decides (who may be deleted, unregistered or
grown, and where new partitions go) and writes the records; nothing here reads the log.
The client and the messages are imported when a command runs, not to build its parser
(issue 34).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metactl.errors import InvalidConfigurationError, MetactlError, error_for_code
from metactl.numbers import int_arg
from ops.cli import EXIT_OK, HELP_FORMAT, error_line, examples, exit_status
from ops.client import add_controller_arguments, controller_address, security_from

if TYPE_CHECKING:
    from protocol.messages.unions import Message

UNKNOWN_TOPIC = "UNKNOWN_TOPIC_OR_PARTITION"


class _KeepParentFlags(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Sub-commands of a command that has flags of its own (`brokers --bootstrap-controller
    H unregister --id 4`): a flag given before the sub-command keeps its value unless the
    sub-command's own flag is given too. argparse would let the sub-command's default
    replace it, sending the request to the default controller instead of H."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        before = dict(vars(namespace))
        super().__call__(parser, namespace, values, option_string)
        chosen = self._name_parser_map[values[0]]
        for key, value in before.items():
            given = value != parser.get_default(key)
            if given and getattr(namespace, key, None) == chosen.get_default(key):
                setattr(namespace, key, value)


def subcommands(sub: Any, group: str) -> Any:
    """The sub-command action of the `group` command another module registered (added,
    optional, if it has none yet: `brokers` alone still lists the brokers)."""
    parser = sub.choices.get(group)
    if parser is None:
        raise RuntimeError(f"`{group}` must be registered before ops.lifecycle_cmds")
    found = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if found is None:
        found = parser.add_subparsers(
            action=_KeepParentFlags, dest=f"{group}_command", metavar="[SUBCOMMAND]"
        )
    return found


def register(sub: Any) -> None:
    # Here, not at the top: `ops.reassign_cmds` imports this module for `Failures` alone.
    from ops.describe_cmds import add_topic_views

    topics = subcommands(sub, "topics")
    d = topics.add_parser(
        "delete",
        help="delete topics",
        description="Delete topics (kafka-topics.sh --delete). The controller writes one "
        "RemoveTopicRecord per topic; brokers stop serving it and delete its data. A topic "
        "created again with the same name is a new topic, with a new id.",
        epilog=examples(
            "metactl topics delete --topic orders",
            "metactl topics delete --topic scratch-1,scratch-2 --if-exists",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(d)
    d.add_argument(
        "--topic",
        required=True,
        metavar="T[,T...]",
        help="the topic, or several, comma-separated (required; exact names)",
    )
    d.add_argument(
        "--if-exists",
        action="store_true",
        help="a topic that does not exist is a success (default: UNKNOWN_TOPIC_OR_PARTITION)",
    )
    d.set_defaults(func=cmd_topics_delete)

    a = topics.add_parser(
        "alter",
        help="add partitions to a topic",
        description="Grow a topic to --partitions N (kafka-topics.sh --alter "
        "--partitions). The controller places the new partitions as at create (striped "
        "over the active brokers, racks alternating) unless --replica-assignment gives "
        "them; a count not larger than the topic's is INVALID_PARTITIONS.",
        epilog=examples(
            "metactl topics alter --topic orders --partitions 12",
            "metactl topics alter --topic pinned --partitions 4 --replica-assignment 3:1:2,1:2:3",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(a)
    a.add_argument("--topic", required=True, help="the topic to grow (required)")
    a.add_argument(
        "--partitions",
        type=int_arg,
        required=True,
        metavar="N",
        help="the new partition count, larger than the current one (required)",
    )
    a.add_argument(
        "--replica-assignment",
        default=None,
        metavar="A:B:C,...",
        help="placement of the NEW partitions only, one colon-separated replica list each, "
        "the preferred leader first (default: the controller places them)",
    )
    a.add_argument(
        "--if-exists",
        action="store_true",
        help="a topic that does not exist is a success (default: UNKNOWN_TOPIC_OR_PARTITION)",
    )
    a.set_defaults(func=cmd_topics_alter)
    add_topic_views(topics)  # topics list, topics describe (kafka-topics.sh --list, --describe)

    brokers = subcommands(sub, "brokers")
    u = brokers.add_parser(
        "unregister",
        help="remove a fenced broker's registration",
        description="Unregister a broker (kafka-cluster.sh unregister). Only a fenced "
        "broker: stop it and wait for it to be fenced (`metactl brokers` shows FENCED). "
        "It leaves every ISR, ELR and LastKnownELR; its replicas stay assigned (move them "
        "with `metactl reassign`). An active broker is refused with INVALID_REQUEST; an "
        "unknown one is BROKER_ID_NOT_REGISTERED.",
        epilog=examples(
            "metactl brokers unregister --id 4",
            "metactl brokers unregister --id 4 --bootstrap-controller 10.0.0.1:9093",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(u)
    u.add_argument(
        "--id", dest="broker_id", type=int_arg, required=True, help="the broker's id (required)"
    )
    u.set_defaults(func=cmd_brokers_unregister)


@dataclass
class Failures:
    """Per-item failures of a command that names several items: each printed as its own
    `error:` line on stderr as it comes; the command's status is the first one's."""

    statuses: list[int] = field(default_factory=list)

    def add(self, code: str, message: str, item: str) -> None:
        if item not in message:
            message = f"{item}: {message}"
        exc = error_for_code(code, message)
        self.statuses.append(exit_status(exc))
        print(error_line(exc), file=sys.stderr, flush=True)

    @property
    def status(self) -> int:
        return self.statuses[0] if self.statuses else EXIT_OK


def plain(obj: Any) -> Any:
    """`obj` as JSON-ready builtins with every field, defaults included: the wire omits
    defaults, but a script reading a command's --json should always find each key. The
    wire's version field `v` is left out."""
    from msgspec import Struct

    if isinstance(obj, Struct):
        return {name: plain(getattr(obj, name)) for name in obj.__struct_fields__ if name != "v"}
    if isinstance(obj, list | tuple):
        return [plain(x) for x in obj]
    return obj


def request(args: argparse.Namespace, body: Message) -> Message:
    """One request to the command's controller, with its security and timeout."""
    import asyncio

    from clients.controller import ask

    address = controller_address(args)
    security = security_from(args)

    async def run() -> Message:
        async with security.controller_client(address) as client:
            return await ask(client, body, args.timeout)

    return asyncio.run(run())


def unexpected(r: Message, args: argparse.Namespace) -> MetactlError:
    return MetactlError(f"unexpected answer {type(r).__name__} from {controller_address(args)}")


# --- topics delete ----------------------------------------------------------------------


def topic_names(text: str) -> list[str]:
    """--topic's names, in order, once each; INVALID_CONFIG for an empty one."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise InvalidConfigurationError(f"--topic {text!r}: an empty topic name")
    return list(dict.fromkeys(names))


def cmd_topics_delete(args: argparse.Namespace) -> int:
    from protocol.messages.admin import DeleteTopicsRequest, DeleteTopicsResponse

    names = topic_names(args.topic)
    r = request(args, DeleteTopicsRequest(topics=names))
    if not isinstance(r, DeleteTopicsResponse):
        raise unexpected(r, args)
    failures = Failures()
    for res in r.results:
        if res.error_code == UNKNOWN_TOPIC and args.if_exists:
            print(f"Topic {res.name} does not exist: nothing to delete (--if-exists)")
        elif res.error_code:
            failures.add(res.error_code, res.message, res.name)
        else:
            print(f"Deleted topic {res.name} ({res.topic_id})", flush=True)
    return failures.status


# --- topics alter -----------------------------------------------------------------------


def cmd_topics_alter(args: argparse.Namespace) -> int:
    from ops.admin_cmds import _assignments
    from protocol.messages.admin import (
        CreatePartitions,
        CreatePartitionsRequest,
        CreatePartitionsResponse,
    )

    spec = CreatePartitions(
        topic=args.topic,
        count=args.partitions,
        assignments=_assignments(args.replica_assignment),
    )
    r = request(args, CreatePartitionsRequest(topics=[spec]))
    if not isinstance(r, CreatePartitionsResponse) or len(r.results) != 1:
        raise unexpected(r, args)
    res = r.results[0]
    if res.error_code == UNKNOWN_TOPIC and args.if_exists:
        print(f"Topic {args.topic} does not exist: nothing to alter (--if-exists)")
        return EXIT_OK
    if res.error_code:
        raise error_for_code(res.error_code, res.message)
    new = res.assignments or []
    first = args.partitions - len(new)
    placed = ", ".join(f"{i}: {','.join(map(str, a))}" for i, a in enumerate(new, first))
    print(f"Topic {res.name} now has {args.partitions} partitions (was {first}); new: {placed}")
    return EXIT_OK


# --- brokers unregister -----------------------------------------------------------------


def cmd_brokers_unregister(args: argparse.Namespace) -> int:
    if getattr(args, "data_dir", None) is not None:
        raise InvalidConfigurationError(
            "brokers unregister asks the controller: --data-dir is for listing brokers offline"
        )
    from protocol.messages.admin import UnregisterBroker
    from protocol.messages.internal import Ack

    r = request(args, UnregisterBroker(broker_id=args.broker_id))
    if not isinstance(r, Ack):
        raise unexpected(r, args)
    print(f"Broker {args.broker_id} is no longer registered.")
    return EXIT_OK
