"""Kafka's topic APIs in metactl's admin messages and back (pure: no IO): CreateTopics
(validate_only checked against the image: metactl has no dry run), DeleteTopics (by
name, or by id from the image, v6+) and CreatePartitions.

It must not do IO (the caller's `Call` does) or decide what the controller decides
(placement, limits): it translates, and checks only what validate_only needs.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from kio.index import load_response_schema

from metactl.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    MetactlError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from protocol.kafka import framing as k
from protocol.kafka.admin.common import (
    CONFIG_SOURCES,
    MIN_ISR,
    Call,
    ask,
    coded,
    error_code,
    error_message,
    throttle_for,
)
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.messages.admin import (
    CreatePartitions,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

RECOVERY_STRATEGY: Final = "unclean.recovery.strategy"
# What a topic's configs may name at creation (metactl keeps no other topic config).
CREATE_CONFIGS: Final = (MIN_ISR, RECOVERY_STRATEGY)


# --- CreateTopics -------------------------------------------------------------------------


def _create_spec(topic: Any) -> CreateTopic:
    """metactl's CreateTopic for one of Kafka's CreatableTopic, or the error Kafka names."""
    assigned = list(topic.assignments)
    partitions = int(topic.num_partitions)
    rf = int(topic.replication_factor)
    assignments: list[list[int]] | None = None
    if assigned:
        if partitions != -1 or rf != -1:
            raise InvalidRequestError(
                "both num_partitions or replication_factor and the replica assignment were set"
            )
        by_index = {int(a.partition_index): [int(b) for b in a.broker_ids] for a in assigned}
        if sorted(by_index) != list(range(len(assigned))):
            raise InvalidReplicaAssignmentError(
                "the replica assignment's partitions must be 0 to N-1, each once"
            )
        assignments = [by_index[i] for i in range(len(assigned))]
    else:
        if partitions == 0 or partitions < -1:
            raise InvalidPartitionsError(
                f"number of partitions must be larger than 0: {partitions}"
            )
        if rf == 0 or rf < -1:
            raise InvalidReplicationFactorError(f"replication factor must be larger than 0: {rf}")
    configs: dict[str, str] = {}
    for c in topic.configs:
        if c.value is None:
            raise InvalidRequestError(f"null value not supported for topic config {c.name}")
        if c.name not in CREATE_CONFIGS:
            raise InvalidConfigurationError(
                f"unknown topic config name: {c.name} (metactl keeps {', '.join(CREATE_CONFIGS)})"
            )
        configs[c.name] = c.value
    min_isr: int | None = None
    if MIN_ISR in configs:
        try:
            min_isr = int(configs[MIN_ISR].strip())
        except ValueError:
            raise InvalidConfigurationError(
                f"invalid value {configs[MIN_ISR]!r} for {MIN_ISR}: not a number"
            ) from None
        if min_isr < 1:
            raise InvalidConfigurationError(f"invalid value {min_isr} for {MIN_ISR}: at least 1")
    return CreateTopic(
        name=str(topic.name),
        partitions=None if assignments is not None or partitions == -1 else partitions,
        replication_factor=None if assignments is not None or rf == -1 else rf,
        assignments=assignments,
        min_isr=min_isr,
        recovery_strategy=configs.get(RECOVERY_STRATEGY),
    )


def _validate_create(spec: CreateTopic, image: ClusterImage | None) -> None:
    """validate_only's checks (metactl has no dry run): what the image can tell."""
    if image is None:
        return
    if spec.name in image.topics:
        raise TopicAlreadyExistsError(f"topic '{spec.name}' already exists")
    registered = len(image.brokers)
    rf = spec.replication_factor
    if rf is not None and rf > registered:
        raise InvalidReplicationFactorError(
            f"replication factor {rf} is larger than the {registered} registered broker(s)"
        )
    for replicas in spec.assignments or []:
        unknown = [b for b in replicas if b not in image.brokers]
        if unknown or len(set(replicas)) != len(replicas) or not replicas:
            raise InvalidReplicaAssignmentError(
                f"replica assignment {replicas} names an unregistered broker, none, or one twice"
            )


