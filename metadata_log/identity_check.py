"""A controller's storage check at start-up: its data directory's identity
(`metadata_log.identity`) against its metadata log, SQLite or etcd.

`check_storage` runs before the controller opens its log (`ControllerService._start`)
and returns the cluster id the controller serves. It refuses, with a named error:

* another cluster's directory or log: ``--cluster-id``, ``meta.properties`` and the
  log's own cluster id (the ``cluster_id`` row of a SQLite log's ``meta`` table, an etcd
  log's `LogMeta`) must agree (INCONSISTENT_CLUSTER_ID);
* a log that is missing or empty (a deleted or truncated file, a file without tables, a
  wiped etcd prefix) while the identity says it was created (METADATA_LOG_MISSING);
* an empty log file in a directory without identity: a truncated log cannot be told from
  a new one (STORAGE_NOT_FORMATTED).

Otherwise it makes the directory whole: a directory without identity is formatted (a new
cluster, when it holds no log) or adopted (a log written before identities existed: its
identity is written, with the log's cluster id if it has one), a new SQLite log is
created, and a log without a cluster id gets the identity's. The identity says
``log.created=true`` from then on.

`inspect_sqlite_log` and `sqlite_verdict` are also what `metactl storage info` reports
with. This module decides nothing about metadata and does not serve: it checks, creates
and records.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from metactl.errors import (
    InconsistentClusterIdError,
    LogError,
    MetadataLogMissingError,
    StorageNotFormattedError,
)
from metadata_log.etcd.tls import PROCESS_DEFAULT, EtcdTls, ProcessDefault
from metadata_log.identity import (
    CONTROLLER,
    IDENTITY_FILE,
    Identity,
    check,
    locked,
    new_id,
    read_identity,
    valid_id,
    write_identity,
)
from metadata_log.sqlite_format import BUSY_TIMEOUT_MS, MAGIC, TABLES_SQL, resolve_log_path

__all__ = [
    "SqliteLogState",
    "check_storage",
    "inspect_sqlite_log",
    "sqlite_location",
    "sqlite_verdict",
    "write_log_cluster_id",
]

log = structlog.get_logger("metadata_log")

LogKind = Literal["absent", "empty", "present", "foreign"]


@dataclass(frozen=True)
class SqliteLogState:
    """What is at a SQLite log's path. `kind`: absent (no file), empty (0 bytes, no
    tables, or only a write-ahead log without its file: `why` says which), present (a
    metactl log), foreign (anything else: opening it names what is wrong)."""

    path: Path
    kind: LogKind
    size: int = 0
    cluster_id: str | None = None
    why: str = ""


def sqlite_location(data_dir: Path, metadata_log: str | None) -> Path | None:
    """The SQLite log file a controller uses, absolute (None for an etcd or in-memory
    log), as `metadata_log.backends.open_store` resolves it."""
    target = os.fspath(metadata_log) if metadata_log is not None else os.fspath(data_dir)
    if target.startswith("etcd://") or target in ("memory:", "memory://"):
        return None
    if target.startswith("sqlite://"):
        target = target.removeprefix("sqlite://")
    elif target.startswith("sqlite:"):
        target = target.removeprefix("sqlite:")
    return resolve_log_path(target).absolute() if target else None


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def inspect_sqlite_log(path: Path) -> SqliteLogState:
    """Look at the file without changing it (a query-only connection)."""
    wal = _sidecar(path, "-wal")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if wal.exists() and wal.stat().st_size > 0:
            return SqliteLogState(path, "empty", why=f"only its write-ahead log {wal} is left")
        return SqliteLogState(path, "absent")
    if size == 0:
        return SqliteLogState(path, "empty", why="0 bytes")
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True)
    except sqlite3.Error:
        return SqliteLogState(path, "foreign", size)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only = ON")
        tables = {row[0] for row in conn.execute(TABLES_SQL)}
        if not tables:
            return SqliteLogState(path, "empty", size, why=f"{size} bytes holding no tables")
        if "meta" not in tables:
            return SqliteLogState(path, "foreign", size)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error:
        return SqliteLogState(path, "foreign", size)
    finally:
        conn.close()
    if meta.get("magic") != MAGIC:
        return SqliteLogState(path, "foreign", size)
    cluster_id = meta.get("cluster_id")
    return SqliteLogState(
        path, "present", size, cluster_id=str(cluster_id) if cluster_id is not None else None
    )


def write_log_cluster_id(path: Path, cluster_id: str) -> None:
    """Record the cluster id in a SQLite log's ``meta`` table (durably; a row already
    there is kept). Takes the log's writer lock, so a log another process writes is left
    alone: LogError, as opening it for writing would say."""
    lock_path = _sidecar(path, ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise LogError(
                f"metadata log {path} is already open for writing by another store "
                f"(lock {lock_path} is held)"
            ) from None
        conn = sqlite3.connect(path)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = FULL")
            with conn:
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('cluster_id', ?)",
                    (cluster_id,),
                )
        finally:
            conn.close()
    finally:
        os.close(fd)


def sqlite_verdict(
    identity: Identity | None,
    state: SqliteLogState,
    data_dir: Path,
    *,
    cluster_id: str | None = None,
    node_id: str | None = None,
) -> None:
    """Refuse what a controller must not start on (see the module's docstring); return
    if it may (formatting, adopting or creating what is missing)."""
    identity_file = data_dir / IDENTITY_FILE
    if identity is None:
        if state.kind == "empty":
            raise StorageNotFormattedError(
                f"{data_dir} has no {IDENTITY_FILE} and its metadata log {state.path} is "
                f"empty ({state.why}): a truncated log cannot be adopted. If this is a new "
                f"cluster, delete the file, or run `metactl storage format --data-dir "
                f"{data_dir}` first"
            )
        if cluster_id is not None and state.cluster_id not in (None, cluster_id):
            raise InconsistentClusterIdError(
                f"{state.path} is the metadata log of cluster {state.cluster_id!r}, not of "
                f"{cluster_id!r}: refusing to use another cluster's log"
            )
        return
    check(identity, data_dir, cluster_id=cluster_id, node_id=node_id, role=CONTROLLER)
    if identity.log_created and state.kind in ("absent", "empty"):
        what = "missing" if state.kind == "absent" else f"empty ({state.why})"
        was = identity.log_location
        moved = (
            f" (at its last start the log was {was}: is --metadata-log right?)"
            if was is not None and was != str(state.path)
            else ""
        )
        raise MetadataLogMissingError(
            f"the metadata log {state.path} is {what}, but {identity_file} says it was "
            f"created{moved}: its metadata is lost, and starting would serve an empty cluster. "
            "Restore the log (from a copy, or `metactl log mirror` of an etcd log); to "
            f"start a new, empty cluster here on purpose, delete {identity_file} and "
            "the log file"
        )
    if identity.cluster_id is not None and state.cluster_id not in (None, identity.cluster_id):
        raise InconsistentClusterIdError(
            f"{state.path} is the metadata log of cluster {state.cluster_id!r}, but "
            f"{data_dir} belongs to cluster {identity.cluster_id!r} ({identity_file}): "
            "refusing to use another cluster's log"
        )


async def check_storage(
    data_dir: Path,
    metadata_log: str | None,
    *,
    cluster_id: str | None = None,
    node_id: str | None = None,
    etcd_tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT,
) -> str | None:
    """Check (and complete) the controller's directory and log before it opens the log;
    the cluster id it serves. An in-memory log has no storage to check (`cluster_id` is
    returned as given). `etcd_tls`: TLS to an etcd log (default: the process's)."""
    data_dir = Path(data_dir)
    for value, what in ((cluster_id, "--cluster-id"), (node_id, "--node-id")):
        if value is not None:
            valid_id(value, what)
    path = sqlite_location(data_dir, metadata_log)
    if path is not None:
        return await _check_sqlite(data_dir, path, cluster_id=cluster_id, node_id=node_id)
    if metadata_log is not None and metadata_log.startswith("etcd://"):
        return await _check_etcd(
            data_dir, metadata_log, cluster_id=cluster_id, node_id=node_id, tls=etcd_tls
        )
    return cluster_id


async def _check_sqlite(
    data_dir: Path, path: Path, *, cluster_id: str | None, node_id: str | None
) -> str | None:
    from metadata_log.sqlite_store import SqliteLogStore

    with locked(data_dir):
        identity = read_identity(data_dir)
        state = inspect_sqlite_log(path)
        if state.kind == "foreign":
            return cluster_id  # opening it names what it is not; nothing is written
        sqlite_verdict(identity, state, data_dir, cluster_id=cluster_id, node_id=node_id)
        chosen = (
            (identity.cluster_id if identity is not None else None)
            or state.cluster_id
            or cluster_id
            or new_id()
        )
        if state.kind != "present":
            store = await SqliteLogStore.open(path, create=True, verify_tail=False)
            await store.close()
        if state.cluster_id is None:
            write_log_cluster_id(path, chosen)
        _record(
            data_dir,
            identity,
            state.kind,
            cluster_id=chosen,
            node_id=node_id,
            location=str(path),
        )
    return chosen


async def _check_etcd(
    data_dir: Path,
    url: str,
    *,
    cluster_id: str | None,
    node_id: str | None,
    tls: EtcdTls | ProcessDefault | None = PROCESS_DEFAULT,
) -> str:
    from metadata_log.etcd.client import Etcd
    from metadata_log.etcd.layout import Keys, open_meta
    from metadata_log.etcd.target import EtcdTarget

    with locked(data_dir):
        identity = read_identity(data_dir)
        if identity is not None:
            check(identity, data_dir, cluster_id=cluster_id, node_id=node_id, role=CONTROLLER)
        expected = identity is not None and identity.log_created
        wanted = (identity.cluster_id if identity is not None else None) or cluster_id
        target = EtcdTarget.parse(url, tls=tls)
        etcd = await Etcd.connect(target)
        try:
            found, _ = await etcd.get(Keys(target).meta)
            if expected and found is None:
                raise MetadataLogMissingError(
                    f"no metadata log at {target.url} (the prefix is empty), but "
                    f"{data_dir / IDENTITY_FILE} says it was created: starting would serve "
                    "an empty cluster. Check the URL and that this is the etcd cluster the "
                    "log was on; to start a new, empty cluster there on purpose, delete "
                    f"{data_dir / IDENTITY_FILE}"
                )
            # Checks the log's cluster id against the identity's (or --cluster-id), or
            # creates the log with it, in one transaction.
            meta = await open_meta(etcd, create=not expected, cluster_id=wanted)
        finally:
            await etcd.close()
        kind: LogKind = "present" if found is not None else "absent"
        _record(
            data_dir,
            identity,
            kind,
            cluster_id=meta.cluster_id,
            node_id=node_id,
            location=target.url,
        )
    return meta.cluster_id


def _record(
    data_dir: Path,
    identity: Identity | None,
    kind: LogKind,
    *,
    cluster_id: str,
    node_id: str | None,
    location: str,
) -> None:
    """Write the identity if the start-up learnt something: formatted, adopted, or the
    log just created."""
    base = identity if identity is not None else Identity.new(cluster_id, node_id)
    updated = base.claimed(
        cluster_id=cluster_id,
        node_id=node_id,
        role=CONTROLLER,
        log_created=True,
        log_location=location,
    )
    if updated == identity:
        return
    write_identity(data_dir, updated)
    if identity is None:
        event = "adopted a metadata log" if kind == "present" else "formatted a new directory"
    else:
        event = "recorded the identity's new facts"
    log.info(
        f"storage identity: {event}",
        data_dir=str(data_dir),
        metadata_log=location,
        cluster_id=updated.cluster_id,
        directory_id=updated.directory_id,
    )
