"""Suite-wide fixtures. Kept minimal: each test directory owns its own helpers.

The leak check: every process a test starts must be gone when the test is over. Each
process this run starts carries `RUN_MARK` (this pytest process's own value) in its
environment, so it is found even in a session of its own or once orphaned to init.
`_no_leaked_processes` (autouse) compares the run's live processes after the test's
teardown with those alive when it started; a module- or session-scoped fixture's processes
(the etcd member, the Spark JVMs, a module's cluster) are checked when that fixture is
finalized instead (`pytest_fixture_setup` notes which processes each one started). A
process a test leaves running that runs the same program as one of a wider fixture alive
(a broker or an etcd member of a module's cluster, killed and restarted by the test) is
handed over to that fixture, the narrowest first, and checked when it is finalized.
Process-lifetime helpers of this process (PySpark's JVM, multiprocessing's resource
tracker and forkserver) are never leaks. A leaked process is SIGKILLed with its process
group (one leak does not cascade) and the test errors at teardown naming each one (pid,
command line).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest
import structlog

from controller.runtime.process import configure_process
from localcluster.etcd import LocalEtcd
from tests.processes import (
    RUN_MARK,
    await_gone,
    cmdline,
    describe,
    kill_processes,
    new_processes,
    pids,
    program,
)

# What the controller's entry point sets for its process, set once for the test process.
configure_process()

# This process's mark, inherited by every process the run starts (each xdist worker sets
# its own: a worker inherits its controller's value and replaces it here).
MARK = f"{os.getpid()}.{os.urandom(4).hex()}"
os.environ[RUN_MARK] = MARK

GRACE_S = 10.0  # how long a test's processes may take to exit after its teardown

# Processes of the fixtures wider than a test, by fixture; allowed until it is finalized.
_fixture_processes: dict[int, list[int]] = {}
# Each such fixture's scope and the programs it runs (see `program`), by fixture.
_fixture_programs: dict[int, tuple[str, set[str]]] = {}
_NARROWEST_FIRST = ["class", "module", "package", "session"]


def _spark_gateway() -> set[int]:
    """PySpark's JVM in this process, if started: it lives as long as the process by
    PySpark's design (a later session reuses it; it exits at the end of its stdin), so
    whichever fixture or test first started it, it and the Python workers it forks are
    never a leak."""
    if "pyspark" not in sys.modules:
        return set()
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return {proc.pid} if proc is not None else set()


def _spark_worker(pid: int) -> bool:
    """A PySpark Python worker (`python -m pyspark.daemon`, or a worker it forked): the
    Spark session's JVM keeps a pool of them for later tasks, and one whose daemon is
    gone exits when its socket to the JVM closes; a task that fails in one (a test of a
    failing job) can leave it orphaned for a while, which is not the test's leak."""
    return " -m pyspark.daemon" in cmdline(pid)


def _multiprocessing_helpers() -> set[int]:
    """multiprocessing's resource tracker and forkserver, if this process started them:
    one each, for as long as the process lives."""
    found = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    if tracker is not None and (pid := getattr(tracker._resource_tracker, "_pid", None)):
        found.add(pid)
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None and (pid := getattr(forkserver._forkserver, "_forkserver_pid", None)):
        found.add(pid)
    return found


def _allowed() -> set[int]:
    """The processes of the wider fixtures alive now, and this process's lifetime helpers:
    they and their descendants (the Python workers a Spark JVM forks, say) are theirs,
    not the test's."""
    fixtures = {pid for procs in _fixture_processes.values() for pid in procs}
    return fixtures | _spark_gateway() | _multiprocessing_helpers()


def _hand_over(leaked: list[int]) -> list[int]:
    """Give each of `leaked` that runs a program of a wider fixture alive (the narrowest
    first) to that fixture; those left are the test's."""
    owners = sorted(_fixture_programs.items(), key=lambda kv: _NARROWEST_FIRST.index(kv[1][0]))
    left = []
    for pid in leaked:
        runs = program(pid)
        owner = next((key for key, (_, programs) in owners if runs in programs), None)
        if owner is None:
            left.append(pid)
        else:
            _fixture_processes[owner].append(pid)
    return left


def _leak_message(what: str, leaked: list[int]) -> str | None:
    """None if every one of `leaked` exits within the grace; else kill them all and say
    which were left."""
    left = await_gone(leaked, GRACE_S)
    if not left:
        return None
    named = describe(left)
    kill_processes(left)
    return f"{what} left {len(left)} process(es) running (killed now): {named}"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
    if fixturedef.scope == "function":
        return (yield)
    before = pids()
    try:
        return (yield)
    finally:
        started = new_processes(before, MARK, _allowed())
        if started:
            _fixture_processes[id(fixturedef)] = started
            _fixture_programs[id(fixturedef)] = (
                fixturedef.scope,
                {program(pid) for pid in started},
            )


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[Any]) -> None:
    started = _fixture_processes.pop(id(fixturedef), None)
    _fixture_programs.pop(id(fixturedef), None)
    if started:
        message = _leak_message(f"the {fixturedef.scope} fixture {fixturedef.argname!r}", started)
        if message is not None:
            pytest.fail(message, pytrace=False)


@pytest.fixture(autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    """Fail the test (at teardown) if a process it started outlives it."""
    before = pids()
    yield
    leaked = [pid for pid in new_processes(before, MARK, _allowed()) if not _spark_worker(pid)]
    if leaked:
        leaked = _hand_over(await_gone(leaked, GRACE_S))
    if leaked and (message := _leak_message("the test", leaked)) is not None:
        pytest.fail(message, pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How `make test` (pytest-xdist, -n 2) hands tests to its workers: a test file at a
    time, its tests in their order, so that a module's shared fixture (a cluster of real
    processes) is built once and tests that build on the one before keep their order;
    and every audit test on one worker, with the run's one Spark session. (xdist's own
    --dist loadgroup cannot do the latter on pytest 9: it renames a test's node id
    through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/audit" if path.startswith("tests/audit/") else path

    return ByFile(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT at Python's default in this process (the controller and every xdist
    worker), however the run was started: a shell starting `make test &` without job
    control starts it with SIGINT ignored, every child a test starts would inherit that,
    and a command started with SIGINT ignored keeps it ignored (as `nohup` wants; ops.cli),
    so every test of a command's own Ctrl-C would fail. Seen: 13 such failures in a
    clean-clone run started in the background. A handler is reset to the default at exec,
    so the children start as from a terminal."""
    import signal
    import threading

    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _sigint_as_found() -> Iterator[None]:
    """Fail a test that leaves SIGINT ignored or blocked in this process, and undo it:
    every child started afterwards would inherit it and never end on Ctrl-C (an ignored
    SIGINT stays ignored, `ops.cli`), failing the Ctrl-C tests that happen to come later
    on the same worker instead of the test that did it."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    blocked = main and signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    problems = []
    if not ignored and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        problems.append("ignored")
    if main and not blocked and signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        problems.append("blocked")
    if problems:
        pytest.fail(f"the test left SIGINT {' and '.join(problems)} (undone now)", pytrace=False)


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """CLI entry points configure structlog for their process; undo that after each test
    so that one test's log level or stream never leaks into the next."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    """One real etcd member on loopback for the whole run (Debian's etcd-server, which
    `make test` installs); tests keep apart by key prefix."""
    cluster = LocalEtcd(tmp_path_factory.mktemp("etcd"), 1).start()
    try:
        yield cluster
    finally:
        cluster.stop()
