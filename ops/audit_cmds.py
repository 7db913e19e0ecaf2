"""`metactl audit JOB`: Spark audits of election history (see `audit.jobs`).

Each job reads one or more data directories (through the ``metactl`` Spark data source)
or a Parquet export, prints a summary, and with ``--out DIR`` writes its tables (Parquet,
or CSV with ``--format csv``), ``summary.txt`` and a static ``report.html``.

Before Spark starts, the inputs are checked: every ``--data-dir`` must hold a metadata
log (the cluster's data dir or the controller's, `ops.paths.resolve_log_dir`), a
``--parquet`` export must exist, and a data directory is refused with a master other
than a local one (executors on other machines cannot open the controller's SQLite
file: export it to storage they can read, then ``--parquet``). While the jobs run, a
progress bar per Spark job (`audit.progress`); Spark's own output only with
``--verbose``. Ctrl-C cancels the jobs, stops the session and exits 130.

``audit all`` runs every job in one session (one JVM start-up instead of five). While
Spark starts, a line every few seconds says so (with progress on); when the command
returns, the JVM it started is gone (`audit.spark.stop_jvm`: stopped, waited for within a
bound, killed if it overstays).

PySpark is an optional part of metactl: nothing here imports it before an audit runs
(``metactl --help`` and ``metactl audit --help`` never do), and without it an audit says
in one line how to get it (PYSPARK_NOT_FOUND).

Exit status (`ops.cli`'s table): 0; 1 when ``invariants`` finds a violation, or a Spark
job fails; 2 for bad arguments; 4 when an input, or Java, is not found; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from metactl.errors import (
    InvalidConfigurationError,
    JavaNotFoundError,
    MetactlError,
    SparkJobFailedError,
    error_for_code,
)
from metactl.numbers import int_arg
from ops.cli import EXIT_INTERRUPTED, HELP_FORMAT, examples, fail
from ops.export_cmds import add_source_options, input_from_args

JOB_HELP = {
    "elections": "elections per topic and kind over time; preferred-leader imbalance",
    "unclean-recoveries": "every potential data-loss event: candidates, choice, margin, delay",
    "offline": "per partition: offline intervals (p50/p99/max), time under MinISR, on the ELR",
    "brokers": "fences, unfences, unclean registrations and flapping per broker",
    "invariants": "replay every partition's history and flag every rule violation",
}

ALL = "all"
ALL_HELP = (
    "every audit (elections, unclean-recoveries, offline, brokers, invariants) in one Spark "
    "session; --out DIR gets one directory per job"
)

JOB_EXAMPLES = {
    "elections": (
        "metactl audit elections --data-dir ./data --bucket hour",
        "metactl audit elections --parquet /shared/pq --master spark://10.0.0.5:7077",
    ),
    "unclean-recoveries": (
        "metactl audit unclean-recoveries --data-dir ./data --out /tmp/audit/unclean",
        "metactl audit unclean-recoveries --data-dir ./data --since 7d",
    ),
    "offline": (
        "metactl audit offline --data-dir ./data",
        "metactl audit offline --parquet /tmp/pq --since 2026-11-01 --until 2026-11-08",
    ),
    "brokers": (
        "metactl audit brokers --data-dir ./data --flap-fences 3 --flap-window 10m",
        "metactl audit brokers --data-dir /a/data --data-dir /b/data --out /tmp/audit/b",
    ),
    "invariants": (
        "metactl audit invariants --data-dir ./data        # exit 1 on any violation",
        "metactl audit invariants --parquet /tmp/pq --show 50",
    ),
    ALL: (
        "metactl audit all --data-dir ./data --out /tmp/audit    # /tmp/audit/elections/...",
        "metactl audit all --parquet /shared/pq --master spark://10.0.0.5:7077 "
        "--conf spark.executor.memory=2g",
    ),
}

# A metactl error that crossed an executor's Python worker: `...errors.CorruptLogError:
# CORRUPT_MESSAGE: batch CRC mismatch (...)` somewhere in Spark's message.
_WORKER_ERROR = re.compile(r"metactl\.errors\.\w+: ([A-Z][A-Z_]+): (.+)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="Spark audits of the election history in metadata logs",
        description="Spark audits of the election history in metadata logs (audit/README.md).",
        epilog=examples(
            "metactl audit elections --data-dir ./data",
            "metactl audit invariants --parquet /tmp/pq --master spark://127.0.0.1:7077",
            "metactl audit JOB --help",
        ),
        formatter_class=HELP_FORMAT,
    )
    jobs = parser.add_subparsers(dest="audit_job", metavar="JOB", required=True)
    for job, text in {**JOB_HELP, ALL: ALL_HELP}.items():
        p = jobs.add_parser(
            job,
            help=text,
            description=text,
            epilog=examples(*JOB_EXAMPLES[job]),
            formatter_class=HELP_FORMAT,
        )
        add_source_options(p)
        p.add_argument(
            "--master",
            default="local[*]",
            help="Spark master (default local[*]); with spark://HOST:PORT read --parquet",
        )
        p.add_argument("--out", type=Path, help="write tables, summary.txt and report.html here")
        p.add_argument(
            "--format",
            choices=("parquet", "csv"),
            default="parquet",
            help="table files under --out (default parquet)",
        )
        p.add_argument(
            "--since",
            help="start of the window: a duration back from now (10m, 2h, 7d), an ISO 8601 "
            "time (UTC) or epoch ms (default: the log's start)",
        )
        p.add_argument(
            "--until",
            help="end of the window, exclusive, in the same forms (default: the log's end)",
        )
        p.add_argument(
            "--shuffle-partitions",
            type=int_arg,
            help="spark.sql.shuffle.partitions (default: Spark's, 200)",
        )
        p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
        p.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="any other Spark setting, as spark-submit's --conf (repeatable; e.g. "
            "spark.executor.memory=2g, spark.cores.max=8)",
        )
        p.add_argument(
            "--progress",
            choices=("auto", "bars", "lines", "off"),
            default="auto",
            help="progress per Spark job on stderr: bars, one line per job start and end, "
            "or off (default auto: bars on a terminal, else off)",
        )
        p.add_argument(
            "--verbose",
            action="store_true",
            help="show Spark's own log (WARN and up) and the JVM's output (default: quiet)",
        )
        if job in ("elections", ALL):
            p.add_argument(
                "--bucket",
                choices=("minute", "hour", "day"),
                help="time bucket (default: from the window's span)",
            )
        if job in ("brokers", ALL):
            p.add_argument(
                "--flap-fences",
                type=int_arg,
                default=3,
                help="flapping: more than N fences (default 3)",
            )
            p.add_argument(
                "--flap-window", default="10m", help="within this long (default 10m; 1h, 30s)"
            )
        if job in ("unclean-recoveries", "invariants", ALL):
            p.add_argument("--show", type=int_arg, default=20, help="events to print (default 20)")
        if job in ("invariants", ALL):
            p.add_argument(
                "--method",
                choices=("auto", "logs", "buckets", "rows"),
                default="auto",
                help="logs: check straight from data directories; buckets: one task per "
                "bucket of a `metactl log export` (no shuffle); rows: through Spark rows, any "
                "input (default auto: logs for data directories, buckets for an export, else "
                "rows)",
            )
        p.set_defaults(func=_run)


_BARE_OR_MIN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(min)?\s*$", re.ASCII)


def flap_window_ms(text: str) -> int:
    """``--flap-window``: a duration as ``--since`` spells one (30s, 10m, 1h, 1d; the
    same parser); a bare number is seconds and ``min`` minutes, as they always were here.
    Longer than 0; INVALID_CONFIG naming the flag otherwise."""
    from ops.times import parse_duration_ms

    bare = _BARE_OR_MIN.match(text)
    spelled = f"{bare[1]}{'m' if bare[2] else 's'}" if bare else text
    window = parse_duration_ms(spelled, "--flap-window")
    if window <= 0:
        raise InvalidConfigurationError(f"--flap-window {text!r}: must be longer than 0")
    return window


def _options(args: argparse.Namespace, job: str) -> dict[str, object]:
    options: dict[str, object] = {}
    if job == "elections":
        options["bucket"] = args.bucket
    elif job == "brokers":
        options["flap_fences"] = args.flap_fences
        options["flap_window_ms"] = flap_window_ms(args.flap_window)
    elif job == "unclean-recoveries":
        options["show"] = args.show
    elif job == "invariants":
        options["show"] = args.show
        options["method"] = args.method
    return options


def _settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def java_binary() -> str:
    """The Java runtime Spark's launcher will run (``$JAVA_HOME/bin/java``, else ``java``
    on PATH, as ``spark-class`` looks); JAVA_NOT_FOUND, naming what installs one,
    before anything starts."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if os.access(java, os.X_OK):
            return str(java)
        raise JavaNotFoundError(
            f"JAVA_HOME is {home}, which holds no bin/java: the audits run Spark, which needs "
            "a Java runtime; unset JAVA_HOME, or install one with `make system` (Debian's "
            "default-jre-headless)"
        )
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(
            "no `java` on PATH: the audits run Spark, which needs a Java runtime; install "
            "one with `make system` (Debian's default-jre-headless)"
        )
    return found


