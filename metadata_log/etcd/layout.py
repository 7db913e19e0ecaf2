"""The layout of a metadata log under an etcd key prefix: its keys, the ``meta`` key
that says what the prefix holds, and the log's state (``state/start``, ``state/end``).

`open_meta` creates a new log's meta and empty state in one transaction, or checks an
existing one (a metactl log, a version this code reads, the expected cluster). The full
key layout is described in `metadata_log.etcd.store`. This module must not read or
write batches or snapshots.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence
from typing import Final

import msgspec
import structlog

from metactl.errors import CorruptLogError, InconsistentClusterIdError, LogError, LogSchemaError
from metadata_log.etcd.client import Etcd, Kv
from metadata_log.etcd.lease import LEADER_KEY, decode_leader
from metadata_log.etcd.registry import CONTROLLERS_PREFIX
from metadata_log.etcd.target import EtcdTarget, prefix_end
from metadata_log.etcd.txn import compare_version, op_get, op_put

__all__ = ["FORMAT_VERSION", "MAGIC", "Keys", "LogMeta", "holder", "open_meta", "read_state"]

log = structlog.get_logger("metadata_log")

MAGIC: Final = "metactl-metadata-log"
FORMAT_VERSION: Final = 1


class LogMeta(msgspec.Struct, frozen=True):
    """The ``meta`` key: what the prefix holds."""

    magic: str
    version: int
    cluster_id: str
    created_ms: int


def new_cluster_id() -> str:
    """A random cluster id in Kafka's form (22 characters of URL-safe base64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class Keys:
    def __init__(self, target: EtcdTarget) -> None:
        p = target.prefix
        self.meta = p + b"meta"
        self.state = p + b"state/"
        self.end = p + b"state/end"
        self.start = p + b"state/start"
        self.log = p + b"log/"
        self.log_end = prefix_end(self.log)
        self.snap = p + b"snap/"
        self.leader = p + LEADER_KEY.encode()
        self.controllers = p + CONTROLLERS_PREFIX.encode()

    def batch(self, base: int) -> bytes:
        return self.log + b"%020d" % base

    def snapshot(self, offset: int) -> bytes:
        return self.snap + b"%020d/" % offset


def holder(kvs: Sequence[Kv]) -> str:
    """Who holds the leadership key, from a read of it, for error messages."""
    if not kvs:
        return "free (nobody holds it)"
    info = decode_leader(bytes(kvs[0].value))
    if info is None:
        return f"held under token {kvs[0].create_revision}"
    return f"held by {info.node} (token {kvs[0].create_revision})"


async def read_state(etcd: Etcd) -> tuple[int, int, int]:
    """(start offset, end offset, revision) as etcd holds them now."""
    keys = Keys(etcd.target)
    kvs, _, revision = await etcd.range(keys.state, prefix_end(keys.state))
    values = {bytes(kv.key): bytes(kv.value) for kv in kvs}
    try:
        return int(values[keys.start]), int(values[keys.end]), revision
    except (KeyError, ValueError):
        raise CorruptLogError(
            f"log state is missing or malformed: {values!r}", path=etcd.target.url
        ) from None


async def open_meta(etcd: Etcd, *, create: bool, cluster_id: str | None) -> LogMeta:
    """The prefix's `LogMeta`, created (with the log's empty state) if the prefix is
    empty and `create`; refuses a prefix that holds something else or another cluster's
    log."""
    keys = Keys(etcd.target)
    url = etcd.target.url
    kv, revision = await etcd.get(keys.meta)
    if kv is None:
        # At the revision the meta was found absent: a log another controller creates
        # meanwhile is not mistaken for foreign keys (its create is the txn below).
        found, _, _ = await etcd.range(
            etcd.target.prefix,
            prefix_end(etcd.target.prefix),
            limit=2,
            keys_only=True,
            revision=revision,
        )
        # The leadership key may come first: controllers campaign before the log exists.
        others = [kv for kv in found if bytes(kv.key) != keys.leader]
        if others:
            raise LogSchemaError(
                f"{url} is not a metactl metadata log: the prefix holds keys (such as "
                f"{bytes(others[0].key)!r}) but no {keys.meta!r}"
            )
        if not create:
            raise LogError(f"no metadata log at {url}")
        created_ms = time.time_ns() // 10**6
        meta = LogMeta(MAGIC, FORMAT_VERSION, cluster_id or new_cluster_id(), created_ms)
        r = await etcd.txn(
            "creating the metadata log",
            [compare_version(keys.meta, 0)],
            [
                op_put(keys.meta, msgspec.msgpack.encode(meta)),
                op_put(keys.start, b"0"),
                op_put(keys.end, b"0"),
            ],
            [op_get(keys.meta)],
        )
        if r.succeeded:
            log.info("created metadata log", location=url, cluster_id=meta.cluster_id)
            return meta
        kv = r.responses[0].response_range.kvs[0]  # created meanwhile by another process
    try:
        meta = msgspec.msgpack.decode(bytes(kv.value), type=LogMeta)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise LogSchemaError(f"{url} is not a metactl metadata log (unreadable meta)") from None
    if meta.magic != MAGIC:
        raise LogSchemaError(f"{url} is not a metactl metadata log (magic {meta.magic!r})")
    if meta.version != FORMAT_VERSION:
        raise LogSchemaError(
            f"{url} has log format version {meta.version}; this metactl reads version "
            f"{FORMAT_VERSION}"
        )
    if cluster_id is not None and meta.cluster_id != cluster_id:
        raise InconsistentClusterIdError(
            f"{url} holds the metadata log of cluster {meta.cluster_id!r}, not of "
            f"{cluster_id!r}: refusing to use another cluster's log"
        )
    return meta
