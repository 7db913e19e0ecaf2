"""What each record does to an image, other than the partition paths: broker
registrations, fences and unfences, controlled shutdown and unregistration; topics
created and removed; configs, features, ClearElr and unclean recoveries; a new active
controller's record (in the delta only). One function
per record type, `(builder, record)`, for `metadata_image.replay`'s dispatch table.

Changes a `Builder` only (never an image), and raises `ReplayError` on a record that
contradicts the image rather than guessing. No IO.
"""

from __future__ import annotations

from sys import intern

from metactl.errors import ReplayError
from metadata_image.builder import Builder, set_index
from metadata_image.state import EMPTY, BrokerState, PartitionState, TopicState
from metadata_log.records import (
    BROKER_RESOURCE,
    CLEAR_ELR_EPOCH_VERSION,
    MIN_ISR_CONFIG,
    NO_LEADER,
    TOPIC_RESOURCE,
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ConfigRecord,
    ControllerChangeRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
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
)


def partition_change(builder: Builder, record: PartitionChangeRecord) -> None:
    builder.partition_changes((record,))


def partition(builder: Builder, record: PartitionRecord) -> None:
    builder.partition_records((record,))


def remove_topic(builder: Builder, record: RemoveTopicRecord) -> None:
    """The topic and all its partitions go: O(its offline partitions + brokers)."""
    name = record.name
    t = builder.topics.get(name)
    if t is None or t.topic_id != record.topic_id:
        raise ReplayError(f"RemoveTopic for unknown topic {name} ({record.topic_id})")
    del builder.topics[name]
    builder.topic_ids = (
        builder.topic_ids.delete(t.topic_id)
        if t.topic_id in builder.topic_ids
        else builder.topic_ids
    )
    parts = builder.partitions
    offline = builder.offline
    reassigning = builder.reassigning
    recoveries = builder.last_recoveries
    for p in list(parts.topic_states(name, range(t.partitions))):
        if p.leader == NO_LEADER:
            del offline[p.tp]
        if p.tp in reassigning:
            reassigning = reassigning.delete(p.tp)
        if p.tp in recoveries:
            recoveries = recoveries.delete(p.tp)
    builder.reassigning = reassigning
    builder.last_recoveries = recoveries
    parts.drop_topic(name, t.partitions)
    im = builder.flush_added()
    for broker_id in {*builder.base_index.keys(), *builder.index_brokers}:
        index = im.get(broker_id)
        if index is not None and name in index.topics:
            set_index(im, broker_id, index.without_topic(name))
    delta = builder.delta
    if delta is not None:
        delta.removed_topics[name] = (t.topic_id, t.partitions)
        delta.topics.discard(name)
        if delta.partitions:
            delta.partitions = {tp for tp in delta.partitions if tp[0] != name}


def config(builder: Builder, record: ConfigRecord) -> None:
    if record.name != MIN_ISR_CONFIG:
        raise ReplayError(f"Config {record.name!r} is not one metactl knows")
    value = record.value
    if record.resource_type == TOPIC_RESOURCE:
        t = builder.topics.get(record.resource_name)
        if t is None:
            raise ReplayError(f"Config for unknown topic {record.resource_name}")
        builder.topics[t.name] = TopicState(
            name=t.name,
            topic_id=t.topic_id,
            partitions=t.partitions,
            min_isr=None if value is None else int(value),
            recovery_strategy=t.recovery_strategy,
        )
    elif record.resource_type == BROKER_RESOURCE and record.resource_name == "":
        if value is None:
            if record.name in builder.cluster_configs:
                builder.cluster_configs = builder.cluster_configs.delete(record.name)
        else:
            builder.cluster_configs = builder.cluster_configs.set(record.name, value)
    else:
        raise ReplayError(
            f"Config for {record.resource_type} {record.resource_name!r} is not one metactl keeps"
        )
    if builder.delta is not None:
        builder.delta.configs.add((record.resource_type, record.resource_name, record.name))


def feature(builder: Builder, record: FeatureLevelRecord) -> None:
    builder.features = builder.features.set(record.name, record.level)
    if builder.delta is not None:
        builder.delta.features.add(record.name)


def unregister(builder: Builder, record: UnregisterBrokerRecord) -> None:
    b = builder.broker(record.broker_id, record)
    if b.epoch != record.broker_epoch:
        raise ReplayError(
            f"UnregisterBroker of broker {b.broker_id} at epoch {record.broker_epoch}, "
            f"its epoch is {b.epoch}"
        )
    del builder.brokers[record.broker_id]
    builder.brokers_changed = True
    if builder.delta is not None:
        builder.delta.unregistered.add(record.broker_id)
        builder.delta.brokers.discard(record.broker_id)


def fence(builder: Builder, record: FenceBrokerRecord) -> None:
    _set_fenced(builder, record, record.broker_id, record.broker_epoch, fenced=True)


def unfence(builder: Builder, record: UnfenceBrokerRecord) -> None:
    _set_fenced(builder, record, record.broker_id, record.broker_epoch, fenced=False)


def _set_fenced(
    builder: Builder, record: MetadataRecord, bid: int, epoch: int, *, fenced: bool
) -> None:
    b = builder.broker(bid, record)
    if b.epoch == epoch:
        builder.brokers_changed = True
        builder.brokers[bid] = replace_broker(b, fenced=fenced)
        if builder.delta is not None:
            builder.delta.brokers.add(bid)


