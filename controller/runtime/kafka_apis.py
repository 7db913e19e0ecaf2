"""The controller's own Kafka listener (`--kafka-listen`, KIP-919): the APIs a Kafka
admin client reaches with `bootstrap.controllers`.

- ApiVersions: `CONTROLLER_SERVED` (nothing else advertised), the features of the image
  this controller answers reads from;
- DescribeCluster: the controllers (endpoint type 2), from this controller's quorum view;
- DescribeQuorum: the metadata partition from this controller's view (any role answers);
- the admin APIs (`protocol.kafka.admin`): each native message admitted as the frame
  listener admits it (`controller.runtime.admission`: the connection's principal,
  authorized under TLS) and answered by the same API handlers (`controller.runtime.apis`),
  in-process: a standby refuses writes with NOT_CONTROLLER (Kafka's clients retry), an
  authorization refusal is TOPIC/CLUSTER_AUTHORIZATION_FAILED in the response.

The framing, the serve loop and the translation are `protocol.kafka`'s. Must not:
authorize or answer a request itself (admission and the API handlers do), or change the
service's role.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kio.index import load_response_schema

from controller.runtime.admission import RequestAdmission
from controller.runtime.apis import ControllerApis
from metactl.errors import MetactlError
from metadata_image.image import ClusterImage
from protocol.admission import Peer
from protocol.kafka import framing as k
from protocol.kafka.admin import (
    CONTROLLER_SERVED,
    answer_admin,
    describe_cluster_controllers,
    describe_quorum,
    error_code,
)
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, api_versions, make
from protocol.messages.admin import (
    DescribeClusterRequest,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
)
from protocol.messages.unions import Message

__all__ = ["ControllerKafkaApis"]


class ControllerKafkaApis:
    """What the controller's Kafka listener serves, and who answers each request."""

    def __init__(
        self,
        admission: RequestAdmission,
        apis: ControllerApis,
        *,
        image: Callable[[], ClusterImage | None],
        describe_quorum: Callable[[DescribeQuorumRequest], Awaitable[DescribeQuorumResponse]],
    ) -> None:
        self.served = dict(CONTROLLER_SERVED)
        self.admission = admission
        self.apis = apis
        self.image = image  # the image reads answer from (committed, standby, last term's)
        self.describe_quorum = describe_quorum
        self.address = ""  # the listener's, once bound (DescribeCluster names it)

    async def call(self, body: Message, peer: Peer) -> Message:
        """One native request, as the frame listener handles it: admitted, then answered."""
        self.admission.admit(body, peer)
        return await self.apis.handle(body, peer)

    async def answer(self, request: Request, peer: Peer) -> Any:
        image = self.image()
        match request.api_key:
            case k.API_VERSIONS:
                return api_versions(
                    request.api_version, image if image is not None else ClusterImage(), self.served
                )
            case k.DESCRIBE_QUORUM:
                try:
                    self.admission.admit(DescribeQuorumRequest(), peer)
                    quorum = await self.describe_quorum(DescribeQuorumRequest())
                except MetactlError as exc:
                    return _refused(request, exc)
                return describe_quorum(request, quorum, self.address)
            case k.DESCRIBE_CLUSTER:
                try:
                    self.admission.admit(DescribeClusterRequest(), peer)
                    quorum = await self.describe_quorum(DescribeQuorumRequest())
                except MetactlError as exc:
                    return _refused(request, exc)
                return describe_cluster_controllers(request, quorum, self.address)

        async def call(body: Message) -> Message:
            return await self.call(body, peer)

        return await answer_admin(request, call, image)


def _refused(request: Request, exc: MetactlError) -> Any:
    """DescribeQuorum's or DescribeCluster's answer to a refused request: its error."""
    response_cls: Any = load_response_schema(request.api_key, request.api_version)
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=error_code(exc),
        error_message=exc.message,
        topics=(),
        nodes=(),
        endpoint_type=2,
        cluster_id="",
        controller_id=-1,
        brokers=(),
        cluster_authorized_operations=-(2**31),
    )
