"""Where a command finds the controller's metadata log.

Operators pass either a cluster's data directory (`./data`, as `cluster up` lays it out)
or the controller's own (`./data/controller`); every command that reads the log accepts
both through `resolve_log_dir`. A log on etcd is named by its URL
(``etcd://host:port[,host:port...]/prefix``) in the same place: `open_log` opens either,
read-only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from metactl.errors import LogDirNotFoundError
from metadata_log.backends import is_etcd_url, open_store
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.store import LogStore

# Where `cluster up` keeps the controller's log inside a cluster data directory.
CONTROLLER_SUBDIR: Final = "controller"


def resolve_log_dir(path: str | os.PathLike[str]) -> Path:
    """`path` if it holds the metadata log file, else `path/controller` if that does;
    else LogDirNotFoundError naming both places tried."""
    given = Path(path)
    sub = given / CONTROLLER_SUBDIR
    for candidate in (given, sub):
        if (candidate / LOG_FILE_NAME).is_file():
            return candidate
    raise LogDirNotFoundError(f"no metadata log ({LOG_FILE_NAME}) in {given} nor in {sub}")


def log_location(path: str | os.PathLike[str]) -> str:
    """An etcd URL as given; else the log file itself, or the directory holding it
    (`resolve_log_dir`)."""
    text = os.fspath(path)
    if is_etcd_url(text):
        return text
    return text if Path(text).is_file() else str(resolve_log_dir(text))


async def open_log(path: str | os.PathLike[str], *, verify_tail: bool = True) -> LogStore:
    """The log a command names (a data directory, a log file or an etcd URL), open
    read-only: it follows a writer's commits (`wait_for`) and never writes."""
    return await open_store(
        log_location(path), read_only=True, create=False, verify_tail=verify_tail
    )
