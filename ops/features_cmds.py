"""`metactl features describe|upgrade|downgrade`: finalized feature levels, as
`kafka-features.sh` spells them.

The one feature is `eligible.leader.replicas.version` (KIP-966): 1 tracks the ELR and
the LastKnownELR, 0 does not. `upgrade --feature NAME=LEVEL` and `downgrade --feature
NAME=LEVEL` (repeatable) ask the controller to finalize a level; what a change does (a
downgrade to 0 clears every ELR and LastKnownELR, an upgrade starts tracking from the
current ISRs) and what it refuses (an "upgrade" that lowers, an unknown feature or level)
is the controller's to decide. A new cluster's level is seeded by the controller's start
flag `--eligible-leader-replicas`; after that, only this command changes it.

This module owns the command's arguments and output; it decides nothing itself. The
client and the messages are imported when a command runs, not to build its parser
(issue 34).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import InvalidConfigurationError, MetactlError
from metactl.numbers import NumberFormatError, kafka_int
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments, controller_address, security_from

if TYPE_CHECKING:
    from protocol.messages.unions import Message

# `metadata_log.records.ELR_FEATURE`, copied for --help: that module loads every record
# type (tests/ops/test_cli_imports.py checks that they agree).
ELR_FEATURE: Final = "eligible.leader.replicas.version"


def register(sub: Any) -> None:
    f = sub.add_parser(
        "features",
        help="describe and change feature levels, like kafka-features.sh",
        description="Finalized feature levels (kafka-features.sh). "
        f"{ELR_FEATURE}=1 tracks eligible leader replicas (KIP-966); a downgrade to 0 "
        "stops tracking and clears every ELR and LastKnownELR.",
        epilog=examples(
            "metactl features describe",
            f"metactl features downgrade --feature {ELR_FEATURE}=0",
            f"metactl features upgrade --feature {ELR_FEATURE}=1",
        ),
        formatter_class=HELP_FORMAT,
    )
    f.set_defaults(help_parser=f)
    fsub = f.add_subparsers(dest="features_command", metavar="SUBCOMMAND")
    d = fsub.add_parser(
        "describe",
        help="the supported and finalized levels of every feature",
        description="Each feature's supported levels and its finalized level, as "
        "kafka-features.sh describe prints them.",
        epilog=examples("metactl features describe", "metactl features describe --json"),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(d)
    d.add_argument("--json", action="store_true", help="one JSON object (default: Kafka's lines)")
    d.set_defaults(func=cmd_describe)
    for kind in ("upgrade", "downgrade"):
        u = fsub.add_parser(
            kind,
            help=f"{kind} a feature's finalized level",
            description=f"Finalize each --feature at a {'higher' if kind == 'upgrade' else 'lower'}"
            " level (or the same, which changes nothing).",
            epilog=examples(f"metactl features {kind} --feature {ELR_FEATURE}="
                            f"{1 if kind == 'upgrade' else 0}"),
            formatter_class=HELP_FORMAT,
        )  # fmt: skip
        add_controller_arguments(u)
        u.add_argument(
            "--feature",
            action="append",
            required=True,
            metavar="NAME=LEVEL",
            help="the feature and its new level (required; repeatable)",
        )
        u.set_defaults(func=cmd_update, upgrade_type=kind)


def features(items: list[str]) -> list[tuple[str, int]]:
    """--feature's NAME=LEVEL pairs, in order; INVALID_CONFIG for a bad pair or a
    feature named twice."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, level = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidConfigurationError(f"--feature {item!r}: expected NAME=LEVEL")
        try:
            value = kafka_int(level, -(2**15), 2**15 - 1)  # a level is Kafka's int16
        except NumberFormatError as exc:
            raise InvalidConfigurationError(
                f"--feature {item!r}: the level must be an integer ({exc})"
            ) from None
        if name in out:
            raise InvalidConfigurationError(f"--feature {name} is given twice")
        out[name] = value
    return list(out.items())


def _run(args: argparse.Namespace, bodies: list[Message], each: Any) -> None:
    """Send `bodies` in order over one connection, `each(answer)` as each comes; the
    first refusal stops the rest (main prints it)."""
    import asyncio

    from clients.controller import ask

    address = controller_address(args)
    security = security_from(args)

    async def run() -> None:
        async with security.controller_client(address) as client:
            for body in bodies:
                r = await ask(client, body, args.timeout)
                each(r)

    asyncio.run(run())


def cmd_describe(args: argparse.Namespace) -> int:
    from ops.lifecycle_cmds import plain
    from protocol.messages.admin import DescribeFeaturesRequest, DescribeFeaturesResponse

    def show(r: Message) -> None:
        if not isinstance(r, DescribeFeaturesResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__}")
        if args.json:
            print(json.dumps({"features": plain(r.features)}, indent=2))
            return
        for f in r.features:
            finalized = (
                str(f.finalized)
                if f.finalized is not None
                else f"none (the controller's flag gives {f.effective})"
            )
            print(
                f"Feature: {f.name}\tSupportedMinVersion: {f.min_version}\t"
                f"SupportedMaxVersion: {f.max_version}\tFinalizedVersionLevel: {finalized}"
            )

    _run(args, [DescribeFeaturesRequest()], show)
    return EXIT_OK


def cmd_update(args: argparse.Namespace) -> int:
    from protocol.messages.admin import UpdateFeature, UpdateFeatureResponse

    bodies: list[Message] = [
        UpdateFeature(name=name, level=level, upgrade_type=args.upgrade_type)
        for name, level in features(args.feature)
    ]

    def done(r: Message) -> None:
        if not isinstance(r, UpdateFeatureResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__}")
        print(f"{r.name} was {args.upgrade_type}d to {r.level}.", flush=True)
        if r.cleared_topics:
            print(
                f"Cleared the ELR and LastKnownELR of {r.cleared_topics} topic(s) (KIP-966).",
                flush=True,
            )

    _run(args, bodies, done)
    return EXIT_OK
