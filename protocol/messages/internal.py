"""The messages that exist only inside the controller: events the runtime feeds the core
(FenceBroker on a session's expiry, UnfenceBroker, ControlledShutdown, a broker's
ReplicaLogInfo answer) and the core's own responses (Ack, ControlledShutdownResponse,
CreateTopicResponse). None travels on the wire except `Ack`.

Data only: no IO, no rules.
"""

from __future__ import annotations

from protocol.messages.base import Msg

# --- inside the controller only -----------------------------------------------------------


class FenceBroker(Msg, tag="FenceBroker", frozen=True):
    """The broker's session expired (or an operator fenced it)."""

    broker_id: int
    reason: str = "session_timeout"


class UnfenceBroker(Msg, tag="UnfenceBroker", frozen=True):
    """The broker caught up with the log and asked to be unfenced."""

    broker_id: int
    broker_epoch: int


class ControlledShutdown(Msg, tag="ControlledShutdown", frozen=True):
    broker_id: int
    broker_epoch: int


class ReplicaLogInfo(Msg, tag="ReplicaLogInfo", frozen=True):
    """A broker's answer to GetReplicaLogInfo for one replica."""

    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    last_leader_epoch: int
    log_end_offset: int


class Ack(Msg, tag="Ack", frozen=True):
    pass


class ControlledShutdownResponse(Msg, tag="ControlledShutdownResponse", frozen=True):
    can_stop: bool  # the broker leads nothing any more


class CreateTopicResponse(Msg, tag="CreateTopicResponse", frozen=True):
    name: str
    topic_id: str
    assignments: list[list[int]]