async def create_topics(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.CREATE_TOPICS, version)
    result_cls = nested(response_cls, "CreatableTopicResult")
    config_cls = nested(response_cls, "CreatableTopicConfigs") if version >= 5 else None
    names = [str(t.name) for t in body.topics]
    twice = {n for n in names if names.count(n) > 1}
    outcome: dict[int, tuple[MetactlError | None, CreateTopicResult | None]] = {}
    send: list[tuple[int, CreateTopic]] = []
    for i, topic in enumerate(body.topics):
        if topic.name in twice:
            outcome[i] = (InvalidRequestError("the request names this topic more than once"), None)
            continue
        try:
            spec = _create_spec(topic)
            if body.validate_only:
                _validate_create(spec, image)
        except MetactlError as exc:
            outcome[i] = (exc, None)
            continue
        if body.validate_only:
            outcome[i] = (None, None)
        else:
            send.append((i, spec))
    throttle = NO_THROTTLE
    if send:
        try:
            answer = await ask(
                call, CreateTopicsRequest(topics=[s for _, s in send]), CreateTopicsResponse
            )
            by_name = {r.name: r for r in answer.results}
            for i, spec in send:
                r = by_name.get(spec.name)
                error = (
                    None
                    if r is not None and r.error_code is None
                    else coded(r.error_code if r is not None else "UNKNOWN_SERVER_ERROR",
                                r.message if r is not None else "no answer for this topic")
                )  # fmt: skip
                outcome[i] = (error, r)
        except MetactlError as exc:
            throttle = throttle_for(exc)
            for i, _ in send:
                outcome[i] = (exc, None)
    results = []
    for i, topic in enumerate(body.topics):
        error, r = outcome[i]
        partitions, rf = -1, -1
        if error is None and r is not None and r.assignments:
            partitions, rf = len(r.assignments), len(r.assignments[0])
        elif error is None:
            n, f = int(topic.num_partitions), int(topic.replication_factor)
            partitions = len(topic.assignments) if topic.assignments else n
            rf = len(topic.assignments[0].broker_ids) if topic.assignments else f
        configs: Any = None
        if config_cls is not None and error is None:
            configs = tuple(
                config_cls(
                    name=c.name,
                    value=c.value,
                    read_only=False,
                    config_source=CONFIG_SOURCES["DYNAMIC_TOPIC_CONFIG"],
                    is_sensitive=False,
                )
                for c in topic.configs
            )
        results.append(
            make(
                result_cls,
                name=topic.name,
                topic_id=uuid.UUID(r.topic_id) if r is not None and r.topic_id else None,
                error_code=error_code(error),
                error_message=error_message(error),
                topic_config_error_code=0,
                num_partitions=partitions,
                replication_factor=rf,
                configs=configs,
            )
        )
    return make(response_cls, throttle_time=throttle, topics=tuple(results))


# --- DeleteTopics -------------------------------------------------------------------------