def registration_change(builder: Builder, record: BrokerRegistrationChangeRecord) -> None:
    b = builder.broker(record.broker_id, record)
    if b.epoch == record.broker_epoch:
        if builder.delta is not None:
            builder.delta.brokers.add(record.broker_id)
        builder.brokers_changed = True
        builder.brokers[record.broker_id] = replace_broker(
            b,
            fenced=b.fenced if record.fenced is None else record.fenced,
            in_controlled_shutdown=(
                b.in_controlled_shutdown
                if record.in_controlled_shutdown is None
                else record.in_controlled_shutdown
            ),
        )


def register(builder: Builder, record: RegisterBrokerRecord) -> None:
    builder.brokers_changed = True
    builder.brokers[record.broker_id] = BrokerState(
        broker_id=record.broker_id,
        epoch=record.broker_epoch,
        incarnation_id=record.incarnation_id,
        endpoint=record.endpoint,
        kafka_endpoint=record.kafka_endpoint,
        rack=record.rack,
        fenced=record.fenced,
        in_controlled_shutdown=False,
        last_registration_clean=record.clean,
    )
    delta = builder.delta
    if delta is not None:
        delta.brokers.add(record.broker_id)
        if not record.clean:
            delta.unclean_registrations.append(record.broker_id)


def topic(builder: Builder, record: TopicRecord) -> None:
    if builder.delta is not None:
        builder.delta.topics.add(record.name)
    old = builder.topics.get(record.name)
    if old is not None and (old.topic_id != record.topic_id or old.partitions > record.partitions):
        raise ReplayError(
            f"Topic {record.name} ({record.topic_id}, {record.partitions} partitions) "
            f"over the existing {old.topic_id} of {old.partitions}"
        )
    if old is None:
        builder.topic_ids = builder.topic_ids.set(record.topic_id, record.name)
    builder.topics[record.name] = TopicState(
        name=record.name,
        topic_id=record.topic_id,
        partitions=record.partitions,
        min_isr=record.min_isr,
        recovery_strategy=record.recovery_strategy,
    )


def clear_elr(builder: Builder, record: ClearElrRecord) -> None:
    topic = record.topic
    t = builder.topics.get(topic)
    if t is None:
        raise ReplayError(f"ClearElr for unknown topic {topic}")
    end = t.partitions if record.end is None else min(record.end, t.partitions)
    configured = record.min_isr
    changed = None if builder.delta is None else builder.delta.partitions
    # From version 3 on (Kafka's rule) only a partition whose ELR or LastKnownELR is
    # cleared gets a new partition epoch; one whose effective MinISR alone changes
    # keeps it, so that its leader's next AlterPartition is not refused for nothing.
    # Earlier records replay as they were written: every changed partition bumped.
    bump_all = record.v < CLEAR_ELR_EPOCH_VERSION
    for p in builder.partitions.topic_states(topic, range(record.first, end)):
        min_isr = p.min_isr if configured is None else min(configured, len(p.target))
        clears = bool(p.elr or p.last_known_elr)
        if clears or min_isr != p.min_isr:
            builder.set_partition(
                p.tp,
                replace_partition(
                    p, elr=EMPTY, lkelr=EMPTY, min_isr=min_isr, bump=clears or bump_all
                ),
                p,
            )
            if changed is not None:
                changed.add(p.tp)


def unclean_recovery(builder: Builder, record: UncleanRecoveryRecord) -> None:
    tp = (intern(record.topic), record.partition)
    if tp not in builder.partitions:
        raise ReplayError(f"UncleanRecovery for unknown partition {tp[0]}-{tp[1]}")
    builder.last_recoveries = builder.last_recoveries.set(tp, record)
    if builder.delta is not None:
        builder.delta.unclean_recoveries.append(record)


def noop(builder: Builder, record: NoOpRecord) -> None:
    """Audit records: the PartitionChangeRecord beside them carries the state.

    Transaction markers replay as no-ops here too: `replay` and `apply` are the
    controller's working image, which holds everything it has decided. Readers of the
    committed log honour the markers through `metadata_image.transactions`."""


def controller_change(builder: Builder, record: ControllerChangeRecord) -> None:
    """A new active controller's first record: the image keeps no controller (who is
    active, and in which term, is the etcd leadership key's; `metactl quorum describe`
    reads it there), so only the delta hears of it, for whoever acts on a new term."""
    if builder.delta is not None:
        builder.delta.controller_changes.append(record)


def replace_broker(
    b: BrokerState, *, fenced: bool, in_controlled_shutdown: bool | None = None
) -> BrokerState:
    return BrokerState(
        broker_id=b.broker_id,
        epoch=b.epoch,
        incarnation_id=b.incarnation_id,
        endpoint=b.endpoint,
        kafka_endpoint=b.kafka_endpoint,
        rack=b.rack,
        fenced=fenced,
        in_controlled_shutdown=(
            b.in_controlled_shutdown if in_controlled_shutdown is None else in_controlled_shutdown
        ),
        last_registration_clean=b.last_registration_clean,
    )


def replace_partition(
    p: PartitionState, *, elr: frozenset[int], lkelr: frozenset[int], min_isr: int, bump: bool
) -> PartitionState:
    return PartitionState(
        topic=p.topic,
        partition=p.partition,
        tp=p.tp,
        replicas=p.replicas,
        isr=p.isr,
        elr=elr,
        last_known_elr=lkelr,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch + 1 if bump else p.partition_epoch,
        recovery_state=p.recovery_state,
        min_isr=min_isr,
        adding=p.adding,
        removing=p.removing,
    )
