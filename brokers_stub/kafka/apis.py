"""The broker's Kafka APIs: which it serves, at which versions, and who answers each.

- ApiVersions, Metadata, DescribeTopicPartitions: `protocol.kafka.metadata`'s answers,
  from the broker's image;
- the data APIs (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, InitProducerId, and
  the group APIs' refusals): `data`, over the replica manager;
- the admin APIs: `forward`, which forwards them to the controller as Kafka's brokers
  forward to the KRaft controller (an envelope naming the client's principal).

It must not frame or read bytes (`protocol.kafka.framing`, `protocol.kafka.listener`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from metadata_image.image import ClusterImage
from protocol.admission import Peer
from protocol.kafka import framing as k
from protocol.kafka.framing import Request, Served
from protocol.kafka.metadata import api_versions, describe_topic_partitions, metadata

# The APIs a broker answers from its image (docs/kafka.md says why these versions).
METADATA_SERVED: Final[Served] = {
    k.API_VERSIONS: (0, 3),
    k.METADATA: (0, 12),
    k.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
}


class Part(Protocol):
    """A group of APIs the broker serves (the data plane's, the forwarded admin ones)."""

    served: Served

    def answer(self, request: Request, peer: Peer) -> Awaitable[Any]: ...


class BrokerKafkaApis:
    def __init__(
        self,
        broker_id: int,
        image: Callable[[], ClusterImage],
        parts: tuple[Part, ...] = (),
        *,
        cluster_id: str | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.image = image
        self.served: Served = dict(METADATA_SERVED)
        self._by_key: dict[int, Part] = {}
        for part in parts:
            for key, versions in part.served.items():
                self.served[key] = versions
                self._by_key[key] = part

    async def answer(self, request: Request, peer: Peer) -> Any:
        part = self._by_key.get(request.api_key)
        if part is not None:
            return await part.answer(request, peer)
        image = self.image()
        match request.api_key:
            case k.API_VERSIONS:
                return api_versions(request.api_version, image, self.served)
            case k.METADATA:
                return metadata(
                    request, image, controller_id=self.broker_id, cluster_id=self.cluster_id
                )
            case k.DESCRIBE_TOPIC_PARTITIONS:
                return describe_topic_partitions(request.body, image)
        raise AssertionError(f"api_key {request.api_key} is not served")