def check_master(master: str, data_dirs: tuple[str, ...]) -> None:
    """A data directory with a cluster master is refused: its executors, on other
    machines, cannot open the controller's SQLite file."""
    from audit.spark import is_local_master

    if data_dirs and not is_local_master(master):
        raise InvalidConfigurationError(
            f"--data-dir reads the controller's SQLite log, which the executors of "
            f"--master {master} cannot open from other machines; export it first "
            f"(metactl log export --data-dir DIR --parquet OUT, OUT on storage every "
            f"worker can read) and audit with --parquet OUT"
        )


def _run(args: argparse.Namespace) -> int:
    names = list(JOB_HELP) if args.audit_job == ALL else [args.audit_job]
    try:
        # Everything that can be checked without Spark is checked before it starts.
        from audit.spark import require_pyspark

        require_pyspark()  # PYSPARK_NOT_FOUND: one line saying how to install it
        inp = input_from_args(args, since=args.since, until=args.until)
        options = {job: _options(args, job) for job in names}
        extra = _settings(args.conf)
        check_master(args.master, inp.data_dirs)
        if "invariants" in names:
            from audit.jobs.invariants import pick_method

            pick_method(inp, args.method)  # a method that cannot read the input: exit 2
        java_binary()
    except ValueError as exc:
        return fail(InvalidConfigurationError(str(exc)))
    except (MetactlError, OSError) as exc:
        return fail(exc)
    from audit.progress import default_mode

    mode = None if args.progress == "auto" else args.progress
    showing = (mode or default_mode(sys.stderr)) != "off"
    if showing:
        # At once, before the imports and the JVM that take seconds (issue 22: a loaded
        # machine showed nothing for 120 s): then a line every few seconds until Spark is
        # up (issue 34), then the bars, one per Spark job.
        print(f"starting Spark ({args.master})…", file=sys.stderr, flush=True)
    results = []
    owned = False  # this command started the JVM: it stops it before returning
    with _interruptible(verbose=args.verbose) as interrupted:
        started = time.perf_counter()
        try:
            from audit.jobs import MODULES
            from audit.progress import JobProgress, StartTicker
            from audit.spark import get_session, jvm_running

            owned = not jvm_running()
            ticking = StartTicker(args.master, sys.stderr) if showing else contextlib.nullcontext()
            with ticking:
                spark = get_session(
                    args.master,
                    shuffle_partitions=args.shuffle_partitions,
                    driver_memory=args.driver_memory,
                    extra=extra,
                    verbose=args.verbose,
                )
            interrupted.spark = spark
            _on_sigint(interrupted)  # again: SparkContext() installs its own handler
            up = time.perf_counter() - started
            for job in names:
                module = importlib.import_module(MODULES[job])
                group = f"metactl-audit-{job}-{time.time_ns()}"
                with JobProgress(spark, group, mode=mode, description=job):
                    results.append(module.run(spark, inp, **options[job]))
        except BaseException as exc:
            # After Ctrl-C, PySpark's clean-up code may raise a JVM error of its own in
            # place of the KeyboardInterrupt: whatever ends the run then, it was Ctrl-C.
            if interrupted.fired or isinstance(exc, KeyboardInterrupt):
                interrupted.wait_stopped()
                _stop_owned(owned, showing=False)
                return EXIT_INTERRUPTED
            _stop_owned(owned, showing=False)
            if isinstance(exc, MetactlError | OSError):
                return fail(exc)
            if not isinstance(exc, Exception) or os.environ.get("METACTL_DEBUG"):
                raise
            # Spark wraps worker errors: one line, not a stack.
            return fail(spark_error(exc, verbose=args.verbose))
    try:
        return _report(args, inp, results, started, up)
    finally:
        _stop_owned(owned, showing=showing)


