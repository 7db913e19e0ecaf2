"""An optional Prometheus endpoint (`--metrics HOST:PORT`) showing the broker's state.

Served by prometheus_client's own HTTP server (`protocol.metrics_http`): over mutual TLS
with the broker's identity when it has one (a scraper needs a certificate of the cluster
CA), plain HTTP with `--insecure`. A collector reads the live state at scrape time (from
the exporter's threads: it only copies, never mutates) through `BrokerState`, the part
of the broker process it shows. Owns the metric names; decides nothing, and must not
reach into the broker beyond `BrokerState`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from brokers_stub.config import BrokerConfig
from brokers_stub.replica_log import ReplicaLog
from metadata_image.state import TopicPartition
from protocol.metrics_http import start_metrics_endpoint


class MetadataProgress(Protocol):
    """How far the broker has applied the metadata log (`metadata.MetadataFollower`)."""

    @property
    def applied_offset(self) -> int: ...

    def lag(self) -> tuple[int, float]: ...


class HostedReplicas(Protocol):
    """The replicas the broker hosts and those it leads (`ReplicaManager`)."""

    @property
    def logs(self) -> Mapping[TopicPartition, ReplicaLog]: ...

    @property
    def leaders(self) -> Mapping[TopicPartition, object]: ...


class BrokerState(Protocol):
    """What /metrics shows of a broker process (`broker.Broker`)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def is_fenced(self) -> bool: ...

    @property
    def metadata(self) -> MetadataProgress: ...

    @property
    def replicas(self) -> HostedReplicas: ...

    @property
    def authorization_failures(self) -> Mapping[tuple[str, str], int]: ...


class BrokerCollector(Collector):
    def __init__(self, broker: BrokerState) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        labels = [str(b.config.broker_id)]
        epoch = GaugeMetricFamily("metactl_broker_epoch", "Current broker epoch", labels=["broker"])
        epoch.add_metric(labels, -1 if b.epoch is None else b.epoch)
        yield epoch
        fenced = GaugeMetricFamily(
            "metactl_broker_fenced", "1 if the controller fences this broker", labels=["broker"]
        )
        fenced.add_metric(labels, 1 if b.is_fenced else 0)
        yield fenced
        md = GaugeMetricFamily(
            "metactl_broker_metadata_offset",
            "Offset of the next metadata record the broker needs",
            labels=["broker"],
        )
        md.add_metric(labels, b.metadata.applied_offset)
        yield md
        lag_records, lag_seconds = b.metadata.lag()
        lag_r = GaugeMetricFamily(
            "metactl_broker_metadata_lag_records",
            "Committed metadata records the broker has not applied yet",
            labels=["broker"],
        )
        lag_r.add_metric(labels, lag_records)
        yield lag_r
        lag_s = GaugeMetricFamily(
            "metactl_broker_metadata_lag_seconds",
            "How long the broker has been behind the committed metadata log (0: caught up)",
            labels=["broker"],
        )
        lag_s.add_metric(labels, lag_seconds)
        yield lag_s
        refused = CounterMetricFamily(
            "metactl_authorization_failures",
            "Requests this broker refused by authorization, by principal and operation",
            labels=["principal", "operation"],
        )
        for (principal, operation), n in list(b.authorization_failures.items()):
            refused.add_metric([principal, operation], n)
        yield refused
        names = ["broker", "topic", "partition"]
        leo = GaugeMetricFamily("metactl_broker_replica_log_end_offset", "LEO", labels=names)
        hw = GaugeMetricFamily("metactl_broker_replica_high_watermark", "HW", labels=names)
        flushed = GaugeMetricFamily(
            "metactl_broker_replica_flushed_offset", "Offset fsynced", labels=names
        )
        le = GaugeMetricFamily(
            "metactl_broker_replica_leader_epoch", "Newest leader epoch known", labels=names
        )
        leader = GaugeMetricFamily(
            "metactl_broker_replica_is_leader", "1 if this broker leads it", labels=names
        )
        leaders = set(b.replicas.leaders)
        for tp, log in list(b.replicas.logs.items()):
            lv = [*labels, tp[0], str(tp[1])]
            leo.add_metric(lv, log.log_end_offset)
            hw.add_metric(lv, log.high_watermark)
            flushed.add_metric(lv, log.flushed_offset)
            le.add_metric(lv, log.last_leader_epoch)
            leader.add_metric(lv, 1 if tp in leaders else 0)
        yield from (leo, hw, flushed, le, leader)


def start_metrics(broker: BrokerState, address: str) -> tuple[Callable[[], None], str]:
    """Serve /metrics on `address` (mutual TLS with the broker's identity, if any); return
    the function that stops it, and the real HOST:PORT (port 0 picks one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    endpoint = start_metrics_endpoint(registry, address, broker.config.tls)
    return endpoint.stop, endpoint.address
