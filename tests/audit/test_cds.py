"""The driver JVM's class-data sharing archive (`audit.cds`): written once, then mapped.

The suite turns CDS off for its own session (tests/audit/conftest.py); these tests give
each process a cache directory of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit import cds
from tests.processes import BOUND_S, wait_exit, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cds.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(cds.ENV_SWITCH, "on")
    return tmp_path


def test_first_launch_writes_then_later_ones_map(cache: Path) -> None:
    first = cds.plan()
    assert first is not None and first.writing is not None
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in first.java_options
    key = first.writing.name.split(".")[0].removeprefix("spark-")
    # The writing JVM is gone and its archive is complete: the next launch maps it.
    first.writing.write_bytes(cds.DYNAMIC_MAGIC + b"\0" * 64)
    cds.note_jvm(first, 2**22 + 1)  # no such process
    second = cds.plan()
    assert second is not None and second.writing is None
    assert f"-XX:SharedArchiveFile={cache / f'spark-{key}.jsa'}" in second.java_options
    assert sorted(p.name for p in cache.iterdir()) == [f"spark-{key}.jsa"]


def test_a_part_still_being_written_or_damaged_is_not_used(cache: Path) -> None:
    key = cds.archive_key()
    assert key is not None
    busy = cache / f"spark-{key}.jsa.1.part"
    busy.write_bytes(cds.DYNAMIC_MAGIC)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(busy)])
    try:
        # Its command line names the part once it has exec'd (as a JVM's does).
        cmdline = Path(f"/proc/{writer.pid}/cmdline")
        wait_for("its exec", lambda: str(busy).encode() in cmdline.read_bytes(), every=0.01)
        busy.with_suffix(".jvm").write_text(str(writer.pid))
        damaged = cache / f"spark-{key}.jsa.2.part"
        damaged.write_bytes(b"\0" * 64)  # killed before its header was written
        damaged.with_suffix(".jvm").write_text(str(2**22 + 1))
        plan = cds.plan()
        assert plan is not None and plan.writing is not None  # no archive to map yet
        assert busy.exists() and not damaged.exists()
    finally:
        writer.kill()
        writer.wait()


def test_archives_of_other_versions_go_once_unused(cache: Path) -> None:
    key = cds.archive_key()
    assert key is not None
    mine = cache / f"spark-{key}.jsa"
    mine.write_bytes(cds.DYNAMIC_MAGIC)
    old = [cache / f"spark-0123456789abcdef.jsa{suffix}" for suffix in ("", ".7.part", ".7.jvm")]
    recent = cache / "spark-fedcba9876543210.jsa"  # another installation's, in use
    long_ago = time.time() - cds.STALE_ARCHIVE_S - 60
    for path in (*old, recent):
        path.write_bytes(cds.DYNAMIC_MAGIC)
    for path in (*old, mine):
        os.utime(path, (long_ago, long_ago))
    plan = cds.plan()
    assert plan is not None and plan.writing is None  # it maps its own archive
    assert sorted(p.name for p in cache.iterdir()) == sorted([mine.name, recent.name])
    assert mine.stat().st_mtime > long_ago + 60  # marked used: kept as long as it is


def test_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cds.ENV_SWITCH, "off")
    assert cds.plan() is None


PROBE = """
import sys
import time
from audit.spark import get_session
from pyspark import SparkContext
spark = get_session("local[1]", driver_memory="1g")
assert spark.range(5).count() == 5
pid = SparkContext._gateway.proc.pid
maps = open(f"/proc/{pid}/maps").read()
print(pid, any(".jsa" in line and sys.argv[1] in line for line in maps.splitlines()))
"""


@pytest.mark.slow
def test_a_real_jvm_writes_the_archive_and_the_next_one_maps_it(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{cds.ENV_DIR: str(tmp_path)})
    env[cds.ENV_SWITCH] = "on"

    def probe() -> tuple[int, bool]:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=BOUND_S,
            check=True,
        )
        pid, mapped = done.stdout.split()
        return int(pid), mapped == "True"

    pid, mapped = probe()
    assert not mapped  # the first JVM writes the archive at its exit
    assert wait_exit(pid), "the first JVM did not exit"  # it writes the archive as it does
    _, mapped = probe()
    assert mapped
    archives = list(tmp_path.iterdir())
    assert [p.suffix for p in archives] == [".jsa"]
    for archive in archives:
        archive.unlink()  # ~160 MB that pytest would keep with its temporary directories
