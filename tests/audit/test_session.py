"""The audits' Spark session: loopback only, a JVM out of the terminal's reach, progress."""

from __future__ import annotations

import io
import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from audit.progress import JobProgress, StartTicker, short_name, step
from audit.spark import AuditInput, is_local_master, master_on_loopback
from tests.processes import wait_for

pytestmark = pytest.mark.slow


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6: four 32-bit words, each in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket process `pid` listens on (from /proc)."""
    inodes = _socket_inodes(pid)
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    addr, port = local.split(":")
                    out.append((str(_address(addr)), int(port, 16)))
    return out


def _loopback(text: str) -> bool:
    addr = ipaddress.ip_address(text)
    mapped = getattr(addr, "ipv4_mapped", None)  # Java's ::ffff:127.0.0.1
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _off_loopback(addresses: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(a, p) for a, p in addresses if not _loopback(a)]


def _jvm_pid(spark: Any) -> int:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    assert gateway is not None and getattr(gateway, "proc", None) is not None
    return int(gateway.proc.pid)


def test_the_local_session_listens_on_loopback_only(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    listening = listening_addresses(_jvm_pid(spark))
    ports = {p for _, p in listening}
    assert int(conf.get("spark.driver.port")) in ports  # the driver's RPC endpoint is seen
    assert _off_loopback(listening) == []


def test_the_listener_check_sees_a_wildcard_socket() -> None:
    # The check above would catch the planted bug (a port on every interface).
    with socket.create_server(("0.0.0.0", 0)) as wide, socket.create_server(("127.0.0.1", 0)):
        found = _off_loopback(listening_addresses(os.getpid()))
        assert found == [("0.0.0.0", wide.getsockname()[1])]


def test_the_jvm_is_out_of_the_terminals_reach(spark: Any) -> None:
    # Its own session: a terminal's Ctrl-C (sent to the foreground process group) reaches
    # this process only, which cancels and stops Spark itself.
    pid = _jvm_pid(spark)
    assert os.getsid(pid) == pid != os.getsid(0)


def test_masters() -> None:
    assert all(is_local_master(m) for m in ("local", "local[2]", "local[*]", "local[2,3]"))
    assert not any(is_local_master(m) for m in ("spark://h:7077", "yarn", "localhost"))
    loopback = ("local[*]", "spark://127.0.0.1:7077", "spark://localhost:7077", "spark://[::1]:1")
    assert all(master_on_loopback(m) for m in loopback)
    assert not any(master_on_loopback(m) for m in ("spark://10.0.0.5:7077", "yarn", "k8s://x"))


def test_progress_sees_each_job_of_its_group(spark: Any, scenario_logs: dict[str, Path]) -> None:
    from audit.jobs import unclean

    out = io.StringIO()
    inp = AuditInput.of(str(scenario_logs["worked-5.3.3-balanced-recovery"]))
    with JobProgress(
        spark, "test-progress", mode="lines", stream=out, description="unclean-recoveries"
    ) as progress:  # as `metactl audit` runs each audit
        unclean.run(spark, inp)
    assert progress.jobs and all(j.status == "SUCCEEDED" for j in progress.jobs.values())
    tracker = spark.sparkContext.statusTracker()
    assert sorted(progress.jobs) == progress.job_ids()
    # Named for the audit's steps (issue 34), never for a call site ("collect at x.py:3").
    names = {j.name for j in progress.jobs.values()}
    assert all(n.startswith("unclean-recoveries: ") and ".py:" not in n for n in names), names
    assert "unclean-recoveries: the recoveries and their candidates" in names
    assert "unclean-recoveries: aborted transactions" in names  # the scan every audit shares
    # A job after the block is in no group: the block's groups ended with it.
    ungrouped = set(tracker.getJobIdsForGroup(None))
    spark.range(3).count()
    after = set(tracker.getJobIdsForGroup(None)) - ungrouped
    assert after and not after & set(progress.job_ids())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 * len(progress.jobs)
    started = [line for line in lines if " started: " in line]
    assert all(line.split(" started: ")[1].startswith("unclean-recoveries: ") for line in started)
    for key in ("spark.jobGroup.id", "spark.job.description", "metactl.progress.block"):
        assert spark.sparkContext.getLocalProperty(key) is None, key  # cleared


def test_a_step_names_its_jobs(spark: Any) -> None:
    """Jobs started after `step` carry its name: in a block, as the bar's text; outside
    one, as the jobs' description in Spark."""
    out = io.StringIO()
    with JobProgress(spark, "test-steps", mode="bars", stream=out, interval=0.05) as progress:
        spark.range(10).count()  # before any step: named for the block (and a call site)
        step(spark, "test: counting")
        spark.range(100).repartition(2).count()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    names = [progress.jobs[j].name for j in sorted(progress.jobs)]
    assert names[0].startswith("metactl audit: ") and names[-1] == "test: counting"
    for job_id, state in progress.jobs.items():
        if state.name == "test: counting":  # (a call site's long name is cut to the width)
            assert f"{state.name} (job {job_id})" in drawn
    step(spark, "test: outside a block")
    assert spark.sparkContext.getLocalProperty("spark.job.description") == "test: outside a block"
    spark.sparkContext.setLocalProperty("spark.job.description", None)


def test_a_line_every_few_seconds_while_spark_starts() -> None:
    """`StartTicker`: a line per interval, with the time elapsed, until the block ends."""
    out = io.StringIO()
    with StartTicker("local[2]", out, every=0.02):
        wait_for("two ticks", lambda: out.getvalue().count("\n") >= 2, every=0.01)
    seen = out.getvalue().count("\n")
    lines = out.getvalue().splitlines()
    assert all(re.fullmatch(r"starting Spark \(local\[2\]\)… \d+ s", line) for line in lines)
    with StartTicker("local[2]", out, every=60.0):
        pass  # ended before its first interval: nothing
    assert out.getvalue().count("\n") == seen


def test_bars_on_a_terminal(spark: Any) -> None:
    out = io.StringIO()
    with JobProgress(spark, "test-bars", mode="bars", stream=out, interval=0.05) as progress:
        spark.range(100_000).repartition(3).selectExpr("sum(id)").collect()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # colours, cursor moves
    assert progress.jobs
    for job_id, state in progress.jobs.items():
        assert f"{state.name} (job {job_id})" in drawn
        assert f"{state.total}/{state.total} tasks" in drawn


def test_short_names() -> None:
    assert short_name("collect at /work/main/audit/spark.py:151") == "collect at spark.py:151"
    assert short_name("toPandas at elections.py:71") == "toPandas at elections.py:71"
