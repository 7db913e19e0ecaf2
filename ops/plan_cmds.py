"""`metactl plan restart --broker N` and `metactl plan roll`: the maintenance pre-flight
(issue 34), answered by the controller from its committed image with its own rules.

`plan restart` asks what a restart of broker N would do now, clean (controlled shutdown)
and unclean (a crash: fenced when its session times out, back without its epoch): which
partitions go under MinISR, lose their leader, elect a leader from the ELR, or need an
unclean recovery (and what their policy needs for it). `plan roll` asks for an order in
which to restart every broker, one at a time, that keeps every partition at or above
MinISR, and the partitions each step waits to see the broker back in; or the partitions
that make it impossible and the brokers they block. The controller makes both
(`planning`, by stepping a copy of its image through its own core); this module parses,
asks, and prints: a table per case by default, `--json` for machines.

Exit status: 0, or 3 (the command's verdict) when `plan restart`'s clean restart would
take a partition below MinISR, leave one without a leader or need an unclean recovery,
or when `plan roll` cannot restart every broker; errors as every command's
(docs/cli.md).

It decides nothing itself and writes nothing to the cluster; the protocol client and
the messages are imported when a command runs, not to build its parser.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import MetactlError
from metactl.numbers import int_arg
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments

if TYPE_CHECKING:
    from protocol.messages.plan import (
        PartitionList,
        PlannedPartition,
        PlanRestartResponse,
        PlanRollResponse,
        RecoveryNeed,
        RestartCase,
        TopicPartitions,
    )

EXIT_NOT_SAFE: Final = 3  # the command's verdict (docs/cli.md's table)
NO_LEADER: Final = -1  # `metadata_log.records.NO_LEADER`, without loading every record type


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="pre-flight: what a broker's restart or a roll would do",
        description="What a restart of one broker would do to its partitions, clean and "
        "unclean, or an order in which to restart every broker that keeps every partition "
        "at or above MinISR: planned by the controller, with its own rules, from its "
        "committed state.",
        epilog=examples(
            "metactl plan restart --broker 1",
            "metactl plan roll",
            "metactl plan roll --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    p.set_defaults(help_parser=p)
    psub = p.add_subparsers(dest="plan_command", metavar="SUBCOMMAND")
    r = psub.add_parser(
        "restart",
        help="what a clean and an unclean restart of one broker would do now",
        description="For a clean restart (controlled shutdown, clean re-registration) and "
        "an unclean one (a crash: fenced when its session times out, back without its "
        "epoch) of --broker: the partitions that would go under MinISR or lose their "
        "leader while it is down, those that would elect a leader from the ELR, and those "
        "that would need an unclean recovery, with what their policy needs. Exit status 3 "
        "when the clean restart takes a partition under MinISR, leaves one leaderless or "
        "needs an unclean recovery.",
        epilog=examples(
            "metactl plan restart --broker 1",
            "metactl plan restart --broker 1 --json --limit 0",
        ),
        formatter_class=HELP_FORMAT,
    )
    r.add_argument(
        "--broker",
        required=True,
        type=int_arg,
        metavar="N",
        help="the broker to restart (required)",
    )
    _common(r)
    r.set_defaults(func=cmd_restart)
    o = psub.add_parser(
        "roll",
        help="an order to restart every broker keeping every partition at or above MinISR",
        description="An order in which to restart every active broker, one at a time "
        "(controlled shutdown, clean re-registration, then waiting until its partitions "
        "have it back in their ISRs), that keeps every partition at or above MinISR at "
        "every step, with the partitions each step waits for; or the partitions that make "
        "it impossible and the brokers they block. Exit status 3 when some broker cannot "
        "be restarted that way.",
        epilog=examples("metactl plan roll", "metactl plan roll --json --limit 100000"),
        formatter_class=HELP_FORMAT,
    )
    _common(o)
    o.set_defaults(func=cmd_roll)


def _common(p: argparse.ArgumentParser) -> None:
    add_controller_arguments(p)
    p.add_argument(
        "--limit",
        type=int_arg,
        default=None,
        metavar="N",
        help="the most partitions each list shows (its count is always whole); 0 for "
        "counts only (default: the controller's, 1,000)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (default: tables)")


def _ask(args: argparse.Namespace, body: Any) -> Any:
    from ops.lifecycle_cmds import request

    return request(args, body)


def cmd_restart(args: argparse.Namespace) -> int:
    from ops.lifecycle_cmds import plain
    from protocol.messages.plan import PlanRestartRequest, PlanRestartResponse

    r = _ask(args, PlanRestartRequest(broker_id=args.broker, limit=args.limit))
    if not isinstance(r, PlanRestartResponse):
        raise MetactlError(f"unexpected answer {type(r).__name__}")
    if args.json:
        print(json.dumps(plain(r), indent=2))
    else:
        print("\n".join(restart_lines(r)))
    clean = r.clean
    unsafe = clean.under_min_isr.count or clean.leader_lost.count or clean.unclean_recovery.count
    return EXIT_NOT_SAFE if unsafe else EXIT_OK


def cmd_roll(args: argparse.Namespace) -> int:
    from ops.lifecycle_cmds import plain
    from protocol.messages.plan import PlanRollRequest, PlanRollResponse

    r = _ask(args, PlanRollRequest(limit=args.limit))
    if not isinstance(r, PlanRollResponse):
        raise MetactlError(f"unexpected answer {type(r).__name__}")
    if args.json:
        print(json.dumps(plain(r), indent=2))
    else:
        print("\n".join(roll_lines(r)))
    return EXIT_NOT_SAFE if r.blocked else EXIT_OK


# --- the tables ---------------------------------------------------------------------------


def ids(xs: Iterable[int]) -> str:
    return ",".join(map(str, xs)) or "-"


def leader(b: int) -> str:
    return "none" if b == NO_LEADER else str(b)


def restart_lines(r: PlanRestartResponse) -> list[str]:
    out = [
        f"Restart of broker {r.broker_id}, planned from the committed log at offset "
        f"{r.end_offset}: it hosts {r.replicas} partition(s) and leads {r.leads}.",
    ]
    for case in (r.clean, r.unclean):
        out.append("")
        out.extend(_case_lines(case, r.broker_id))
    return out


_SECTIONS: Final = (
    ("under_min_isr", "Under MinISR while it is down (acks=all refused)"),
    ("leader_lost", "Without a leader while it is down"),
    ("elected_from_elr", "Leader elected from the ELR (a clean election)"),
    ("unclean_recovery", "Need an unclean recovery (potential data loss)"),
)


def _case_lines(case: RestartCase, broker_id: int) -> list[str]:
    title = "CLEAN restart" if case.kind == "clean" else "UNCLEAN restart (a crash)"
    out = [f"{title}: " + "; ".join(case.steps) + "."]
    for field, heading in _SECTIONS:
        listed: PartitionList = getattr(case, field)
        out.append(f"  {heading}: {listed.count}")
        out.extend(_partition_table(listed, broker_id))
    return out


def _partition_table(listed: PartitionList, broker_id: int) -> list[str]:
    if not listed.partitions:
        return [] if not listed.count else [f"    ({listed.count} not listed: --limit)"]
    rows: list[tuple[str, ...]] = [
        ("PARTITION", "MINISR", "LEADER", "ISR", "ELR", "LASTKNOWNELR", "NOTE")
    ]
    for p in listed.partitions:
        rows.append(
            (
                f"{p.topic}-{p.partition}",
                str(p.min_isr),
                _change(leader(p.leader_before), leader(p.leader)),
                _change(ids(p.isr_before), ids(p.isr)),
                ids(p.elr),
                ids(p.last_known_elr),
                _note(p, broker_id),
            )
        )
    out = _aligned(rows, indent="    ")
    more = listed.count - len(listed.partitions)
    if more:
        out.append(f"    ... and {more} more (--limit)")
    return out


def _change(before: str, after: str) -> str:
    return before if before == after else f"{before}→{after}"


def _note(p: PlannedPartition, broker_id: int) -> str:
    if p.recovery is not None:
        return _recovery_note(p.recovery, broker_id)
    if p.election == "elr":
        when = f"on broker {broker_id}'s return" if p.on_return else "while it is down"
        return f"{p.leader} elected from the ELR {when}"
    return ""


def _recovery_note(need: RecoveryNeed, broker_id: int) -> str:
    if need.chosen is not None:
        return f"{need.strategy}: {need.chosen} elected uncleanly at once"
    if need.operator:
        text = f"{need.strategy}: only an operator's unclean election (metactl elect)"
    elif need.window_ms is not None:
        text = (
            f"{need.strategy}: inspects {ids(need.awaiting)} for {need.window_ms} ms, "
            "then elects the best log"
        )
    else:
        text = f"{need.strategy}: waits for the logs of {ids(need.awaiting)}, then elects"
    if need.until_return:
        text += f" (unless broker {broker_id} is back first)"
    return text


def _aligned(rows: list[tuple[str, ...]], *, indent: str) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def roll_lines(r: PlanRollResponse) -> list[str]:
    out: list[str] = []
    if r.steps:
        out.append(
            f"Roll planned from the committed log at offset {r.end_offset}: restart these "
            f"{len(r.steps)} broker(s) one at a time, in this order; each keeps every "
            "partition at or above MinISR while it is down."
        )
        rows: list[tuple[str, ...]] = [
            ("STEP", "BROKER", "LEADS", "AT-MINISR", "AWAIT BACK IN ISR")
        ]
        for i, s in enumerate(r.steps, 1):
            rows.append(
                (str(i), str(s.broker_id), str(s.leads), str(s.at_min_isr), f"{s.await_count}")
            )
        out.extend(_aligned(rows, indent="  "))
        for i, s in enumerate(r.steps, 1):
            if s.awaits:
                shown = sum(len(g.partitions) for g in s.awaits)
                more = s.await_count - shown
                out.append(
                    f"  step {i} awaits broker {s.broker_id} back in: {_runs(s.awaits)}"
                    + (f" ... and {more} more (--limit)" if more else "")
                )
    elif r.blocked:
        out.append(
            f"Roll planned from the committed log at offset {r.end_offset}: no broker can "
            "be restarted first."
        )
    else:
        out.append(f"Nothing to roll at offset {r.end_offset}: no broker is up.")
    if r.blocked:
        out.append("")
        out.append(
            f"BLOCKED: broker(s) {ids(r.blocked)} cannot be restarted without taking a "
            f"partition below MinISR, in any order; {r.blocking_count} partition(s) block:"
        )
        blocking: list[tuple[str, ...]] = [
            ("PARTITION", "MINISR", "LEADER", "REPLICAS", "ISR", "BLOCKS")
        ]
        for b in r.blocking:
            blocking.append(
                (
                    f"{b.topic}-{b.partition}",
                    str(b.min_isr),
                    leader(b.leader),
                    ids(b.replicas),
                    ids(b.isr),
                    ids(b.blocks),
                )
            )
        if r.blocking:
            out.extend(_aligned(blocking, indent="  "))
        more = r.blocking_count - len(r.blocking)
        if more:
            out.append(f"  ... and {more} more (--limit)")
    for n in r.not_rolled:
        why = "fenced: down already" if n.reason == "fenced" else "in controlled shutdown"
        out.append(f"Not rolled: broker {n.broker_id} ({why}).")
    if r.under_min_isr.count:
        out.append("")
        out.append(f"Under MinISR before the roll (not made worse by it): {r.under_min_isr.count}")
        out.extend(_partition_table(r.under_min_isr, NO_LEADER))
    return out


def _runs(groups: list[TopicPartitions]) -> str:
    return "; ".join(f"{g.topic} {ids(g.partitions)}" for g in groups)
