"""The controller's frame listener: metactl's own wire protocol, the door brokers and the
CLI come in by.

A listener turns what arrives on its wire into requests and answers back: this one is
the shared frame server (`protocol.server.FrameServer`: TLS, framing, connection limits),
whose handler is `FrameListener.dispatch`. Each request is admitted first
(`controller.runtime.admission`: authorization, before anything is submitted), then
answered by the API handlers (`controller.runtime.apis`); the frame server refuses an
answer over the frame limit with MESSAGE_TOO_LARGE (the up-front caps should make that
impossible). Another wire
(the Kafka protocol's listener) goes beside this one and calls the same admission and
API handlers.

Must not: decide, authorize or answer a request itself, or change the service's role.
"""

from __future__ import annotations

from controller.runtime.admission import RequestAdmission
from controller.runtime.apis import ControllerApis
from protocol.admission import Peer
from protocol.messages.unions import Message

__all__ = ["FrameListener"]


class FrameListener:
    """The frame server's handler: admit, then answer."""

    def __init__(self, admission: RequestAdmission, apis: ControllerApis) -> None:
        self.admission = admission
        self.apis = apis

    async def dispatch(self, body: Message, peer: Peer) -> Message:
        self.admission.admit(body, peer)  # before anything is submitted
        return await self.apis.handle(body, peer)
