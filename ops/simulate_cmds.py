"""`metactl simulate history` and `metactl simulate faults`.

`history`: a long random history through the real controller core (see
`simulation.history`); its output is an ordinary data directory that every ``metactl log``
and ``metactl audit`` command reads.

`faults`: seeded fault schedules, with lifecycle operations interleaved, against the
controller core and the brokers' replication logic, with an oracle of acknowledged
records (see `simulation.faults` and docs/safety.md). Exit 0 iff no acknowledged
record was lost silently and no invariant broke, else 3; with ``--expect-silent-loss``,
0 iff some record was lost silently, else 3. 2: bad options or replay file; 1: a file
could not be read or written (as ``metactl chaos run``). `history`: 0, 2 for bad
options, else the table's status (docs/cli.md). Every failure is one ``error: NAME:
message`` line; Ctrl-C exits 130.

This module parses arguments and prints; the simulators decide everything.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from metactl.errors import InvalidConfigurationError
from metactl.numbers import decimal_arg, int_arg, long_arg
from ops.cli import EXIT_REFUSED, HELP_FORMAT, examples, fail
from ops.run_progress import MODES

if TYPE_CHECKING:
    from simulation.faults import FaultsSummary
    from simulation.faults_schedule import ReplayFile


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate long cluster histories into a metadata log",
        description="Simulate long cluster histories into a metadata log, or seeded fault "
        "schedules against the real controller step (docs/safety.md).",
        epilog=examples(
            "metactl simulate history --brokers 30 --partitions 5000 --days 30 --out /tmp/hist",
            "metactl simulate faults --schedules 200 --seed 7",
        ),
        formatter_class=HELP_FORMAT,
    )
    parser.set_defaults(help_parser=parser)
    commands = parser.add_subparsers(dest="simulate_command", metavar="WHAT", required=True)
    history = commands.add_parser(
        "history",
        help="random fences, restarts, outages, recoveries and elections over days",
        description="Drive the real controller core with virtual time through random "
        "fences, clean and unclean restarts, power outages, unclean recoveries, "
        "preferred elections and AlterPartition shrinks and expansions. The output is an "
        "ordinary data directory for `metactl log`, `events`, `describe` and `audit`.",
        epilog=examples(
            "metactl simulate history --brokers 30 --partitions 5000 --days 30 --out /tmp/hist",
            "metactl simulate history --brokers 5 --partitions 50 --days 1 --out /tmp/small "
            "--quiet",
            "metactl events --data-dir /tmp/small --since 2026-01-01T12:00:00Z",
        ),
        formatter_class=HELP_FORMAT,
    )
    history.add_argument(
        "--brokers", type=int_arg, default=30, metavar="N", help="brokers (default 30)"
    )
    history.add_argument(
        "--partitions",
        type=int_arg,
        default=5000,
        metavar="N",
        help="partitions in all (default 5000)",
    )
    history.add_argument(
        "--days",
        type=decimal_arg,
        default=30.0,
        metavar="D",
        help="virtual days to run (default 30)",
    )
    history.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="new data directory (required)"
    )
    history.add_argument("--seed", type=long_arg, default=0, help="random seed (default 0)")
    history.add_argument(
        "--topics", type=int_arg, metavar="N", help="topics (default: one per 100 partitions)"
    )
    history.add_argument(
        "--replication-factor",
        type=int_arg,
        default=3,
        metavar="R",
        help="replicas per partition (default 3)",
    )
    history.add_argument(
        "--min-isr", type=int_arg, default=2, metavar="M", help="min.insync.replicas (default 2)"
    )
    history.add_argument(
        "--strategy",
        default="balanced",
        help="cluster unclean recovery strategy (default balanced)",
    )
    history.add_argument(
        "--intensity", type=decimal_arg, default=1.0, help="scale every event rate (default 1.0)"
    )
    history.add_argument(
        "--start",
        metavar="TIME",
        help="virtual start time (ISO 8601, default 2026-01-01T00:00:00Z)",
    )
    history.add_argument(
        "--quiet", action="store_true", help="no progress lines (default: progress on stderr)"
    )
    history.set_defaults(func=_history)
    _register_faults(commands)


def _register_faults(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from controller.runtime.serve import add_rule_mode_arguments
    from simulation.faults_schedule import FAILOVERS, LIFECYCLE_OPS

    faults = commands.add_parser(
        "faults",
        help="seeded crashes, page-cache loss and network faults; count lost acknowledged data",
        description="Run seeded fault schedules (lossy and plain kills, controlled "
        "shutdowns, network partitions, message loss, delay and reordering, and "
        "controller failovers), with "
        "lifecycle operations interleaved (MinISR changes, reassignments, partition "
        "additions, topic deletes, unregistrations, ELR feature cycles), against the real "
        "controller step and "
        "the brokers' replication logic in virtual time, and classify every acks=all "
        "record as present, lost and reported (an unclean recovery after it was "
        "acknowledged), lost silently, or of a topic deleted since. Exit 0 iff nothing "
        "was lost silently and no invariant broke, else 3.",
        epilog=examples(
            "metactl simulate faults --schedules 200 --seed 7",
            "metactl simulate faults --eligible-leader-replicas disabled --expect-silent-loss",
            "metactl simulate faults --replay metactl-faults/schedule-1.json --json",
            "metactl simulate faults --failovers 2 --work-budget 1 --schedules 500",
        ),
        formatter_class=HELP_FORMAT,
    )
    faults.add_argument(
        "--schedules", type=int_arg, default=200, metavar="N", help="fault schedules (default 200)"
    )
    faults.add_argument("--seed", type=long_arg, default=0, help="random seed (default 0)")
    faults.add_argument(
        "--strategy",
        choices=("balanced", "proactive", "manual"),
        default="balanced",
        help="unclean recovery strategy (KIP-966 mode; default balanced)",
    )
    add_rule_mode_arguments(faults)
    faults.add_argument(
        "--lossy-kills",
        type=int_arg,
        default=2,
        metavar="K",
        help="lossy kills (SIGKILL with the page cache lost) per schedule (default 2)",
    )
    faults.add_argument(
        "--lifecycle-ops",
        type=int_arg,
        default=LIFECYCLE_OPS,
        metavar="N",
        help="lifecycle operations (MinISR changes, reassignments and cancels, partition "
        "additions, topic deletes and re-creates, unregistrations) interleaved with the "
        f"faults per schedule; 0 for faults only (default {LIFECYCLE_OPS})",
    )
    faults.add_argument(
        "--failovers",
        type=int_arg,
        default=FAILOVERS,
        metavar="N",
        help="controller failovers per schedule: the active controller dies (half of them "
        "inside a metadata transaction) and a standby takes over 0.5-3 s later from the "
        f"durable log (default {FAILOVERS}; 0 for none)",
    )
    faults.add_argument(
        "--work-budget",
        type=int_arg,
        default=None,
        metavar="P",
        help="the controller's work budget, partitions per event (default the "
        "controller's, 1000); 1 slices every fence, shutdown, unclean registration and "
        "create of these small clusters into metadata transactions, which a failover "
        "may then interrupt",
    )
    faults.add_argument(
        "--json", action="store_true", help="print one JSON object (default: text lines)"
    )
    faults.add_argument(
        "--progress",
        choices=MODES,
        default="auto",
        help="progress on stderr: a bar on a terminal, a line every few seconds "
        "otherwise (auto, the default), or off",
    )
    faults.add_argument(
        "--expect-silent-loss",
        action="store_true",
        help="exit 0 iff some acknowledged record was lost silently (default: iff none was)",
    )
    faults.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="run the one schedule of a replay file (default: generate --schedules)",
    )
    faults.add_argument(
        "--save-dir",
        type=Path,
        default=Path("metactl-faults"),
        help="where shrunk failing schedules are written (default ./metactl-faults)",
    )
    faults.add_argument(
        "--shrink-max",
        type=int_arg,
        default=3,
        metavar="M",
        help="failing schedules to shrink and save (default 3)",
    )
    # Test-only mutants that must make the oracle fail (docs/safety.md).
    faults.add_argument(
        "--mutant",
        action="append",
        choices=("lie-clean-shutdown", "hw-ignores-min-isr", "isr-join-ignores-hw"),
        default=[],
        help=argparse.SUPPRESS,
    )
    faults.set_defaults(func=_faults)


def _faults(args: argparse.Namespace) -> int:
    import json

    from controller.core.config import ControllerConfig
    from controller.runtime.serve import rule_mode
    from ops.run_progress import Progress
    from simulation.faults import Mode, replay, run_faults

    try:
        if args.replay is not None:
            doc = _load_replay(args.replay)
            summary = replay(doc.schedule, doc.mode)
        else:
            if (
                args.schedules < 1
                or args.lossy_kills < 0
                or args.lifecycle_ops < 0
                or args.failovers < 0
            ):
                raise InvalidConfigurationError(
                    "--schedules must be positive, --lossy-kills, --lifecycle-ops and "
                    "--failovers not negative"
                )
            if args.work_budget is not None and args.work_budget < 1:
                raise InvalidConfigurationError("--work-budget must be positive")
            rules = rule_mode(args)
            # The config refuses a bad combination (InvalidConfigurationError) before a run.
            ControllerConfig(unclean_recovery_strategy=args.strategy, **rules)
            mode = Mode(
                strategy=args.strategy,
                **rules,
                lie_clean_shutdown="lie-clean-shutdown" in args.mutant,
                hw_ignores_min_isr="hw-ignores-min-isr" in args.mutant,
                isr_join_ignores_hw="isr-join-ignores-hw" in args.mutant,
                work_budget=args.work_budget,
            )
            with Progress(
                "simulate faults", args.schedules, unit="schedules", mode=args.progress
            ) as bar:

                def progress(so_far: FaultsSummary) -> None:
                    bar.update(so_far.schedules, _status(so_far))

                summary = run_faults(
                    schedules=args.schedules,
                    seed=args.seed,
                    mode=mode,
                    lossy_kills=args.lossy_kills,
                    lifecycle_ops=args.lifecycle_ops,
                    failovers=args.failovers,
                    save_dir=args.save_dir,
                    shrink_max=args.shrink_max,
                    progress=progress,
                )
    except OSError as exc:  # docs/safety.md: 1 when a file cannot be read or written
        fail(exc)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(summary.to_json(), sort_keys=True))
    else:
        for line in summary.lines():
            print(line)
    silent = summary.lost_silent > 0
    if args.expect_silent_loss:
        return 0 if silent else 3
    return 3 if silent or summary.invariant_violations else 0


def _status(s: FaultsSummary) -> str:
    """The running figures a progress line shows."""
    text = f"{s.acknowledged:,} acknowledged, {s.lost_silent} lost silently"
    if s.failing_schedules:
        text += f", {s.failing_schedules} failing schedules"
    return text


def _load_replay(path: Path) -> ReplayFile:
    """The replay file at `path`; INVALID_CONFIG (exit 2) for one that is not valid."""
    from simulation.faults_schedule import load_replay

    try:
        return load_replay(path)
    except ValueError as exc:  # msgspec's decode errors are ValueErrors too
        raise InvalidConfigurationError(str(exc)) from None


def _history(args: argparse.Namespace) -> int:
    from simulation.history import simulate_history
    from simulation.history_config import HistoryConfig, parse_time_ms

    if args.brokers < 1 or args.partitions < 1 or args.days <= 0:
        raise InvalidConfigurationError("--brokers, --partitions and --days must be positive")
    if args.replication_factor > args.brokers:
        raise InvalidConfigurationError("--replication-factor cannot exceed --brokers")
    try:
        extra = {} if args.start is None else {"start_ms": parse_time_ms(args.start)}
    except ValueError as exc:
        raise InvalidConfigurationError(f"--start {args.start!r}: {exc}") from None
    cfg = HistoryConfig(
        brokers=args.brokers,
        partitions=args.partitions,
        days=args.days,
        seed=args.seed,
        topics=args.topics,
        replication_factor=args.replication_factor,
        min_isr=args.min_isr,
        strategy=args.strategy,
        intensity=args.intensity,
        **extra,
    )
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    report = asyncio.run(simulate_history(cfg, args.out, progress=progress))
    for line in report.lines():
        print(line)
    return 0
