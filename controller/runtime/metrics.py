"""Prometheus metrics of the active controller: `ControllerMetrics`, one term's.

Owns the metric names, types and meanings of the controller's term (the contract with
`grafana/`: the dashboard, the alert rules and their tests; the role's own metrics and
the `/metrics` endpoint are `controller.runtime.metrics_server`). Scrapes run in the HTTP
server's threads, so collectors only read.

* Counters come from *committed* records only (`Controller.commit_listeners`), so nothing
  un-durable is ever counted: every UncleanRecoveryRecord is a potential data-loss event,
  every PartitionChangeRecord with an `election` is an election of that kind (and one
  with the reason `leader_balance` an election of the automatic leader balance), every
  unclean RegisterBrokerRecord an unclean registration. The one exception counts what was
  *not* committed: `metactl_log_append_failures_total`, the store's `append_failures`
  read at scrape time (a full disk: fences and everything else cannot commit).
* Gauges are read from the committed image at scrape time by a custom collector. The
  per-partition health counts (under MinISR, ELR, LastKnownELR, recovering) are kept in
  sets updated from committed partition records (`controller.runtime.partition_gauges`),
  so a scrape costs O(brokers), never O(partitions).
* The metadata lifecycle (issue 19): partitions being reassigned (the image's own index)
  and how long the oldest of them has been (`Reassignments`, kept from the committed
  deltas, so a scrape reads one number), reassignments started, completed and cancelled,
  topics deleted, brokers unregistered, ELR clears by scope (a topic's or the cluster
  default's min.insync.replicas, or an ELR feature downgrade), and each feature's
  effective level. A deleted topic's series go with it: its data-loss series are
  removed and its partitions leave the health sets (the delta no longer names them).
* Histograms: store-append latency (`Controller.append_listeners`) and, by event type,
  the event queue and processing times (`Controller.event_listeners`; Kafka's
  EventQueueTimeMs and EventQueueProcessingTimeMs). Every event type's series exist
  from 0 (`EVENT_NAMES`), so `rate()` sees the first events of each.
* A histogram only sees an event once it ends, so a stalled event loop shows nothing
  there while it is stalled. `metactl_event_processing_age_seconds` is read at scrape
  time, in the HTTP server's thread, from the start time the driver sets while it
  handles an event (`Controller.busy_since`): it grows while the loop is stuck.

Must not: decide anything, touch the log, block the event loop for work proportional to
the cluster on a scrape, register in prometheus_client's global registry (each service,
and each test, gets its own), or put a per-partition label on any metric.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.core.lifecycle import SUPPORTED_FEATURES
from controller.core.recovery.tracker import strategy_for
from controller.core.step import Event
from controller.runtime.driver import Controller
from controller.runtime.partition_gauges import PartitionHealth, Reassignments
from metactl import __version__
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_log.records import (
    BROKER_RESOURCE,
    ELR_FEATURE,
    RECORD_TYPES,
    TOPIC_RESOURCE,
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    PartitionChangeRecord,
)

PREFIX: Final = "metactl_"
ELECTION_KINDS: Final[tuple[str, ...]] = tuple(k.value for k in ElectionKind)
BROKER_STATES: Final = ("active", "fenced", "controlled_shutdown")
MANUAL_STRATEGY: Final = "manual"
# The `scope` label of metactl_elr_clears_total: what cleared the ELRs (KIP-966).
ELR_CLEAR_SCOPES: Final = ("topic", "cluster", "feature")
# The `outcome` label of metactl_reassignments_total.
REASSIGNMENT_OUTCOMES: Final = ("started", "completed", "cancelled")

# Store appends are one SQLite transaction with an fsync: sub-millisecond to seconds.
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# The controller should answer within ~250 ms but may stall for seconds (a large change,
# a GC pause): the store's buckets, and 30 s for a stall.
EVENT_BUCKETS: Final = (*LATENCY_BUCKETS, 30.0)

# The `event` label of the event histograms: the class names the driver reports (requests,
# Tick, and the continuations the controller submits to itself), all created at 0.
EVENT_NAMES: Final[tuple[str, ...]] = tuple(sorted(t.__name__ for t in get_args(Event)))


def broker_state(fenced: bool, in_controlled_shutdown: bool) -> str:
    """The `state` label of metactl_brokers: exactly one per registered broker."""
    if fenced:
        return "fenced"
    if in_controlled_shutdown:
        return "controlled_shutdown"
    return "active"


class ControllerMetrics:
    """Every metric of one controller, in a registry of its own.

    `attach` registers the listeners on the controller; `detach` removes them.
    """

    def __init__(self, ctl: Controller, registry: CollectorRegistry | None = None) -> None:
        self.ctl = ctl
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.potential_data_loss = Counter(
            "metactl_potential_data_loss_events",
            "Unclean recoveries committed (every one may have lost acknowledged data), "
            "manual elections included; one series per topic and strategy.",
            ["topic", "strategy"],
            registry=r,
        )
        self.elections = Counter(
            "metactl_elections",
            "Leader elections committed, by how the leader was chosen.",
            ["kind"],
            registry=r,
        )
        self.leader_balance_elections = Counter(
            "metactl_leader_balance_elections",
            "Preferred-leader elections the automatic leader balance committed "
            "(auto.leader.rebalance.enable; reason leader_balance), a subset of "
            'metactl_elections_total{kind="preferred"}.',
            registry=r,
        )
        self.unclean_registrations = Counter(
            "metactl_unclean_registrations",
            "Broker registrations judged unclean (no or a stale previous epoch).",
            registry=r,
        )
        self.committed_records = Counter(
            "metactl_committed_records",
            "Metadata records durably committed, by record type.",
            ["type"],
            registry=r,
        )
        self.events = Counter(
            "metactl_events",
            "Controller events handled, by event type.",
            ["event"],
            registry=r,
        )
        # Requests refused by controller/core/authz.py before anything was submitted. The
        # labels are bounded: principals are the CA's certificates, operations
        # authz.OPERATIONS.
        self.authorization_failures = Counter(
            "metactl_authorization_failures",
            "Requests refused by authorization (nothing submitted), by the certificate's "
            "principal and the operation asked for.",
            ["principal", "operation"],
            registry=r,
        )
        self.commit_latency = Histogram(
            "metactl_commit_latency_seconds",
            "Time of one durable store append (a group commit of one or more events).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.event_queue_time = Histogram(
            "metactl_event_queue_time_seconds",
            "Time an event waited in the controller queue before it was handled, by event type.",
            ["event"],
            buckets=EVENT_BUCKETS,
            registry=r,
        )
        self.event_processing_time = Histogram(
            "metactl_event_processing_time_seconds",
            "Time to decide and replay one event (excludes the durable commit), by event type.",
            ["event"],
            buckets=EVENT_BUCKETS,
            registry=r,
        )
        # The metadata lifecycle (issue 19).
        self.topics_deleted = Counter(
            "metactl_topics_deleted",
            "Topics deleted (RemoveTopicRecords committed).",
            registry=r,
        )
        self.brokers_unregistered = Counter(
            "metactl_brokers_unregistered",
            "Broker registrations removed (UnregisterBrokerRecords committed).",
            registry=r,
        )
        self.elr_clears = Counter(
            "metactl_elr_clears",
            "Operations that cleared ELRs and LastKnownELRs (KIP-966), by scope: a topic's "
            "min.insync.replicas (topic), the cluster default's (cluster, every topic), or "
            "an eligible.leader.replicas.version downgrade (feature, every topic).",
            ["scope"],
            registry=r,
        )
        self.reassignments = Counter(
            "metactl_reassignments",
            "Partition reassignments (KIP-455) by outcome: started, completed (the target "
            "is the assignment) or cancelled (the original replicas restored).",
            ["outcome"],
            registry=r,
        )
        for scope in ELR_CLEAR_SCOPES:
            self.elr_clears.labels(scope=scope)
        for outcome in REASSIGNMENT_OUTCOMES:
            self.reassignments.labels(outcome=outcome)
        for kind in ELECTION_KINDS:
            self.elections.labels(kind=kind)
        for event in EVENT_NAMES:
            self.event_queue_time.labels(event=event)
            self.event_processing_time.labels(event=event)
        # event type -> its (count, queue time, processing time) series (`on_event`)
        self._event_series: dict[str, tuple[Counter, Histogram, Histogram]] = {}
        for name in sorted(RECORD_TYPES):
            self.committed_records.labels(type=name)
        self.health = PartitionHealth()
        self.health.rebuild(ctl.committed_image)
        self.moving = Reassignments()
        self.moving.rebuild(ctl.committed_image, ctl.clock.now_ms())
        # topic -> the strategies of its data-loss series (removed when it is deleted)
        self._loss_series: dict[str, set[str]] = {}
        for topic in ctl.committed_image.topics:
            self._init_data_loss_series(ctl.committed_image, topic)
        self._collector = _StateCollector(self)
        r.register(self._collector)

    @classmethod
    def attach(
        cls, ctl: Controller, registry: CollectorRegistry | None = None
    ) -> ControllerMetrics:
        m = cls(ctl, registry)
        ctl.commit_listeners.append(m.on_commit)
        ctl.event_listeners.append(m.on_event)
        ctl.append_listeners.append(m.on_append)
        return m

    def detach(self) -> None:
        with contextlib.suppress(ValueError):
            self.ctl.commit_listeners.remove(self.on_commit)
        with contextlib.suppress(ValueError):
            self.ctl.event_listeners.remove(self.on_event)
        with contextlib.suppress(ValueError):
            self.ctl.append_listeners.remove(self.on_append)
        with contextlib.suppress(KeyError):
            self.registry.unregister(self._collector)

    # --- listeners (called on the event loop by the driver) ------------------------------

    def on_commit(
        self,
        base_offset: int,
        records: Sequence[MetadataRecord],
        delta: MetadataDelta,
        now_ms: int,
    ) -> None:
        """Count what one event committed, from its delta. `committed_image` already
        includes it (and any later event of the same group commit, which re-reads the same
        partitions)."""
        image = self.ctl.committed_image
        health = self.health
        partitions = image.partitions
        # A deleted topic first (the delta no longer names its partitions): a topic deleted
        # and created again in one delta has its new partitions in `delta.partitions`.
        for topic, (_, count) in delta.removed_topics.items():
            health.drop_topic(topic, count)
            self.moving.drop_topic(topic)
            self._remove_topic_series(topic)
        moving = self.moving
        outcomes: dict[str, int] = {}
        for tp in delta.partitions:
            p = partitions.get(tp)
            health.update(tp, p)
            outcome = moving.update(tp, p, now_ms)
            if outcome is not None:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        for outcome, n in outcomes.items():
            self.reassignments.labels(outcome=outcome).inc(n)
        for recovery in delta.unclean_recoveries:
            if recovery.potential_data_loss:
                self._loss_series.setdefault(recovery.topic, set()).add(recovery.strategy)
                self.potential_data_loss.labels(
                    topic=recovery.topic, strategy=recovery.strategy
                ).inc()
        if delta.unclean_registrations:
            self.unclean_registrations.inc(len(delta.unclean_registrations))
        for topic in delta.topics:
            self._init_data_loss_series(image, topic)
        for tag, n in delta.records_by_type.items():
            self.committed_records.labels(type=tag).inc(n)
        elections: dict[str, int] = {}
        for e in delta.elections:
            elections[e.kind.value] = elections.get(e.kind.value, 0) + 1
        for election, n in elections.items():
            self.elections.labels(kind=election).inc(n)
        if ElectionKind.PREFERRED.value in elections:  # an operator's or the balance's
            balanced = sum(
                1
                for r in records
                if isinstance(r, PartitionChangeRecord) and r.reason is ChangeReason.LEADER_BALANCE
            )
            if balanced:
                self.leader_balance_elections.inc(balanced)
        by_type = delta.records_by_type
        if "RemoveTopic" in by_type:
            self.topics_deleted.inc(by_type["RemoveTopic"])
        if "UnregisterBroker" in by_type:
            self.brokers_unregistered.inc(by_type["UnregisterBroker"])
        if "ClearElr" in by_type:
            scope = elr_clear_scope(delta)
            if scope is not None:
                self.elr_clears.labels(scope=scope).inc()

    def _remove_topic_series(self, topic: str) -> None:
        for strategy in sorted(self._loss_series.pop(topic, ())):
            with contextlib.suppress(KeyError):
                self.potential_data_loss.remove(topic, strategy)

    def on_event(self, event: str, queue_seconds: float, processing_seconds: float) -> None:
        # Every event (each heartbeat) passes here: the event type's three series are
        # looked up once (`labels` takes a lock and builds a key each call), not per event.
        series = self._event_series.get(event)
        if series is None:
            series = self._event_series[event] = (
                self.events.labels(event=event),
                self.event_queue_time.labels(event=event),
                self.event_processing_time.labels(event=event),
            )
        count, queued, processing = series
        count.inc()
        queued.observe(max(0.0, queue_seconds))
        processing.observe(max(0.0, processing_seconds))

    def on_append(self, seconds: float, record_count: int) -> None:
        self.commit_latency.observe(seconds)

    def _init_data_loss_series(self, image: ClusterImage, topic: str) -> None:
        """Create the topic's data-loss series at 0 (its strategy, and `manual`).

        `increase()` needs a sample *before* the first event: a series that first appears
        at 1 shows no increase, and `MetactlPotentialDataLoss` would miss the first data
        loss of every topic. Two series per topic; topics are never per-partition.
        """
        if topic not in image.topics:
            return  # deleted again before this commit was told: nothing to show
        strategies = {strategy_for(image, topic, self.ctl.config), MANUAL_STRATEGY}
        self._loss_series.setdefault(topic, set()).update(strategies)
        for strategy in sorted(strategies):
            self.potential_data_loss.labels(topic=topic, strategy=strategy)


def elr_clear_scope(delta: MetadataDelta) -> str | None:
    """What an event that wrote ClearElrRecords cleared for: its config change's scope,
    or a feature downgrade. None for an event that only continues a clearing (its next
    slice of topics): the operation is counted once, by the event that started it."""
    if "Config" in delta.records_by_type:
        for resource_type, _, _ in sorted(delta.configs):
            if resource_type == TOPIC_RESOURCE:
                return "topic"
            if resource_type == BROKER_RESOURCE:
                return "cluster"
    if "FeatureLevel" in delta.records_by_type and ELR_FEATURE in delta.features:
        return "feature"
    return None


def build_info(*, with_samples: bool) -> GaugeMetricFamily:
    """`metactl_build_info`: always 1, labelled with the version (active or standby)."""
    build = GaugeMetricFamily(
        PREFIX + "build_info", "Always 1; the version label names the build.", labels=["version"]
    )
    if with_samples:
        build.add_metric([__version__], 1)
    return build


class _StateCollector(Collector):
    """Gauges read at scrape time from the committed image (and the recovery tracker)."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return list(self._families(with_samples=False))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(with_samples=True))

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        m = self.metrics
        ctl = m.ctl
        image = ctl.committed_image
        health = m.health.counts()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc)
            if with_samples:
                g.add_metric([], value)
            return g

        yield build_info(with_samples=with_samples)
        brokers = GaugeMetricFamily(
            PREFIX + "brokers",
            "Registered brokers by state (active, fenced, controlled_shutdown).",
            labels=["state"],
        )
        if with_samples:
            by_state = dict.fromkeys(BROKER_STATES, 0)
            for b in image.brokers.values():
                by_state[broker_state(b.fenced, b.in_controlled_shutdown)] += 1
            for state in BROKER_STATES:
                brokers.add_metric([state], by_state[state])
        yield brokers
        yield gauge("topics", "Topics in the committed image.", len(image.topics))
        yield gauge("partitions", "Partitions in the committed image.", len(image.partitions))
        yield gauge("offline_partitions", "Partitions with no leader.", len(image.offline))
        yield gauge(
            "under_min_isr_partitions",
            "Partitions whose ISR is smaller than their (effective) min.insync.replicas.",
            health["under_min_isr"],
        )
        yield gauge(
            "partitions_with_elr",
            "Partitions with a non-empty ELR: running on their last complete copies.",
            health["with_elr"],
        )
        yield gauge(
            "partitions_with_last_known_elr",
            "Partitions with a non-empty LastKnownELR (ELR members that registered uncleanly).",
            health["last_known_elr"],
        )
        yield gauge(
            "recovering_partitions",
            "Partitions whose leader was chosen by unclean recovery and is still recovering.",
            health["recovering"],
        )
        yield gauge(
            "partitions_reassigning",
            "Partitions with a reassignment in progress (KIP-455: adding or removing replicas).",
            len(image.reassigning),
        )
        yield gauge(
            "oldest_reassignment_age_seconds",
            "Seconds since the oldest reassignment still in progress started (0: none); "
            "one that was in progress when this controller took over counts from then.",
            m.moving.age_seconds(ctl.clock.now_ms()),
        )
        features = GaugeMetricFamily(
            PREFIX + "feature_level",
            "Effective level of each feature (kafka-features): the finalized level, else "
            "what the controller's start flags seed (eligible.leader.replicas.version 1: "
            "KIP-966 ELR tracking on, 0: classic).",
            labels=["feature"],
        )
        if with_samples:
            for name in sorted(SUPPORTED_FEATURES):
                level = image.features.get(name)
                if level is None and name == ELR_FEATURE:
                    level = 1 if ctl.config.eligible_leader_replicas else 0
                features.add_metric([name], level if level is not None else 0)
        yield features
        yield gauge(
            "unclean_recoveries_pending",
            "Leaderless partitions whose unclean recovery waits for log inspections.",
            len(ctl.tracker.pending),
        )
        yield gauge(
            "log_end_offset",
            "Offset of the next record (includes records decided but not yet committed).",
            ctl.image.end_offset,
        )
        yield gauge(
            "last_committed_offset",
            "Offset of the newest durably committed record (-1: empty log).",
            ctl.store.end_offset - 1,
        )
        # Read from the store at scrape time: it counts every append whose commit failed.
        failures = CounterMetricFamily(
            PREFIX + "log_append_failures",
            "Metadata log appends that failed (disk full, I/O error, or writes stopped after "
            "a fatal error): nothing in them was committed or acknowledged.",
        )
        if with_samples:
            failures.add_metric([], ctl.store.append_failures)
        yield failures
        yield gauge(
            "event_processing_age_seconds",
            "Seconds the controller has spent on the event it is handling now (0 while it "
            "waits for events): grows during a stall, which the histograms see only once "
            "the event ends.",
            event_processing_age(ctl),
        )


def event_processing_age(ctl: Controller) -> float:
    """How long the event being handled has run: now minus `Controller.busy_since` (the
    `time.perf_counter()` at which the event task started it; None between events). Read
    in a scrape thread while the event loop may be stuck: one attribute read, no lock."""
    since = ctl.busy_since
    if since is None:
        return 0.0
    return max(0.0, time.perf_counter() - since)