def _stop_owned(owned: bool, *, showing: bool) -> None:
    """Stop the session and the JVM this command started (`audit.spark.stop_jvm`), so
    that none of it outlives the command; a session it found running (a test suite's,
    another caller's in this process) is not its to stop."""
    if not owned:
        return
    from audit.spark import active_session, stop_jvm, writes_archive

    if showing and writes_archive():
        print(
            "stopping Spark: its JVM writes the class-data archive (once per machine)…",
            file=sys.stderr,
            flush=True,
        )
    stop_jvm(active_session())


def _report(
    args: argparse.Namespace, inp: Any, results: list[Any], started: float, up: float
) -> int:
    """Every result's summary, and its files with --out; the exit status."""
    for i, result in enumerate(results):
        if i:
            print()
        for line in result.summary:
            print(line)
        if args.out is not None:
            from audit.report import write_outputs

            out = args.out / result.job if args.audit_job == ALL else args.out
            paths = write_outputs(result, out, args.format)
            print(f"wrote {len(paths)} files to {out} (report: {out / 'report.html'})")
    hint = parquet_hint(inp.data_dirs, args.data_dir or [])
    if hint:
        print(hint)
    total = time.perf_counter() - started
    print(f"({total:.1f} s on {args.master}, of which {up:.1f} s starting Spark)")
    return max(int(r.exit_status) for r in results)


