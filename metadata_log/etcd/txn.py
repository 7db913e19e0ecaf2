"""The compares and operations an etcd transaction is built of (`Etcd.txn`), as etcd's
protobuf messages: thin names over the client library's builders.

No IO: building requests only.
"""

from __future__ import annotations

from etcd3aio._protobuf import Compare, RequestOp
from etcd3aio.kv import KVService


def compare_create_revision(key: bytes, revision: int) -> Compare:
    return KVService.txn_compare_create_revision(key, revision)


def compare_mod_revision(key: bytes, revision: int) -> Compare:
    """The key was last written at `revision` (0: it does not exist)."""
    return Compare(result=Compare.EQUAL, target=Compare.MOD, key=key, mod_revision=revision)


def compare_version(key: bytes, version: int) -> Compare:
    return KVService.txn_compare_version(key, version)


def compare_value(key: bytes, value: bytes) -> Compare:
    return KVService.txn_compare_value(key, value)


def op_put(key: bytes, value: bytes, *, lease: int = 0) -> RequestOp:
    return KVService.txn_op_put(key, value, lease=lease)


def op_get(key: bytes, end: bytes | None = None) -> RequestOp:
    return KVService.txn_op_get(key, range_end=end)


def op_delete(key: bytes, end: bytes | None = None) -> RequestOp:
    return KVService.txn_op_delete(key, range_end=end)
