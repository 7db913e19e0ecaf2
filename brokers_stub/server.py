"""The broker's TCP listener: the shared protocol server loop around the broker's handler.

Serves the requests other parties send to a broker (the controller's GetReplicaLogInfo,
followers' ReplicaFetch) by passing each decoded body to a handler. Framing, bad input
and failing handlers are `protocol.server.FrameServer`'s business; this module only
binds it to the broker's logger. It must not interpret requests.
"""

from __future__ import annotations

from brokers_stub.logctx import BrokerLog
from metactl.errors import InvalidRequestError, MetactlError
from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.messages import Message
from protocol.server import FrameServer, Handler

__all__ = ["BrokerServer", "Handler", "unsupported"]


class BrokerServer(FrameServer):
    def __init__(
        self,
        handler: Handler,
        log: BrokerLog,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        super().__init__(handler, log=log, max_frame_bytes=max_frame_bytes)


def unsupported(body: Message) -> MetactlError:
    return InvalidRequestError(f"a broker does not handle {type(body).__name__}")
