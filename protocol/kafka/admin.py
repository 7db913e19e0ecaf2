"""Kafka's admin APIs in metactl's terms (pure: no IO): which versions are served, the
translation of a kio request into metactl's own admin messages, and of their answers (or
a `MetactlError`) back into the kio response at the request's version, with Kafka's
error codes (metactl's codes are Kafka's names) and messages.

`answer_admin(request, call, image)` answers one admin request: `call` sends one native
message and returns its answer or raises the error it was refused with (the broker's
forwarder: over its controller client, in an envelope naming the client's principal; the
controller's own Kafka listener: in-process, admitted as the native path admits), and
`image` is the asker's metadata image (the broker's, or the controller's committed one),
read for what Kafka's request leaves to the server: the replica of an UNCLEAN election,
the partitions of an election of all of them, validate_only's checks, topic ids.

| API | key | versions | native message |
| --- | --- | --- | --- |
| CreateTopics | 19 | 2-7 | CreateTopicsRequest |
| DeleteTopics | 20 | 1-6 | DeleteTopicsRequest |
| CreatePartitions | 37 | 0-3 | CreatePartitionsRequest |
| DescribeConfigs | 32 | 1-4 | DescribeConfigsRequest, one per resource |
| IncrementalAlterConfigs | 44 | 0-1 | AlterConfigs, one per resource |
| ElectLeaders | 43 | 0-2 | ElectLeader per partition; ElectPreferredLeaders for all |
| AlterPartitionReassignments | 45 | 0-1 | AlterPartitionReassignments |
| ListPartitionReassignments | 46 | 0 | ListPartitionReassignmentsRequest v2, every page |
| UpdateFeatures | 57 | 0-2 | UpdateFeature, one per feature |
| DescribeCluster | 60 | 0-2 | none: the image (brokers) or the quorum (controllers) |
| DescribeQuorum | 55 | 0-2 | DescribeQuorumRequest (controllers only) |

The versions are every one kio 0.6.5 has (Kafka 4's ranges, after KIP-896 removed the
oldest): librdkafka 2.x and the Java client negotiate within them. docs/kafka.md, "Admin
over Kafka's protocol", has every difference from Kafka.
"""

from __future__ import annotations

import datetime
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from metactl.errors import (
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    MetactlError,
    ThrottlingQuotaExceededError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from protocol.address import parse_address
from protocol.kafka import framing as k
from protocol.kafka.framing import Request, Served
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeQuorumResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
    Reassignment,
    UpdateFeature,
)
from protocol.messages.broker_controller import ReplicaRef
from protocol.messages.unions import Message

__all__ = [
    "ADMIN_SERVED",
    "CONTROLLER_SERVED",
    "FORWARDED",
    "Call",
    "answer_admin",
    "describe_cluster_brokers",
    "describe_cluster_controllers",
    "describe_quorum",
    "error_code",
    "node_number",
]

Call = Callable[[Message], Awaitable[Message]]

# The admin APIs a broker serves (all forwarded to the controller but DescribeCluster,
# answered from the broker's image as Kafka's brokers answer it).
ADMIN_SERVED: Final[Served] = {
    k.CREATE_TOPICS: (2, 7),
    k.DELETE_TOPICS: (1, 6),
    k.CREATE_PARTITIONS: (0, 3),
    k.DESCRIBE_CONFIGS: (1, 4),
    k.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    k.ELECT_LEADERS: (0, 2),
    k.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    k.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    k.UPDATE_FEATURES: (0, 2),
    k.DESCRIBE_CLUSTER: (0, 2),
}
FORWARDED: Final = frozenset(ADMIN_SERVED) - {k.DESCRIBE_CLUSTER}

# The controller's Kafka listener (KIP-919): ApiVersions, the admin APIs, DescribeQuorum.
CONTROLLER_SERVED: Final[Served] = {
    k.API_VERSIONS: (0, 3),
    **ADMIN_SERVED,
    k.DESCRIBE_QUORUM: (0, 2),
}

