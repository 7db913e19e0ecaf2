"""The scenario file format: the structs a YAML scenario is read into, and its validation.

A scenario file (YAML) names a config, brokers, topics and steps; each step is one action
as a single-key mapping (`STEP_TYPES` lists them and the struct each one's argument is
read into). `load_scenario` and `parse_scenario` turn a file or a parsed document into a
`Scenario`, raising `ScenarioError` that names the step and field of what is invalid.

This module owns the format only. It must not run anything (no controller, no log, no
IO beyond reading the file it is given) nor decide what a step does; the runner,
`simulation.scenario`, carries the steps out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import yaml

from controller.core.config import ControllerConfig
from metactl.errors import MetactlError, ScenarioError
from metadata_image.state import parse_tp
from metadata_log.records import ELR_FEATURE, MIN_ISR_CONFIG


class _Spec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class BrokerSpec(_Spec, frozen=True):
    id: int
    rack: str | None = None


class TopicSpec(_Spec, frozen=True):
    name: str
    partitions: list[list[int]]
    min_insync_replicas: int | None = None
    unclean_recovery_strategy: str | None = None


class AlterPartitionStep(_Spec, frozen=True):
    partition: str
    isr: list[int]
    leader: int | None = None
    partition_epoch: int | None = None
    leader_epoch: int | None = None
    member_epochs: dict[int, int] = {}


class RegisterStep(_Spec, frozen=True):
    broker: int
    clean: bool | None = None
    previous_epoch: int | None = None


class RestartStep(_Spec, frozen=True):
    broker: int
    clean: bool


class ReplicaLogStep(_Spec, frozen=True):
    broker: int
    partition: str
    last_leader_epoch: int = 0
    log_end_offset: int = 0


class ElectStep(_Spec, frozen=True):
    partition: str
    type: Literal["preferred", "unclean"]
    replica: int | None = None


class CreateTopicStep(_Spec, frozen=True):
    name: str
    replication_factor: int | None = None
    partitions: int | None = None
    assignments: list[list[int]] | None = None
    min_insync_replicas: int | None = None
    unclean_recovery_strategy: str | None = None


class _ConfigResource(_Spec, frozen=True):
    """Whose config: exactly one of a `topic`, the cluster default (`cluster_default:
    true`, kafka-configs --entity-type brokers --entity-default) or one `broker` (which
    metactl refuses: it keeps no per-broker min.insync.replicas)."""

    topic: str | None = None
    cluster_default: bool = False
    broker: int | None = None


class AlterConfigStep(_ConfigResource, frozen=True):
    set_configs: dict[str, str | int] = msgspec.field(default_factory=dict, name="set")
    delete: list[str] = []


class DeleteConfigStep(_ConfigResource, frozen=True):
    name: str = MIN_ISR_CONFIG


class FeatureStep(_Spec, frozen=True):
    level: int
    name: str = ELR_FEATURE


class AddPartitionsStep(_Spec, frozen=True):
    topic: str
    count: int
    assignments: list[list[int]] | None = None


class ReassignStep(_Spec, frozen=True):
    partition: str
    replicas: list[int]


class ExpectStep(_Spec, frozen=True):
    # The subject: exactly one of these (`_SUBJECT_FIELDS` says which fields go with it).
    partition: str | None = None
    broker: int | None = None
    topic: str | None = None
    feature: str | None = None
    cluster_default: bool = False
    # partition
    leader: int | msgspec.UnsetType | None = msgspec.UNSET  # null: expect no leader
    leader_epoch: int | None = None
    partition_epoch: int | None = None
    isr: list[int] | None = None
    elr: list[int] | None = None
    last_known_elr: list[int] | None = None
    recovering: bool | None = None
    recovery_pending: list[int] | bool | None = None
    min_isr: int | None = None
    replicas: list[int] | None = None
    adding: list[int] | None = None
    removing: list[int] | None = None
    # broker
    epoch: int | None = None
    fenced: bool | None = None
    controlled_shutdown: bool | None = None
    registered: bool | None = None
    # topic
    exists: bool | None = None
    partitions: int | None = None
    topic_id_changed: bool | None = None
    # a topic's own min.insync.replicas (null: expect none), or the cluster default's
    min_insync_replicas: int | msgspec.UnsetType | None = msgspec.UNSET
    # feature: the effective level (the finalized one, else the controller's setting)
    level: int | None = None

    @property
    def subject(self) -> str | None:
        """Which subject the expectation names, or None if not exactly one."""
        given = [
            name
            for name, value in (
                ("partition", self.partition),
                ("broker", self.broker),
                ("topic", self.topic),
                ("feature", self.feature),
                ("cluster_default", self.cluster_default or None),
            )
            if value is not None
        ]
        return given[0] if len(given) == 1 else None


_SUBJECTS: Final = ("partition", "broker", "topic", "feature", "cluster_default")
_SUBJECT_FIELDS: Final[dict[str, frozenset[str]]] = {
    "partition": frozenset(
        {
            "leader",
            "leader_epoch",
            "partition_epoch",
            "isr",
            "elr",
            "last_known_elr",
            "recovering",
            "recovery_pending",
            "min_isr",
            "replicas",
            "adding",
            "removing",
        }
    ),
    "broker": frozenset({"epoch", "fenced", "controlled_shutdown", "registered"}),
    "topic": frozenset({"exists", "partitions", "topic_id_changed", "min_insync_replicas"}),
    "feature": frozenset({"level"}),
    "cluster_default": frozenset({"min_insync_replicas"}),
}


def _check_expect(value: ExpectStep, where: str) -> None:
    subject = value.subject
    if subject is None:
        raise ScenarioError(
            f"{where}: give exactly one of `partition` or `broker` (or `topic`, `feature`, "
            "`cluster_default: true`)"
        )
    allowed = _SUBJECT_FIELDS[subject]
    for name in value.__struct_fields__:
        if name in _SUBJECTS or name in allowed:
            continue
        given = getattr(value, name)
        if given is not None and given is not msgspec.UNSET:
            raise ScenarioError(f"{where}: field `{name}` does not apply to a {subject}")
    if subject == "feature" and value.level is None:
        raise ScenarioError(f"{where}: give the `level` the feature should be at")


STEP_TYPES: dict[str, Any] = {
    "alter_partition": AlterPartitionStep,
    "fence": int,
    "controlled_shutdown": int,
    "register": RegisterStep,
    "unfence": int,
    "restart": RestartStep,
    "replica_log": ReplicaLogStep,
    "advance_ms": int,
    "elect": ElectStep,
    "create_topic": CreateTopicStep,
    "delete_topic": str,
    "add_partitions": AddPartitionsStep,
    "alter_config": AlterConfigStep,
    "delete_config": DeleteConfigStep,
    "upgrade_feature": FeatureStep,
    "downgrade_feature": FeatureStep,
    "reassign": ReassignStep,
    "cancel_reassignment": str,
    "unregister": int,
    "restart_controller": None,
    "snapshot": None,
    "expect": ExpectStep,
    "expect_error": str,
}


class Step(msgspec.Struct, frozen=True):
    index: int
    action: str
    arg: Any


class Scenario(msgspec.Struct, frozen=True):
    config: ControllerConfig
    brokers: list[BrokerSpec]
    topics: list[TopicSpec]
    steps: list[Step]
    source: str = ""


def _convert(value: Any, type_: Any, where: str) -> Any:
    try:
        return msgspec.convert(value, type_, strict=False)
    except (msgspec.ValidationError, MetactlError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    text = Path(path).read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return parse_scenario(doc, source=str(path))


def parse_scenario(doc: Any, source: str = "") -> Scenario:
    if not isinstance(doc, dict):
        raise ScenarioError(
            f"{source}: a scenario is a mapping with config, brokers, topics, steps"
        )
    unknown = set(doc) - {"config", "brokers", "topics", "steps", "description"}
    if unknown:
        raise ScenarioError(f"{source}: unknown top-level field(s) {sorted(unknown)}")
    config = _convert(doc.get("config") or {}, ControllerConfig, "config")
    brokers = [
        _convert({"id": b} if isinstance(b, int) else b, BrokerSpec, f"brokers[{i}]")
        for i, b in enumerate(doc.get("brokers") or [])
    ]
    topics = [_convert(t, TopicSpec, f"topics[{i}]") for i, t in enumerate(doc.get("topics") or [])]
    raw_steps = doc.get("steps") or []
    if not isinstance(raw_steps, list):
        raise ScenarioError("steps: expected a list")
    steps: list[Step] = []
    for i, raw in enumerate(raw_steps, start=1):
        if isinstance(raw, str) and raw in {"restart_controller", "snapshot"}:
            steps.append(Step(i, raw, None))
            continue
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ScenarioError(
                f"step {i}: expected one action as a single-key mapping, got {raw!r}"
            )
        ((action, arg),) = raw.items()
        if action not in STEP_TYPES:
            raise ScenarioError(
                f"step {i}: unknown action {action!r} (known: {', '.join(STEP_TYPES)})"
            )
        type_ = STEP_TYPES[action]
        value = None if type_ is None else _convert(arg, type_, f"step {i} ({action})")
        if isinstance(value, ExpectStep):
            _check_expect(value, f"step {i} (expect)")
        if isinstance(
            value, ExpectStep | AlterPartitionStep | ReplicaLogStep | ElectStep | ReassignStep
        ):
            _check_tp(value.partition, f"step {i} ({action}): field `partition`")
        if action == "cancel_reassignment":
            _check_tp(value, f"step {i} ({action})")
        if isinstance(value, _ConfigResource):
            chosen = [value.topic is not None, value.cluster_default, value.broker is not None]
            if sum(chosen) != 1:
                raise ScenarioError(
                    f"step {i} ({action}): give exactly one of `topic`, "
                    "`cluster_default: true` or `broker`"
                )
        if isinstance(value, RegisterStep) and value.clean is None and value.previous_epoch is None:
            raise ScenarioError(f"step {i} (register): give `clean` or `previous_epoch`")
        if action == "expect_error" and not steps:
            raise ScenarioError(f"step {i} (expect_error): there is no previous step")
        steps.append(Step(i, action, value))
    return Scenario(config=config, brokers=brokers, topics=topics, steps=steps, source=source)


def _check_tp(name: str | None, where: str) -> None:
    if name is None:
        return
    try:
        parse_tp(name)
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
