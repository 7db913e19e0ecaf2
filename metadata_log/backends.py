"""Opening a metadata log by path or URL: the one place that knows every backend.

`open_store` maps ``memory:`` to a `MemoryLogStore` and ``sqlite:``/``sqlite://`` URLs or
plain data directories and files to a `SqliteLogStore`. Keeping it here, above the
backends, is what lets `metadata_log.store` stay ignorant of them: the backends import the
store, and only this module imports the backends. Neither the store modules nor a backend
may import this module, and it must not add semantics of its own (it only chooses and
opens).
"""

from __future__ import annotations

import os

from metactl.errors import InvalidRequestError
from metadata_log.memory_store import MemoryLogStore
from metadata_log.sqlite_store import SqliteLogStore
from metadata_log.store import LogStore

__all__ = ["open_store"]


async def open_store(path_or_url: str | os.PathLike[str]) -> LogStore:
    """Open a log by path or URL: ``memory:``, ``sqlite:///abs/path``, or a data dir/file."""
    target = os.fspath(path_or_url)
    if target in ("memory:", "memory://"):
        return MemoryLogStore()
    if target.startswith("sqlite://"):
        target = target.removeprefix("sqlite://")
    elif target.startswith("sqlite:"):
        target = target.removeprefix("sqlite:")
    if not target:
        raise InvalidRequestError(f"no path in log URL {os.fspath(path_or_url)!r}")
    return await SqliteLogStore.open(target)