async def delete_topics(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DELETE_TOPICS, version)
    result_cls = nested(response_cls, "DeletableTopicResult")
    asked: list[tuple[str | None, uuid.UUID | None]] = (
        [(t.name, t.topic_id) for t in body.topics]
        if version >= 6
        else [(str(n), None) for n in body.topic_names]
    )
    ids = dict(image.topic_ids) if image is not None else {}  # id -> name
    names: list[str | None] = []
    errors: dict[int, MetactlError] = {}
    for i, (asked_name, topic_id) in enumerate(asked):
        name = asked_name
        if name is None and topic_id is not None:
            name = ids.get(str(topic_id))
            if name is None:
                errors[i] = coded("UNKNOWN_TOPIC_ID", f"unknown topic id {topic_id}")
        names.append(name)
    send = [n for i, n in enumerate(names) if i not in errors and n is not None]
    answered: dict[str, tuple[MetactlError | None, str | None]] = {}
    throttle = NO_THROTTLE
    if send:
        try:
            answer = await ask(
                call, DeleteTopicsRequest(topics=list(dict.fromkeys(send))), DeleteTopicsResponse
            )
            for r in answer.results:
                err = None if r.error_code is None else coded(r.error_code, r.message)
                answered[r.name] = (err, r.topic_id)
        except MetactlError as exc:
            throttle = throttle_for(exc)
            answered = dict.fromkeys(send, (exc, None))
    results = []
    for i, (_, topic_id) in enumerate(asked):
        error = errors.get(i)
        tid: str | None = str(topic_id) if topic_id is not None else None
        if error is None:
            if names[i] is None:
                error = InvalidRequestError("neither a topic name nor a topic id")
            else:
                error, got = answered.get(names[i] or "", (None, None))
                tid = got or tid
        results.append(
            make(
                result_cls,
                name=names[i],
                topic_id=uuid.UUID(tid) if tid else None,
                error_code=error_code(error),
                error_message=error_message(error),
            )
        )
    return make(response_cls, throttle_time=throttle, responses=tuple(results))


# --- CreatePartitions ---------------------------------------------------------------------


def _validate_grow(spec: CreatePartitions, image: ClusterImage | None) -> None:
    if spec.count < 1:
        raise InvalidPartitionsError(f"the number of partitions must be positive: {spec.count}")
    if image is None:
        return
    t = image.topics.get(spec.topic)
    if t is None:
        raise UnknownTopicOrPartitionError(f"the topic '{spec.topic}' does not exist")
    if spec.count <= t.partitions:
        raise InvalidPartitionsError(
            f"topic '{spec.topic}' has {t.partitions} partitions: {spec.count} is not more"
        )
    if spec.assignments is not None and len(spec.assignments) != spec.count - t.partitions:
        raise InvalidReplicaAssignmentError(
            f"{len(spec.assignments)} assignments for {spec.count - t.partitions} new partitions"
        )


async def create_partitions(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.CREATE_PARTITIONS, version)
    result_cls = nested(response_cls, "CreatePartitionsTopicResult")
    names = [str(t.name) for t in body.topics]
    twice = {n for n in names if names.count(n) > 1}
    errors: dict[int, MetactlError | None] = {}
    send: list[tuple[int, CreatePartitions]] = []
    for i, t in enumerate(body.topics):
        if t.name in twice:
            errors[i] = InvalidRequestError("the request names this topic more than once")
            continue
        spec = CreatePartitions(
            topic=str(t.name),
            count=int(t.count),
            assignments=None
            if t.assignments is None
            else [[int(b) for b in a.broker_ids] for a in t.assignments],
        )
        if body.validate_only:
            try:
                _validate_grow(spec, image)
                errors[i] = None
            except MetactlError as exc:
                errors[i] = exc
        else:
            send.append((i, spec))
    throttle = NO_THROTTLE
    if send:
        try:
            answer = await ask(
                call,
                CreatePartitionsRequest(topics=[s for _, s in send]),
                CreatePartitionsResponse,
            )
            by_name = {r.name: r for r in answer.results}
            for i, spec in send:
                r = by_name.get(spec.topic)
                errors[i] = (
                    None
                    if r is not None and r.error_code is None
                    else coded(r.error_code if r is not None else None,
                                r.message if r is not None else "no answer for this topic")
                )  # fmt: skip
        except MetactlError as exc:
            throttle = throttle_for(exc)
            for i, _ in send:
                errors[i] = exc
    results = tuple(
        make(
            result_cls,
            name=t.name,
            error_code=error_code(errors[i]),
            error_message=error_message(errors[i]),
        )
        for i, t in enumerate(body.topics)
    )
    return make(response_cls, throttle_time=throttle, results=results)
