"""The controllers of a metadata log on etcd, as each records itself: ``controllers/<node
id>`` under the log's prefix, for `metactl quorum describe` to list every controller of
the cluster (as kafka-metadata-quorum lists every voter), not only those it was given.

Each controller puts its `ControllerEntry` (node id, advertised address, start time,
last-seen time) when it starts and again every `REFRESH_S` (`Registration`), with no
lease: a controller that is gone stays listed with the time it was last seen, rather
than vanishing. A controller retired for good is forgotten by deleting its key
(`unregister`, in one transaction that deletes the record only if it is still the one
read: `recorded` gives it with the revision it was written at; `metactl quorum
remove`, whose checks are `metadata_log.etcd.retire`'s). The entries are advisory:
nothing elects, fences or routes by them, and a failed write is logged (at most once a
`WARN_EVERY_S`) and tried again at the next refresh.

This module must not know the log's records or the leadership.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import structlog
from etcd3aio._protobuf import Compare

from metadata_log.etcd.client import Etcd
from metadata_log.etcd.target import prefix_end
from metadata_log.etcd.txn import compare_mod_revision, op_delete, op_get, op_put

__all__ = [
    "CONTROLLERS_PREFIX",
    "REFRESH_S",
    "ControllerEntry",
    "Record",
    "Registration",
    "Unregistered",
    "decode_entry",
    "recorded",
    "registered",
    "unregister",
]

log = structlog.get_logger("metadata_log.etcd")

CONTROLLERS_PREFIX: Final = "controllers/"
REFRESH_S: Final = 5.0
"""How often a controller refreshes its entry's last-seen time."""
WRITE_TIMEOUT_S: Final = 1.0
"""One write of an entry waits this long; a slow etcd delays nothing else."""
WARN_EVERY_S: Final = 60.0
"""Failed writes are logged at most this often (each one is retried at the next refresh)."""


class ControllerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The value of ``controllers/<node id>``: a controller of this log, as it last
    recorded itself. Times are epoch milliseconds of the controller's own clock."""

    node: str
    address: str  # HOST:PORT it advertises to clients
    started_ms: int
    last_seen_ms: int


def decode_entry(value: bytes) -> ControllerEntry | None:
    """An entry's value, or None if it does not decode as a `ControllerEntry`."""
    try:
        return msgspec.msgpack.decode(value, type=ControllerEntry)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def registered(etcd: Etcd) -> list[ControllerEntry]:
    """Every controller recorded under the log's prefix, by node id (entries that do not
    decode are left out)."""
    start = etcd.target.key(CONTROLLERS_PREFIX)
    kvs, _, _ = await etcd.range(start, prefix_end(start))
    entries = (decode_entry(bytes(kv.value)) for kv in kvs)
    return [e for e in entries if e is not None]


@dataclass(frozen=True)
class Record:
    """One controller's key as read: its entry (None if the value does not decode) and
    the revision it was last written at (etcd's mod revision), which `unregister`
    compares."""

    node: str
    entry: ControllerEntry | None
    mod_revision: int

    @classmethod
    def of(cls, node: str, kv: Any) -> Record:
        """The record a read of ``controllers/<node>`` returned (`kv`: etcd's KeyValue)."""
        return cls(node, decode_entry(bytes(kv.value)), int(kv.mod_revision))


async def recorded(etcd: Etcd, node: str) -> Record | None:
    """The record of controller `node` (None: no key ``controllers/<node>``)."""
    kv, _ = await etcd.get(etcd.target.key(CONTROLLERS_PREFIX + node))
    if kv is None:
        return None
    return Record.of(node, kv)


@dataclass(frozen=True)
class Unregistered:
    """What `unregister` did: `deleted` the record, at etcd `revision`; or, if not, the
    record now there (`now`: None if the key is gone, else it was written again)."""

    deleted: bool
    revision: int
    now: Record | None = None


async def unregister(etcd: Etcd, record: Record, *, also: Sequence[Compare] = ()) -> Unregistered:
    """Delete `record`'s key in one transaction, only if it was last written at the
    record's revision (a controller that recorded itself again since keeps its record)
    and every compare of `also` holds (the caller's conditions, e.g. on the leadership
    key). Attempted once: an error means its outcome is unknown (read it again)."""
    key = etcd.target.key(CONTROLLERS_PREFIX + record.node)
    r = await etcd.txn(
        "the removal of a controller's registration",
        [compare_mod_revision(key, record.mod_revision), *also],
        [op_delete(key)],
        [op_get(key)],
    )
    revision = int(r.header.revision)
    if r.succeeded:
        return Unregistered(deleted=True, revision=revision)
    kvs = r.responses[0].response_range.kvs
    now = Record.of(record.node, kvs[0]) if kvs else None
    return Unregistered(deleted=False, revision=revision, now=now)


class Registration:
    """This controller's entry, written by `write` and refreshed by `run` (a task of its
    owner, cancelled when it stops) until cancelled. Never raises an etcd error: a write
    that fails is logged (rate-limited) and tried again at the next refresh."""

    def __init__(self, etcd: Etcd, node: str, address: str) -> None:
        self.etcd = etcd
        self.node = node
        self.address = address
        self.started_ms = time.time_ns() // 1_000_000
        self.key = etcd.target.key(CONTROLLERS_PREFIX + node)
        self._warned_at: float | None = None

    async def write(self) -> bool:
        """Put the entry with the last-seen time now; whether etcd took it."""
        entry = ControllerEntry(
            node=self.node,
            address=self.address,
            started_ms=self.started_ms,
            last_seen_ms=time.time_ns() // 1_000_000,
        )
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self.etcd.txn(
                    "a controller's registration",
                    [],
                    [op_put(self.key, msgspec.msgpack.encode(entry))],
                    timeout_s=WRITE_TIMEOUT_S,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # advisory: nothing may stop the controller
            now = time.monotonic()
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "could not record this controller in etcd; retrying",
                    node=self.node,
                    error=getattr(exc, "message", None) or repr(exc),
                    every_s=REFRESH_S,
                )
            return False
        return True

    async def run(self) -> None:
        """Refresh the entry every `REFRESH_S`, until cancelled."""
        while True:
            await asyncio.sleep(REFRESH_S)  # a timer, not synchronisation
            await self.write()
