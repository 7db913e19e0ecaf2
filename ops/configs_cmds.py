"""`metactl configs`: dynamic configs, as `kafka-configs.sh` spells them.

`--entity-type topics --entity-name T` or `--entity-type brokers --entity-default` (the
cluster default), then `--alter` with `--add-config K=V[,K=V]` and/or `--delete-config
K[,K]`, or `--describe` (without `--entity-name`, every topic). The controller keeps
`min.insync.replicas` only; what it accepts, refuses (the cluster default cannot be
deleted; a broker's own value is not allowed) and what an update clears (KIP-966: a
topic's ELR and LastKnownELR, or every topic's for the cluster default, even when the
value does not change) is the controller's to decide. This command reports it: how many
topics' ELR state the change cleared.

This module owns the command's arguments, the parsing of `--add-config` and
`--delete-config`, and the output; it decides nothing and writes nothing itself. The
client and the messages are imported when the command runs, not to build its parser
(issue 34).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import InvalidConfigurationError, MetactlError
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments, controller_address, security_from

if TYPE_CHECKING:
    from protocol.client import RpcClient
    from protocol.messages.admin import AlterConfigsResponse, DescribeConfigsResponse

# `metadata_log.records`' resource types, copied: that module loads every record type
# (tests/ops/test_cli_imports.py checks that they agree).
TOPIC_RESOURCE: Final = "topic"
BROKER_RESOURCE: Final = "broker"  # with an empty name: the cluster default

# kafka-configs' entity types -> the resource types of the wire requests.
ENTITY_TYPES: Final = {"topics": TOPIC_RESOURCE, "brokers": BROKER_RESOURCE}


def register(sub: Any) -> None:
    c = sub.add_parser(
        "configs",
        help="describe and alter dynamic configs, like kafka-configs.sh",
        description="Describe or alter min.insync.replicas of a topic or of the cluster "
        "default (kafka-configs.sh). Any update clears the ELR and LastKnownELR it "
        "governs (KIP-966): a topic's for a topic, every topic's for the cluster default, "
        "even when the value is unchanged. A value above a topic's replication factor is "
        "accepted; the effective MinISR is then the replication factor. The cluster "
        "default cannot be deleted.",
        epilog=examples(
            "metactl configs --entity-type topics --entity-name orders --alter "
            "--add-config min.insync.replicas=3",
            "metactl configs --entity-type topics --entity-name orders --alter "
            "--delete-config min.insync.replicas",
            "metactl configs --entity-type brokers --entity-default --alter "
            "--add-config min.insync.replicas=2",
            "metactl configs --entity-type topics --entity-name orders --describe",
            "metactl configs --entity-type topics --describe --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(c)
    c.add_argument(
        "--entity-type",
        required=True,
        choices=sorted(ENTITY_TYPES),
        help="what the configs belong to (required): topics, or brokers with "
        "--entity-default for the cluster default",
    )
    which = c.add_mutually_exclusive_group()
    which.add_argument(
        "--entity-name",
        default=None,
        metavar="NAME",
        help="the topic (or broker id); --describe without it describes every topic",
    )
    which.add_argument(
        "--entity-default",
        action="store_true",
        help="the cluster default (with --entity-type brokers)",
    )
    action = c.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true", help="change configs (one of the two)")
    action.add_argument("--describe", action="store_true", help="show configs (one of the two)")
    c.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="with --alter: configs to set, comma-separated, repeatable (default: none)",
    )
    c.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K]",
        help="with --alter: configs to delete (the topic then inherits the cluster "
        "default), comma-separated, repeatable (default: none)",
    )
    c.add_argument(
        "--json",
        action="store_true",
        help="with --describe: one JSON object (default: Kafka's lines)",
    )
    c.set_defaults(func=cmd_configs)


# --- arguments --------------------------------------------------------------------------


def split_top_level(text: str) -> list[str]:
    """`text` split at commas outside square brackets (kafka-configs' list values,
    `k=[a,b]`); INVALID_CONFIG for unbalanced brackets."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise InvalidConfigurationError(f"{text!r}: unbalanced [ ]")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def added_configs(items: list[str]) -> dict[str, str]:
    """--add-config's K=V pairs; INVALID_CONFIG for a pair without a key or `=`, or a key
    given twice with different values."""
    out: dict[str, str] = {}
    for item in items:
        for pair in split_top_level(item):
            key, sep, value = pair.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise InvalidConfigurationError(f"--add-config {pair!r}: expected KEY=VALUE")
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            if key in out and out[key] != value:
                raise InvalidConfigurationError(
                    f"--add-config {key} is given twice ({out[key]!r} and {value!r})"
                )
            out[key] = value
    return out


def deleted_configs(items: list[str]) -> list[str]:
    keys = [k.strip() for item in items for k in item.split(",")]
    if not all(keys):
        raise InvalidConfigurationError(f"--delete-config {','.join(items)!r}: an empty name")
    return list(dict.fromkeys(keys))


