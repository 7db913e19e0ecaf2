"""Progress of an audit's Spark jobs, from Spark's status tracker (``sc.statusTracker()``).

`JobProgress` is a context manager around one audit run: it puts the run's jobs in a job
group of their own and polls the tracker from a daemon thread. On a terminal it draws one
`rich` progress bar per job (tasks done of tasks planned, over all of the job's stages;
the bars vanish when the run ends, leaving the summary); elsewhere (``lines``) it writes
one line when a job starts and one when it ends, which a log or a test can follow::

    spark job 3 started: offline: each partition's timeline (2 tasks)
    spark job 3 succeeded: 2/2 tasks in 0.4 s

A job is named for the audit step that started it (issue 34: not ``collect at
spark.py:351``): the audits call `step` before their Spark work, which gives the jobs
that follow a job group of their own (``setJobGroup``, with the step as the jobs'
description in Spark's own UI and logs) that the block polls under that name. A job
started outside any step is named for the audit and its call site.

`StartTicker` prints a line every few seconds while Spark starts (issue 34: "starting
Spark" alone for minutes on a loaded machine).

The tracker's answers are weakly consistent (a job's stages may not be known yet); the
poller treats whatever is missing as "not yet", and stops quietly if the session goes.
It must not start jobs or sessions itself.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, TextIO

Mode = Literal["bars", "lines", "off"]

POLL_SECONDS: Final = 0.2
_PATH = re.compile(r"(?:[^\s:]*/)([^/\s:]+:\d+)")
_DONE: Final = frozenset({"SUCCEEDED", "FAILED"})
# Which block's steps this thread runs (a local property, thread by thread as Spark's).
_BLOCK_PROPERTY: Final = "metactl.progress.block"
# What `setJobGroup` sets on this thread, and the block; cleared when the block ends.
_GROUP_PROPERTIES: Final = (
    "spark.jobGroup.id",
    "spark.job.description",
    "spark.job.interruptOnCancel",
    _BLOCK_PROPERTY,
)
_ACTIVE: dict[str, JobProgress] = {}  # the blocks running, by their group
_ACTIVE_LOCK = threading.Lock()
TICK_SECONDS: Final = 5.0


def step(spark: Any, text: str) -> None:
    """Name the Spark jobs this thread starts from now on (until the next step) `text`,
    e.g. ``offline: each partition's timeline``: in the `JobProgress` block around them,
    and as their description in Spark (``setJobDescription`` outside a block)."""
    sc = spark.sparkContext
    block = sc.getLocalProperty(_BLOCK_PROPERTY)
    with _ACTIVE_LOCK:
        progress = _ACTIVE.get(block) if block else None
    if progress is None:
        sc.setJobDescription(text)
    else:
        progress.step(text)


@contextlib.contextmanager
def aside(spark: Any, text: str) -> Iterator[None]:
    """Name the jobs of the block `text` (prefixed with the audit's name inside a
    `JobProgress` block), then give the jobs after it the name they had before: for work
    shared by the audits (the scan for aborted transactions), whatever step runs it."""
    sc = spark.sparkContext
    saved = {key: sc.getLocalProperty(key) for key in _GROUP_PROPERTIES[:3]}
    block = sc.getLocalProperty(_BLOCK_PROPERTY)
    with _ACTIVE_LOCK:
        progress = _ACTIVE.get(block) if block else None
    step(spark, text if progress is None else f"{progress.description}: {text}")
    try:
        yield
    finally:
        for key, value in saved.items():
            sc.setLocalProperty(key, value)


class StartTicker:
    """While Spark starts (the ``with`` block): ``starting Spark (MASTER)… N s`` on
    `stream` every `every` seconds, so that a slow start on a loaded machine shows it is
    alive; nothing if the block ends first."""

    def __init__(self, master: str, stream: TextIO, every: float = TICK_SECONDS) -> None:
        self.master, self.stream, self.every = master, stream, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metactl-start-ticker", daemon=True)
        self._started = 0.0

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            took = time.monotonic() - self._started
            print(f"starting Spark ({self.master})… {took:.0f} s", file=self.stream, flush=True)

    def __enter__(self) -> StartTicker:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def short_name(stage_name: str) -> str:
    """``collect at /work/main/audit/spark.py:151`` -> ``collect at spark.py:151``."""
    return _PATH.sub(r"\1", stage_name).strip()


def default_mode(stream: TextIO) -> Mode:
    """Bars on a terminal; nothing otherwise (pass ``lines`` to follow a log)."""
    isatty = getattr(stream, "isatty", None)
    return "bars" if isatty is not None and isatty() else "off"


@dataclass
class JobState:
    job_id: int
    name: str = ""
    done: int = 0
    total: int = 0
    status: str = "RUNNING"
    started: float = 0.0
    ended: float | None = None
    task: Any = None  # the rich task id, in bars mode


class JobProgress:
    """Track the Spark jobs started inside the ``with`` block (see the module docs)."""

    def __init__(
        self,
        spark: Any,
        group: str,
        *,
        mode: Mode | None = None,
        stream: TextIO | None = None,
        interval: float = POLL_SECONDS,
        description: str = "metactl audit",
    ) -> None:
        self.sc = spark.sparkContext
        self.group = group
        self.stream = stream if stream is not None else sys.stderr
        self.mode: Mode = mode if mode is not None else default_mode(self.stream)
        self.interval = interval
        self.description = description
        self.jobs: dict[int, JobState] = {}
        # Job group -> the step it names (`step`); the block's own group names none.
        self.groups: dict[str, str | None] = {group: None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bars: Any = None
        self._lock = threading.Lock()

    # --- the block --------------------------------------------------------------------------

    def __enter__(self) -> JobProgress:
        # interruptOnCancel: a cancelled job's task threads are interrupted, not awaited.
        self.sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
        self.sc.setLocalProperty(_BLOCK_PROPERTY, self.group)
        with _ACTIVE_LOCK:
            _ACTIVE[self.group] = self
        if self.mode == "off":
            return self
        if self.mode == "bars":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tasks"),
                TimeElapsedColumn(),
                console=Console(file=self.stream, force_terminal=True),  # bars were asked for
                transient=True,
            )
            self._bars.start()
        self._thread = threading.Thread(target=self._run, name="metactl-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        with _ACTIVE_LOCK:
            _ACTIVE.pop(self.group, None)
        if self._thread is not None:
            self._thread.join(5.0)
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        if not interrupted and self.mode != "off":
            # The last jobs may have ended between two polls: one final look. (Not after
            # Ctrl-C: this thread's JVM connection may be mid-call.)
            self._poll()
        if self._bars is not None:
            self._bars.stop()
        if not interrupted:
            for key in _GROUP_PROPERTIES:
                self.sc.setLocalProperty(key, None)

    def step(self, text: str) -> None:
        """The jobs this thread starts from now on form a group named `text` (`step`)."""
        with self._lock:
            group = f"{self.group}.{len(self.groups)}"
            self.groups[group] = text
        self.sc.setJobGroup(group, text, interruptOnCancel=True)

    def job_ids(self) -> list[int]:
        """Every job of the block's groups that the tracker knows."""
        tracker = self.sc.statusTracker()
        with self._lock:
            groups = list(self.groups)
        return sorted(j for g in groups for j in tracker.getJobIdsForGroup(g))

    # --- polling ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except Exception:  # the session is going (Ctrl-C, stop): nothing more to show
                return

    def _poll(self) -> None:
        tracker = self.sc.statusTracker()
        with self._lock:
            named = {
                job_id: text
                for group, text in list(self.groups.items())
                for job_id in tracker.getJobIdsForGroup(group)
            }
            for job_id in sorted(named):
                state = self.jobs.get(job_id)
                if state is not None and state.status in _DONE:
                    continue
                info = tracker.getJobInfo(job_id)
                if info is None:
                    continue
                stages = [tracker.getStageInfo(s) for s in info.stageIds]
                known = [s for s in stages if s is not None]
                new = state is None
                if state is None:
                    if not known:
                        continue  # stages not registered yet: next poll
                    final = max(known, key=lambda s: s.stageId)
                    name = named[job_id] or f"{self.description}: {short_name(str(final.name))}"
                    state = JobState(job_id, name, started=time.monotonic())
                    self.jobs[job_id] = state
                state.total = max(state.total, sum(s.numTasks for s in known))
                state.done = sum(s.numCompletedTasks for s in known)
                if new:
                    self._started(state)
                state.status = str(info.status)
                if state.status == "SUCCEEDED":
                    state.done = state.total  # skipped stages (reused shuffles) never run
                if state.status in _DONE:
                    state.ended = time.monotonic()
                    self._ended(state, state.ended - state.started)
                elif self._bars is not None:
                    self._bars.update(state.task, completed=state.done, total=state.total)

    def _started(self, state: JobState) -> None:
        if self._bars is not None:
            state.task = self._bars.add_task(
                f"{state.name} (job {state.job_id})", total=state.total or None
            )
        elif self.mode == "lines":
            self._line(f"spark job {state.job_id} started: {state.name} ({state.total} tasks)")

    def _ended(self, state: JobState, took: float) -> None:
        if self._bars is not None:
            # The last finished job's bar stays; older finished bars make way.
            for other in self.jobs.values():
                if other is not state and other.ended is not None and other.task is not None:
                    self._bars.update(other.task, visible=False)
            self._bars.update(state.task, completed=state.done, total=state.total)
            self._bars.refresh()  # drawn finished now, not at the next tick (or never)
        elif self.mode == "lines":
            self._line(
                f"spark job {state.job_id} {state.status.lower()}: "
                f"{state.done}/{state.total} tasks in {took:.1f} s"
            )

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
