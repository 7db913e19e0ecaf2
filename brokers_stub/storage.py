"""Small file primitives of the broker's data directory: atomic replace, fsync, the two
little state files (`clean_shutdown`, `metadata_offset`).

Owns *how* bytes reach the disk: "page cache" writes (write a temporary file, rename it
over the old one, no fsync) and durable writes (fsync the file before the rename and the
directory after it). It must not know what a replica or a partition is, and must not
decide *when* anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

CLEAN_SHUTDOWN_FILE: Final = "clean_shutdown"
METADATA_OFFSET_FILE: Final = "metadata_offset"
REPLICAS_DIR: Final = "replicas"
TMP_SUFFIX: Final = ".tmp"


def fsync_dir(directory: Path) -> None:
    """Make a rename, create or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Atomically replace `path` with `data` (write a sibling temporary file, rename).

    With `durable=False` the bytes only reach the page cache: a process crash keeps them,
    an OS crash may not. With `durable=True` the file is fsynced before the rename and the
    directory after it, so the new content survives an OS crash.
    """
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def take_clean_shutdown_epoch(data_dir: Path) -> tuple[int | None, str | None]:
    """Read and delete `clean_shutdown`; return (epoch, problem).

    The file is deleted (and the deletion made durable) before the broker registers, so
    that a crash from now on is seen as unclean at the next start. A missing file gives
    (None, None); an unreadable one gives (None, a description) and is deleted too: a
    file we cannot trust is no proof of a clean shutdown.
    """
    path = data_dir / CLEAN_SHUTDOWN_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    epoch: int | None = None
    problem: str | None = None
    try:
        doc = json.loads(raw)
        value = doc.get("broker_epoch") if isinstance(doc, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            epoch = value
        else:
            problem = f"no valid broker_epoch in {path}"
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"unreadable {path}: {exc}"
    path.unlink()
    fsync_dir(data_dir)
    return epoch, problem


def write_clean_shutdown(data_dir: Path, broker_epoch: int) -> None:
    """The last act of a clean shutdown: record the epoch durably."""
    data = json.dumps({"broker_epoch": broker_epoch}).encode() + b"\n"
    replace_file(data_dir / CLEAN_SHUTDOWN_FILE, data, durable=True)


def write_metadata_offset(data_dir: Path, offset: int) -> None:
    """The offset of the next metadata record the broker needs (page-cache write)."""
    replace_file(data_dir / METADATA_OFFSET_FILE, f"{offset}\n".encode(), durable=False)


def read_metadata_offset(data_dir: Path) -> int | None:
    try:
        return int((data_dir / METADATA_OFFSET_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
