"""What every pure handler returns: `HandlerResult`, and the continuations (`FollowUp`)
a handler returns when its work is larger than the budget (`controller.core.work`).

The handlers are by concern: brokers (`controller.core.broker_handlers`), partitions
(`controller.core.partition_handlers`), topic creation and placement
(`controller.core.topic_handlers`) and the metadata lifecycle
(`controller.core.lifecycle`); `controller.core.step` runs them. A continuation is an
event only the controller submits to itself, never the wire, stepped inside the
transaction its first slice opened.

Data only: no rules, no IO, no clock.
"""

from __future__ import annotations

import enum

import msgspec

from controller.core.work import PartitionPlan
from metadata_log.records import MetadataRecord
from protocol.messages.admin import Reassignment, ReassignmentResult
from protocol.messages.unions import ControllerResponse

__all__ = [
    "BrokerOp",
    "ClearElrSlice",
    "Continue",
    "CreateTopicSlice",
    "FollowUp",
    "HandlerResult",
    "ReassignSlice",
]


class CreateTopicSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of a topic created in slices: partitions [start, partitions) are still to be
    written, inside the transaction the first slice opened (`create_topic`).

    An event for `controller.core.step.step` that only the controller submits to itself,
    never the wire. Everything a slice needs was decided and validated by the first one:
    the topic id, the effective min ISR and the placement (`assignments` when explicit,
    else striped over `brokers`). `placed` keeps the striped assignments written so far,
    for the response of the last slice.
    """

    name: str
    topic_id: str
    partitions: int
    min_isr: int
    start: int
    assignments: list[list[int]] | None = None  # explicit, from partition `first` on
    brokers: tuple[int, ...] = ()
    replication_factor: int = 0
    placed: tuple[list[list[int]], ...] = ()
    first: int = 0  # the partition `assignments[0]` is for (add partitions: the old count)


class BrokerOp(enum.Enum):
    """What a `Continue` does to each partition of its broker."""

    FENCE = "fence"  # leave the ISR (rule 2), re-elect where it led
    CONTROLLED_SHUTDOWN = "controlled_shutdown"  # the same, as rule 5
    UNFENCE = "unfence"  # elect where its ELR/ISR membership makes it possible (rule 4)
    UNCLEAN_REGISTRATION = "unclean_registration"  # ELR -> LastKnownELR (rule 3)
    UNREGISTER = "unregister"  # leave every ISR, ELR and LastKnownELR (KIP-966)


class Continue(msgspec.Struct, frozen=True, gc=False):
    """The rest of an operation on one broker's partitions, stepped after its first slice
    inside the transaction that slice opened (see `controller.core.work`).

    An event for `controller.core.step.step` that only the controller submits to itself,
    never the wire. The broker-level record was written by the first slice; each
    continuation writes the partition changes of the next `WORK_BUDGET` partitions of
    `plan` (re-reading each partition from the image, so the changes are exactly those
    the unsliced operation would write). `response` is the operation's answer, released
    after the last slice; for a controlled shutdown `still_leads` accumulates whether the
    broker still leads a partition once its changes apply.
    """

    op: BrokerOp
    broker_id: int
    plan: PartitionPlan
    response: ControllerResponse
    still_leads: bool = False


class ClearElrSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of a clearing (a min.insync.replicas change or an ELR downgrade): the
    topics still to clear, each with its partition count and new configured MinISR (None:
    unchanged), from partition `start` of the first. An event only the controller
    submits to itself, inside the transaction its first slice opened."""

    topics: tuple[tuple[str, int, int | None], ...]
    start: int
    response: ControllerResponse


class ReassignSlice(msgspec.Struct, frozen=True, gc=False):
    """The rest of an AlterPartitionReassignments: the partitions from `position` on,
    and the results so far."""

    reassignments: tuple[Reassignment, ...]
    position: int
    results: tuple[ReassignmentResult, ...]


FollowUp = CreateTopicSlice | Continue | ClearElrSlice | ReassignSlice


class HandlerResult(msgspec.Struct, frozen=True):
    records: list[MetadataRecord]
    response: ControllerResponse
    # Work larger than the budget: the continuation to step next (the response is then a
    # placeholder; the last continuation's response is the request's).
    follow_up: FollowUp | None = None