MAX_INT32: Final = 2**31 - 1
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "not requested"
TOPIC: Final = 2  # Kafka's ConfigResource.Type
BROKER: Final = 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations
PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types
ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2  # DescribeCluster's endpoint_type (KIP-919)
# Kafka's ConfigSource and ConfigType numbers.
CONFIG_SOURCES: Final = {
    "DYNAMIC_TOPIC_CONFIG": 1,
    "DYNAMIC_BROKER_CONFIG": 2,
    "DYNAMIC_DEFAULT_BROKER_CONFIG": 3,
    "STATIC_BROKER_CONFIG": 4,
    "DEFAULT_CONFIG": 5,
}
CONFIG_TYPE_INT: Final = 3
CONFIG_TYPE_STRING: Final = 2
MIN_ISR: Final = "min.insync.replicas"
RECOVERY_STRATEGY: Final = "unclean.recovery.strategy"
# What a topic's configs may name at creation (metactl keeps no other topic config).
CREATE_CONFIGS: Final = (MIN_ISR, RECOVERY_STRATEGY)
METADATA_TOPIC: Final = "__cluster_metadata"  # DescribeQuorum's one partition

# metactl's codes Kafka has no number for, as a Kafka client should take them: a log
# that cannot be written now is a controller moving (retried), a recovery policy unknown
# a bad config.
_NOT_KAFKA: Final = {
    "LOG_CLOSED": ErrorCode.not_controller,
    "FATAL_STORAGE_ERROR": ErrorCode.not_controller,
    "CONTROLLER_FENCED": ErrorCode.not_controller,
    "METADATA_STORE_UNAVAILABLE": ErrorCode.not_controller,
    "UNKNOWN_RECOVERY_POLICY": ErrorCode.invalid_config,
    "SSL_AUTHENTICATION_FAILED": ErrorCode.network_exception,
}


def error_code(exc: MetactlError | str | None) -> ErrorCode:
    """Kafka's code for a metactl error (or its code): the same name, or the nearest."""
    if exc is None:
        return ErrorCode.none
    code = exc if isinstance(exc, str) else exc.code
    try:
        return ErrorCode[code.lower()]
    except KeyError:
        return _NOT_KAFKA.get(code, ErrorCode.unknown_server_error)


def _message(exc: MetactlError | None) -> str | None:
    return None if exc is None else exc.message


def _throttle(exc: MetactlError | None) -> datetime.timedelta:
    if isinstance(exc, ThrottlingQuotaExceededError) and exc.retry_after_ms > 0:
        return datetime.timedelta(milliseconds=exc.retry_after_ms)
    return NO_THROTTLE


async def _ask(call: Call, body: Message, expect: type[Any]) -> Any:
    answer = await call(body)
    if not isinstance(answer, expect):
        raise InvalidRequestError(
            f"unexpected answer {type(answer).__name__} to {body.__class__.__name__}"
        )
    return answer


async def answer_admin(request: Request, call: Call, image: ClusterImage | None) -> Any:
    """The kio response to one forwarded admin API (`FORWARDED`) at the request's version."""
    match request.api_key:
        case k.CREATE_TOPICS:
            return await create_topics(request, call, image)
        case k.DELETE_TOPICS:
            return await delete_topics(request, call, image)
        case k.CREATE_PARTITIONS:
            return await create_partitions(request, call, image)
        case k.DESCRIBE_CONFIGS:
            return await describe_configs(request, call)
        case k.INCREMENTAL_ALTER_CONFIGS:
            return await incremental_alter_configs(request, call, image)
        case k.ELECT_LEADERS:
            return await elect_leaders(request, call, image)
        case k.ALTER_PARTITION_REASSIGNMENTS:
            return await alter_reassignments(request, call, image)
        case k.LIST_PARTITION_REASSIGNMENTS:
            return await list_reassignments(request, call)
        case k.UPDATE_FEATURES:
            return await update_features(request, call)
    raise AssertionError(f"api_key {request.api_key} is not an admin API")


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
            answer = await _ask(
                call, CreateTopicsRequest(topics=[s for _, s in send]), CreateTopicsResponse
            )
            by_name = {r.name: r for r in answer.results}
            for i, spec in send:
                r = by_name.get(spec.name)
                error = (
                    None
                    if r is not None and r.error_code is None
                    else _coded(r.error_code if r is not None else "UNKNOWN_SERVER_ERROR",
                                r.message if r is not None else "no answer for this topic")
                )  # fmt: skip
                outcome[i] = (error, r)
        except MetactlError as exc:
            throttle = _throttle(exc)
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
                error_message=_message(error),
                topic_config_error_code=0,
                num_partitions=partitions,
                replication_factor=rf,
                configs=configs,
            )
        )
    return make(response_cls, throttle_time=throttle, topics=tuple(results))


