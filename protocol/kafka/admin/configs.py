"""Kafka's config APIs in metactl's admin messages and back (pure: no IO):
DescribeConfigs (one native request per resource) and IncrementalAlterConfigs (one
AlterConfigs per resource; validate_only checked against the image). Topic and broker
resources only; a broker's configs are the cluster default's.

It must not do IO (the caller's `Call` does) or keep configs: the controller does.
"""

from __future__ import annotations

from typing import Any, Final

from kio.index import load_response_schema

from metactl.errors import (
    InvalidConfigurationError,
    InvalidRequestError,
    MetactlError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from protocol.kafka import framing as k
from protocol.kafka.admin.common import (
    CONFIG_SOURCES,
    MIN_ISR,
    Call,
    ask,
    error_code,
    error_message,
    throttle_for,
)
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.messages.admin import (
    AlterConfigs,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)

TOPIC: Final = 2  # Kafka's ConfigResource.Type
BROKER: Final = 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations
# Kafka's ConfigType numbers.
CONFIG_TYPE_INT: Final = 3
CONFIG_TYPE_STRING: Final = 2


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
            answer = await ask(
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
                error_message=error_message(error),
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
            throttle = max(throttle, throttle_for(exc))
        results.append(
            make(
                result_cls,
                error_code=error_code(error),
                error_message=error_message(error),
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return make(response_cls, throttle_time=throttle, responses=tuple(results))
