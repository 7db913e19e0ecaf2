"""A new term of the active controller, recorded in the log (`ControllerActivated`).

On a log shared by several controllers (etcd, docs/ha.md) the controller that wins the
leadership writes, as its first record of the term (after the abort of a transaction
the previous controller left open), a `ControllerChangeRecord`: who is active now, its
term (the leadership's fencing token) and how the term before it ended, as the
leadership key's history told its campaign. Kafka's KRaft writes a LeaderChangeMessage
at each new epoch the same way. The event feed words it (`metactl events`: "controller
c3 active (term 1234); c2 lost it (dead-active detection)"), and `cluster up` says who is
active from it.

`ControllerActivated` is an event only the controller submits to itself, when it
becomes active on a shared log; `controller_change` is its pure handler. A single
controller on SQLite has no terms and submits none.

Must not: read a clock, do IO, or decide who is active (the election did).
"""

from __future__ import annotations

import msgspec

from controller.core.handler_result import HandlerResult
from metactl.errors import InvalidRequestError
from metadata_log.records import ControllerChangeRecord
from protocol.messages.internal import Ack

__all__ = ["ControllerActivated", "controller_change"]


class ControllerActivated(msgspec.Struct, frozen=True, gc=False):
    """This controller became the active one over the shared log, in term `term` (the
    leadership's token). The `previous_*` fields say how the term before it ended (all
    empty: not known), as `metadata_log.records.ControllerChangeRecord` has them."""

    node: str
    term: int
    address: str = ""
    previous_node: str = ""
    previous_term: int = 0
    previous_reason: str = ""
    previous_by: str = ""
    previous_detail: str = ""


def controller_change(event: ControllerActivated) -> HandlerResult:
    """The record of the new term; INVALID_REQUEST for a term that is no fencing token
    (not positive) or no node."""
    if event.term <= 0:
        raise InvalidRequestError(f"a controller's term is a positive token, not {event.term}")
    if not event.node:
        raise InvalidRequestError("a controller's term names its node")
    record = ControllerChangeRecord(
        node=event.node,
        term=event.term,
        address=event.address,
        previous_node=event.previous_node,
        previous_term=event.previous_term,
        previous_reason=event.previous_reason,
        previous_by=event.previous_by,
        previous_detail=event.previous_detail,
    )
    return HandlerResult([record], Ack())
