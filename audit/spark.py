"""The Spark session the audits run in, and how jobs load records from either form.

`get_session` makes (or reuses) one session with settings the audits rely on: UTC session
time zone (buckets and dates are UTC), Arrow transfers, no UI, and Python workers that
run this interpreter with this source tree importable. Jobs get their input through
`AuditInput.load`, which reads data directories through the ``metactl`` data source or
a Parquet export, with the same columns either way.

The session is an operator's tool, not a service (issue 13):

* a local master (``local``, ``local[N]``) or one on a loopback address binds the driver
  to 127.0.0.1 (``spark.driver.host``/``bindAddress`` and ``SPARK_LOCAL_IP``), so an
  audit opens no port on the machine's external interface;
* the JVM gets its own session (process group), so a terminal's Ctrl-C reaches only this
  process, which cancels the jobs and stops the session (`stop_in_background`); the JVM
  and its Python workers never print a stack of their own;
* Spark's own output (the JVM's stdout and stderr, log4j) is discarded unless
  ``verbose``; errors still reach the caller as exceptions;
* the driver JVM maps Spark's classes from a class-data sharing archive that the first
  audit on the machine writes (`audit.cds`): about half the start-up time;
* a command that started the JVM stops it before it returns (`stop_jvm`): the session
  stopped, the JVM told to exit and waited for within a bound (longer while it writes
  the archive), killed with what it started if it overstays (issue 34: a JVM left
  behind kept a core busy for a minute).

PySpark is imported by the functions that use it, never at module level: `AuditInput`
and the checks before Spark starts work without it (the CLI then says how to install
it, ``metactl --help`` never loads it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from audit.schema import (
    CLUSTER,
    COLUMN_NAMES,
    OFFSET,
    RECORD_TYPE,
    TIMESTAMP,
    check_columns,
    check_types,
    spark_schema,
)
from audit.transactions import MARKER_TYPES, OPEN_END, aborted_ranges
from metactl.errors import PySparkNotFoundError

DEFAULT_MASTER: Final = "local[*]"
LOOPBACK: Final = "127.0.0.1"
JVM_EXIT_S: Final = 20.0  # how long a stopped driver JVM may take to exit
JVM_ARCHIVE_EXIT_S: Final = 180.0  # ... when it writes the class-data archive at exit
_WRITES_ARCHIVE: list[bool] = [False]  # the JVM this process launched writes one (`audit.cds`)


PYSPARK_HINT: Final = "the audits need PySpark: run `make audit` (or `pip install -e '.[audit]'`)"


def require_pyspark() -> None:
    """PYSPARK_NOT_FOUND, in one line saying how to install it, when PySpark cannot be
    imported (an optional extra of metactl): before anything that needs it starts."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise PySparkNotFoundError(PYSPARK_HINT) from None


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: executors in this process."""
    return master == "local" or master.startswith("local[")


def master_on_loopback(master: str) -> bool:
    """A local master, or a cluster master whose address is this machine's loopback."""
    if is_local_master(master):
        return True
    host = urlsplit(master).hostname
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _prepare_python_env() -> None:
    """Executors' Python workers: this interpreter, with this source tree on the path."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def _launch_jvm(settings: dict[str, str], *, verbose: bool) -> None:
    """Start the driver JVM (spark-submit) unless this process has one: in its own
    session, so that a terminal's SIGINT does not reach it or its Python workers, and
    with its output discarded unless `verbose`. `launch_gateway` is PySpark's own
    launcher; `popen_kwargs` is its documented hook for exactly this."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None:
        return
    from audit import cds

    plan = cds.plan()
    if plan is not None:
        key = "spark.driver.extraJavaOptions"
        settings[key] = " ".join(filter(None, (plan.java_options, settings.get(key))))
    conf = SparkConf(loadDefaults=False)
    for key, value in settings.items():
        conf.set(key, value)
    popen: dict[str, Any] = {"start_new_session": True}
    if not verbose:
        popen.update(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = _launch_or_kill(conf, popen)
    _WRITES_ARCHIVE[0] = plan is not None and plan.writing is not None
    if plan is not None:
        cds.note_jvm(plan, gateway.proc.pid)
    SparkContext._ensure_initialized(gateway=gateway)


def _launch_or_kill(conf: Any, popen: dict[str, Any]) -> Any:
    """`launch_gateway`, and if it does not return (Ctrl-C while the JVM starts), kill
    the JVM it started: PySpark removes the directory where the JVM reports its port, the
    JVM's main thread then dies, and its py4j server thread would keep it alive for ever.
    PySpark does not hand the process out on failure, so its `Popen` is wrapped for the
    call (SIGINT held while the process is created, so it is always recorded)."""
    from pyspark import java_gateway as module

    gw: Any = module  # its Popen is an import, not an export: typed loosely here
    started: list[subprocess.Popen[bytes]] = []
    original = gw.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        held = threading.current_thread() is threading.main_thread()
        if held:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc: subprocess.Popen[bytes] = original(*args, **kwargs)
            started.append(proc)
            return proc
        finally:
            if held:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    gw.Popen = recorded
    try:
        return gw.launch_gateway(conf, popen_kwargs=popen)
    except BaseException:
        for proc in started:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the JVM and children
            proc.wait()
        raise
    finally:
        gw.Popen = original


def get_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "metactl-audit",
    shuffle_partitions: int | None = None,
    driver_memory: str | None = "4g",
    extra: dict[str, str] | None = None,
    verbose: bool = False,
) -> Any:
    """A local (or given-master) Spark session with the metactl data source registered.

    The first call in a process starts the JVM (see the module documentation); later
    calls reuse its session (``getOrCreate``: start-up settings of the first call win).
    """
    _prepare_python_env()
    from pyspark.sql import SparkSession

    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        "spark.python.worker.reuse": "true",
    }
    if master_on_loopback(master):
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK  # the JVM's environment: no other address
        settings["spark.driver.host"] = LOOPBACK
        settings["spark.driver.bindAddress"] = LOOPBACK
    if not is_local_master(master):
        # Executors elsewhere import the data source and the jobs from this tree too.
        settings["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    settings.update(extra or {})
    _launch_jvm(settings, verbose=verbose)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    from audit.source import register

    register(spark)
    return spark


def jvm_running() -> bool:
    """This process has a driver JVM (launched, or attached to) already."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def active_session() -> Any:
    """The session this process runs, if any (None: none, or it was stopped)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def writes_archive() -> bool:
    """The JVM this process launched writes the class-data archive when it exits."""
    return _WRITES_ARCHIVE[0]


def stop_jvm(spark: Any, bound_s: float | None = None) -> bool:
    """Stop `spark` (if any), then the driver JVM this process launched, and wait for it
    to exit: the py4j gateway closed, the JVM's stdin closed (PySpark's gateway server
    exits at its end of file), its exit awaited for `bound_s` (default `JVM_EXIT_S`, or
    `JVM_ARCHIVE_EXIT_S` while it writes the class-data archive). One that overstays is
    killed with its session (its own: the Python workers it started go too). True when
    it exited by itself (or there was none). The next session launches a new JVM."""
    from pyspark import SparkContext

    if spark is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone already
            spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    SparkContext._gateway = None
    SparkContext._jvm = None
    if gateway is None:
        return True
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is None:
        return True
    bound = (
        bound_s if bound_s is not None else (JVM_ARCHIVE_EXIT_S if writes_archive() else JVM_EXIT_S)
    )
    with contextlib.suppress(OSError):
        proc.stdin.close()
    exited = True
    try:
        proc.wait(bound)
    except subprocess.TimeoutExpired:
        exited = False
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _WRITES_ARCHIVE[0] = False
    _end_session(proc.pid)
    return exited


def _session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (from /proc; none where there is no /proc)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if fields[0] != b"Z" and int(fields[3]) == sid:
                found.append(int(entry))
    return found


def _end_session(sid: int, bound_s: float = 5.0) -> None:
    """The JVM's session once the JVM is gone: its Python workers (PySpark's daemon, in
    a process group of its own) exit when their pipe to the JVM closes; wait for that,
    and kill what is left after `bound_s`."""
    deadline = time.monotonic() + bound_s
    while (left := _session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # a bounded poll of process state: no event tells a session emptied
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop_in_background(spark: Any) -> threading.Thread:
    """Cancel every running job and stop the session, from a thread of its own: the
    caller may be a signal handler whose thread is inside a JVM call, on a connection
    that cannot carry another. Join the returned thread to wait for it."""

    def stop() -> None:
        try:
            sc = spark.sparkContext
            sc.setLogLevel("OFF")
            sc.cancelAllJobs()
            spark.stop()
        except Exception:  # the JVM may already be gone: nothing left to stop
            return

    worker = threading.Thread(target=stop, name="metactl-spark-stop", daemon=True)
    worker.start()
    return worker


@dataclass(frozen=True)
class AuditInput:
    """Where a job reads records from: data directories or a Parquet export (not both)."""

    data_dirs: tuple[str, ...] = ()
    parquet: str | None = None
    clusters: tuple[str, ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    _aborted: dict[str, list[tuple[int, int]]] | None = field(
        default=None, init=False, compare=False, repr=False
    )
    _manifest: Any = field(default=None, init=False, compare=False, repr=False)
    # What jobs work out once per input and share (`audit all`): see `audit.jobs.common`.
    cache: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if bool(self.data_dirs) == bool(self.parquet):
            raise ValueError("give data directories or a Parquet export, not both or neither")

    @classmethod
    def of(
        cls,
        data_dirs: Sequence[str] | str | None = None,
        parquet: str | None = None,
        **kwargs: Any,
    ) -> AuditInput:
        dirs: list[str] = []
        for item in [data_dirs] if isinstance(data_dirs, str) else data_dirs or []:
            dirs.extend(p.strip() for p in str(item).split(",") if p.strip())
        return cls(data_dirs=tuple(dirs), parquet=parquet, **kwargs)

    def _reader(self, spark: Any) -> Any:
        from audit.source import FORMAT

        reader = spark.read.format(FORMAT).option("paths", ",".join(self.data_dirs))
        if self.clusters:
            reader = reader.option("cluster", ",".join(self.clusters))
        for key, value in self.options.items():
            reader = reader.option(key, value)
        return reader

    def load(
        self,
        spark: Any,
        columns: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        any_of: str | None = None,
        *,
        include_aborted: bool = False,
    ) -> Any:
        """Records up to `until` (state needs the history before `since`; jobs apply it),
        without those of aborted or unfinished transactions (`audit.transactions`) unless
        `include_aborted`.

        `any_of` keeps only records matching one of its conditions (the data source's
        ``anyOf`` option; a Spark filter on Parquet).
        """
        from pyspark.sql import functions as F

        cols = check_columns(list(columns) if columns is not None else None)
        wanted = check_types(list(types) if types is not None else None)
        ranges = {} if include_aborted else self.aborted(spark)
        # The cuts need their columns even when the caller did not ask for them.
        needed = set(cols)
        if self.until_ms is not None:
            needed.add(TIMESTAMP)
        if ranges:
            needed.update((CLUSTER, OFFSET))
        read = check_columns(list(needed))
        if self.parquet is not None:
            df = self._parquet(spark, wanted).select(*read)
            if wanted is not None:
                df = df.where(F.col(RECORD_TYPE).isin(sorted(wanted)))
            if any_of:
                df = df.where(_any_of_condition(any_of))
        else:
            reader = self._reader(spark)
            if "partitions" not in self.options and "partitionRecords" not in self.options:
                reader = reader.option("partitions", str(self.partitions(spark)))
            if read != COLUMN_NAMES:
                reader = reader.option("columns", ",".join(read))
            if wanted is not None:
                reader = reader.option("types", ",".join(sorted(wanted)))
            if any_of:
                reader = reader.option("anyOf", any_of)
            df = reader.load()
        if self.until_ms is not None:
            df = df.where(F.unix_millis(F.col(TIMESTAMP)) < F.lit(self.until_ms))
        if ranges:
            df = _outside(df, ranges)
        return df.select(*cols)

    def manifest(self) -> Any:
        """The Parquet export's manifest (`audit.export_layout.Manifest`), or None: data
        directories, or an export of another layout (read once per input)."""
        if self.parquet is None:
            return None
        found = self._manifest
        if found is None:
            from audit.export_layout import read_manifest

            found = read_manifest(self.parquet) or False
            object.__setattr__(self, "_manifest", found)  # a cache on a frozen dataclass
        return found or None

    def _parquet(self, spark: Any, wanted: frozenset[str] | None) -> Any:
        """The export as a DataFrame. With a manifest the schema is known (no inference
        job) and the ``kind`` directories that cannot hold a wanted type are pruned."""
        from pyspark.sql import functions as F

        from audit.export_layout import CLUSTER_KIND, KIND, PARTITION_KIND, PARTITION_TYPES

        if self.manifest() is None:
            return spark.read.parquet(self.parquet)
        from pyspark.sql.types import StringType, StructField

        schema = spark_schema().add(StructField(KIND, StringType()))
        df = spark.read.schema(schema).parquet(self.parquet)
        if wanted is not None and wanted <= PARTITION_TYPES:
            df = df.where(F.col(KIND) == PARTITION_KIND)
        elif wanted is not None and not wanted & PARTITION_TYPES:
            df = df.where(F.col(KIND) == CLUSTER_KIND)
        return df

    def aborted(self, spark: Any) -> dict[str, list[tuple[int, int]]]:
        """Per cluster, the offset ranges of aborted and unfinished transactions (from the
        export's manifest, else a scan of the marker records only; once per input)."""
        ranges = self._aborted
        if ranges is None and self.manifest() is not None:
            ranges = self.manifest().aborted()
            object.__setattr__(self, "_aborted", ranges)
        if ranges is None:
            from audit.progress import aside

            markers = self.load(
                spark, (CLUSTER, OFFSET, RECORD_TYPE), MARKER_TYPES, include_aborted=True
            )
            by_cluster: dict[str, list[tuple[int, str]]] = {}
            with aside(spark, "aborted transactions"):
                found_rows = markers.collect()
            for row in found_rows:
                by_cluster.setdefault(row[CLUSTER], []).append((row[OFFSET], row[RECORD_TYPE]))
            found = {c: aborted_ranges(m) for c, m in by_cluster.items()}
            ranges = {c: r for c, r in found.items() if r}
            object.__setattr__(self, "_aborted", ranges)  # a cache on a frozen dataclass
        return ranges

    def partitions(self, spark: Any) -> int:
        """Input partitions per log: a multiple of the cores, of at most ~2M records each."""
        from audit.logread import log_info

        cores = max(1, int(spark.sparkContext.defaultParallelism))
        largest = max(
            (log_info(d).end_offset - log_info(d).start_offset for d in self.data_dirs),
            default=0,
        )
        rounds = max(1, -(-largest // (cores * 2_000_000)))
        return cores * rounds


# Up to this many closed ranges become one condition; more, a broadcast range join.
OUTSIDE_CONDITION_RANGES: Final = 16
_BLOCK: Final = 4096  # offsets per join key of the range join


def _outside(df: Any, ranges: dict[str, list[tuple[int, int]]]) -> Any:
    """The rows of `df` in none of their cluster's offset `ranges` (inclusive).

    An open range (a transaction unfinished at the end of the log, at most one per
    cluster) is one condition. Closed ranges, when few, are a condition too; when many
    (a chain of hundreds of ORs is slow to plan and to evaluate), a left anti join on
    (cluster, offset block) against the ranges cut into blocks, broadcast: each row
    probes only the ranges of its block.
    """
    from pyspark.sql import functions as F

    offset, cluster = F.col(OFFSET), F.col(CLUSTER)
    closed = {c: [(a, b) for a, b in spans if b != OPEN_END] for c, spans in ranges.items()}
    keep = F.lit(True)
    for name, spans in ranges.items():
        for first, last in spans:
            if last == OPEN_END:
                keep = keep & ~((cluster == F.lit(name)) & (offset >= F.lit(first)))
    total = sum(len(spans) for spans in closed.values())
    if total <= OUTSIDE_CONDITION_RANGES:
        for name, spans in closed.items():
            inside = F.lit(False)
            for first, last in spans:
                inside = inside | offset.between(first, last)
            keep = keep & ~((cluster == F.lit(name)) & inside)
        return df.where(keep)
    rows = [
        (name, block, first, last)
        for name, spans in closed.items()
        for first, last in spans
        for block in range(first // _BLOCK, last // _BLOCK + 1)
    ]
    cut = df.sparkSession.createDataFrame(
        rows, "r_cluster string, r_block long, r_first long, r_last long"
    )
    return df.where(keep).join(
        F.broadcast(cut),
        (cluster == F.col("r_cluster"))
        & (F.floor(offset / F.lit(_BLOCK)).cast("long") == F.col("r_block"))
        & offset.between(F.col("r_first"), F.col("r_last")),
        "left_anti",
    )


def _any_of_condition(text: str) -> Any:
    from pyspark.sql import functions as F

    from audit.selection import NOT_NULL, parse_any_of

    cond = F.lit(False)
    for col, want in parse_any_of(text):
        cond = cond | (F.col(col).isNotNull() if want is NOT_NULL else (F.col(col) == F.lit(want)))
    return cond
