"""Every audit on a real Spark standalone cluster gives the local answers.

A master and two workers (one core each) run on 127.0.0.1 from the launcher bundled with
pyspark (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``;
the pip package has no ``sbin/start-master.sh``), each in a process group of its own that
the fixture stops. Readiness is awaited on the master's JSON status page (two ALIVE
workers), not slept for. The audits run as the real command in a subprocess (its own
driver JVM, executors on the workers) over a Parquet export of two logs, one of them with
violations; the suite's local session runs the same command in-process, and every table
and summary must be equal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import ops.cli
from audit.export import export_parquet
from tests.processes import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 180.0  # bounds on waiting, not timing assertions
JOBS = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class Standalone:
    """A master and workers on loopback, as subprocesses in their own process groups."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(
            os.environ,
            SPARK_HOME=str(_spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            PYTHONPATH=str(ROOT),
        )
        self.url = ""
        self.ui = ""

    def _start(self, name: str, *args: str) -> Path:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(_spark_home() / "bin" / "spark-class"), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.root,
                    start_new_session=True,
                )
            )
        return log

    def start(self, workers: int = 2) -> Standalone:
        log = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
        )

        def bound() -> tuple[str, str] | None:
            text = log.read_text(errors="replace")
            url = re.search(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", text)
            ui = re.search(r"MasterWebUI to \S+ and started at http://\S+:(\d+)", text)
            return (url[1], f"http://127.0.0.1:{ui[1]}") if url and ui else None

        self.url, self.ui = wait_for("master address in its log", bound, BOUND_S)
        for i in range(workers):
            work = self.root / f"work-{i}"
            self._start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--webui-port", "0", "--work-dir", str(work), self.url),
            )
        wait_for(f"{workers} workers registered", lambda: self.alive_workers() == workers, BOUND_S)
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


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path_factory.mktemp("standalone"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _tables(out: Path, job: str) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((out / job).glob("*.parquet"))}


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in a fixed order (by every column that sorts), values as plain lists."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: v.tolist() if hasattr(v, "tolist") else v)
    keys = [c for c in out.columns if out[c].dtype != object or out[c].map(type).eq(str).all()]
    return out.sort_values(keys, kind="stable").reset_index(drop=True) if keys else out


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, sim_log: tuple[Path, Any], crafted_log: Path
) -> Path:
    """Two logs, one with violations, as Parquet on storage every worker reads (here: the
    same machine's disk)."""
    pq = tmp_path_factory.mktemp("cluster-export") / "pq"
    export_parquet([str(sim_log[0]), str(crafted_log)], pq)
    return pq


@pytest.mark.usefixtures("spark")
def test_every_audit_on_a_standalone_cluster_equals_local(
    standalone: Standalone,
    exported: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pq = exported
    cmd = [sys.executable, "-m", "ops.cli", "audit", "all", "--parquet", str(pq)]
    cmd += ["--master", standalone.url, "--driver-memory", "1g", "--shuffle-partitions", "4"]
    cmd += ["--conf", "spark.executor.memory=512m", "--out", str(tmp_path / "cluster")]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=BOUND_S * 2,
        check=False,
    )
    # Exit 1: the crafted log breaks invariants. Nothing but the answers was printed.
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert f"s on {standalone.url}, of which" in done.stdout

    # It ran on the cluster: the master saw the application finish, with executors.
    apps = wait_for(
        "the finished application",
        lambda: [a for a in standalone.status()["completedapps"] if a["name"] == "metactl-audit"],
        bound=30,
    )
    assert apps[0]["state"] == "FINISHED"

    # The same command on the suite's local session.
    local = tmp_path / "local"
    status = ops.cli.main(
        ["audit", "all", "--parquet", str(pq), "--out", str(local), "--progress", "off"]
    )
    out = capsys.readouterr().out
    assert status == 1
    for job in JOBS:
        remote_summary = (tmp_path / "cluster" / job / "summary.txt").read_text()
        assert remote_summary == (local / job / "summary.txt").read_text()
        assert remote_summary.splitlines()[0] in out
        remote, here = _tables(tmp_path / "cluster", job), _tables(local, job)
        assert remote.keys() == here.keys() and remote
        for name in remote:
            pd.testing.assert_frame_equal(
                _canonical(remote[name]), _canonical(here[name]), obj=f"{job}/{name}"
            )
    violations = pd.read_parquet(local / "invariants" / "violations.parquet")
    assert len(violations) > 0  # the comparison covers a non-empty answer
