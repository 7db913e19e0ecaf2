"""A small synchronous harness over the pure controller core, for the tests in this package.

`Cluster` runs every request through the one event step (`controller.core.step.step`),
exactly as the driver does, with an explicit virtual clock. `evaluate` is a Tick event
through the same step. It also keeps the full record log, so that tests can rebuild the
image from scratch or from a snapshot.

`image_of` builds an image directly from records for the unit tests that need a state
the handlers reach only after many steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from controller.core.config import ControllerConfig
from controller.core.handler_result import HandlerResult
from controller.core.recovery.builtin import BalancedPolicy, ManualPolicy, ProactivePolicy
from controller.core.recovery.policy import RecoveryPolicy
from controller.core.recovery.tracker import RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle, step
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.state import PartitionState
from metadata_log.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.broker_controller import (
    AlterPartition,
    IsrMember,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopicResponse,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

POLICIES: Mapping[str, RecoveryPolicy] = {
    "balanced": BalancedPolicy(),
    "proactive": ProactivePolicy(),
    "manual": ManualPolicy(),
}
KNOWN_STRATEGIES = frozenset(POLICIES)

View = tuple[int, list[int], list[int], list[int]]


def apply(image: ClusterImage, result: HandlerResult) -> ClusterImage:
    """The image once a handler's records are replayed."""
    return replay(image, result.records)


def view(p: PartitionState) -> View:
    """(leader, ISR, ELR, LastKnownELR), the sets sorted: what the documents' examples show."""
    return p.leader, sorted(p.isr), sorted(p.elr), sorted(p.last_known_elr)