# From this many records, audits of a Parquet export beat the SQLite data source by far
# (bench/spark_audit.py: every job, 10M records, audit/README.md).
PARQUET_HINT_RECORDS = 1_000_000


def parquet_hint(data_dirs: tuple[str, ...], typed: list[str]) -> str | None:
    """One line when the logs are large enough that a Parquet export would make audits
    faster; None otherwise (Parquet input, or small logs). `typed`: --data-dir as given."""
    from audit.logread import log_info

    if not data_dirs:
        return None
    records = sum(log_info(d).end_offset - log_info(d).start_offset for d in data_dirs)
    if records < PARQUET_HINT_RECORDS:
        return None
    return (
        f"hint: {records:,} records read from SQLite; audits of a Parquet export run "
        f"several times faster: metactl log export --data-dir {','.join(typed or data_dirs)} "
        f"--parquet OUT, then --parquet OUT"
    )


def spark_error(exc: BaseException, *, verbose: bool = False) -> MetactlError:
    """A Spark failure as a named error: a metactl error raised in an executor keeps
    its code; anything else is SPARK_JOB_FAILED with Spark's first telling line."""
    text = str(exc)
    found = _WORKER_ERROR.search(text)
    if found is not None:
        return error_for_code(found.group(1), found.group(2).strip())
    return SparkJobFailedError(
        f"{type(exc).__name__}: {_first_line(exc)}"
        + ("" if verbose else " (--verbose shows Spark's log)")
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error:" in line or "Exception:" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- Ctrl-C --------------------------------------------------------------------------------


class _Interrupted:
    """Ctrl-C during an audit: fired once; stops the session (if any) in the background
    at once, so that the jobs are cancelled while the main thread unwinds."""

    STOP_WAIT_S = 10.0

    def __init__(self) -> None:
        self.fired = False
        self.spark: Any = None
        self.stopper: threading.Thread | None = None

    def fire(self) -> None:
        self.fired = True
        if self.spark is not None and self.stopper is None:
            from audit.spark import stop_in_background

            self.stopper = stop_in_background(self.spark)

    def wait_stopped(self) -> None:
        self.fire()  # a KeyboardInterrupt that did not come through our handler
        if self.stopper is not None:
            self.stopper.join(self.STOP_WAIT_S)


def _on_sigint(state: _Interrupted) -> None:
    """SIGINT, once: start stopping Spark from another thread, then KeyboardInterrupt.
    No JVM call in the handler itself (PySpark's own handler makes one, on a connection
    that may be mid-call)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if not state.fired:
            state.fire()
            raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)


def _not_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


@contextmanager
def _interruptible(*, verbose: bool) -> Iterator[_Interrupted]:
    """Our SIGINT handler for the block (in the main thread; elsewhere signals stay as
    they are), the previous one restored after it. Unless `verbose`, py4j's own log
    records (it logs an interrupted call with its stack) and PySpark's warnings are
    dropped: the command reports what happened in one line of its own."""
    state = _Interrupted()
    previous: Any = signal.getsignal(signal.SIGINT)
    _on_sigint(state)
    root = logging.getLogger()
    with warnings.catch_warnings():
        if not verbose:
            root.addFilter(_not_py4j)
            warnings.filterwarnings("ignore", module=r"pyspark(\.|$)")
        try:
            yield state
        finally:
            root.removeFilter(_not_py4j)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, previous)
