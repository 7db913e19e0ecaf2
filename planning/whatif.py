"""A copy of an image stepped through the controller's core with the events a broker's
restart causes: what-if, by the real rules.

`WhatIf` holds a `ControllerState` made from an image (no recovery in progress, nothing
queued: only what its own events touch is evaluated) and settles each event through
`controller.core.step.settle`, the step the driver, the simulators and the tests run,
with the controller's own rules (its config and recovery policies). The events are the
ones the brokers send, built here from the copy's current state:

* `shut_down`: the broker's heartbeat asking for a controlled shutdown (rule 5);
* `crash`: the FenceBroker its session's expiry causes (rule 2);
* `register_again`: a new incarnation's registration, with the epoch it last had (clean,
  from its clean-shutdown file) or without (unclean: rule 3, Unclean Exclusion);
* `unfence`: its first heartbeat once it has caught up with the log (rule 4);
* `rejoin`: each leader's AlterPartitions taking the broker back into the ISR of every
  partition it hosts that has an active leader (rule 6, case E), once its replicas have
  caught up.

The steps are unsliced (`Rules.work_budget` None): slicing cuts the same records into
transactions so that the live controller answers in between (`controller.core.work`),
which a copy nobody waits on does not need.

Pure: no IO, no clock, never changes the image it was given (images are immutable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from controller.core.recovery.tracker import RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, StepResult, settle
from controller.core.work import EMPTY_BACKLOG
from metactl.errors import BrokerIdNotRegisteredError, InvalidRequestError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.state import BrokerState, PartitionState
from metadata_log.records import NO_LEADER
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitions,
    BrokerHeartbeatRequest,
    IsrMember,
    RegisterBroker,
)
from protocol.messages.internal import FenceBroker

# The incarnation id of a restarted broker in a plan (a real one draws a fresh one).
PLANNED_INCARNATION = "planned-restart"


def active_broker(image: ClusterImage, broker_id: int) -> BrokerState:
    """The broker, which must be registered and active (unfenced, not stopping) for a
    restart of it to mean anything: BROKER_ID_NOT_REGISTERED or INVALID_REQUEST."""
    b = image.broker(broker_id)
    if b is None:
        raise BrokerIdNotRegisteredError(f"broker {broker_id} is not registered")
    if b.fenced:
        raise InvalidRequestError(
            f"broker {broker_id} is fenced: it is down already (metactl describe "
            "--unavailable-partitions shows what that costs)"
        )
    if b.in_controlled_shutdown:
        raise InvalidRequestError(f"broker {broker_id} is in controlled shutdown already")
    return b


class WhatIf:
    """A copy of `image`, stepped event by event with the controller's `rules` at `now_ms`."""

    def __init__(self, image: ClusterImage, rules: Rules, now_ms: int) -> None:
        self.state = ControllerState(image, RecoveryTracker(), EMPTY_BACKLOG)
        self.rules = msgspec.structs.replace(rules, work_budget=None)
        self.now_ms = now_ms

    @property
    def image(self) -> ClusterImage:
        return self.state.image

    @property
    def tracker(self) -> RecoveryTracker:
        return self.state.tracker

    def run(self, event: Event) -> StepResult:
        """`event`, its recovery evaluation included, through the core's step."""
        result = settle(self.state, event, self.now_ms, self.rules)
        self.state = result.state
        return result

    def fork(self) -> WhatIf:
        """Another copy from where this one is (the state is immutable: nothing copied)."""
        other = WhatIf.__new__(WhatIf)
        other.state, other.rules, other.now_ms = self.state, self.rules, self.now_ms
        return other

    def shut_down(self, broker_id: int) -> StepResult:
        b = self.image.brokers[broker_id]
        return self.run(
            BrokerHeartbeatRequest(
                broker_id=broker_id,
                broker_epoch=b.epoch,
                metadata_offset=self.image.end_offset,
                want_shutdown=True,
            )
        )

    def crash(self, broker_id: int) -> StepResult:
        return self.run(FenceBroker(broker_id=broker_id, reason="session_timeout"))

    def register_again(self, broker_id: int, *, clean: bool) -> StepResult:
        b = self.image.brokers[broker_id]
        return self.run(
            RegisterBroker(
                broker_id=broker_id,
                incarnation_id=f"{PLANNED_INCARNATION}-{broker_id}-{self.image.end_offset}",
                previous_epoch=b.epoch if clean else None,
                endpoint=b.endpoint,
                rack=b.rack,
                kafka_endpoint=b.kafka_endpoint,
            )
        )

    def unfence(self, broker_id: int) -> StepResult:
        b = self.image.brokers[broker_id]
        return self.run(
            BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=b.epoch, metadata_offset=self.image.end_offset
            )
        )

    def rejoin(self, broker_id: int) -> list[StepResult]:
        """Every leader's AlterPartitions adding `broker_id` back to the ISR of the
        partitions it hosts (one request per leader, as a leader batches its own). An
        item the controller refuses leaves its partition as it was."""
        image = self.image
        by_leader: dict[int, list[AlterPartition]] = {}
        for p in image.partitions_of(broker_id):
            item = expansion(image, p, broker_id)
            if item is not None:
                by_leader.setdefault(item.leader, []).append(item)
        return [self.run(AlterPartitions(items=by_leader[leader])) for leader in sorted(by_leader)]


def merged(results: Iterable[StepResult]) -> MetadataDelta:
    """What several steps changed, as one delta."""
    delta = MetadataDelta()
    for r in results:
        delta.update(r.delta)
    return delta


def expansion(image: ClusterImage, p: PartitionState, broker_id: int) -> AlterPartition | None:
    """The AlterPartition with which `p`'s leader takes `broker_id` back into its ISR,
    as a leader sends it (its epochs, the ISR members' broker epochs); None where the
    broker is in it already, or no active leader could (none, or itself)."""
    leader = p.leader
    if broker_id in p.isr or leader in (NO_LEADER, broker_id):
        return None
    if not image.is_active(leader) or not image.is_active(broker_id):
        return None
    brokers = image.brokers
    return AlterPartition(
        topic=p.topic,
        partition=p.partition,
        leader=leader,
        broker_epoch=brokers[leader].epoch,
        partition_epoch=p.partition_epoch,
        leader_epoch=p.leader_epoch,
        isr=_members(brokers, sorted(p.isr | {broker_id})),
    )


def _members(brokers: Mapping[int, BrokerState], ids: Iterable[int]) -> list[IsrMember]:
    return [IsrMember(broker_id=i, broker_epoch=brokers[i].epoch) for i in ids]
