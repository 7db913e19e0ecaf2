"""What the scenario runner reports after each step, and how expectations are checked.

A `StepReport` holds the state after a step (every partition as a `PartitionReport`,
every broker as a `BrokerReport`, every topic as a `TopicReport` and the cluster-wide
settings as a `ClusterReport`), the step's elections and unclean recoveries (from the
committed deltas, `delta_events`) and the differences between an `expect` step and that
state (`check_expectation`, which also knows every id a topic name has had in the run,
`TopicIds`); a `Summary` closes a run.

This module only describes and compares state. It must not change the controller or
submit anything to it, nor print (printing belongs to `ops.scenario_cmds`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from controller.runtime.driver import Controller
from metadata_image.delta import MetadataDelta
from metadata_image.state import PartitionState, tp_name
from metadata_log.records import ELR_FEATURE, NO_LEADER, ElectionKind, LeaderRecoveryState
from simulation.scenario_format import ExpectStep


class PartitionReport(msgspec.Struct, frozen=True, omit_defaults=True):
    replicas: list[int]
    leader: int | None
    leader_epoch: int
    partition_epoch: int
    isr: list[int]
    elr: list[int]
    last_known_elr: list[int]
    recovering: bool
    recovery_pending: list[int] | None
    min_isr: int
    # A reassignment in progress (KIP-455), as describe's Adding/Removing Replicas;
    # omitted when there is none.
    adding: list[int] = []
    removing: list[int] = []


class BrokerReport(msgspec.Struct, frozen=True):
    epoch: int
    fenced: bool
    controlled_shutdown: bool


class TopicReport(msgspec.Struct, frozen=True, omit_defaults=True):
    topic_id: str
    partitions: int
    min_insync_replicas: int | None = None  # the topic's own; None: the cluster's applies


class ClusterReport(msgspec.Struct, frozen=True):
    min_insync_replicas: int  # the cluster default in force (dynamic, else static)
    features: dict[str, int]  # effective levels (finalized, else the controller's setting)


class StepReport(msgspec.Struct, frozen=True):
    step: int
    action: str
    ok: bool
    error: str | None
    partitions: dict[str, PartitionReport]
    brokers: dict[str, BrokerReport]
    events: list[dict[str, Any]]
    failures: list[str] = []
    detail: str = ""
    topics: dict[str, TopicReport] = {}
    cluster: ClusterReport | None = None


class Summary(msgspec.Struct, frozen=True):
    steps: int
    failed_expectations: int
    log_end_offset: int
    potential_data_loss_events: int


def describe_partition(ctl: Controller, p: PartitionState) -> PartitionReport:
    return PartitionReport(
        replicas=list(p.replicas),
        leader=None if p.leader == NO_LEADER else p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        isr=sorted(p.isr),
        elr=sorted(p.elr),
        last_known_elr=sorted(p.last_known_elr),
        recovering=p.recovery_state is LeaderRecoveryState.RECOVERING,
        recovery_pending=ctl.tracker.awaited(ctl.image, p.tp, ctl.policies),
        min_isr=p.min_isr,
        adding=list(p.adding),
        removing=list(p.removing),
    )


def snapshot_state(ctl: Controller) -> tuple[dict[str, PartitionReport], dict[str, BrokerReport]]:
    image = ctl.image
    parts = {
        tp_name(tp): describe_partition(ctl, image.partitions[tp])
        for tp in sorted(image.partitions.keys())
    }
    brokers = {
        str(b.broker_id): BrokerReport(
            epoch=b.epoch, fenced=b.fenced, controlled_shutdown=b.in_controlled_shutdown
        )
        for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
    }
    return parts, brokers


def snapshot_topics(ctl: Controller) -> tuple[dict[str, TopicReport], ClusterReport]:
    """Every topic, and the cluster default and feature levels in force."""
    image, config = ctl.image, ctl.config
    topics = {
        t.name: TopicReport(
            topic_id=t.topic_id, partitions=t.partitions, min_insync_replicas=t.min_isr
        )
        for t in sorted(image.topics.values(), key=lambda t: t.name)
    }
    features = dict(sorted(image.features.items()))
    features[ELR_FEATURE] = 1 if image.elr_enabled(config.eligible_leader_replicas) else 0
    cluster = ClusterReport(
        min_insync_replicas=image.cluster_min_isr(config.default_min_insync_replicas),
        features=features,
    )
    return topics, cluster


class TopicIds:
    """Every id each topic name has had in a run, in order (`see` after every step):
    what `topic_id_changed` is checked against."""

    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = {}

    def see(self, topics: dict[str, TopicReport]) -> None:
        for name, t in topics.items():
            seen = self.ids.setdefault(name, [])
            if not seen or seen[-1] != t.topic_id:
                seen.append(t.topic_id)

    def changed(self, name: str, topic_id: str) -> bool:
        """True iff the name had an id before `topic_id`, and `topic_id` is none of them:
        a re-created topic is a different topic."""
        seen = self.ids.get(name, [])
        earlier = seen[:-1] if seen and seen[-1] == topic_id else seen
        return bool(earlier) and topic_id not in earlier


def delta_events(delta: MetadataDelta) -> list[dict[str, Any]]:
    """A step's elections and unclean recoveries, in log order (a recovery's audit record
    comes just before the election it made)."""
    recoveries = {(r.topic, r.partition): r for r in delta.unclean_recoveries}
    events: list[dict[str, Any]] = []
    for e in delta.elections:
        r = recoveries.pop(e.tp, None) if e.kind in _RECOVERY_KINDS else None
        if r is not None:
            events.append(
                {
                    "type": "unclean_recovery",
                    "partition": f"{r.topic}-{r.partition}",
                    "strategy": r.strategy,
                    "chosen": r.chosen,
                    "candidates": [
                        {
                            "broker": c.broker_id,
                            "last_leader_epoch": c.last_leader_epoch,
                            "log_end_offset": c.log_end_offset,
                        }
                        for c in r.candidates
                    ],
                    "potential_data_loss": r.potential_data_loss,
                }
            )
        events.append(
            {
                "type": "election",
                "partition": f"{e.tp[0]}-{e.tp[1]}",
                "leader": e.leader,
                "kind": e.kind.value,
            }
        )
    return events


_RECOVERY_KINDS = frozenset((ElectionKind.UNCLEAN_RECOVERY, ElectionKind.MANUAL))


def check_expectation(
    exp: ExpectStep,
    parts: dict[str, PartitionReport],
    brokers: dict[str, BrokerReport],
    *,
    topics: dict[str, TopicReport] | None = None,
    cluster: ClusterReport | None = None,
    topic_ids: TopicIds | None = None,
) -> list[str]:
    """Differences between an expectation and the state; empty when it holds."""
    diffs: list[str] = []

    def cmp(field: str, want: Any, got: Any, as_set: bool = False) -> None:
        if as_set and want is not None and got is not None:
            ok = set(want) == set(got)
        else:
            ok = want == got
        if not ok:
            diffs.append(f"{field}: expected {want!r}, got {got!r}")

    subject = exp.subject
    if subject == "partition":
        assert exp.partition is not None
        p = parts.get(exp.partition)
        if p is None:
            return [f"partition {exp.partition} does not exist"]
        if exp.leader is not msgspec.UNSET:
            cmp("leader", exp.leader, p.leader)
        for field in ("leader_epoch", "partition_epoch", "recovering", "min_isr"):
            want = getattr(exp, field)
            if want is not None:
                cmp(field, want, getattr(p, field))
        for field in ("isr", "elr", "last_known_elr", "adding", "removing"):
            want = getattr(exp, field)
            if want is not None:
                cmp(field, sorted(want), getattr(p, field), as_set=True)
        if exp.replicas is not None:
            cmp("replicas", exp.replicas, p.replicas)
        if exp.recovery_pending is not None:
            if isinstance(exp.recovery_pending, bool):
                cmp("recovery_pending", exp.recovery_pending, p.recovery_pending is not None)
            else:
                cmp("recovery_pending", sorted(exp.recovery_pending), p.recovery_pending, True)
    elif subject == "broker":
        b = brokers.get(str(exp.broker))
        if exp.registered is not None:
            cmp("registered", exp.registered, b is not None)
            if b is None:
                return diffs
        if b is None:
            return [f"broker {exp.broker} is not registered"]
        for field in ("epoch", "fenced", "controlled_shutdown"):
            want = getattr(exp, field)
            if want is not None:
                cmp(field, want, getattr(b, field))
    elif subject == "topic":
        assert exp.topic is not None
        t = (topics or {}).get(exp.topic)
        if exp.exists is not None:
            cmp("exists", exp.exists, t is not None)
            if t is None:
                return diffs
        if t is None:
            return [f"topic {exp.topic} does not exist"]
        if exp.partitions is not None:
            cmp("partitions", exp.partitions, t.partitions)
        if exp.min_insync_replicas is not msgspec.UNSET:
            cmp("min_insync_replicas", exp.min_insync_replicas, t.min_insync_replicas)
        if exp.topic_id_changed is not None:
            changed = topic_ids is not None and topic_ids.changed(exp.topic, t.topic_id)
            cmp("topic_id_changed", exp.topic_id_changed, changed)
    elif cluster is None:
        return ["the cluster-wide state was not reported"]
    elif subject == "feature":
        assert exp.feature is not None
        cmp(f"{exp.feature} level", exp.level, cluster.features.get(exp.feature, 0))
    elif exp.min_insync_replicas is not msgspec.UNSET:
        cmp("min_insync_replicas", exp.min_insync_replicas, cluster.min_insync_replicas)
    return diffs
