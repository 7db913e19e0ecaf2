"""Requests the controller handles and the responses it gives, as versioned msgspec Structs.

These are the controller's own events (broker registration, heartbeat-driven fencing,
AlterPartition, elections, topic creation, log-inspection replies). The wire protocol
carries them unchanged; the scenario runner builds them directly. Data only.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class _Request(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    v: int = 1


class RegisterBroker(_Request, tag="RegisterBroker", frozen=True):
    broker_id: int
    incarnation_id: str
    previous_epoch: int | None = None  # from the clean-shutdown file; None after a crash
    endpoint: str = ""
    rack: str | None = None


class FenceBroker(_Request, tag="FenceBroker", frozen=True):
    """The broker's session expired (or an operator fenced it)."""

    broker_id: int
    reason: str = "session_timeout"


class UnfenceBroker(_Request, tag="UnfenceBroker", frozen=True):
    """The broker caught up with the log and asked to be unfenced."""

    broker_id: int
    broker_epoch: int


class ControlledShutdown(_Request, tag="ControlledShutdown", frozen=True):
    broker_id: int
    broker_epoch: int


class IsrMember(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    broker_epoch: int


class AlterPartition(_Request, tag="AlterPartition", frozen=True):
    topic: str
    partition: int
    leader: int
    broker_epoch: int  # the sender's
    partition_epoch: int
    isr: list[IsrMember]
    leader_epoch: int | None = None
    recovered: bool = True  # the leader has finished recovering after an unclean election


class CreateTopic(_Request, tag="CreateTopic", frozen=True):
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    assignments: list[list[int]] | None = None  # explicit placement, one list per partition
    min_isr: int | None = None
    recovery_strategy: str | None = None


class ElectLeader(_Request, tag="ElectLeader", frozen=True):
    topic: str
    partition: int
    election_type: Literal["preferred", "unclean"]
    replica: int | None = None  # required for unclean


class ReplicaLogInfo(_Request, tag="ReplicaLogInfo", frozen=True):
    """A broker's answer to GetReplicaLogInfo for one replica."""

    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    last_leader_epoch: int
    log_end_offset: int


ControllerRequest = (
    RegisterBroker
    | FenceBroker
    | UnfenceBroker
    | ControlledShutdown
    | AlterPartition
    | CreateTopic
    | ElectLeader
    | ReplicaLogInfo
)


class _Response(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    v: int = 1


class Ack(_Response, tag="Ack", frozen=True):
    pass


class RegisterBrokerResponse(_Response, tag="RegisterBrokerResponse", frozen=True):
    broker_epoch: int
    clean: bool


class ControlledShutdownResponse(_Response, tag="ControlledShutdownResponse", frozen=True):
    can_stop: bool  # the broker leads nothing any more


class PartitionView(_Response, tag="PartitionView", frozen=True):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: list[int]


class CreateTopicResponse(_Response, tag="CreateTopicResponse", frozen=True):
    name: str
    topic_id: str
    assignments: list[list[int]]


ControllerResponse = (
    Ack | RegisterBrokerResponse | ControlledShutdownResponse | PartitionView | CreateTopicResponse
)
