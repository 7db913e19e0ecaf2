"""What a controller service serves on `/metrics`, and the endpoint that serves it.

`RoleMetrics` is the service's registry: whether this controller is the active one, how
often it took over and how often it ended a dead active controller's term, and, while
active, every metric of the term's `controller.runtime.metrics.ControllerMetrics`
(a standby's scrape shows no cluster gauges). `MetricsServer` is `/metrics` on
prometheus_client's own HTTP server (`protocol.metrics_http`), mutual TLS when the
controller has an identity; scrapes run in its threads, so collectors only read.

Must not: decide anything, touch the log, or register in prometheus_client's global
registry (each service, and each test, gets its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from controller.runtime.metrics import ControllerMetrics, build_info
from protocol.metrics_http import MetricsEndpoint, start_metrics_endpoint
from protocol.tls import TlsIdentity

__all__ = ["MetricsServer", "RoleMetrics"]

log = structlog.get_logger("metactl.controller.metrics")


class RoleMetrics:
    """What a controller service serves on `/metrics`: whether it is the active controller
    (`metactl_controller_active`), how often it took over (`..._failovers_total`), how
    often it ended a dead active controller's term (`..._dead_active_revocations_total`)
    and, while active, every metric of `ControllerMetrics` (a fresh set per term: counters
    count what this term committed, and a scrape of a standby shows no cluster gauges, so
    sums over controllers count each partition once, as Kafka's controller gauges do)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active_gauge = Gauge(
            "metactl_controller_active",
            "1 while this controller is the active one (it writes the metadata log), else 0.",
            registry=self.registry,
        )
        self.failovers = Counter(
            "metactl_controller_failovers",
            "Times this controller took over as the active controller after winning the "
            "metadata log's leadership (etcd logs only; a SQLite log has one controller).",
            registry=self.registry,
        )
        self.dead_active_revocations = Counter(
            "metactl_controller_dead_active_revocations",
            "Terms of a dead active controller (its listener refused connections) that "
            "this controller ended as a standby (deleting the leadership key), so as to "
            "take over without waiting out the TTL (etcd logs, --dead-active-detection).",
            registry=self.registry,
        )
        self.current: ControllerMetrics | None = None
        self.registry.register(_ActiveDelegate(self))

    def active(self, metrics: ControllerMetrics) -> None:
        self.current = metrics
        self.active_gauge.set(1)

    def inactive(self) -> None:
        self.current = None
        self.active_gauge.set(0)


class _ActiveDelegate(Collector):
    def __init__(self, role: RoleMetrics) -> None:
        self.role = role

    def describe(self) -> Iterable[Metric]:
        return []  # what it yields changes with the role

    def collect(self) -> Iterable[Metric]:
        current = self.role.current
        if current is not None:
            return list(current.registry.collect())
        return [build_info(with_samples=True)]


class MetricsServer:
    """`/metrics` on HOST:PORT through prometheus_client's own HTTP server
    (`protocol.metrics_http`), in threads of its own; mutual TLS with the controller's
    identity when it has one (a scraper needs a certificate of the cluster CA), plain HTTP
    without. Scrapes run in those threads: the collectors only read (the committed
    image is immutable; set sizes and counters are read whole)."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.address = endpoint.address

    @classmethod
    async def start(
        cls, registry: CollectorRegistry, listen: str, tls: TlsIdentity | None = None
    ) -> MetricsServer:
        """Listen on HOST:PORT (port 0: any free port; `address` tells which)."""
        endpoint = start_metrics_endpoint(registry, listen, tls)
        log.info("metrics serving", listen=endpoint.address, tls=endpoint.tls)
        return cls(endpoint)

    async def close(self) -> None:
        await asyncio.to_thread(self.endpoint.stop)
