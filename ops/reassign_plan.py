"""A reassignment plan in `kafka-reassign-partitions.sh`'s file format, and what
`--verify` concludes from the cluster's answers: the logic of `metactl reassign`, apart
from its arguments, requests and output (`ops.reassign_cmds`).

The file: `{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2,
3, 4]}]}`. `log_dirs`, if present, must be `"any"` for each replica (a metactl broker has
one log directory); `replicas` may be left out to `--cancel`. Anything else (bad JSON, an
unknown key, another version, a partition listed twice) is INVALID_CONFIG naming the file.
Its numbers are JSON integers within Java's int, as Kafka's decoder takes them: `true`,
`1.0`, `"1"` or 2147483648 as a partition or a broker id are INVALID_CONFIG (`Int32`).
`file_text` writes the format as Kafka's tool prints it (compact JSON, sorted).

`--generate`'s inputs and proposal: the topics file (`{"version": 1, "topics": [{"topic":
"t"}]}`, `read_topics_file`), `--broker-list` (`broker_list`), and `propose`, which
places each topic afresh over the listed brokers by the controller's own placement of a
new topic (`controller.core.topic_handlers`: reused, not copied; imported by `propose`
alone), with the topic's replication factor.

Pure but for reading the files: no requests, no printing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Final

import msgspec

from metactl.errors import InvalidConfigurationError, InvalidReplicationFactorError
from metactl.numbers import INT32_MAX, INT32_MIN, NumberFormatError, kafka_int
from metadata_image.state import TopicPartition
from protocol.messages.admin import OngoingReassignment, Reassignment

ANY_LOG_DIR: Final = "any"
EXPECTED: Final = (
    '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3, 4]}]}'
)


# A number of a JSON file an operator writes: a JSON integer within Java's int, as
# Kafka's JSON decoder (`DecodeJson.DecodeInt`) takes one; msgspec refuses a bool, a
# float and a string for an int already.
Int32 = Annotated[int, msgspec.Meta(ge=INT32_MIN, le=INT32_MAX)]


class JsonPartition(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    partition: Int32
    replicas: list[Int32] | None = None  # not needed to --cancel
    log_dirs: list[str] | None = None


class JsonFile(msgspec.Struct):
    partitions: list[JsonPartition]
    version: Int32 = 1


def tp_name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


def read_file(path: Path, *, need_replicas: bool) -> list[JsonPartition]:
    """The file's partitions, checked: INVALID_CONFIG (naming the file) for a bad
    document, a version other than 1, no partitions, a partition listed twice, missing
    replicas (unless cancelling) or a log directory other than "any". A missing file is
    the OSError it is (ENOENT: not found)."""

    def bad(why: str) -> InvalidConfigurationError:
        return InvalidConfigurationError(f"--reassignment-json-file {path}: {why}")

    try:
        doc = msgspec.json.decode(path.read_bytes(), type=JsonFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad(f"{exc} (expected {EXPECTED})") from None
    if doc.version != 1:
        raise bad(f"version {doc.version} is not supported (1 is)")
    if not doc.partitions:
        raise bad("no partitions")
    seen: set[TopicPartition] = set()
    for p in doc.partitions:
        name = tp_name((p.topic, p.partition))
        if (p.topic, p.partition) in seen:
            raise bad(f"{name} is listed twice")
        seen.add((p.topic, p.partition))
        if need_replicas and p.replicas is None:
            raise bad(f"{name} has no replicas")
        if p.log_dirs is not None:
            if p.replicas is not None and len(p.log_dirs) != len(p.replicas):
                raise bad(f"{name}: {len(p.log_dirs)} log_dirs for {len(p.replicas)} replicas")
            if any(d != ANY_LOG_DIR for d in p.log_dirs):
                raise bad(f'{name}: log_dirs must be "any" (a broker has one log directory)')
    return doc.partitions


def reassignments(entries: Sequence[JsonPartition], *, cancel: bool) -> list[Reassignment]:
    """The wire's reassignments of the file's partitions: to their replicas, or (None)
    cancelled."""
    return [
        Reassignment(topic=e.topic, partition=e.partition, replicas=None if cancel else e.replicas)
        for e in entries
    ]


def file_text(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's file for `assignment`, on one line, compact and sorted by topic and
    partition (as the tool prints it: `formatAsReassignmentJson`)."""
    partitions = [
        {"topic": t, "partition": p, "replicas": list(rs), "log_dirs": [ANY_LOG_DIR] * len(rs)}
        for (t, p), rs in sorted(assignment.items())
    ]
    return json.dumps({"version": 1, "partitions": partitions}, separators=(",", ":"))


def rollback(
    entries: Sequence[JsonPartition],
    current: Mapping[TopicPartition, Sequence[int]],
    moving: Mapping[TopicPartition, OngoingReassignment],
) -> dict[TopicPartition, list[int]]:
    """What `--execute` prints to roll back with: each existing partition's replicas
    before any reassignment (one already being reassigned goes back to its original
    replicas, as a cancel would restore them)."""
    out: dict[TopicPartition, list[int]] = {}
    for e in entries:
        tp = (e.topic, e.partition)
        if tp in current:
            adding = moving[tp].adding_replicas if tp in moving else []
            out[tp] = [b for b in current[tp] if b not in adding]
    return out