class Cluster:
    def __init__(
        self,
        config: ControllerConfig | None = None,
        policies: Mapping[str, RecoveryPolicy] = POLICIES,
    ) -> None:
        self.config = config or ControllerConfig()
        self.policies = policies
        self.rules = Rules(self.config, policies)
        self.state = ControllerState(ClusterImage())
        self.log: list[MetadataRecord] = []
        self.now = 0
        self.last: StepResult | None = None
        self._incarnations = itertools.count(1)

    @property
    def image(self) -> ClusterImage:
        return self.state.image

    @property
    def tracker(self) -> RecoveryTracker:
        return self.state.tracker

    # --- plumbing -----------------------------------------------------------------------

    def commit(self, records: Iterable[MetadataRecord]) -> None:
        """Replay records that no event produced (a test's own), as a tool would."""
        records = list(records)
        self.state, _ = self.state.absorb(records)
        self.log.extend(records)

    def submit(self, event: Event) -> StepResult:
        """One event through the one step, with its continuations and the Ticks that
        drain the recovery backlog (`settle`); its records join the log."""
        return self._took(settle(self.state, event, self.now, self.rules))

    def step_one(self, event: Event) -> StepResult:
        """Exactly one step, as the driver takes it (a continuation is the caller's)."""
        return self._took(step(self.state, event, self.now, self.rules))

    def _took(self, result: StepResult) -> StepResult:
        self.state = result.state
        self.log.extend(result.records)
        self.last = result
        return result

    def run(self, request: Event) -> HandlerResult:
        """Submit `request`: the event's own records (without the recoveries the step
        decided after it) and its response."""
        result = self.submit(request)
        return HandlerResult(
            result.records[: len(result.records) - result.recovery_records], result.response
        )

    def epoch(self, broker: int) -> int:
        return self.image.brokers[broker].epoch

    def p(self, topic: str = "t", partition: int = 0) -> PartitionState:
        return self.image.partitions[(topic, partition)]

    def view(self, topic: str = "t", partition: int = 0) -> View:
        return view(self.p(topic, partition))

    # --- brokers ------------------------------------------------------------------------

    def register(
        self,
        broker: int,
        *,
        previous_epoch: int | None = None,
        clean: bool = False,
        rack: str | None = None,
        incarnation: str | None = None,
    ) -> RegisterBrokerResponse:
        """Register a new incarnation; `clean=True` presents the current epoch."""
        prev = self.epoch(broker) if clean else previous_epoch
        inc = incarnation or f"broker-{broker}-{next(self._incarnations)}"
        result = self.run(
            RegisterBroker(broker_id=broker, incarnation_id=inc, previous_epoch=prev, rack=rack),
        )
        assert isinstance(result.response, RegisterBrokerResponse)
        return result.response

    def unfence(self, broker: int) -> HandlerResult:
        return self.run(UnfenceBroker(broker_id=broker, broker_epoch=self.epoch(broker)))

    def start(self, *brokers: int, rack: str | None = None) -> None:
        """First registration and unfencing of each broker."""
        for b in brokers:
            self.register(b, rack=rack)
            self.unfence(b)

    def fence(self, broker: int) -> HandlerResult:
        return self.run(FenceBroker(broker_id=broker))

    def restart(self, broker: int, *, clean: bool) -> RegisterBrokerResponse:
        """Re-register (new incarnation, epoch presented only if clean) and unfence."""
        response = self.register(broker, clean=clean)
        self.unfence(broker)
        return response

    def shutdown(self, broker: int) -> ControlledShutdownResponse:
        result = self.run(
            ControlledShutdown(broker_id=broker, broker_epoch=self.epoch(broker)),
        )
        assert isinstance(result.response, ControlledShutdownResponse)
        return result.response

    # --- partitions ---------------------------------------------------------------------

    def create(self, name: str = "t", **kwargs: object) -> CreateTopicResponse:
        request = CreateTopic(name=name, **kwargs)  # type: ignore[arg-type]
        result = self.run(request)
        assert isinstance(result.response, CreateTopicResponse)
        return result.response

    def alter_request(
        self,
        isr: Iterable[int],
        topic: str = "t",
        partition: int = 0,
        **overrides: Any,
    ) -> AlterPartition:
        """A valid AlterPartition from the current leader, unless `overrides` say otherwise."""
        p = self.p(topic, partition)
        fields: dict[str, object] = {
            "topic": topic,
            "partition": partition,
            "leader": p.leader,
            "broker_epoch": self.epoch(p.leader) if p.leader in self.image.brokers else -1,
            "partition_epoch": p.partition_epoch,
            "isr": [
                IsrMember(
                    broker_id=b,
                    broker_epoch=self.epoch(b) if b in self.image.brokers else -1,
                )
                for b in isr
            ],
        }
        fields.update(overrides)
        return AlterPartition(**fields)  # type: ignore[arg-type]

    def alter(
        self, isr: Iterable[int], topic: str = "t", partition: int = 0, **overrides: Any
    ) -> PartitionView:
        result = self.run(self.alter_request(isr, topic, partition, **overrides))
        assert isinstance(result.response, PartitionView)
        return result.response

    def preferred(self, topic: str = "t", partition: int = 0) -> PartitionView:
        result = self.run(
            ElectLeader(topic=topic, partition=partition, election_type="preferred"),
        )
        assert isinstance(result.response, PartitionView)
        return result.response

    # --- unclean recovery ---------------------------------------------------------------

    def answer(
        self,
        broker: int,
        last_leader_epoch: int,
        log_end_offset: int,
        *,
        topic: str = "t",
        partition: int = 0,
        broker_epoch: int | None = None,
    ) -> None:
        reply = ReplicaLogInfo(
            broker_id=broker,
            broker_epoch=self.epoch(broker) if broker_epoch is None else broker_epoch,
            topic=topic,
            partition=partition,
            last_leader_epoch=last_leader_epoch,
            log_end_offset=log_end_offset,
        )
        self.submit(reply)

    def evaluate(self, now: int | None = None) -> StepResult:
        """A Tick through the step: recoveries due now are decided."""
        if now is not None:
            self.now = now
        return self.submit(Tick())

    def elect_unclean(
        self, replica: int | None, topic: str = "t", partition: int = 0
    ) -> list[MetadataRecord]:
        request = ElectLeader(
            topic=topic, partition=partition, election_type="unclean", replica=replica
        )
        return self.submit(request).records


def image_of(
    *,
    active: Iterable[int] = (),
    fenced: Iterable[int] = (),
    partitions: Iterable[PartitionRecord] = (),
    min_isr: int = 2,
) -> ClusterImage:
    """An image built from records: brokers active or fenced, and the given partitions
    (each of its own topic, named after the record's topic, with one partition)."""
    records: list[MetadataRecord] = []
    for b in active:
        records.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=b))
        records.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=b))
    for b in fenced:
        records.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=b))
    for pr in partitions:
        records.append(
            TopicRecord(name=pr.topic, topic_id=f"id-{pr.topic}", partitions=1, min_isr=min_isr)
        )
        records.append(pr)
    return replay(ClusterImage(), records)
