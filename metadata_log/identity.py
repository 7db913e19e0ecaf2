"""A data directory's identity: the ``meta.properties`` file, as Kafka's `kafka-storage`
writes it, and the checks a process makes of it before it starts.

The file (Java properties, one ``key=value`` a line)::

    version=1                 # of this file's format
    cluster.id=mC3tL0ZpQv6...  # the cluster the directory belongs to
    directory.id=Zx1c...      # this directory, random (Kafka's directory.id)
    node.id=1                 # the broker id, or a controller's --node-id (optional)
    process.role=controller   # controller or broker: set by the first start (optional)
    log.created=true          # the process's log exists: the controller's metadata log,
                              # a broker's replica directory
    metadata.log=/data/controller/metadata.log.sqlite
                              # where a controller's log was at its last start (for the
                              # messages and `storage info`; not checked)

`metactl storage format` writes it (``log.created=false`` unless a log is there already);
a process writes it on its first start (`metadata_log.identity_check` for a controller,
`brokers_stub.identity_check` for a broker), and flips ``log.created`` once its log
exists. From then on a missing or emptied log is refused instead of silently becoming an
empty cluster (docs/operations.md, Storage identity).

Every write is atomic and durable: a temporary file is written and fsynced, renamed over
the old one, and the directory fsynced. `locked` serializes the processes that check and
write one directory (an advisory lock on the directory itself).

This module only reads, checks and writes the file: it opens no log and decides nothing
about what a process does with its directory. Standard library only, so a broker can use
it without loading the log's backends.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metactl.errors import (
    InconsistentClusterIdError,
    InconsistentNodeIdError,
    InvalidConfigurationError,
    StorageIdentityError,
)

__all__ = [
    "BROKER",
    "CONTROLLER",
    "IDENTITY_FILE",
    "Identity",
    "check",
    "locked",
    "new_id",
    "read_identity",
    "valid_id",
    "write_identity",
]

IDENTITY_FILE: Final = "meta.properties"
VERSION: Final = 1
CONTROLLER: Final = "controller"
BROKER: Final = "broker"
ROLES: Final = (CONTROLLER, BROKER)
_KNOWN: Final = (
    "version", "cluster.id", "directory.id", "node.id", "process.role", "log.created",
    "metadata.log",
)  # fmt: skip
_HEADER: Final = (
    "# metactl storage identity, written by `metactl storage format` or a first start.\n"
    "# Do not edit: docs/operations.md, Storage identity.\n"
)


def new_id() -> str:
    """A random id in Kafka's form: 22 characters of URL-safe base64 (a v4 UUID), never
    starting with "-" (as Kafka's Uuid.randomUuid: such an id would read as a flag on a
    command line)."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value


