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

Reading it refuses every damaged shape with INVALID_STORAGE_IDENTITY naming the file
(`read_identity`): a directory, a FIFO, a device or a socket where the file should be (it
is opened without blocking and checked to be a regular file, so a FIFO cannot hang a
start), a symbolic link that loops or leads nowhere, a file that cannot be read, one
larger than `MAX_IDENTITY_BYTES`, not UTF-8 text, holding control characters, empty, with
a line that is not ``key=value``, a key set twice, a version other than 1, no
``directory.id``, or a bad ``process.role`` or ``log.created``. Numbers in it (``version``,
a broker's ``node.id``) are read as Kafka reads them (`metactl.numbers`): ``version=01``
is 1, ``node.id=1_0`` is refused. Only a missing file (or directory) is no identity.

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
import errno
import fcntl
import os
import stat
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
from metactl.numbers import INT32_MAX, NumberFormatError, kafka_int

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
# Far more than any identity (about 300 bytes): a larger file is not one, and is not read.
MAX_IDENTITY_BYTES: Final = 64 * 1024
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
                raise StorageIdentityError(f"{where} line {number} is not key=value: {raw[:64]!r}")
            if not (key.isprintable() and value.isprintable()):
                raise StorageIdentityError(
                    f"{where} line {number} holds control characters: {raw[:64]!r}"
                )
            if key in values:
                raise StorageIdentityError(f"{where} sets {key} twice")
            values[key] = value
        if not values:
            raise StorageIdentityError(
                f"{where} is empty (no key=value line): not an identity. Format the "
                "directory again (`metactl storage format`) or restore the file"
            )
        version = values.get("version")
        try:
            read_version = None if version is None else kafka_int(version)
        except NumberFormatError:
            read_version = None
        if read_version != VERSION:
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
        node_id = values.get("node.id") or None
        if role == BROKER and node_id is not None:
            node_id = broker_node_id(node_id, where)
        return cls(
            cluster_id=values.get("cluster.id") or None,
            directory_id=directory_id,
            node_id=node_id,
            role=role,
            log_created=created == "true",
            log_location=values.get("metadata.log") or None,
            extra=tuple((k, v) for k, v in values.items() if k not in _KNOWN),
        )


def identity_path(data_dir: Path) -> Path:
    return data_dir / IDENTITY_FILE


def broker_node_id(value: str, where: str) -> str:
    """A broker directory's ``node.id`` as Kafka reads it (a broker id, 0 .. 2^31-1), in
    its canonical spelling; StorageIdentityError naming `where` if it is not one. (A
    controller's ``node.id`` is its --node-id, any name.)"""
    try:
        return str(kafka_int(value, 0, INT32_MAX))
    except NumberFormatError as exc:
        raise StorageIdentityError(
            f"{where} has node.id {value[:64]!r}, which is not a broker id: {exc}"
        ) from None


_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _unusable(path: Path, why: str) -> StorageIdentityError:
    return StorageIdentityError(
        f"{path} {why}: it cannot be this directory's identity. Restore the file, or "
        "move it away and format the directory (`metactl storage format`)"
    )


def _read_identity_bytes(path: Path) -> bytes | None:
    """The file's bytes; None if there is no file. Never blocks on a FIFO (opened with
    O_NONBLOCK, then refused as not a regular file) and never reads more than
    `MAX_IDENTITY_BYTES` + 1 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        if path.is_symlink():
            raise _unusable(
                path, f"is a symbolic link to {os.readlink(path)!r}, which does not exist"
            ) from None
        return None  # no file (or no directory): no identity
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unusable(path, "is a symbolic link that loops") from None
        if exc.errno == errno.ENOTDIR:
            raise _unusable(path, f"is under {path.parent}, which is not a directory") from None
        raise _unusable(path, f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        for test, kind in _KINDS:
            if test(st.st_mode):
                raise _unusable(path, f"is {kind}, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise _unusable(path, "is not a regular file")
        if st.st_size > MAX_IDENTITY_BYTES:
            raise _unusable(
                path, f"is {st.st_size} bytes (an identity is at most {MAX_IDENTITY_BYTES})"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_IDENTITY_BYTES:
            chunk = os.read(fd, MAX_IDENTITY_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_IDENTITY_BYTES:
            raise _unusable(path, f"is over {MAX_IDENTITY_BYTES} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise _unusable(path, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_identity(data_dir: Path) -> Identity | None:
    """The directory's identity; None if it has none (no file, or no directory);
    StorageIdentityError naming the file for every other shape it cannot be read as an
    identity in (the module's docstring lists them)."""
    path = identity_path(data_dir)
    raw = _read_identity_bytes(path)
    if raw is None:
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise _unusable(path, f"is not text (not UTF-8 at byte {exc.start})") from None
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
    if role == BROKER and identity.role in (None, BROKER) and identity.node_id is not None:
        # A broker's node.id is a number (Kafka's): 01 is 1; a name is refused.
        identity = dataclasses.replace(
            identity, node_id=broker_node_id(identity.node_id, str(where))
        )
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
