"""The committed metadata log as one readable line per event (`metactl events`).

`Feed` takes log entries (offset, timestamp, record) in order, from the controller's
FetchMetadata answers or from a data directory, and returns `Event`s: a line such as
"broker 2 fenced (session expired)", "demo-3 leader 1→2 (isr)" or "demo-0 UNCLEAN
RECOVERY: chose 2 of LastKnownELR [2,3] (balanced) — potential data loss". It keeps the
image the records build, because a line says what changed ("1→2") and the record says
only the new value.

A metadata transaction (KIP-868) takes effect whole: its records give lines only once its
end marker is read, and an aborted or unfinished one gives none
(`metadata_image.transactions.EffectiveEntries` says which entries take effect).
Records older than `since_ms` are replayed without lines. Transaction markers, no-ops
and the PartitionRecords of a topic creation or growth (summed up by the topic's line)
give no line of their own.

The lifecycle has lines too: a config set or deleted ("topic orders:
min.insync.replicas=3 (was 2)"), a feature level, a topic deleted or grown, a broker
unregistered, the ELR and LastKnownELR a config change cleared (with the partition range
when a large topic is cleared in slices), and a reassignment's steps ("demo-0 replicas
[1,2,3]→[2,3,4,1], adding [4], removing [1] (reassignment)", later "reassignment
complete" or "reassignment cancelled").

Pure: no IO, no clock. `parse_since` reads `--since` (10m, 2h, 1d, an ISO time).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

import msgspec

from metactl.errors import InvalidConfigurationError
from metadata_image.image import ClusterImage, PartitionState, TopicPartition, TopicState
from metadata_image.replay import image_from_records, replay
from metadata_image.transactions import EffectiveEntries
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    TOPIC_RESOURCE,
    AbortTransactionRecord,
    BeginTransactionRecord,
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ConfigRecord,
    EndTransactionRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    record_type,
)
from simulation.history_config import parse_time_ms

# What a fence reason means to an operator.
FENCE_REASONS: Final = {
    "session_timeout": "session expired",
    "registered": "registered, catching up",
    "requested": "requested",
}


def fence_reason_text(reason: str) -> str:
    return FENCE_REASONS.get(reason, reason.replace("_", " "))


class Entry(Protocol):
    """A committed record and where it is: a store's LogEntry or a FetchedRecord."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp_ms(self) -> int: ...

    @property
    def record(self) -> MetadataRecord: ...


@dataclass(frozen=True)
class Event:
    offset: int
    timestamp_ms: int
    type: str  # the record's type tag, e.g. "PartitionChange"
    text: str
    record: MetadataRecord

    def line(self) -> str:
        """The event as the terminal shows it: the UTC time, then the text."""
        return f"{iso_ms(self.timestamp_ms)}  {self.text}"


def iso_ms(timestamp_ms: int) -> str:
    when = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ids(xs: Iterable[int]) -> str:
    return "[" + ",".join(map(str, xs)) + "]"


def _leader(x: int) -> str:
    return "none" if x == NO_LEADER else str(x)


