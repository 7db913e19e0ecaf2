"""One pure entry point for every controller request: which handler, which soft state.

`decide(image, tracker, request, now_ms, config=..., strategies=...)` routes a request to its
handler and returns the records, the response and the (possibly updated) recovery
tracker. The async driver and the history simulator both call it, so the routing exists
once. No IO and no clock reads, like the handlers it calls.
"""

from __future__ import annotations

from collections.abc import Set

from controller.core.config import ControllerConfig
from controller.core.handlers import (
    HandlerResult,
    alter_partition,
    controlled_shutdown,
    create_topic,
    elect_preferred,
    fence_broker,
    partition_view,
    register_broker,
    unfence_broker,
)
from controller.core.recovery.tracker import RecoveryTracker, manual_election, record_answer
from metactl.errors import InvalidRequestError
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import MetadataRecord
from protocol.requests import (
    Ack,
    AlterPartition,
    ControlledShutdown,
    ControllerRequest,
    ControllerResponse,
    CreateTopic,
    ElectLeader,
    FenceBroker,
    RegisterBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

Decided = tuple[list[MetadataRecord], ControllerResponse, RecoveryTracker]


def decide(
    image: ClusterImage,
    tracker: RecoveryTracker,
    request: ControllerRequest,
    now_ms: int,
    *,
    config: ControllerConfig,
    strategies: Set[str],
) -> Decided:
    result: HandlerResult
    match request:
        case RegisterBroker():
            result = register_broker(image, request, now_ms, config)
        case FenceBroker():
            result = fence_broker(image, request, now_ms, config)
        case UnfenceBroker():
            result = unfence_broker(image, request, now_ms, config)
        case ControlledShutdown():
            result = controlled_shutdown(image, request, now_ms, config)
        case AlterPartition():
            result = alter_partition(image, request, now_ms, config)
        case CreateTopic():
            result = create_topic(image, request, now_ms, config, frozenset(strategies))
        case ElectLeader(election_type="preferred"):
            result = elect_preferred(image, request, now_ms, config)
        case ElectLeader():
            records, tracker = manual_election(image, tracker, request, now_ms)
            after = replay(image, records).partitions[(request.topic, request.partition)]
            return records, partition_view(after), tracker
        case ReplicaLogInfo():
            return [], Ack(), record_answer(image, tracker, request)
        case _:
            raise InvalidRequestError(f"the controller does not handle {type(request).__name__}")
    return result.records, result.response, tracker
