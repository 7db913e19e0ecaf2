"""Class-data sharing for the audits' driver JVM: Spark starts in about half the time.

Most of an audit's fixed cost on a small log is the JVM loading and verifying Spark's
classes (issue 13: ~6 s of a ~15 s ``audit elections``). HotSpot can map them from an
archive instead (AppCDS, JDK 13+; Spark 4 needs 17+). The first audit on a machine runs
with ``-XX:ArchiveClassesAtExit``: its JVM writes the archive when it exits, after the
command has returned (in the background, ~160 MB, some seconds). Later audits start with
``-XX:SharedArchiveFile``. Nothing else changes; a stale or damaged archive is refused
by the JVM (``-XX:+VerifySharedSpaces``, ``-Xshare:auto``) and the audit just starts
without it.

Where: ``$METACTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/metactl``, else
``~/.cache/metactl``; one archive per pyspark version and Java installation.
``METACTL_SPARK_CDS=off`` disables it (the test suite does, but for its own test).

A JVM writes ``spark-KEY.jsa.PID.part`` (PID: the creating process), and a sidecar
``.jvm`` file names that JVM's pid once it runs; the next launch promotes a finished part
(its JVM gone, the archive's magic number in place) to ``spark-KEY.jsa`` atomically.
Each launch that maps an archive marks it used (its mtime); the files of other keys (an
earlier pyspark or Java) unused for ``STALE_ARCHIVE_S`` are removed, so upgrades leave no
archive behind, while two installations sharing the cache keep theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ENV_SWITCH: Final = "METACTL_SPARK_CDS"
ENV_DIR: Final = "METACTL_CACHE_DIR"
# A dynamic archive's header starts with this magic number (HotSpot, little-endian).
DYNAMIC_MAGIC: Final = (0xF00BABA8).to_bytes(4, "little")
STALE_PART_S: Final = 3600.0  # a part with no JVM noted after this long was abandoned
STALE_ARCHIVE_S: Final = 7 * 86400.0  # another key's files, unused this long, are removed
COMMON: Final = (
    "-XX:+IgnoreUnrecognizedVMOptions",  # a JVM without CDS still starts
    "-Xshare:auto",  # an unusable archive is skipped, never fatal
    "-XX:+VerifySharedSpaces",  # checksummed when written, checked when mapped
    "-Xlog:cds=off",
    "-Xlog:cds+dynamic=off",
)


@dataclass(frozen=True)
class Plan:
    """The driver JVM's options, and the archive it will write at exit (if any)."""

    java_options: str
    writing: Path | None = None


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("0", "off", "false", "no")


def cache_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "metactl"


def _java_home() -> Path | None:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"]).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else None


def archive_key() -> str | None:
    """One archive per pyspark version and Java installation; None without Java."""
    import pyspark

    home = _java_home()
    if home is None:
        return None
    parts = [pyspark.__version__, str(home)]
    for name in ("release", "lib/server/libjvm.so"):
        f = home / name
        if f.exists():
            st = f.stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(directory: Path, key: str) -> Path:
    """The finished archive for `key` in `directory` (parts are named after it)."""
    return directory / f"spark-{key}.jsa"


def _alive(pid: int, part: Path) -> bool:
    """Is `pid` still the JVM writing `part`? (A reused pid runs something else.)"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: trust the pid
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return str(part).encode() in cmdline


def promote_finished(directory: Path, key: str) -> None:
    """Turn finished parts into the archive; drop damaged or abandoned ones."""
    final = archive_path(directory, key)
    for part in directory.glob(f"{final.name}.*.part"):
        sidecar = part.with_suffix(".jvm")
        try:
            pid = int(sidecar.read_text().strip())
        except (OSError, ValueError):
            pid = None
        try:
            if pid is None:
                if time.time() - part.stat().st_mtime > STALE_PART_S:
                    part.unlink()
                continue
            if _alive(pid, part):
                continue  # still running, or still writing
            with part.open("rb") as f:
                finished = f.read(4) == DYNAMIC_MAGIC
            if finished and not final.exists():
                os.replace(part, final)
            else:
                part.unlink()
            sidecar.unlink(missing_ok=True)
        except OSError:
            continue  # another launch got there first


def drop_unused(directory: Path, key: str) -> None:
    """Remove the archives of other keys (and their parts) not used for STALE_ARCHIVE_S:
    an earlier pyspark's or Java's, ~160 MB each. (A JVM mapping one keeps its mapping.)"""
    mine = archive_path(directory, key).name
    now = time.time()
    for path in directory.glob("spark-*.jsa*"):
        if path.name.startswith(mine):
            continue
        try:
            if now - path.stat().st_mtime > STALE_ARCHIVE_S:
                path.unlink()
        except OSError:
            continue  # another launch got there first


def plan() -> Plan | None:
    """The options for the next driver JVM, or None when CDS is off or impossible."""
    if not enabled():
        return None
    key = archive_key()
    if key is None:
        return None
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        promote_finished(directory, key)
        drop_unused(directory, key)
    except OSError:
        return None  # no writable cache: start as usual
    final = archive_path(directory, key)
    if final.is_file():
        with contextlib.suppress(OSError):
            os.utime(final)  # used: kept while its installation is (`drop_unused`)
        return Plan(" ".join((*COMMON, f"-XX:SharedArchiveFile={final}")))
    part = directory / f"{final.name}.{os.getpid()}.part"
    return Plan(" ".join((*COMMON, f"-XX:ArchiveClassesAtExit={part}")), writing=part)


def note_jvm(plan: Plan, pid: int) -> None:
    """Record which JVM writes `plan`'s archive, so a later launch knows when it is done."""
    if plan.writing is not None:
        try:
            plan.writing.with_suffix(".jvm").write_text(f"{pid}\n")
        except OSError:
            return
