"""`metactl roll --data-dir D`: a rolling restart of the brokers of the `cluster up`
running on D, one at a time, in the order the controller plans (issue 34).

For each step of the controller's roll plan (`metactl plan roll`): a controlled shutdown
of the broker, its start again with its recorded command line (by `cluster up`, through
its control socket), a wait until it is back in the ISR of the step's partitions, a look
at every partition's MinISR, and a fresh plan before the next step. A plan that blocks a
broker to roll touches nothing: it prints which partitions block which brokers and exits
3. One line per stage as it goes (on stderr with ``--json``, whose one object comes on
stdout at the end). Ctrl-C waits for the broker being restarted (`cluster up` never
leaves it down), says where the roll stopped, and exits 130.

Exit status: 0 every broker rolled; 3 (the command's verdict) a plan blocked the roll
(at its start: nothing restarted; later: the roll stopped there), or a broker to roll
went down meanwhile; errors as every command's (docs/cli.md): no `cluster up` on D is
NETWORK_EXCEPTION (5), a broker not back in its ISRs within ``--timeout``
REQUEST_TIMED_OUT (5), an unknown broker INVALID_CONFIG (2).

This module parses, calls `localcluster.roll` and prints; the roll is there (imported
when the command runs, not to build its parser), the processes are `cluster up`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metactl.numbers import decimal_flag, parse_int
from ops.cli import EXIT_INTERRUPTED, EXIT_OK, HELP_FORMAT, examples

if TYPE_CHECKING:
    from localcluster.roll import RollResult

EXIT_STOPPED: Final = 3  # the command's verdict (docs/cli.md's table)
STEP_TIMEOUT_S: Final = 120.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "roll",
        help="restart `cluster up`'s brokers one at a time, keeping MinISR",
        description="A rolling restart of the brokers of the `metactl cluster up` running "
        "on DATA_DIR, one at a time, in the order the controller plans (`metactl plan "
        "roll`): a controlled shutdown, a start with the broker's recorded command line, a "
        "wait until it is back in the ISR of the step's partitions, then a fresh plan "
        "before the next. Refuses (exit 3, nothing restarted) when the plan blocks a broker "
        "to roll, naming the partitions that block it.",
        epilog=examples(
            "metactl roll --data-dir ./data",
            "metactl roll --data-dir /tmp/c --brokers 1,3 --timeout 300",
            "metactl roll --data-dir ./data --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./data"),
        help="the data directory `cluster up` runs on (default ./data)",
    )
    p.add_argument(
        "--brokers",
        default=None,
        metavar="ID[,ID...]",
        help="roll only these brokers, in the plan's order (default: every active broker)",
    )
    p.add_argument(
        "--timeout",
        type=decimal_flag(minimum=0.001),
        default=STEP_TIMEOUT_S,
        metavar="S",
        help="seconds a restarted broker may take to be back in the ISRs of its step's "
        f"partitions (default {STEP_TIMEOUT_S:.0f})",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object at the end on stdout, the progress lines on stderr "
        "(default: the lines on stdout)",
    )
    p.set_defaults(func=cmd_roll)


def broker_ids(text: str) -> list[int]:
    """--brokers' ids, in order, once each; INVALID_CONFIG for a bad one."""
    ids = [parse_int(x.strip(), "--brokers", minimum=0) for x in text.split(",")]
    return list(dict.fromkeys(ids))


def cmd_roll(args: argparse.Namespace) -> int:
    from localcluster.roll import Roll, RollInterrupted, Target

    brokers = broker_ids(args.brokers) if args.brokers is not None else None
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    roll = Roll(
        Target.of(Path(args.data_dir).resolve()),
        brokers=brokers,
        timeout_s=args.timeout,
        say=say,
    )
    try:
        result = roll.run()
    except RollInterrupted as stop:
        if args.json:
            print(json.dumps({**stop.result.to_json(), "stopped": "interrupted"}))
        print(f"interrupted: {stop.where}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(_json(result)))
    else:
        print("\n".join(summary(result)))
    return EXIT_OK if result.done else EXIT_STOPPED


def summary(result: RollResult) -> list[str]:
    """The roll's last lines: done, or what stopped it (with the plan's table of what
    blocks, `metactl plan roll`'s)."""
    if result.done:
        order = ", ".join(str(s.broker_id) for s in result.steps)
        return [
            f"Roll done: {len(result.steps)} broker(s) restarted one at a time ({order}) in "
            f"{result.seconds:.1f} s, each back in its ISRs before the next."
        ]
    head = "Roll refused" if not result.steps else f"Roll stopped after {len(result.steps)} step(s)"
    out = [f"{head}: {result.why}."]
    if result.blocked is not None:
        from ops.plan_cmds import roll_lines

        out += ["", *roll_lines(result.blocked)]
    return out


def _json(result: RollResult) -> dict[str, Any]:
    from ops.lifecycle_cmds import plain

    blocked = plain(result.blocked) if result.blocked is not None else None
    return {**result.to_json(), "done": result.done, "blocked": blocked}
