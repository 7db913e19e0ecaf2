"""`metactl simulate history`: a long random history through the real controller core.

See `simulation.history` for what happens. The output is an ordinary data directory: every
``metactl log`` and ``metactl audit`` command reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


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
