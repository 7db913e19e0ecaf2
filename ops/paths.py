"""Where a command finds the controller's metadata log.

Operators pass either a cluster's data directory (`./data`, as `cluster up` lays it out)
or the controller's own (`./data/controller`); every command that reads the log accepts
both through `resolve_log_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from metactl.errors import LogDirNotFoundError
from metadata_log.sqlite_format import LOG_FILE_NAME

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
