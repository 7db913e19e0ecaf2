"""Opening a metadata log by path or URL: the one place that knows every backend.

`open_store` maps ``memory:`` to a `MemoryLogStore`, ``etcd://host:port[,...]/prefix`` to
an `EtcdLogStore` (imported only then: it loads the etcd client library), and
``sqlite:``/``sqlite://`` URLs or plain data directories and files to a `SqliteLogStore`.
Keeping it here, above the backends, is what lets `metadata_log.store` stay ignorant of
them: the backends import the store, and only this module imports the backends. Neither
the store modules nor a backend may import this module, and it must not add semantics of
its own (it only chooses and opens).
"""

from __future__ import annotations

import os

from metactl.errors import InvalidRequestError
from metadata_log.memory_store import MemoryLogStore
from metadata_log.sqlite_store import SqliteLogStore
from metadata_log.store import LogStore

__all__ = ["is_etcd_url", "open_store"]


def is_etcd_url(path_or_url: str | os.PathLike[str]) -> bool:
    return os.fspath(path_or_url).startswith("etcd://")


async def open_store(
    path_or_url: str | os.PathLike[str],
    *,
    read_only: bool = False,
    create: bool = True,
    verify_tail: bool = True,
    verify_all: bool = False,
) -> LogStore:
    """Open a log by path or URL: ``memory:``, ``etcd://host:port/prefix``,
    ``sqlite:///abs/path``, or a data dir/file."""
    target = os.fspath(path_or_url)
    if target in ("memory:", "memory://"):
        return MemoryLogStore()
    if is_etcd_url(target):
        from metadata_log.etcd.store import EtcdLogStore

        return await EtcdLogStore.open(
            target,
            read_only=read_only,
            create=create,
            verify_tail=verify_tail,
            verify_all=verify_all,
        )
    if target.startswith("sqlite://"):
        target = target.removeprefix("sqlite://")
    elif target.startswith("sqlite:"):
        target = target.removeprefix("sqlite:")
    if not target:
        raise InvalidRequestError(f"no path in log URL {os.fspath(path_or_url)!r}")
    return await SqliteLogStore.open(
        target, read_only=read_only, create=create, verify_tail=verify_tail, verify_all=verify_all
    )
