"""The controller's frame listener: metactl's own wire protocol, the door brokers and the
CLI come in by.

A listener turns what arrives on its wire into requests and answers back: this one is
the shared frame server (`protocol.server.FrameServer`: TLS, framing, connection limits),
whose handler is `FrameListener.dispatch`. Each request is admitted first
(`controller.runtime.admission`: authorization, before anything is submitted), then
answered by the API handlers (`controller.runtime.apis`), and no answer leaves larger
than the frame limit (MESSAGE_TOO_LARGE instead: the up-front caps should make that
impossible, so a named error rather than a frame the client cannot read). Another wire
(the Kafka protocol's listener) goes beside this one and calls the same admission and
API handlers.

Must not: decide, authorize or answer a request itself, or change the service's role.
"""

from __future__ import annotations

from typing import Final

import structlog

from controller.runtime.admission import RequestAdmission
from controller.runtime.apis import ControllerApis
from controller.runtime.request_caps import encoded_size
from metactl.errors import FrameTooLargeError
from protocol.admission import Peer
from protocol.messages.admin import (
    DescribeClusterResponse,
    DescribeQuorumResponse,
    ListPartitionReassignmentsResponse,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    BrokerHeartbeatResponse,
    FetchMetadataResponse,
    PartitionView,
    RegisterBrokerResponse,
)
from protocol.messages.internal import Ack
from protocol.messages.unions import Message

__all__ = ["FrameListener"]

log = structlog.get_logger("metactl.controller.service")

# Answers not measured against the frame limit on the way out: those measured as they
# are built (pages, fetches), and the small fixed ones of the hot path (a heartbeat's
# answer encoded twice would cost every broker's heartbeat for nothing), and
# DescribeQuorum's (one controller's view: a few names per controller and etcd member).
_UNMEASURED: Final = (
    DescribeClusterResponse,
    ListPartitionReassignmentsResponse,
    FetchMetadataResponse,
    ErrorResponse,
    BrokerHeartbeatResponse,
    RegisterBrokerResponse,
    PartitionView,
    Ack,
    DescribeQuorumResponse,
)


class FrameListener:
    """The frame server's handler: admit, answer, bound the answer."""

    def __init__(
        self, admission: RequestAdmission, apis: ControllerApis, *, max_frame_bytes: int
    ) -> None:
        self.admission = admission
        self.apis = apis
        self.max_frame_bytes = max_frame_bytes

    async def dispatch(self, body: Message, peer: Peer) -> Message:
        self.admission.admit(body, peer)  # before anything is submitted
        answer = await self.apis.handle(body, peer)
        if not isinstance(answer, _UNMEASURED):
            # The up-front caps keep every answer inside the frame limit; should one not
            # be (a bug), the client gets a named error, not a frame it cannot read.
            size = encoded_size(answer)
            if size > self.max_frame_bytes:
                log.error(
                    "answer over the frame limit; refused",
                    request=type(body).__name__,
                    bytes=size,
                    limit=self.max_frame_bytes,
                )
                raise FrameTooLargeError(
                    f"the {type(answer).__name__} ({size:,} bytes) exceeds the "
                    f"{self.max_frame_bytes:,}-byte frame limit"
                )
        return answer
