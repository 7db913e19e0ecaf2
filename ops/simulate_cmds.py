"""`metactl simulate history` and `metactl simulate faults`.

`history`: a long random history through the real controller core (see
`simulation.history`); its output is an ordinary data directory that every ``metactl log``
and ``metactl audit`` command reads.

`faults`: seeded fault schedules against the controller core and the brokers' replication
logic, with an oracle of acknowledged records (see `simulation.faults` and
docs/safety.md). Exit 0 iff no acknowledged record was lost silently and no invariant
broke, else 3; with ``--expect-silent-loss``, 0 iff some record was lost silently, else
3. 2: bad options or replay file; 1: a file could not be read or written (as
``metactl chaos run``).

This module parses arguments and prints; the simulators decide everything.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from controller.runtime.serve import add_rule_mode_arguments, rule_mode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate long cluster histories into a metadata log",
        description="Simulate long cluster histories into a metadata log.",
    )
    commands = parser.add_subparsers(dest="simulate_command", metavar="WHAT", required=True)
    history = commands.add_parser(
        "history",
        help="random fences, restarts, outages, recoveries and elections over days",
        description="Drive the real controller core with virtual time through random "
        "fences, clean and unclean restarts, power outages, unclean recoveries, "
        "preferred elections and AlterPartition shrinks and expansions.",
    )
    history.add_argument("--brokers", type=int, default=30)
    history.add_argument("--partitions", type=int, default=5000)
    history.add_argument("--days", type=float, default=30.0)
    history.add_argument("--out", type=Path, required=True, help="new data directory")
    history.add_argument("--seed", type=int, default=0)
    history.add_argument("--topics", type=int, help="default: one per 100 partitions")
    history.add_argument("--replication-factor", type=int, default=3)
    history.add_argument("--min-isr", type=int, default=2)
    history.add_argument("--strategy", default="balanced", help="cluster unclean recovery strategy")
    history.add_argument(
        "--intensity", type=float, default=1.0, help="scale every event rate (default 1.0)"
    )
    history.add_argument("--start", help="virtual start time (ISO 8601, default 2026-01-01Z)")
    history.add_argument("--quiet", action="store_true", help="no progress lines")
    history.set_defaults(func=_history)
    _register_faults(commands)


def _register_faults(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    faults = commands.add_parser(
        "faults",
        help="seeded crashes, page-cache loss and network faults; count lost acknowledged data",
        description="Run seeded fault schedules (lossy and plain kills, controlled "
        "shutdowns, network partitions, message loss, delay and reordering) against the "
        "real controller step and the brokers' replication logic in virtual time, and "
        "classify every acks=all record as present, lost and reported (an unclean "
        "recovery after it was acknowledged), or lost silently. Exit 0 iff nothing was "
        "lost silently and no invariant broke.",
    )
    faults.add_argument("--schedules", type=int, default=200)
    faults.add_argument("--seed", type=int, default=0)
    faults.add_argument(
        "--strategy",
        choices=("balanced", "proactive", "manual"),
        default="balanced",
        help="unclean recovery strategy (KIP-966 mode)",
    )
    add_rule_mode_arguments(faults)
    faults.add_argument(
        "--lossy-kills",
        type=int,
        default=2,
        metavar="K",
        help="lossy kills (SIGKILL with the page cache lost) per schedule (default 2)",
    )
    faults.add_argument("--json", action="store_true", help="print one JSON object")
    faults.add_argument(
        "--expect-silent-loss",
        action="store_true",
        help="exit 0 iff some acknowledged record was lost silently",
    )
    faults.add_argument(
        "--replay", type=Path, metavar="FILE", help="run the one schedule of a replay file"
    )
    faults.add_argument(
        "--save-dir",
        type=Path,
        default=Path("metactl-faults"),
        help="where shrunk failing schedules are written (default ./metactl-faults)",
    )
    faults.add_argument(
        "--shrink-max", type=int, default=3, help="failing schedules to shrink and save"
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

    import msgspec

    from controller.core.config import ControllerConfig
    from metactl.errors import MetactlError
    from simulation.faults import Mode, replay, run_faults
    from simulation.faults_schedule import load_replay

    try:
        if args.replay is not None:
            doc = load_replay(args.replay)
            summary = replay(doc.schedule, doc.mode)
        else:
            if args.schedules < 1 or args.lossy_kills < 0:
                raise ValueError("--schedules must be positive and --lossy-kills not negative")
            rules = rule_mode(args)
            # The config refuses a bad combination (InvalidConfigurationError) before a run.
            ControllerConfig(unclean_recovery_strategy=args.strategy, **rules)
            mode = Mode(
                strategy=args.strategy,
                **rules,
                lie_clean_shutdown="lie-clean-shutdown" in args.mutant,
                hw_ignores_min_isr="hw-ignores-min-isr" in args.mutant,
                isr_join_ignores_hw="isr-join-ignores-hw" in args.mutant,
            )
            progress = None if args.json else (lambda line: print(line, file=sys.stderr))
            summary = run_faults(
                schedules=args.schedules,
                seed=args.seed,
                mode=mode,
                lossy_kills=args.lossy_kills,
                save_dir=args.save_dir,
                shrink_max=args.shrink_max,
                progress=progress,
            )
    except (MetactlError, ValueError, msgspec.ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary.to_json(), sort_keys=True))
    else:
        for line in summary.lines():
            print(line)
    silent = summary.lost_silent > 0
    if args.expect_silent_loss:
        return 0 if silent else 3
    return 3 if silent or summary.invariant_violations else 0


def _history(args: argparse.Namespace) -> int:
    from metactl.errors import MetactlError
    from simulation.history import simulate_history
    from simulation.history_config import HistoryConfig, parse_time_ms

    try:
        if args.brokers < 1 or args.partitions < 1 or args.days <= 0:
            raise ValueError("--brokers, --partitions and --days must be positive")
        if args.replication_factor > args.brokers:
            raise ValueError("--replication-factor cannot exceed --brokers")
        extra = {} if args.start is None else {"start_ms": parse_time_ms(args.start)}
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
    except (MetactlError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    return 0
