"""One line for a record, told against the state before it (`describe_record`): "broker
2 fenced (session expired)", "demo-3 leader 1→2 (isr)", "demo-0 UNCLEAN RECOVERY: chose 2
of LastKnownELR [2,3] (balanced) — potential data loss"; and the lifecycle's lines: a
config set or deleted ("topic orders: min.insync.replicas=3 (was 2)"), a feature level, a
topic deleted or grown, a broker unregistered, the ELR and LastKnownELR a config change
cleared (with the partition range when a large topic is cleared in slices), and a
reassignment's steps ("demo-0 replicas [1,2,3]→[2,3,4,1], adding [4], removing [1]
(reassignment)", later "reassignment complete" or "reassignment cancelled"); and a new
active controller on a shared log ("controller c3 active (term 1234); c2 lost it
(dead-active detection)"). A preferred election of the automatic leader balance says so
("demo-0 leader 2→1 (preferred, automatic leader balance)"), an operator's does not.

Pure: no IO, no clock; it words records and keeps no state (`eventfeed.view` does)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from eventfeed.view import View
from metadata_image.state import PartitionState
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    TOPIC_RESOURCE,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ClearElrRecord,
    ConfigRecord,
    ControllerChangeRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

# What a fence reason means to an operator.
FENCE_REASONS: Final = {
    "session_timeout": "session expired",
    "registered": "registered, catching up",
    "requested": "requested",
}


def fence_reason_text(reason: str) -> str:
    return FENCE_REASONS.get(reason, reason.replace("_", " "))


def _ids(xs: Iterable[int]) -> str:
    return "[" + ",".join(map(str, xs)) + "]"


def _leader(x: int) -> str:
    return "none" if x == NO_LEADER else str(x)


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
    if isinstance(r, ControllerChangeRecord):
        return controller_change_text(r)
    return None  # PartitionRecord (the topic's line says it), NoOp, transaction markers


def controller_change_text(r: ControllerChangeRecord) -> str:
    """A new term's line: "controller c3 active (term 1234); c2 lost it (dead-active
    detection)", with the holder's own reason when it resigned ("(resigned: shutting
    down)"); the first term (or one whose predecessor is not known) only "controller c1
    active (term 17)"."""
    text = f"controller {r.node} active (term {r.term})"
    if not r.previous_node:
        return text
    why = r.previous_reason or "ended"
    if r.previous_detail:
        why += f": {r.previous_detail}"
    return f"{text}; {r.previous_node} lost it ({why})"


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
        if r.reason is ChangeReason.LEADER_BALANCE:  # not an operator's `elect`
            why += ", automatic leader balance"
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