def valid_id(value: str, what: str) -> str:
    """`value` if it can be a cluster or node id (printable, non-empty, no surrounding
    blanks, no ``=``); InvalidConfigurationError naming `what` otherwise."""
    if not value or not value.isprintable() or value != value.strip() or "=" in value:
        raise InvalidConfigurationError(
            f"{what} must be printable, without spaces around it or '=': got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Identity:
    """What ``meta.properties`` says. `cluster_id` is None only in a broker directory
    formatted before it was told its cluster (it takes the first `--cluster-id` given)."""

    cluster_id: str | None
    directory_id: str
    node_id: str | None = None
    role: str | None = None  # CONTROLLER or BROKER, once a process has started on it
    log_created: bool = False
    log_location: str | None = None  # a controller's log at its last start: path or URL
    extra: tuple[tuple[str, str], ...] = ()  # keys of a newer metactl, kept as they are

    @classmethod
    def new(cls, cluster_id: str | None, node_id: str | None = None) -> Identity:
        return cls(cluster_id=cluster_id, directory_id=new_id(), node_id=node_id)

    def claimed(
        self,
        *,
        cluster_id: str | None,
        node_id: str | None,
        role: str,
        log_created: bool,
        log_location: str | None = None,
    ) -> Identity:
        """This identity with what a start-up learnt filled in: a cluster id, node id or
        role it did not record yet, `log_created` once the log exists (never unset: only
        formatting again does that), and where the log is now. Fields already set are kept
        (`check` refuses a process that disagrees with them)."""
        return dataclasses.replace(
            self,
            cluster_id=self.cluster_id or cluster_id,
            node_id=self.node_id if self.node_id is not None else node_id,
            role=self.role or role,
            log_created=self.log_created or log_created,
            log_location=log_location or self.log_location,
        )

    def fields(self) -> dict[str, str]:
        """The file's keys and values, in the file's order."""
        out = {"version": str(VERSION)}
        if self.cluster_id is not None:
            out["cluster.id"] = self.cluster_id
        out["directory.id"] = self.directory_id
        if self.node_id is not None:
            out["node.id"] = self.node_id
        if self.role is not None:
            out["process.role"] = self.role
        out["log.created"] = "true" if self.log_created else "false"
        if self.log_location is not None:
            out["metadata.log"] = self.log_location
        out.update(self.extra)
        return out

    def encode(self) -> bytes:
        return (_HEADER + "".join(f"{k}={v}\n" for k, v in self.fields().items())).encode()

    @classmethod
    def parse(cls, text: str, where: str) -> Identity:
        """From the file's text; StorageIdentityError naming `where` if malformed."""
        values: dict[str, str] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise StorageIdentityError(f"{where} line {number} is not key=value: {raw!r}")
            if key in values:
                raise StorageIdentityError(f"{where} sets {key} twice")
            values[key] = value
        version = values.get("version")
        if version != str(VERSION):
            raise StorageIdentityError(
                f"{where} has version {version!r}; this metactl reads version {VERSION}"
            )
        directory_id = values.get("directory.id")
        if not directory_id:
            raise StorageIdentityError(f"{where} has no directory.id")
        role = values.get("process.role") or None
        if role is not None and role not in ROLES:
            raise StorageIdentityError(f"{where} has process.role {role!r} (controller, broker)")
        created = values.get("log.created", "false")
        if created not in ("true", "false"):
            raise StorageIdentityError(f"{where} has log.created {created!r} (true, false)")
        return cls(
            cluster_id=values.get("cluster.id") or None,
            directory_id=directory_id,
            node_id=values.get("node.id") or None,
            role=role,
            log_created=created == "true",
            log_location=values.get("metadata.log") or None,
            extra=tuple((k, v) for k, v in values.items() if k not in _KNOWN),
        )


def identity_path(data_dir: Path) -> Path:
    return data_dir / IDENTITY_FILE


def read_identity(data_dir: Path) -> Identity | None:
    """The directory's identity; None if it has none (or does not exist);
    StorageIdentityError if the file is unreadable as an identity."""
    path = identity_path(data_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise StorageIdentityError(f"{path} is not text") from None
    return Identity.parse(text, str(path))


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_identity(data_dir: Path, identity: Identity) -> None:
    """Write the identity atomically and durably: a temporary file, fsynced, renamed over
    the old one, then the directory fsynced (a crash leaves the old file or the new one,
    never a torn one)."""
    path = identity_path(data_dir)
    tmp = data_dir / f".{IDENTITY_FILE}.tmp"
    data = identity.encode()
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(data_dir)


@contextlib.contextmanager
def locked(data_dir: Path) -> Iterator[None]:
    """Create the directory if needed and hold an exclusive advisory lock on it: two
    processes starting on one directory check and write its identity one after the other
    (the second then meets the first's log lock, as before)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def check(
    identity: Identity,
    data_dir: Path,
    *,
    cluster_id: str | None,
    node_id: str | None,
    role: str,
) -> None:
    """Refuse a process that does not fit the directory: another cluster's
    (InconsistentClusterIdError), another node's (InconsistentNodeIdError), the other
    kind of process's (StorageIdentityError). What the identity does not record yet, or
    the process was not told, is not compared."""
    where = identity_path(data_dir)
    if cluster_id is not None and identity.cluster_id not in (None, cluster_id):
        raise InconsistentClusterIdError(
            f"{data_dir} belongs to cluster {identity.cluster_id!r} ({where}), not to "
            f"{cluster_id!r}: refusing to start on another cluster's directory"
        )
    if node_id is not None and identity.node_id not in (None, node_id):
        raise InconsistentNodeIdError(
            f"{data_dir} belongs to node {identity.node_id!r} ({where}), not to "
            f"{node_id!r}: refusing to start on another node's directory"
        )
    if identity.role not in (None, role):
        raise StorageIdentityError(
            f"{data_dir} is a {identity.role}'s data directory ({where}): a {role} may not "
            "start on it"
        )