class View:
    """The state a record's line is told against: the image, and over it what the records
    read since (not yet replayed into it) changed of partitions and brokers. Replaying
    record by record would cost a replay per line; a long history is replayed in bulk."""

    def __init__(self, image: ClusterImage, kip966: Kip966Seen | None = None) -> None:
        self.image = image
        self.kip966 = kip966 if kip966 is not None else Kip966Seen(image)
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._brokers: set[int] = set()
        self._topics: dict[str, TopicState] = {}

    def partition(self, tp: TopicPartition) -> PartitionState | None:
        p = self._partitions.get(tp)
        return p if p is not None else self.image.partitions.get(tp)

    def topic(self, name: str) -> TopicState | None:
        t = self._topics.get(name)
        return t if t is not None else self.image.topics.get(name)

    def has_broker(self, broker_id: int) -> bool:
        return broker_id in self._brokers or broker_id in self.image.brokers

    def isrs_of(self, broker_id: int) -> list[TopicPartition]:
        """The partitions whose ISR holds the broker now (the image's, as changed by the
        records read since, and those created since)."""
        now = {q.tp: q for q in self.image.partitions_of(broker_id)}
        now.update(self._partitions)
        return [tp for tp, p in now.items() if broker_id in p.isr]

    def classic(self, broker_id: int) -> bool:
        """The classic rules (eligible.leader.replicas.version 0, KIP-966 off) apply to
        the broker's registration: the finalized level says so (a feature record is
        replayed into the image before the next record is told). A log without one (a
        scenario's, or from before levels were recorded) finalized no KIP-966: it reads
        as classic, unless it shows KIP-966 at work where only KIP-966 can be (an ELR, a
        LastKnownELR or an unclean recovery, `Kip966Seen`) and the broker is not where
        only the classic rules leave a fenced broker (the ISR of a partition with no
        leader)."""
        level = self.image.features.get(ELR_FEATURE)
        if level is not None:
            return level < 1
        if any(
            (p := self.partition(tp)) is not None and p.leader == NO_LEADER
            for tp in self.isrs_of(broker_id)
        ):
            return True
        return not self.kip966.seen()

    def note(self, r: MetadataRecord) -> bool:
        """Take `r` into account; False when this view cannot (replay, then a new view)."""
        if isinstance(r, PartitionChangeRecord):
            p = self.partition((r.topic, r.partition))
            if p is not None:
                self._partitions[p.tp] = msgspec.structs.replace(
                    p,
                    leader=p.leader if r.leader is None else r.leader,
                    isr=p.isr if r.isr is None else frozenset(r.isr),
                    elr=p.elr if r.elr is None else frozenset(r.elr),
                    last_known_elr=(
                        p.last_known_elr
                        if r.last_known_elr is None
                        else frozenset(r.last_known_elr)
                    ),
                    replicas=p.replicas if r.replicas is None else tuple(r.replicas),
                    adding=p.adding if r.adding_replicas is None else tuple(r.adding_replicas),
                    removing=(
                        p.removing if r.removing_replicas is None else tuple(r.removing_replicas)
                    ),
                    min_isr=p.min_isr if r.min_isr is None else r.min_isr,
                )
        elif isinstance(r, PartitionRecord):
            tp = (r.topic, r.partition)
            self._partitions[tp] = PartitionState(
                topic=r.topic,
                partition=r.partition,
                tp=tp,
                replicas=tuple(r.replicas),
                isr=frozenset(r.isr),
                elr=frozenset(r.elr),
                last_known_elr=frozenset(r.last_known_elr),
                leader=r.leader,
                min_isr=r.min_isr,
                adding=tuple(r.adding_replicas),
                removing=tuple(r.removing_replicas),
            )
        elif isinstance(r, TopicRecord):
            self._topics[r.name] = TopicState(
                name=r.name,
                topic_id=r.topic_id,
                partitions=r.partitions,
                min_isr=r.min_isr,
                recovery_strategy=r.recovery_strategy,
            )
        elif isinstance(r, RegisterBrokerRecord):
            self._brokers.add(r.broker_id)
        elif isinstance(
            r,
            ClearElrRecord
            | RemoveTopicRecord
            | ConfigRecord
            | FeatureLevelRecord
            | UnregisterBrokerRecord,
        ):
            # Changes many partitions (a topic's, or a broker's), or state this view does
            # not keep (configs, features); rare: replay instead.
            return False
        return True


class Kip966Seen:
    """Whether a log shows KIP-966 at work: a partition with an ELR or a LastKnownELR, or
    an unclean recovery, in the image the feed started from or in a record read since.
    Only KIP-966 makes them, so a log that finalized no eligible.leader.replicas.version
    and holds one of them ran with ELRs. The start image is looked at only if asked, once
    (it walks the partitions until it finds one); records are looked at as read."""

    def __init__(self, image: ClusterImage) -> None:
        self._image: ClusterImage | None = image
        self._seen = False

    def seen(self) -> bool:
        if not self._seen and self._image is not None:
            image, self._image = self._image, None
            self._seen = bool(image.last_recoveries) or any(
                p.elr or p.last_known_elr for p in image.partitions.values()
            )
        return self._seen

    def take(self, r: MetadataRecord) -> None:
        if self._seen:
            return
        if isinstance(r, PartitionChangeRecord | PartitionRecord):
            self._seen = bool(r.elr or r.last_known_elr)
        elif isinstance(r, UncleanRecoveryRecord):
            self._seen = True