def _coded(code: str | None, message: str) -> MetactlError:
    """A native result's error code and message as an error (for `error_code`)."""
    err = MetactlError(message)
    err.code = code or "UNKNOWN_SERVER_ERROR"
    return err


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
                errors[i] = _coded("UNKNOWN_TOPIC_ID", f"unknown topic id {topic_id}")
        names.append(name)
    send = [n for i, n in enumerate(names) if i not in errors and n is not None]
    answered: dict[str, tuple[MetactlError | None, str | None]] = {}
    throttle = NO_THROTTLE
    if send:
        try:
            answer = await _ask(
                call, DeleteTopicsRequest(topics=list(dict.fromkeys(send))), DeleteTopicsResponse
            )
            for r in answer.results:
                err = None if r.error_code is None else _coded(r.error_code, r.message)
                answered[r.name] = (err, r.topic_id)
        except MetactlError as exc:
            throttle = _throttle(exc)
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
                error_message=_message(error),
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
            answer = await _ask(
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
                    else _coded(r.error_code if r is not None else None,
                                r.message if r is not None else "no answer for this topic")
                )  # fmt: skip
        except MetactlError as exc:
            throttle = _throttle(exc)
            for i, _ in send:
                errors[i] = exc
    results = tuple(
        make(
            result_cls,
            name=t.name,
            error_code=error_code(errors[i]),
            error_message=_message(errors[i]),
        )
        for i, t in enumerate(body.topics)
    )
    return make(response_cls, throttle_time=throttle, results=results)


# --- DescribeConfigs ----------------------------------------------------------------------


def _resource(resource_type: int, name: str) -> tuple[str, str]:
    """metactl's (resource_type, resource_name) for Kafka's: a topic, or a broker (any
    broker's configs are the cluster default's: metactl keeps no per-broker config)."""
    if resource_type == TOPIC:
        return "topic", name
    if resource_type == BROKER:
        return "broker", name
    raise InvalidRequestError(
        f"resource type {resource_type} is not served: metactl keeps topic and broker configs"
    )


