"""Retiring a controller for good: `metactl quorum remove` forgets its record in etcd
(`metadata_log.etcd.registry`), which has no lease, so that `metactl quorum describe`
stops listing it as unreachable.

`remove_controller` reads the record and the leadership key, and refuses:

* a node that is not recorded: VoterNotFoundError (with `if_exists`, nothing is done);
* the active controller, the holder of the leadership key (`metadata_log.etcd.lease`):
  ControllerIsActiveError, even with `force`;
* a controller last seen under `RECENT_S` ago (three refreshes of its record), unless
  `force`: ControllerInUseError. It is probably running, and a running controller
  records itself again within `REFRESH_S` anyway. Its last-seen time is its own clock's,
  compared with this process's: a clock ahead by more than `RECENT_S` makes a controller
  look alive for ever (`force` then), one behind makes a live one look gone for a while.

The record is then deleted in one transaction (`registry.unregister`) that also checks
that it is the one read (its mod revision: a controller that recorded itself again
meanwhile keeps its record, ControllerInUseError) and that the leadership key is the
one read (its create revision: a term that began meanwhile is checked again, up to
`ATTEMPTS` times).

This module reads the leadership key; it never writes it, and knows no log record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from metactl.errors import (
    ControllerInUseError,
    ControllerIsActiveError,
    StoreUnavailableError,
    VoterNotFoundError,
)
from metadata_log.etcd.client import Etcd
from metadata_log.etcd.lease import LEADER_KEY, current_leader
from metadata_log.etcd.registry import (
    REFRESH_S,
    ControllerEntry,
    Record,
    recorded,
    registered,
    unregister,
)
from metadata_log.etcd.txn import compare_create_revision

__all__ = ["ATTEMPTS", "RECENT_S", "Removed", "remove_controller"]

RECENT_S: Final = 3 * REFRESH_S
"""A controller last seen more recently than this is taken to be running."""
ATTEMPTS: Final = 3
"""Reads and deletes tried while only the leadership changes between them."""


@dataclass(frozen=True)
class Removed:
    """A controller's record, deleted at etcd `revision`."""

    node: str
    entry: ControllerEntry | None  # None: the value did not decode (it was never listed)
    revision: int
    seen_ago_s: float | None  # how long before the removal it was last seen (None: unknown)
    forced: bool  # seen under RECENT_S ago, removed because of `force`


def _seen_ago_s(record: Record, now_ms: int) -> float | None:
    if record.entry is None or not record.entry.last_seen_ms:
        return None
    return (now_ms - record.entry.last_seen_ms) / 1000


def _who(record: Record) -> str:
    address = record.entry.address if record.entry is not None else ""
    return f"controller {record.node!r}" + (f" ({address})" if address else "")


async def remove_controller(
    etcd: Etcd,
    node: str,
    *,
    force: bool = False,
    if_exists: bool = False,
    now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> Removed | None:
    """Delete the record of controller `node` under `etcd`'s prefix, after the checks
    of the module's docstring; None if it is not recorded and `if_exists`. Raises
    VoterNotFoundError, ControllerIsActiveError or ControllerInUseError (nothing was
    deleted), or etcd's errors (an error from the delete itself leaves its outcome
    unknown: a second run says)."""
    where = etcd.target.url
    for _ in range(ATTEMPTS):
        record = await recorded(etcd, node)
        if record is None:
            if if_exists:
                return None
            names = sorted(e.node for e in await registered(etcd))
            raise VoterNotFoundError(
                f"no controller {node!r} is recorded under {where} (recorded: "
                f"{', '.join(names) or 'none'}); quorum describe lists the recorded ones"
            )
        leader, token = await current_leader(etcd)
        if leader is not None and leader.node == node:
            raise ControllerIsActiveError(
                f"{_who(record)} is the active controller (it holds the leadership key, "
                f"term {token}): its record is not removed, even with --force. Stop it; "
                "once another controller has taken over, remove it"
            )
        if token and leader is None and not force:
            raise ControllerInUseError(
                f"the leadership key under {where} is held but does not decode, so whether "
                f"{_who(record)} is the active controller is unknown; nothing was deleted "
                "(--force removes the record anyway)"
            )
        seen_ago = _seen_ago_s(record, now_ms())
        recent = seen_ago is not None and seen_ago < RECENT_S
        if recent and not force:
            assert seen_ago is not None
            raise ControllerInUseError(
                f"{_who(record)} was last seen {max(0.0, seen_ago):.0f} s ago (under "
                f"{RECENT_S:g} s, three refreshes of its record): it is probably running, "
                f"and a running controller records itself again within {REFRESH_S:g} s, so "
                f"removing its record would not retire it. Stop it and retry after "
                f"{RECENT_S:g} s, or pass --force"
            )
        done = await unregister(
            etcd, record, also=[compare_create_revision(etcd.target.key(LEADER_KEY), token)]
        )
        if done.deleted:
            return Removed(node, record.entry, done.revision, seen_ago, forced=recent)
        if done.now is None:
            if if_exists:
                return None
            raise VoterNotFoundError(
                f"the record of {_who(record)} under {where} was deleted by someone else "
                "while being removed"
            )
        if done.now.mod_revision != record.mod_revision:
            raise ControllerInUseError(
                f"{_who(record)} recorded itself again while its record was being removed: "
                "it is running; nothing was deleted"
            )
        # Only the leadership changed (a new term, maybe this controller's): check again.
    raise StoreUnavailableError(
        f"the leadership under {where} changed {ATTEMPTS} times while the record of "
        f"controller {node!r} was being removed; nothing was deleted, try again"
    )