SILENT_LOSS_NOTE: Final = (
    " — elected from the ISR it stayed in after an UNCLEAN restart (classic rules): "
    "acknowledged records it lost are gone, silently"
)


class StaleIsr:
    """Under the classic rules, the ISR places brokers kept through an UNCLEAN restart
    (partition -> brokers): electing one of them is the silent-loss path (README, "Does
    it keep acknowledged data?"), which the election's line says. A place ends when the
    broker leaves that ISR (it rejoins only once caught up) or is elected."""

    def __init__(self) -> None:
        self.places: dict[TopicPartition, set[int]] = {}

    def take(self, r: MetadataRecord, before: View) -> bool:
        """Note `r` (told against `before`); True if it elects a broker from such a place."""
        if isinstance(r, RegisterBrokerRecord):
            if not r.clean and before.has_broker(r.broker_id) and before.classic(r.broker_id):
                for tp in before.isrs_of(r.broker_id):
                    self.places.setdefault(tp, set()).add(r.broker_id)
            return False
        if isinstance(r, PartitionChangeRecord):
            tp = (r.topic, r.partition)
            held = self.places.get(tp)
            if not held:
                return False
            elected = r.leader is not None and r.leader in held
            if elected:
                held.discard(r.leader)
            if r.isr is not None:
                held &= set(r.isr)
            if not held:
                del self.places[tp]
            return elected
        if isinstance(r, RemoveTopicRecord):
            for tp in [tp for tp in self.places if tp[0] == r.name]:
                del self.places[tp]
        return False


class Feed:
    """Turns committed entries into events, keeping the image they build.

    `next_offset` is the offset of the next entry to read (after the last one added, or
    the start image's end): a reader that stops (an error, a reconnection) continues from
    it with the same feed, and tells nothing twice."""

    def __init__(self, image: ClusterImage | None = None, *, since_ms: int | None = None) -> None:
        self.since_ms = since_ms
        self.start(image if image is not None else ClusterImage())

    def start(self, image: ClusterImage) -> None:
        """Start (again) from `image`, e.g. a snapshot's: lines are told against it, and
        whatever was read before is forgotten."""
        self.image = image
        self.next_offset = image.end_offset
        self._effective = EffectiveEntries[Entry]()  # holds an open transaction
        self._pending: list[MetadataRecord] = []  # taken, not yet replayed into the image
        self._kip966 = Kip966Seen(image)
        self._view = View(image, self._kip966)
        self._stale = StaleIsr()

    def reset(self, records: Iterable[MetadataRecord], end_offset: int) -> None:
        """Start again from a snapshot (FetchMetadata's answer for a truncated log)."""
        self.start(image_from_records(records, end_offset))

    def add(self, entries: Iterable[Entry]) -> list[Event]:
        """The events of these entries (read in log order), in log order."""
        batch = entries if isinstance(entries, list) else list(entries)
        if batch:
            self.next_offset = batch[-1].offset + 1
        out: list[Event] = []
        for e in self._effective.add(batch):
            self._take(e, out)
        self._flush()
        return out

    def _take(self, e: Entry, out: list[Event]) -> None:
        r = e.record
        quiet = self.since_ms is not None and e.timestamp_ms < self.since_ms
        text = None if quiet or type(r) in _SILENT else describe_record(r, self._view)
        if self._stale.take(r, self._view) and text is not None:
            text += SILENT_LOSS_NOTE
        self._kip966.take(r)
        self._pending.append(r)
        if not self._view.note(r):
            self._flush()
        if text is not None:
            out.append(Event(e.offset, e.timestamp_ms, record_type(r), text, r))

    def _flush(self) -> None:
        if self._pending:
            self.image = replay(self.image, self._pending)
            self._pending = []
            self._view = View(self.image, self._kip966)