async def describe_configs(request: Request, call: Call) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DESCRIBE_CONFIGS, version)
    result_cls = nested(response_cls, "DescribeConfigsResult")
    entry_cls = nested(response_cls, "DescribeConfigsResourceResult")
    synonym_cls = nested(response_cls, "DescribeConfigsSynonym")
    results = []
    for res in body.resources:
        configs: tuple[Any, ...] = ()
        error: MetactlError | None = None
        try:
            kind, name = _resource(int(res.resource_type), res.resource_name)
            # A broker id's configs: the cluster default (Kafka would show the broker's
            # own, which metactl does not keep).
            ask_name = "" if kind == "broker" else name
            if kind == "broker" and name and not name.isdigit():
                raise InvalidRequestError(f"broker resource name must be a broker id: {name!r}")
            answer = await _ask(
                call, DescribeConfigsRequest(resource_type=kind, resource_name=ask_name),
                DescribeConfigsResponse,
            )  # fmt: skip
            keys = set(res.configuration_keys) if res.configuration_keys is not None else None
            configs = tuple(
                make(
                    entry_cls,
                    name=c.name,
                    value=c.value,
                    read_only=c.read_only,
                    config_source=CONFIG_SOURCES.get(c.source, 0),
                    is_default=c.source == "DEFAULT_CONFIG",
                    is_sensitive=False,
                    synonyms=tuple(
                        synonym_cls(
                            name=c.name, value=c.value, source=CONFIG_SOURCES.get(c.source, 0)
                        )
                        for _ in range(1 if body.include_synonyms else 0)
                    ),
                    config_type=CONFIG_TYPE_INT if c.name == MIN_ISR else CONFIG_TYPE_STRING,
                    documentation=None,
                )
                for c in answer.configs
                if keys is None or c.name in keys
            )
        except MetactlError as exc:
            error = exc
        results.append(
            make(
                result_cls,
                error_code=error_code(error),
                error_message=_message(error),
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return make(response_cls, throttle_time=NO_THROTTLE, results=tuple(results))


# --- IncrementalAlterConfigs --------------------------------------------------------------


def _alter(resource: Any) -> AlterConfigs:
    kind, name = _resource(int(resource.resource_type), resource.resource_name)
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        raise InvalidRequestError("a config is named more than once for this resource")
    set_configs: dict[str, str] = {}
    delete: list[str] = []
    for c in resource.configs:
        op = int(c.config_operation)
        if op == SET:
            if c.value is None:
                raise InvalidRequestError(f"null value not supported for SET of {c.name}")
            set_configs[c.name] = c.value
        elif op == DELETE:
            delete.append(c.name)
        elif op in (APPEND, SUBTRACT):
            raise InvalidConfigurationError(
                f"{c.name}: APPEND and SUBTRACT are for list configs; metactl keeps none"
            )
        else:
            raise InvalidRequestError(f"unknown config operation {op} for {c.name}")
    return AlterConfigs(
        resource_type=kind, resource_name=name, set_configs=set_configs, delete_configs=delete
    )


def _validate_alter(alter: AlterConfigs, image: ClusterImage | None) -> None:
    """validate_only's checks (metactl has no dry run): the keys, values and topic."""
    for key in [*alter.set_configs, *alter.delete_configs]:
        if key != MIN_ISR:
            raise InvalidConfigurationError(
                f"unsupported config {key}: metactl keeps only {MIN_ISR}"
            )
    value = alter.set_configs.get(MIN_ISR)
    if value is not None and not (value.strip().isdigit() and int(value) >= 1):
        raise InvalidConfigurationError(f"invalid value {value!r} for {MIN_ISR}")
    if (
        alter.resource_type == "topic"
        and image is not None
        and alter.resource_name not in image.topics
    ):
        raise UnknownTopicOrPartitionError(f"unknown topic {alter.resource_name}")
    if alter.resource_type == "broker" and alter.resource_name:
        raise InvalidRequestError(
            f"broker-level {MIN_ISR}: metactl keeps the cluster default only (an empty name)"
        )


async def incremental_alter_configs(
    request: Request, call: Call, image: ClusterImage | None
) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.INCREMENTAL_ALTER_CONFIGS, version)
    result_cls = nested(response_cls, "AlterConfigsResourceResponse")
    keys = [(int(r.resource_type), r.resource_name) for r in body.resources]
    twice = {x for x in keys if keys.count(x) > 1}
    results = []
    throttle = NO_THROTTLE
    for res, key in zip(body.resources, keys, strict=True):
        error: MetactlError | None = None
        try:
            if key in twice:
                raise InvalidRequestError("the request names this resource more than once")
            alter = _alter(res)
            if body.validate_only:
                _validate_alter(alter, image)
            else:
                await call(alter)  # the core clears the ELRs (KIP-966's ClearElr rule)
        except MetactlError as exc:
            error = exc
            throttle = max(throttle, _throttle(exc))
        results.append(
            make(
                result_cls,
                error_code=error_code(error),
                error_message=_message(error),
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return make(response_cls, throttle_time=throttle, responses=tuple(results))


# --- ElectLeaders -------------------------------------------------------------------------


def unclean_replica(image: ClusterImage | None, topic: str, partition: int) -> int | None:
    """The replica an UNCLEAN election of Kafka's (which names none) elects: a live ISR
    member, else a live eligible replica (ELR), else the first live replica in assignment
    order; None if the image does not know the partition or it has a leader (the
    controller answers those). Raises ELIGIBLE_LEADERS_NOT_AVAILABLE with no live replica."""
    p = image.partition((topic, partition)) if image is not None else None
    if p is None or p.has_leader:
        return None
    assert image is not None
    for group in (
        [r for r in p.replicas if r in p.isr],
        [r for r in p.replicas if r in p.elr],
        list(p.replicas),
    ):
        for r in group:
            if image.is_active(r):
                return r
    raise EligibleLeadersNotAvailableError(
        f"no live replica of {topic}-{partition} to elect: replicas {list(p.replicas)}"
    )


async def elect_leaders(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.ELECT_LEADERS, version)
    topic_cls = nested(response_cls, "ReplicaElectionResult")
    partition_cls = nested(response_cls, "PartitionResult")
    kind = int(body.election_type) if version >= 1 else PREFERRED
    outcome: dict[str, dict[int, MetactlError | None]] = {}
    top: MetactlError | None = None
    if kind not in (PREFERRED, UNCLEAN):
        top = InvalidRequestError(f"unknown election type {kind}")
    elif body.topic_partitions is None:
        if kind == UNCLEAN:
            top = InvalidRequestError("an UNCLEAN election of every partition is not served")
        else:
            try:
                outcome = await _elect_all_preferred(call, image)
            except MetactlError as exc:
                top = exc
    else:
        for t in body.topic_partitions:
            for p in t.partitions:
                outcome.setdefault(str(t.topic), {})[int(p)] = await _elect_one(
                    call, image, str(t.topic), int(p), kind
                )
        codes = {
            error_code(e) for parts in outcome.values() for e in parts.values() if e is not None
        }
        # A refusal of the principal is the request's too, as Kafka answers it.
        if ErrorCode.cluster_authorization_failed in codes:
            top = next(
                e
                for parts in outcome.values()
                for e in parts.values()
                if e is not None and error_code(e) == ErrorCode.cluster_authorization_failed
            )
    results = tuple(
        topic_cls(
            topic=topic,
            partition_result=tuple(
                make(
                    partition_cls,
                    partition_id=p,
                    error_code=error_code(e),
                    error_message=_message(e),
                )
                for p, e in sorted(parts.items())
            ),
        )
        for topic, parts in sorted(outcome.items())
    )
    if top is not None and version == 0 and not results and body.topic_partitions:
        # v0 has no top-level error: every partition named carries it.
        results = tuple(
            topic_cls(
                topic=t.topic,
                partition_result=tuple(
                    make(
                        partition_cls,
                        partition_id=p,
                        error_code=error_code(top),
                        error_message=_message(top),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topic_partitions
        )
    return make(
        response_cls,
        throttle_time=_throttle(top),
        error_code=error_code(top),
        replica_election_results=results,
    )


async def _elect_one(
    call: Call, image: ClusterImage | None, topic: str, partition: int, kind: int
) -> MetactlError | None:
    try:
        if kind == PREFERRED:
            await call(ElectLeader(topic=topic, partition=partition, election_type="preferred"))
        else:
            replica = unclean_replica(image, topic, partition)
            if replica is None and image is not None:
                p = image.partition((topic, partition))
                if p is not None and p.has_leader:
                    raise ElectionNotNeededError(f"{topic}-{partition} has leader {p.leader}")
            # The same request as `metactl elect --election-type unclean`: the same
            # UncleanRecoveryRecord, metric and log line (a potential data-loss event).
            await call(
                ElectLeader(topic=topic, partition=partition, election_type="unclean",
                            replica=replica)
            )  # fmt: skip
    except MetactlError as exc:
        return exc
    return None


async def _elect_all_preferred(
    call: Call, image: ClusterImage | None
) -> dict[str, dict[int, MetactlError | None]]:
    """Every partition not led by its preferred replica (Kafka leaves out those that
    need no election): one bulk ElectPreferredLeaders, its failures by partition."""
    targets: list[ReplicaRef] = []
    if image is not None:
        for name in sorted(image.topics):
            for i in range(image.topics[name].partitions):
                p = image.partition((name, i))
                if p is not None and p.replicas and p.leader != p.replicas[0]:
                    targets.append(ReplicaRef(topic=name, partition=i))
    if image is not None and not targets:
        return {}
    answer = await _ask(
        call,
        ElectPreferredLeaders(partitions=targets if image is not None else None),
        ElectPreferredLeadersResponse,
    )
    failed = {
        (f.topic, f.partition): _coded(f.error_code, f"{f.topic}-{f.partition}: {f.error_code}")
        for f in answer.failures
    }
    out: dict[str, dict[int, MetactlError | None]] = {}
    for ref in targets:
        out.setdefault(ref.topic, {})[ref.partition] = failed.get((ref.topic, ref.partition))
    for (topic, partition), error in failed.items():
        out.setdefault(topic, {})[partition] = error
    return out


# --- reassignments ------------------------------------------------------------------------


async def alter_reassignments(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.ALTER_PARTITION_REASSIGNMENTS, version)
    topic_cls = nested(response_cls, "ReassignableTopicResponse")
    partition_cls = nested(response_cls, "ReassignablePartitionResponse")
    allow_rf_change = bool(getattr(body, "allow_replication_factor_change", True))
    errors: dict[tuple[str, int], MetactlError | None] = {}
    send: list[Reassignment] = []
    for t in body.topics:
        for p in t.partitions:
            tp = (str(t.name), int(p.partition_index))
            replicas = None if p.replicas is None else [int(b) for b in p.replicas]
            state = image.partition(tp) if image is not None else None
            if tp in errors or any((r.topic, r.partition) == tp for r in send):
                errors[tp] = InvalidRequestError("the request names this partition more than once")
                continue
            if not allow_rf_change and replicas is not None and state is not None:
                original = len(state.replicas) - len(state.adding)
                if len(replicas) != original:
                    errors[tp] = InvalidReplicationFactorError(
                        f"the replication factor would change from {original} to {len(replicas)}"
                        " and allow_replication_factor_change is false"
                    )
                    continue
            send.append(Reassignment(topic=tp[0], partition=tp[1], replicas=replicas))
    top: MetactlError | None = None
    if send:
        try:
            answer = await _ask(
                call, AlterPartitionReassignments(reassignments=send),
                AlterPartitionReassignmentsResponse,
            )  # fmt: skip
            for r in answer.results:
                errors.setdefault(
                    (r.topic, r.partition),
                    None if r.error_code is None else _coded(r.error_code, r.message),
                )
        except MetactlError as exc:
            top = exc
            for r in send:
                errors.setdefault((r.topic, r.partition), exc)
    by_topic: dict[str, list[Any]] = {}
    for t in body.topics:
        for p in t.partitions:
            e = errors.get((str(t.name), int(p.partition_index)))
            by_topic.setdefault(str(t.name), []).append(
                partition_cls(
                    partition_index=p.partition_index,
                    error_code=error_code(e),
                    error_message=_message(e),
                )
            )
    return make(
        response_cls,
        throttle_time=_throttle(top),
        allow_replication_factor_change=allow_rf_change,
        error_code=error_code(top),
        error_message=_message(top),
        responses=tuple(
            topic_cls(name=name, partitions=tuple(parts)) for name, parts in by_topic.items()
        ),
    )


async def list_reassignments(request: Request, call: Call) -> Any:
    body = request.body
    response_cls: Any = load_response_schema(k.LIST_PARTITION_REASSIGNMENTS, request.api_version)
    topic_cls = nested(response_cls, "OngoingTopicReassignment")
    partition_cls = nested(response_cls, "OngoingPartitionReassignment")
    wanted: dict[str, set[int]] | None = (
        None
        if body.topics is None
        else {str(t.name): {int(i) for i in t.partition_indexes} for t in body.topics}
    )
    found: list[OngoingReassignment] = []
    native = ListPartitionReassignmentsRequest(
        v=2, topics=None if wanted is None else sorted(wanted)
    )
    error: MetactlError | None = None
    try:
        last: tuple[str, int] | None = None
        while True:
            answer = await _ask(call, native, ListPartitionReassignmentsResponse)
            found.extend(answer.reassignments)
            cursor = answer.next_cursor
            if cursor is None:
                break
            if last is not None and (cursor.topic, cursor.partition) <= last:
                raise InvalidRequestError("the controller's list went back")
            last = (cursor.topic, cursor.partition)
            native = ListPartitionReassignmentsRequest(v=2, topics=native.topics, cursor=cursor)
    except MetactlError as exc:
        error, found = exc, []
    by_topic: dict[str, list[Any]] = {}
    for o in found:
        if wanted is not None and o.partition not in wanted.get(o.topic, set()):
            continue
        by_topic.setdefault(o.topic, []).append(
            partition_cls(
                partition_index=o.partition,
                replicas=tuple(o.replicas),
                adding_replicas=tuple(o.adding_replicas),
                removing_replicas=tuple(o.removing_replicas),
            )
        )
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=error_code(error),
        error_message=_message(error),
        topics=tuple(topic_cls(name=n, partitions=tuple(ps)) for n, ps in by_topic.items()),
    )


# --- UpdateFeatures -----------------------------------------------------------------------


async def update_features(request: Request, call: Call) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.UPDATE_FEATURES, version)
    validate_only = bool(getattr(body, "validate_only", False))
    outcome: list[tuple[str, MetactlError | None]] = []
    for f in body.feature_updates:
        # v0: allow_downgrade; v1+: SAFE_DOWNGRADE (2) or UNSAFE_DOWNGRADE (3).
        downgrade = bool(f.allow_downgrade) if version == 0 else int(f.upgrade_type) in (2, 3)
        error: MetactlError | None = None
        try:
            if int(f.max_version_level) < 0:
                raise InvalidRequestError(f"level {f.max_version_level} of {f.feature} is negative")
            if not validate_only:
                await call(
                    UpdateFeature(
                        name=f.feature,
                        level=int(f.max_version_level),
                        upgrade_type="downgrade" if downgrade else "upgrade",
                    )
                )
        except MetactlError as exc:
            error = exc
        outcome.append((f.feature, error))
    first = next((e for _, e in outcome if e is not None), None)
    if version >= 2:  # no per-feature results: the request's error is the first one
        return make(
            response_cls,
            throttle_time=_throttle(first),
            error_code=error_code(first),
            error_message=_message(first),
        )
    result_cls = nested(response_cls, "UpdatableFeatureResult")
    return make(
        response_cls,
        throttle_time=_throttle(first),
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(
            result_cls(feature=name, error_code=error_code(e), error_message=_message(e))
            for name, e in outcome
        ),
    )


# --- DescribeCluster ----------------------------------------------------------------------


def _describe_cluster(
    request: Request,
    *,
    served_type: int,
    nodes: Iterable[tuple[int, str, int, str | None, bool]],
    controller_id: int,
    cluster_id: str,
) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DESCRIBE_CLUSTER, version)
    broker_cls = nested(response_cls, "DescribeClusterBroker")
    asked = int(body.endpoint_type) if version >= 1 else ENDPOINT_BROKERS
    error: MetactlError | None = None
    listed: tuple[Any, ...] = ()
    if asked != served_type:
        error = _coded(
            "UNSUPPORTED_ENDPOINT_TYPE",
            f"the request was sent to an endpoint of type {served_type}, "
            f"but it wanted an endpoint of type {asked}",
        )
    else:
        include_fenced = bool(getattr(body, "include_fenced_brokers", False))
        listed = tuple(
            make(broker_cls, broker_id=n, host=h, port=p, rack=rack, is_fenced=fenced)
            for n, h, p, rack, fenced in nodes
            if include_fenced or not fenced
        )
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=error_code(error),
        error_message=_message(error),
        endpoint_type=served_type,
        cluster_id=cluster_id,
        controller_id=controller_id if error is None else -1,
        brokers=listed,
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def describe_cluster_brokers(
    request: Request, image: ClusterImage, *, controller_id: int, cluster_id: str = ""
) -> Any:
    """A broker's DescribeCluster (endpoint type brokers): the registered brokers with a
    Kafka listener (fenced ones only with include_fenced_brokers, v2), and as controller
    a live broker (this one), as KRaft brokers answer clients."""
    nodes = []
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        if not b.kafka_endpoint:
            continue
        host, port = parse_address(b.kafka_endpoint)
        nodes.append((b.broker_id, host, port, b.rack, b.fenced))
    return _describe_cluster(
        request,
        served_type=ENDPOINT_BROKERS,
        nodes=nodes,
        controller_id=controller_id,
        cluster_id=cluster_id,
    )


def node_number(node_id: str) -> int:
    """A controller's node id as Kafka's int32: --node-id if it is a number, else a
    stable positive number made from it (metactl's node ids are names)."""
    text = node_id.strip()
    if text.isdigit() and int(text) <= MAX_INT32:
        return int(text)
    return zlib.crc32(text.encode()) & MAX_INT32


def describe_cluster_controllers(
    request: Request, quorum: DescribeQuorumResponse, kafka_address: str
) -> Any:
    """A controller's DescribeCluster (KIP-919, endpoint type controllers): this
    controller at its Kafka listener (the others' Kafka listeners are not recorded), the
    active one as controller_id when this one is it (-1 otherwise)."""
    me = node_number(quorum.node_id)
    host, port = parse_address(kafka_address)
    return _describe_cluster(
        request,
        served_type=ENDPOINT_CONTROLLERS,
        nodes=[(me, host, port, None, False)],
        controller_id=me if quorum.role == "active" else _leader_number(quorum),
        cluster_id=quorum.cluster_id,
    )


def _leader_number(quorum: DescribeQuorumResponse) -> int:
    if quorum.leader_id is None:
        return -1
    return node_number(quorum.leader_id)


# --- DescribeQuorum -----------------------------------------------------------------------


def describe_quorum(request: Request, quorum: DescribeQuorumResponse, kafka_address: str) -> Any:
    """KRaft's answer for the metadata partition (__cluster_metadata-0) from this
    controller's view: the active controller as leader, its term as the leader epoch (0
    on SQLite), the committed log end as high watermark; the voters are the controllers
    etcd recorded (this one alone on SQLite), each's log end known only for this one."""
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.DESCRIBE_QUORUM, version)
    topic_cls = nested(response_cls, "TopicData")
    partition_cls = nested(response_cls, "PartitionData")
    replica_cls = nested(response_cls, "ReplicaState")
    me = node_number(quorum.node_id)
    voters: dict[int, int] = {me: quorum.applied_offset}
    for c in quorum.controllers:
        voters.setdefault(node_number(c.node_id), -1)
    replicas = tuple(
        make(
            replica_cls,
            replica_id=n,
            replica_directory_id=None,
            log_end_offset=end,
            last_fetch_timestamp=-1,
            last_caught_up_timestamp=-1,
        )
        for n, end in sorted(voters.items())
    )
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            known = t.topic_name == METADATA_TOPIC and int(p.partition_index) == 0
            parts.append(
                make(
                    partition_cls,
                    partition_index=p.partition_index,
                    error_code=ErrorCode.none if known else ErrorCode.unknown_topic_or_partition,
                    error_message=None,
                    leader_id=_leader_number(quorum) if known else -1,
                    leader_epoch=(quorum.term or 0) if known else -1,
                    high_watermark=quorum.log_end_offset if known else -1,
                    current_voters=replicas if known else (),
                    observers=(),
                )
            )
        topics.append(topic_cls(topic_name=t.topic_name, partitions=tuple(parts)))
    nodes: tuple[Any, ...] = ()
    if version >= 2:
        node_cls = nested(response_cls, "Node")
        listener_cls = nested(response_cls, "Listener")
        host, port = parse_address(kafka_address)
        nodes = (
            node_cls(node_id=me, listeners=(listener_cls(name="KAFKA", host=host, port=port),)),
        )
    return make(
        response_cls, error_code=ErrorCode.none, error_message=None, topics=tuple(topics),
        nodes=nodes,
    )  # fmt: skip
