"""`metactl log …`: dump, verify and tail the metadata log in a data directory.

These commands only read: they open the log read-only, so they are safe next to a running
controller, and they never repair or rewrite anything. They hold no rules; a record is
printed, never interpreted (`metactl events` interprets). `--data-dir` is a cluster's data
directory (`./data`) or the controller's (`./data/controller`), or the log file itself
(`log dump --files F` too, kafka-dump-log's spelling).
Errors are printed as ``error: CODE: message`` on stderr with the exit status of the
one table (ops/cli.py, docs/cli.md), never as a traceback; Ctrl-C exits 130.

This module owns the commands' arguments and what they do; their lines are
`ops.log_lines`', imported with the log's reader when a command runs, not to build its
parser (issue 34).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from metactl.errors import (
    CorruptLogError,
    InvalidRequestError,
    OffsetOutOfRangeError,
)
from metactl.logs import configure
from metactl.numbers import long_arg
from metadata_log.etcd.tls import add_etcd_tls_arguments
from ops.cli import EXIT_OK, EXIT_REFUSED, HELP_FORMAT, examples

EXIT_ERROR = EXIT_REFUSED  # a damaged log (`verify`)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "log",
        help="inspect the durable metadata log",
        description="Inspect the durable metadata log of a data directory (read-only).",
        epilog=examples(
            "metactl log dump --data-dir ./data --type PartitionChange",
            "metactl log verify --data-dir ./data",
            "metactl log tail --data-dir ./data --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    parser.set_defaults(help_parser=parser)
    commands = parser.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)

    dump = commands.add_parser(
        "dump",
        help="print records, one per line",
        description="Print the log's records, one per line: offset, commit time, type and "
        "the fields that say something (or every field, as JSON lines).",
        epilog=examples(
            "metactl log dump --data-dir ./data",
            "metactl log dump --data-dir ./data --type UncleanRecovery --json",
            "metactl log dump --data-dir ./data/controller --from 100 --to 200",
            "metactl log dump --files ./data/controller/metadata.log.sqlite",
        ),
        formatter_class=HELP_FORMAT,
    )
    _add_data_dir(dump, "--files")
    dump.add_argument(
        "--from",
        dest="from_offset",
        type=long_arg,
        metavar="OFFSET",
        help="first offset (default: the start of the log)",
    )
    dump.add_argument(
        "--to",
        dest="to_offset",
        type=long_arg,
        metavar="OFFSET",
        help="stop before this offset (default: the end of the log)",
    )
    _add_output_options(dump)
    dump.set_defaults(func=_dump)

    verify = commands.add_parser(
        "verify",
        help="check every CRC and the offset continuity; exit 1 on damage",
        description="Check every batch's CRC, record count and offset continuity, every "
        "record's decoding, every snapshot and SQLite's quick_check. Exit 1 on damage, "
        "naming the file and the first bad offset.",
        epilog=examples(
            "metactl log verify --data-dir ./data",
            "metactl log verify --data-dir ./data/controller/metadata.log.sqlite",
        ),
        formatter_class=HELP_FORMAT,
    )
    _add_data_dir(verify)
    verify.set_defaults(func=_verify)

    tail = commands.add_parser(
        "tail",
        help="follow new records until Ctrl-C",
        description="Print records as they are committed, until Ctrl-C (exit 130). "
        "`metactl events --follow` prints the same as readable events.",
        epilog=examples(
            "metactl log tail --data-dir ./data",
            "metactl log tail --data-dir ./data --from 0 --type FenceBroker",
        ),
        formatter_class=HELP_FORMAT,
    )
    _add_data_dir(tail)
    tail.add_argument(
        "--from",
        dest="from_offset",
        type=long_arg,
        metavar="OFFSET",
        help="first offset (default: the current end)",
    )
    _add_output_options(tail)
    tail.set_defaults(func=_tail)

    mirror = commands.add_parser(
        "mirror",
        help="copy a log (e.g. one on etcd) into a SQLite log file, batch for batch",
        description="Copy the log's batches (same offsets, timestamps and CRCs) and "
        "snapshots into a new SQLite log in --to, as of its end when the copy starts. The "
        "audits and the Parquet export read SQLite log files: mirror an etcd log to audit "
        "it. The copy is renamed into place only once complete.",
        epilog=examples(
            "metactl log mirror --data-dir etcd://127.0.0.1:2379/metactl --to ./mirror",
            "metactl audit elections --data-dir ./mirror",
        ),
        formatter_class=HELP_FORMAT,
    )
    _add_data_dir(mirror)
    mirror.add_argument(
        "--to",
        required=True,
        metavar="DIR",
        help="the directory to write metadata.log.sqlite in; it must not hold one (required)",
    )
    mirror.set_defaults(func=_mirror)


def _add_data_dir(parser: argparse.ArgumentParser, *aliases: str) -> None:
    parser.add_argument(
        "--data-dir",
        *aliases,
        dest="data_dir",
        required=True,
        metavar="DIR|URL",
        help="a cluster's data directory (./data) or the controller's (./data/controller), "
        "the log file itself, or an etcd log's URL (etcd://HOST:PORT/PREFIX) (required)"
        + (f"; {', '.join(aliases)}: an alias (kafka-dump-log's)" if aliases else ""),
    )
    add_etcd_tls_arguments(parser)


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="only records of this type, e.g. PartitionChange (repeatable, comma-separated; "
        "default: every type)",
    )
    parser.add_argument(
        "--json", action="store_true", help="JSON lines instead of text (default: text)"
    )


# --- commands --------------------------------------------------------------------------------


def _dump(args: argparse.Namespace) -> int:
    from ops.log_lines import print_entries, type_filter
    from ops.paths import open_log

    async def run() -> int:
        types = type_filter(args.types)
        async with await open_log(args.data_dir) as store:
            first = store.start_offset if args.from_offset is None else args.from_offset
            end = store.end_offset
            if first > end:
                raise OffsetOutOfRangeError(
                    f"--from {first} is past the end of the log ({end}) in {store.location}"
                )
            last = end if args.to_offset is None else min(args.to_offset, end)
            if last < first:
                raise InvalidRequestError(f"--to {last} is before --from {first}")
            async for chunk in store.iter_chunks(first, last):
                print_entries(chunk, types, args.json, sys.stdout)
        return EXIT_OK

    return run_command(run)


def _verify(args: argparse.Namespace) -> int:
    from ops.paths import open_log

    async def run() -> int:
        async with await open_log(args.data_dir, verify_tail=False) as store:
            try:
                report = await store.verify()
            except CorruptLogError as exc:
                print(f"error: {exc}", file=sys.stderr)
                print(f"file: {exc.path}", file=sys.stderr)
                where = "unknown" if exc.offset is None else str(exc.offset)
                print(f"first bad offset: {where}", file=sys.stderr)
                return EXIT_ERROR
        snapshots = report.snapshot_offsets
        print(
            f"ok: {report.location}: {report.records:,} records in {report.batches:,} batches, "
            f"offsets [{report.start_offset}, {report.end_offset}), "
            f"{report.payload_bytes:,} payload bytes, {len(snapshots)} snapshot(s)"
            + (f" at {', '.join(map(str, snapshots))}" if snapshots else "")
        )
        return EXIT_OK

    return run_command(run)


def _tail(args: argparse.Namespace) -> int:
    from ops.log_lines import print_entries, type_filter
    from ops.paths import open_log

    async def run() -> int:
        types = type_filter(args.types)
        async with await open_log(args.data_dir) as store:
            position = store.end_offset if args.from_offset is None else args.from_offset
            while True:
                entries = await store.read(position, 1000)
                if entries:
                    print_entries(entries, types, args.json, sys.stdout)
                    sys.stdout.flush()
                    position = entries[-1].offset + 1
                else:
                    await store.wait_for(position)

    return run_command(run)


def _mirror(args: argparse.Namespace) -> int:
    async def run() -> int:
        from metadata_log.mirror import mirror_to_sqlite
        from ops.paths import open_log

        async with await open_log(args.data_dir) as store:
            report = await mirror_to_sqlite(store, args.to)
        print(
            f"mirrored {report.source}: offsets [{report.start_offset}, {report.end_offset}), "
            f"{report.batches:,} batches, {report.snapshots} snapshot(s) to {report.path} "
            f"in {report.seconds:.1f} s"
        )
        return EXIT_OK

    return run_command(run)


def run_command(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run a command's coroutine with library warnings off (the command reports problems
    itself); `ops.cli.main` turns what escapes into its line and exit status."""
    import asyncio

    configure(json=False, level=logging.ERROR)
    status = asyncio.run(main())
    sys.stdout.flush()  # a reader gone (`| head`) is main's BrokenPipeError, not one at exit
    return status