# Records that never give a line of their own (describe_record says None for them).
_SILENT: Final = frozenset(
    (
        PartitionRecord,
        NoOpRecord,
        BeginTransactionRecord,
        EndTransactionRecord,
        AbortTransactionRecord,
    )
)


def describe_record(r: MetadataRecord, before: View) -> str | None:
    """One line for a record, given the image before it; None: nothing to say."""
    if isinstance(r, FenceBrokerRecord):
        return f"broker {r.broker_id} fenced ({fence_reason_text(r.reason)})"
    if isinstance(r, UnfenceBrokerRecord):
        return f"broker {r.broker_id} unfenced (caught up with the log)"
    if isinstance(r, RegisterBrokerRecord):
        if not before.has_broker(r.broker_id):
            how = "first registration"
        elif r.clean:
            how = "clean restart"
        elif not before.classic(r.broker_id):
            how = "UNCLEAN restart: out of ISR and ELR"
        elif n := len(before.isrs_of(r.broker_id)):
            # Kafka before KIP-966: nothing removes it; elected from that ISR, its log may
            # miss acknowledged records, and nothing says so (the silent-loss path).
            how = (
                f"UNCLEAN restart; classic rules: it stays in the ISR of {n} partition(s) "
                "and may be elected from it, missing acknowledged records"
            )
        else:
            how = "UNCLEAN restart; classic rules: in no ISR"
        return f"broker {r.broker_id} registered at epoch {r.broker_epoch} ({how})"
    if isinstance(r, BrokerRegistrationChangeRecord):
        parts = []
        if r.in_controlled_shutdown:
            parts.append(f"broker {r.broker_id} in controlled shutdown")
        elif r.in_controlled_shutdown is False:
            parts.append(f"broker {r.broker_id} out of controlled shutdown")
        if r.fenced is not None:
            parts.append(f"broker {r.broker_id} {'fenced (requested)' if r.fenced else 'unfenced'}")
        return "; ".join(parts) or None
    if isinstance(r, TopicRecord):
        return _topic(r, before)
    if isinstance(r, PartitionChangeRecord):
        return _partition_change(r, before)
    if isinstance(r, UncleanRecoveryRecord):
        return _recovery(r, before)
    if isinstance(r, ClearElrRecord):
        return _clear_elr(r, before)
    if isinstance(r, RemoveTopicRecord):
        t = before.topic(r.name)
        size = f"{t.partitions} partition(s), " if t is not None else ""
        return f"topic {r.name} deleted ({size}id {r.topic_id})"
    if isinstance(r, ConfigRecord):
        return _config(r, before)
    if isinstance(r, FeatureLevelRecord):
        return _feature(r, before)
    if isinstance(r, UnregisterBrokerRecord):
        return f"broker {r.broker_id} unregistered (epoch {r.broker_epoch})"
    return None  # PartitionRecord (the topic's line says it), NoOp, transaction markers


def _topic(r: TopicRecord, before: View) -> str:
    old = before.topic(r.name)
    if old is not None and old.topic_id == r.topic_id:
        return f"topic {r.name} grown: {old.partitions}→{r.partitions} partition(s)"
    if r.min_isr is not None:
        min_isr = f"MinISR {r.min_isr}"
    else:
        default = before.image.cluster_configs.get(MIN_ISR_CONFIG)
        min_isr = "MinISR " + (f"{default} " if default is not None else "") + "(cluster default)"
    strategy = f", {r.recovery_strategy} recovery" if r.recovery_strategy else ""
    return (
        f"topic {r.name} created: {r.partitions} partition(s), {min_isr}"
        f"{strategy} (id {r.topic_id})"
    )


