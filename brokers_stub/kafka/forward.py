"""The broker's admin APIs over Kafka's wire: forwarded to the controller as Kafka's
brokers forward to the KRaft controller (KIP-590).

Each admin request a Kafka client sends is translated into metactl's own admin messages
(`protocol.kafka.admin`), each sent to the controller in an `Envelope` naming the
client's principal (the common name of its certificate; None under --insecure) and
address, over a controller client of its own (so that admin requests never queue behind
heartbeats or metadata fetches). The controller accepts envelopes from brokers only and
authorizes the inner request as the client's; its answer (or refusal) comes back as is
and is translated into Kafka's response. DescribeCluster is answered here, from the
broker's image, as Kafka's brokers answer it.

Must not: authorize admin requests itself (the controller does), or decide anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metadata_image.image import ClusterImage
from protocol.admission import Peer
from protocol.client import RpcClient
from protocol.kafka import framing as k
from protocol.kafka.admin import ADMIN_SERVED, answer_admin, describe_cluster_brokers
from protocol.kafka.framing import Request, Served
from protocol.messages.admin import Envelope, EnvelopedRequest
from protocol.messages.unions import Message

__all__ = ["AdminForwarder"]

# Each forwarded request's own timeout: the controller answers once a write is durable;
# Kafka's admin clients wait 30-60 s (request.timeout.ms / default.api.timeout.ms).
FORWARD_TIMEOUT_S = 30.0


class AdminForwarder:
    """A `Part` of the broker's Kafka APIs: the admin ones."""

    served: Served = ADMIN_SERVED

    def __init__(
        self,
        broker_id: int,
        image: Callable[[], ClusterImage],
        controller: RpcClient,
        *,
        cluster_id: str | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.image = image
        self.controller = controller
        self.cluster_id = cluster_id or ""

    async def answer(self, request: Request, peer: Peer) -> Any:
        if request.api_key == k.DESCRIBE_CLUSTER:
            return describe_cluster_brokers(
                request, self.image(), controller_id=self.broker_id, cluster_id=self.cluster_id
            )

        async def forward(body: Message) -> Message:
            assert isinstance(body, EnvelopedRequest)
            envelope = Envelope(principal=peer.principal, client_address=peer.address, request=body)
            return await self.controller.request(envelope, FORWARD_TIMEOUT_S)

        return await answer_admin(request, forward, self.image())
