"""Every audit on a real Spark standalone cluster gives the local answers.

This is the scaled-down form of the 100M-record run of `bench/spark_cluster.py` (a tiled
history, exported, audited by ``audit all`` on a master and two workers).

A master and two workers (one core each) run on 127.0.0.1 from the launcher bundled with
pyspark (`audit.standalone`: ``bin/spark-class``; the pip package has no
``sbin/start-master.sh``), each in a process group of its own that the fixture stops.
Readiness is awaited on the master's JSON status page (two ALIVE workers), not slept for.
The audits run as the real command in a subprocess (its own driver JVM, executors on the
workers) over a Parquet export of three logs, one of them with violations; the suite's
local session runs the same command in-process, and every table and summary must be
equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import ops.cli
from audit.export import export_parquet
from audit.standalone import Standalone
from audit.tile import tile_log
from tests.processes import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 180.0  # bounds on waiting, not timing assertions
JOBS = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path_factory.mktemp("standalone"), bound_s=BOUND_S)
    try:
        yield cluster.start(2, cores=1, memory="1g")
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


# The cluster run of bench/spark_cluster.py (100M records, audit/README.md), scaled down:
# a history tiled from the simulated one, beside it and the crafted log.
TILED_RECORDS = 150_000


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, sim_log: tuple[Path, Any], crafted_log: Path
) -> Path:
    """Three logs, one with violations and one tiled to TILED_RECORDS, as Parquet on
    storage every worker reads (here: the same machine's disk), in several buckets."""
    root = tmp_path_factory.mktemp("cluster-export")
    tiled = root / "tiled"
    assert tile_log(sim_log[0], tiled, TILED_RECORDS) >= TILED_RECORDS
    pq = root / "pq"
    export_parquet([str(sim_log[0]), str(crafted_log), str(tiled)], pq, buckets=4)
    return pq


@pytest.mark.usefixtures("spark")
def test_every_audit_on_a_standalone_cluster_equals_local(
    standalone: Standalone,
    exported: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pq = exported
    # Relative, as typed: executors run in their workers' directories, so the bucket tasks
    # must be handed the driver's absolute path.
    relative = os.path.relpath(pq, ROOT)
    cmd = [sys.executable, "-m", "ops.cli", "audit", "all", "--parquet", relative]
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
    recoveries = pd.read_parquet(local / "unclean-recoveries" / "unclean_recoveries.parquet")
    assert (recoveries["cluster"] == "tiled").sum() > 0  # and the tiled history's