def _config(r: ConfigRecord, before: View) -> str:
    """A dynamic config set or deleted, with the value it replaces where the image keeps
    it (a topic's min.insync.replicas, the cluster defaults)."""
    was: str | None = None
    if r.resource_type == TOPIC_RESOURCE:
        who = f"topic {r.resource_name}:"
        t = before.topic(r.resource_name)
        if t is not None and r.name == MIN_ISR_CONFIG:
            was = "the cluster default" if t.min_isr is None else str(t.min_isr)
    elif r.resource_type == BROKER_RESOURCE and r.resource_name == "":
        who = "cluster default"
        was = before.image.cluster_configs.get(r.name)
    else:
        who = f"{r.resource_type} {r.resource_name}:"
    if r.value is None:
        after = " (was " + was + ")" if was is not None else ""
        applies = ": the cluster default applies" if r.resource_type == TOPIC_RESOURCE else ""
        return f"{who} {r.name} deleted{after}{applies}"
    return f"{who} {r.name}={r.value}" + (f" (was {was})" if was is not None else "")


def _feature(r: FeatureLevelRecord, before: View) -> str:
    old = before.image.features.get(r.name)
    if old is None:
        effect = ""
        if r.name == ELR_FEATURE:
            effect = " (ELR on)" if r.level >= 1 else " (ELR off)"
        return f"feature {r.name} finalized at level {r.level}{effect}"
    effect = ""
    if r.name == ELR_FEATURE and (old >= 1) != (r.level >= 1):
        effect = (
            " (ELR on: tracked from the current ISRs)"
            if r.level >= 1
            else " (ELR off: every ELR and LastKnownELR cleared)"
        )
    return f"feature {r.name} level {old}→{r.level}{effect}"


def _clear_elr(r: ClearElrRecord, before: View) -> str:
    """The partitions a ClearElrRecord cleared (all of a topic, or the range a slice
    covers) and the MinISR they now have: min(min.insync.replicas, RF)."""
    t = before.topic(r.topic)
    end = r.end if r.end is not None else (t.partitions if t is not None else None)
    if r.first == 0 and r.end is None:
        where = f"all {t.partitions} partition(s)" if t is not None else "all partitions"
    elif end is not None and end - r.first == 1:
        where = f"partition {r.first}"
    else:
        where = f"partitions {r.first}..{'?' if end is None else end - 1}"
    text = f"topic {r.topic}: ELR and LastKnownELR cleared on {where}"
    if r.min_isr is None:
        return text
    p = before.partition((r.topic, r.first))
    rf = len(p.replicas) if p is not None else None
    if rf is not None and r.min_isr > rf:
        return text + f", MinISR {rf} (min.insync.replicas {r.min_isr}, capped at RF {rf})"
    return text + f", MinISR {r.min_isr} (min.insync.replicas updated)"


def _partition_change(r: PartitionChangeRecord, before: View) -> str | None:
    name = f"{r.topic}-{r.partition}"
    p = before.partition((r.topic, r.partition))
    parts: list[str] = []
    if r.leader is not None:
        old = _leader(p.leader) if p is not None else "?"
        why = r.election.value if r.election is not None else r.reason.value
        if r.leader == NO_LEADER:
            parts.append(f"{name} OFFLINE: leader {old}→none ({why})")
        else:
            parts.append(f"{name} leader {old}→{r.leader} ({why})")
    else:
        parts.append(name)
    parts.extend(_reassignment(r, p))
    for label, new, old_set in (
        ("isr", r.isr, p.isr if p is not None else None),
        ("elr", r.elr, p.elr if p is not None else None),
        ("LastKnownELR", r.last_known_elr, p.last_known_elr if p is not None else None),
    ):
        if new is not None:
            was = _ids(sorted(old_set)) if old_set is not None else "?"
            parts.append(f"{label} {was}→{_ids(new)}")
    if r.min_isr is not None and (p is None or r.min_isr != p.min_isr):
        parts.append(f"MinISR {p.min_isr if p is not None else '?'}→{r.min_isr}")
    if r.recovery_state is LeaderRecoveryState.RECOVERED:
        parts.append("recovered")
    elif r.recovery_state is LeaderRecoveryState.RECOVERING:
        parts.append("recovering")
    if len(parts) == 1 and r.leader is None:
        return None  # only epochs moved: nothing an operator reads
    if r.leader is None:
        cause = r.reason.value + (f" of broker {r.broker}" if r.broker is not None else "")
        return f"{parts[0]} " + ", ".join(parts[1:]) + f" ({cause})"
    return ", ".join(parts)


