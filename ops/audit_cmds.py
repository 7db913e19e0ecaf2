"""`metactl audit JOB`: Spark audits of election history (see `audit.jobs`).

Each job reads one or more data directories (through the ``metactl`` Spark data source)
or a Parquet export, prints a summary, and with ``--out DIR`` writes its tables (Parquet,
or CSV with ``--format csv``), ``summary.txt`` and a static ``report.html``. Exit status:
0, or 1 when ``invariants`` finds a violation; errors print ``error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from ops.export_cmds import add_source_options, input_from_args

JOB_HELP = {
    "elections": "elections per topic and kind over time; preferred-leader imbalance",
    "unclean-recoveries": "every potential data-loss event: candidates, choice, margin, delay",
    "offline": "per partition: offline intervals (p50/p99/max), time under MinISR, on the ELR",
    "brokers": "fences, unfences, unclean registrations and flapping per broker",
    "invariants": "replay every partition's history and flag every rule violation",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="Spark audits of the election history in metadata logs",
        description="Spark audits of the election history in metadata logs.",
    )
    jobs = parser.add_subparsers(dest="audit_job", metavar="JOB", required=True)
    for job, text in JOB_HELP.items():
        p = jobs.add_parser(job, help=text, description=text)
        add_source_options(p)
        p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        p.add_argument("--out", type=Path, help="write tables, summary.txt and report.html here")
        p.add_argument("--format", choices=("parquet", "csv"), default="parquet")
        p.add_argument("--since", help="start of the window (ISO 8601 UTC, or epoch ms)")
        p.add_argument("--until", help="end of the window, exclusive (ISO 8601 UTC, or epoch ms)")
        p.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions")
        p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
        if job == "elections":
            p.add_argument("--bucket", choices=("minute", "hour", "day"), help="time bucket")
        if job == "brokers":
            p.add_argument("--flap-fences", type=int, default=3, help="flapping: more than N")
            p.add_argument("--flap-window", default="10m", help="within this long (10m, 1h)")
        if job in ("unclean-recoveries", "invariants"):
            p.add_argument("--show", type=int, default=20, help="events to print (default 20)")
        if job == "invariants":
            p.add_argument(
                "--method",
                choices=("auto", "logs", "rows"),
                default="auto",
                help="logs: check straight from data directories; rows: through Spark rows",
            )
        p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from audit.jobs import MODULES
    from audit.jobs.brokers import parse_duration_ms
    from audit.report import write_outputs
    from audit.spark import get_session

    try:
        inp = input_from_args(args, since=args.since, until=args.until)
        options: dict[str, object] = {}
        if args.audit_job == "elections":
            options["bucket"] = args.bucket
        elif args.audit_job == "brokers":
            options["flap_fences"] = args.flap_fences
            options["flap_window_ms"] = parse_duration_ms(args.flap_window)
        elif args.audit_job == "unclean-recoveries":
            options["show"] = args.show
        elif args.audit_job == "invariants":
            options["show"] = args.show
            options["method"] = args.method
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        spark = get_session(
            args.master,
            shuffle_partitions=args.shuffle_partitions,
            driver_memory=args.driver_memory,
        )
        module = importlib.import_module(MODULES[args.audit_job])
        result = module.run(spark, inp, **options)
    except Exception as exc:  # Spark wraps worker errors; report them, not a traceback
        print(f"error: {type(exc).__name__}: {_first_line(exc)}", file=sys.stderr)
        return 2
    for line in result.summary:
        print(line)
    if args.out is not None:
        paths = write_outputs(result, args.out, args.format)
        print(f"wrote {len(paths)} files to {args.out} (report: {args.out / 'report.html'})")
    print(f"({time.perf_counter() - started:.1f} s on {args.master})")
    return int(result.exit_status)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error:" in line or "Exception:" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__