def resource(args: argparse.Namespace) -> tuple[str, str] | None:
    """(resource type, name) the arguments name; None: every topic (--describe only)."""
    kind = ENTITY_TYPES[args.entity_type]
    if args.entity_default:
        if kind != BROKER_RESOURCE:
            raise InvalidConfigurationError(
                "--entity-default is the cluster default: use it with --entity-type brokers"
            )
        return kind, ""
    if args.entity_name is not None:
        if not args.entity_name.strip():
            raise InvalidConfigurationError("--entity-name is empty")
        return kind, args.entity_name
    if kind == TOPIC_RESOURCE and args.describe:
        return None
    if kind == TOPIC_RESOURCE:
        raise InvalidConfigurationError("name the topic: --entity-name T")
    raise InvalidConfigurationError(
        "name the cluster default (--entity-default) or a broker (--entity-name ID)"
    )


def entity_label(kind: str, name: str) -> str:
    if kind == BROKER_RESOURCE and name == "":
        return "default config for brokers in the cluster"
    return f"config for {kind} {name}"


# --- the command ------------------------------------------------------------------------


def cmd_configs(args: argparse.Namespace) -> int:
    target = resource(args)
    if args.describe:
        if args.add_config or args.delete_config:
            raise InvalidConfigurationError("--add-config and --delete-config go with --alter")
        return describe(args, target)
    if args.json:
        raise InvalidConfigurationError("--json goes with --describe")
    assert target is not None
    to_set = added_configs(args.add_config)
    to_delete = deleted_configs(args.delete_config)
    if not to_set and not to_delete:
        raise InvalidConfigurationError("--alter needs --add-config or --delete-config")
    both = sorted(set(to_set) & set(to_delete))
    if both:
        raise InvalidConfigurationError(f"{', '.join(both)}: both added and deleted")
    import asyncio

    from clients.controller import ask
    from protocol.messages.admin import AlterConfigs, AlterConfigsResponse

    kind, name = target
    body = AlterConfigs(
        resource_type=kind, resource_name=name, set_configs=to_set, delete_configs=to_delete
    )
    address = controller_address(args)
    security = security_from(args)

    async def run() -> AlterConfigsResponse:
        async with security.controller_client(address) as client:
            r = await ask(client, body, args.timeout)
        if not isinstance(r, AlterConfigsResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__} from {address}")
        return r

    r = asyncio.run(run())
    print(f"Completed updating {entity_label(kind, name)}.")
    if r.cleared_topics:
        print(f"Cleared the ELR and LastKnownELR of {r.cleared_topics} topic(s) (KIP-966).")
    return EXIT_OK


async def _describe_one(
    client: RpcClient, kind: str, name: str, timeout_s: float
) -> DescribeConfigsResponse:
    from clients.controller import ask
    from protocol.messages.admin import DescribeConfigsRequest, DescribeConfigsResponse

    r = await ask(client, DescribeConfigsRequest(resource_type=kind, resource_name=name), timeout_s)
    if not isinstance(r, DescribeConfigsResponse):
        raise MetactlError(f"unexpected answer {type(r).__name__} from {client.address}")
    return r


async def _topic_names(client: RpcClient, timeout_s: float) -> list[str]:
    """Every topic's name, in name order (a topic that spans pages is listed once)."""
    from clients.admin import pages
    from protocol.messages.admin import DescribeClusterRequest

    names: list[str] = []
    async for page in pages(client, DescribeClusterRequest(broker_limit=0), timeout_s=timeout_s):
        for t in page.topics:
            if not names or names[-1] != t.name:
                names.append(t.name)
    return names


def describe(args: argparse.Namespace, target: tuple[str, str] | None) -> int:
    import asyncio

    from ops.lifecycle_cmds import plain

    address = controller_address(args)
    security = security_from(args)

    async def run() -> list[DescribeConfigsResponse]:
        async with security.controller_client(address) as client:
            if target is not None:
                return [await _describe_one(client, *target, args.timeout)]
            return [
                await _describe_one(client, TOPIC_RESOURCE, name, args.timeout)
                for name in await _topic_names(client, args.timeout)
            ]

    answers = asyncio.run(run())
    if args.json:
        print(json.dumps({"resources": plain(answers)}, indent=2))
        return EXIT_OK
    for r in answers:
        if r.resource_type == BROKER_RESOURCE and r.resource_name == "":
            print("Default configs for brokers in the cluster are:")
        else:
            print(f"Configs for {r.resource_type} {r.resource_name} are:")
        for e in r.configs:
            flags = " read_only=true" if e.read_only else ""
            print(f"  {e.name}={'' if e.value is None else e.value} source={e.source}{flags}")
    return EXIT_OK