def _reassignment(r: PartitionChangeRecord, p: PartitionState | None) -> list[str]:
    """A reassignment's part of a partition change (KIP-455): the new replicas, what is
    being added and removed, or that it completed or was cancelled."""
    if r.replicas is None:
        return []
    was = _ids(p.replicas) if p is not None else "?"
    parts = [f"replicas {was}→{_ids(r.replicas)}"]
    if r.adding_replicas:
        parts.append(f"adding {_ids(r.adding_replicas)}")
    if r.removing_replicas:
        parts.append(f"removing {_ids(r.removing_replicas)}")
    if not r.adding_replicas and not r.removing_replicas and p is not None and p.reassigning:
        if tuple(r.replicas) == p.target:
            parts.append("reassignment complete")
        elif tuple(r.replicas) == p.original:
            parts.append("reassignment cancelled")
    return parts


def _recovery(r: UncleanRecoveryRecord, before: View) -> str:
    name = f"{r.topic}-{r.partition}"
    loss = " — potential data loss" if r.potential_data_loss else ""
    if r.trigger == "operator":
        return f"{name} UNCLEAN RECOVERY: operator elected {r.chosen} ({r.strategy}){loss}"
    p = before.partition((r.topic, r.partition))
    # Sets in ascending order, as everywhere (describe's "chose 2 of [2,3]" too).
    candidates = sorted(c.broker_id for c in r.candidates)
    if r.strategy == "balanced" and p is not None and p.last_known_elr:
        pool = f"LastKnownELR {_ids(sorted(p.last_known_elr))}"
    elif candidates:
        pool = f"replicas {_ids(candidates)} that reported"
    else:
        pool = f"replicas {_ids(sorted(p.replicas))}" if p is not None else "its replicas"
    return f"{name} UNCLEAN RECOVERY: chose {r.chosen} of {pool} ({r.strategy}){loss}"


# ASCII digits only (`metactl.numbers`: `\d` would take "١٠m").
_DURATION: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*$", re.ASCII)
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_EPOCH_MS: Final = re.compile(r"^\s*-?[0-9]+\s*$", re.ASCII)


def parse_duration_ms(text: str, flag: str) -> int:
    """`10m`, `2h`, `1d`, `30s`, `500ms` in milliseconds, or a bare `0` (no time at all
    needs no unit); INVALID_CONFIG otherwise."""
    if text.strip() == "0":
        return 0
    m = _DURATION.match(text)
    if m is None:
        raise InvalidConfigurationError(
            f"{flag} {text!r}: expected a duration such as 30s, 10m, 2h or 1d"
        )
    return int(float(m.group(1)) * _UNIT_MS[m.group(2)])


def parse_since(text: str, now_ms: int, flag: str = "--since", *, epoch_ms: bool = False) -> int:
    """`--since`: a duration back from `now_ms` (10m, 2h, 1d), an ISO 8601 time (UTC
    unless it says otherwise) or, with `epoch_ms`, epoch milliseconds; in epoch
    milliseconds (`simulation.history_config.parse_time_ms` reads the times).
    INVALID_CONFIG naming `flag` otherwise."""
    if _DURATION.match(text):
        return now_ms - parse_duration_ms(text, flag)
    when = text
    if not epoch_ms and _EPOCH_MS.match(text):
        # A bare number is no epoch time here; as an ISO date (YYYYMMDD) it is midnight.
        when = text.strip() + "T00"
    try:
        return parse_time_ms(when)
    except ValueError:
        kinds = ["a duration back from now (10m, 2h, 1d)", "an ISO 8601 time"]
        kinds += ["epoch milliseconds"] if epoch_ms else []
        raise InvalidConfigurationError(
            f"{flag} {text!r}: expected {', '.join(kinds[:-1])} or {kinds[-1]}"
        ) from None
