"""A Spark standalone cluster on this machine: a master and workers as real processes.

For trying the cluster path of the audits without a cluster (and for the tests and the
benchmarks that run it): pyspark's pip package ships the jars and ``bin/spark-class``
but not ``sbin/start-master.sh``, so the master and each worker are started from
``spark-class`` (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each
in a process group of its own, bound to 127.0.0.1, with their logs in a directory of
their own. Readiness is awaited on the master's JSON status page (every worker ALIVE),
not slept for.

    python -m audit.standalone --workers 2 --cores 1 --memory 4g --dir /tmp/spark
    # prints the master's URL (spark://127.0.0.1:PORT); Ctrl-C stops the cluster

then, with an export every worker reads at the same path::

    metactl audit all --parquet /tmp/pq --master spark://127.0.0.1:PORT \\
        --conf spark.executor.memory=2g

Executors run the jobs' Python: each worker starts them with this interpreter and this
source tree (``PYTHONPATH``), as `audit.spark.get_session` also tells them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from metactl.errors import MetactlError
from metactl.numbers import int_arg
from metactl.processes import dies_with_parent

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def spark_home() -> Path:
    from audit.spark import require_pyspark

    require_pyspark()  # PYSPARK_NOT_FOUND, saying how to install it
    import pyspark

    return Path(pyspark.__file__).parent


def _wait(what: str, probe: Callable[[], T | None], bound_s: float) -> T:
    deadline = time.monotonic() + bound_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {bound_s:.0f} s waiting for {what}")
        time.sleep(0.2)


class Standalone:
    """A master and workers on loopback, as subprocesses in their own process groups."""

    def __init__(
        self,
        root: Path,
        *,
        daemon_memory: str = "256m",
        bound_s: float = 180.0,
    ) -> None:
        self.root = root
        self.bound_s = bound_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.master: subprocess.Popen[bytes] | None = None
        self.env = dict(
            os.environ,
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=daemon_memory,
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            PYSPARK_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        )
        self.url = ""
        self.ui = ""

    def _start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                # Dies with its parent: a test run killed outright left a master and two
                # workers running for hours (spark-class execs the JVM, which keeps it).
                [*dies_with_parent(), str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, log

    def start(self, workers: int = 2, *, cores: int = 1, memory: str = "1g") -> Standalone:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master, log = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
        )

        def bound() -> tuple[str, str] | None:
            text = log.read_text(errors="replace")
            url = re.search(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", text)
            ui = re.search(r"MasterWebUI to \S+ and started at http://\S+:(\d+)", text)
            return (url[1], f"http://127.0.0.1:{ui[1]}") if url and ui else None

        self.url, self.ui = _wait("the master's address in its log", bound, self.bound_s)
        for i in range(workers):
            proc, _ = self._start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                *("--webui-port", "0", "--work-dir", str(self.root / f"work-{i}"), self.url),
            )
            self.workers.append(proc)
        _wait(
            f"{workers} workers registered",
            lambda: self.alive_workers() == workers,
            self.bound_s,
        )
        return self

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as resp:
            return dict(json.load(resp))

    def alive_workers(self) -> int:
        try:
            return int(self.status().get("aliveworkers", 0))
        except OSError:
            return 0  # the UI is not serving yet

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> Standalone:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int_arg, default=2, help="workers (default 2)")
    parser.add_argument("--cores", type=int_arg, default=1, help="cores per worker (default 1)")
    parser.add_argument("--memory", default="4g", help="memory per worker (default 4g)")
    parser.add_argument(
        "--dir", type=Path, default=Path("spark-standalone"), help="logs and work directories"
    )
    args = parser.parse_args(argv)
    try:
        spark_home()
    except MetactlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cluster = Standalone(args.dir.resolve())
    try:
        cluster.start(args.workers, cores=args.cores, memory=args.memory)
        print(f"master {cluster.url} (status {cluster.ui}); logs in {args.dir}", flush=True)
        print("Ctrl-C stops the cluster", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
