"""The leadership key of a metadata log on etcd and what is written beside it: its value
(`LeaderInfo`, who holds it and where), a holder as a campaign finds it (`Holder`), and how
the last term ended (`TermEnd`, at ``<prefix>term-end``, written in the transaction that
deleted the key: "resigned", "lease expired", "dead-active detection" or "restarted").

Data and decoding only: how terms are won, kept and ended is `metadata_log.etcd.lease`'s
and `metadata_log.etcd.outlast`'s. This module must not call etcd but to read the key.
"""

from __future__ import annotations

import contextlib
from typing import Final, NamedTuple

import msgspec

from metadata_log.etcd.client import Etcd

__all__ = [
    "DEAD_ACTIVE",
    "LEADER_KEY",
    "LEASE_EXPIRED",
    "RESIGNED",
    "RESTARTED",
    "TERM_END_KEY",
    "Holder",
    "LeaderInfo",
    "TermEnd",
    "current_leader",
    "decode_leader",
    "decode_term_end",
]

LEADER_KEY: Final = "leader"
TERM_END_KEY: Final = "term-end"
"""How the last term ended (a `TermEnd`), written with the leadership key's deletion."""
RESIGNED: Final = "resigned"
LEASE_EXPIRED: Final = "lease expired"
DEAD_ACTIVE: Final = "dead-active detection"
RESTARTED: Final = "restarted"


class LeaderInfo(msgspec.Struct, frozen=True):
    """The value of the leadership key: who holds it and where to reach it."""

    node: str
    address: str = ""  # HOST:PORT of the holder's listener ("" for a tool with no listener)
    since_ms: int = 0
    ttl_ms: int = 0  # the holder's TTL (0: an older controller's key, bound to a lease)


class TermEnd(msgspec.Struct, frozen=True):
    """How a term of the leadership ended, written by whoever ended it in the transaction
    that deleted the key, and read by the next holder as it wins."""

    node: str  # the holder whose term ended
    token: int  # that term's token
    reason: str  # RESIGNED, LEASE_EXPIRED, DEAD_ACTIVE or RESTARTED
    by: str = ""  # the controller that ended it ("" when the holder resigned)
    detail: str = ""  # the holder's own reason, when it resigned


def decode_term_end(kvs: object) -> TermEnd | None:
    for kv in kvs:  # type: ignore[attr-defined]  # the range's key-values: one or none
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            return msgspec.msgpack.decode(kv.value, type=TermEnd)
    return None


class Holder(NamedTuple):
    """The leadership key as a campaign found it held by another: its value (None if it
    does not decode), its create revision (that term's token) and its etcd lease (0 but
    for an older controller's key)."""

    info: LeaderInfo | None
    token: int
    lease_id: int


def decode_leader(value: bytes) -> LeaderInfo | None:
    """The leadership key's value, or None if it does not decode as a `LeaderInfo`."""
    try:
        return msgspec.msgpack.decode(value, type=LeaderInfo)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def current_leader(etcd: Etcd) -> tuple[LeaderInfo | None, int]:
    """Who holds the leadership key now (None: nobody, or an unreadable value) and its
    create revision (0: nobody)."""
    kv, _ = await etcd.get(etcd.target.key(LEADER_KEY))
    if kv is None:
        return None, 0
    return decode_leader(kv.value), int(kv.create_revision)