class Status(Enum):
    COMPLETED = "completed"  # no reassignment runs and the replicas are the file's, in order
    IN_PROGRESS = "in progress"
    DIFFERENT = "different"  # no reassignment runs, but the replicas are not the file's
    UNKNOWN = "unknown"  # no such partition


@dataclass(frozen=True)
class Check:
    tp: TopicPartition
    status: Status
    target: list[int]
    current: list[int] | None  # the committed replicas (None: unknown partition)


def verify(
    entries: Sequence[JsonPartition],
    moving: Mapping[TopicPartition, OngoingReassignment],
    current: Mapping[TopicPartition, Sequence[int]],
) -> list[Check]:
    """`--verify`'s verdict per partition of the file, from the reassignments in
    progress and the committed replicas. Ask for `moving` first: a reassignment that
    completes between the two answers then shows as in progress (the next --verify says
    completed), never as a wrong replica set."""
    out = []
    for e in entries:
        tp = (e.topic, e.partition)
        target = list(e.replicas or [])
        now = list(current[tp]) if tp in current else None
        if tp in moving:
            status = Status.IN_PROGRESS
        elif now is None:
            status = Status.UNKNOWN
        elif now == target:
            status = Status.COMPLETED
        else:
            status = Status.DIFFERENT
        out.append(Check(tp, status, target, now))
    return out


# --- --generate ---------------------------------------------------------------------------

TOPICS_EXPECTED: Final = '{"version": 1, "topics": [{"topic": "t"}]}'


class JsonTopic(msgspec.Struct, forbid_unknown_fields=True):
    topic: str


class JsonTopicsFile(msgspec.Struct):
    topics: list[JsonTopic]
    version: Int32 = 1


def _duplicates(items: Sequence[object]) -> list[object]:
    """The items given more than once, each once, in order."""
    seen: set[object] = set()
    twice: list[object] = []
    for x in items:
        if x in seen and x not in twice:
            twice.append(x)
        seen.add(x)
    return twice


def read_topics_file(path: Path) -> list[str]:
    """The topics of `--topics-to-move-json-file`, in the file's order: INVALID_CONFIG
    (naming the file) for a bad document, a version other than 1, no topics or a topic
    listed twice (Kafka's "duplicate entries"). A missing file is ENOENT."""

    def bad(why: str) -> InvalidConfigurationError:
        return InvalidConfigurationError(f"--topics-to-move-json-file {path}: {why}")

    try:
        doc = msgspec.json.decode(path.read_bytes(), type=JsonTopicsFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad(f"{exc} (expected {TOPICS_EXPECTED})") from None
    if doc.version != 1:
        raise bad(f"version {doc.version} is not supported (1 is)")
    names = [t.topic for t in doc.topics]
    if not names:
        raise bad("no topics")
    twice = _duplicates(names)
    if twice:
        raise bad(f"the list of topics contains duplicate entries: {', '.join(map(str, twice))}")
    return names


def broker_list(text: str) -> list[int]:
    """`--broker-list 1,2,3`: broker ids (0..2^31-1), once each; INVALID_CONFIG if not."""
    try:
        ids = [kafka_int(x, 0, INT32_MAX) for x in text.split(",")]
    except NumberFormatError:
        raise InvalidConfigurationError(
            f"--broker-list {text!r}: expected broker ids separated by commas, e.g. 1,2,3"
        ) from None
    twice = _duplicates(ids)
    if twice:
        raise InvalidConfigurationError(
            f"--broker-list {text!r} contains duplicate entries: {', '.join(map(str, twice))}"
        )
    return ids


def propose(
    current: Mapping[TopicPartition, Sequence[int]],
    factors: Mapping[str, int],
    racks: Mapping[int, str | None],
) -> dict[TopicPartition, list[int]]:
    """`--generate`'s proposal: every partition of `current`'s topics placed afresh over
    the brokers of `racks` (id -> rack; None: no rack, or racks disregarded) as the
    controller places a new topic of that many partitions and `factors[topic]` replicas
    (`broker_order`: racks alternate; `_striped`: partition p from the p-th broker on).
    INVALID_REPLICATION_FACTOR when a topic has more replicas than there are brokers."""
    import immutables

    from controller.core.topic_handlers import _striped, broker_order
    from metadata_image.image import ClusterImage
    from metadata_image.state import BrokerState

    brokers = {
        b: BrokerState(broker_id=b, epoch=0, incarnation_id="", rack=rack, fenced=False)
        for b, rack in racks.items()
    }
    order = broker_order(ClusterImage(brokers=immutables.Map(brokers), active=frozenset(brokers)))
    counts: dict[str, int] = {}
    for topic, partition in current:
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    out: dict[TopicPartition, list[int]] = {}
    for topic, count in sorted(counts.items()):
        rf = factors[topic]
        if not 1 <= rf <= len(order):
            raise InvalidReplicationFactorError(
                f"topic {topic} has replication factor {rf}: more than the {len(order)} "
                "active broker(s) of --broker-list to place it on"
            )
        placed = _striped(order, 0, count, rf)
        out.update({(topic, p): list(placed[p]) for p in range(count) if (topic, p) in current})
    return out
