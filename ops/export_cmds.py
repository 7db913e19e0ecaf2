"""`metactl log export`: a metadata log as Parquet in the audit schema (see `audit.export`).

This module adds ``export`` to the ``log`` command (registered by `ops.log_cmds`, which
must come first in `ops.cli.COMMAND_MODULES`). It also holds the input options that the
audit commands share: ``--data-dir`` (repeatable, or comma-separated) or ``--parquet``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    log_parser = subparsers.choices.get("log")
    if log_parser is None:
        log_parser = subparsers.add_parser("log", help="inspect the durable metadata log")
    commands = next(
        (a for a in log_parser._actions if isinstance(a, argparse._SubParsersAction)), None
    )
    if commands is None:
        commands = log_parser.add_subparsers(
            dest="log_command", metavar="SUBCOMMAND", required=True
        )
    export = commands.add_parser(
        "export",
        help="write the log as Parquet in the audit schema, partitioned by date",
        description="Write every record as one row of the audit schema to a Parquet "
        "dataset OUT/date=YYYY-MM-DD/ (read-only on the log; no Spark needed).",
    )
    export.add_argument(
        "--data-dir",
        action="append",
        required=True,
        help="data directory (or log file); repeat or comma-separate for several clusters",
    )
    export.add_argument("--parquet", required=True, type=Path, help="output directory")
    export.add_argument("--cluster", action="append", help="cluster name(s), one per data dir")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty output")
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from audit.export import export_parquet
    from metactl.errors import MetactlError

    try:
        report = export_parquet(
            _split(args.data_dir),
            args.parquet,
            clusters=_split(args.cluster),
            overwrite=args.overwrite,
        )
    except (MetactlError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    return 0


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """--data-dir D [--data-dir D2 ...] | --parquet P, and --cluster names."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--data-dir",
        action="append",
        help="data directory (or log file); repeat or comma-separate for several clusters",
    )
    src.add_argument("--parquet", help="a `metactl log export` output directory")
    parser.add_argument(
        "--cluster", action="append", help="cluster name(s) for the data dirs (default: names)"
    )


def input_from_args(args: argparse.Namespace, since: str | None, until: str | None) -> Any:
    from audit.spark import AuditInput
    from simulation.history_config import parse_time_ms

    return AuditInput.of(
        _split(args.data_dir) or None,
        args.parquet,
        clusters=tuple(_split(args.cluster)),
        since_ms=parse_time_ms(since) if since else None,
        until_ms=parse_time_ms(until) if until else None,
    )
