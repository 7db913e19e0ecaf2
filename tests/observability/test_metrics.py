"""Controller metrics read through a per-test registry, on a real SQLite log with virtual
time: an unclean recovery is a potential data-loss event with the right labels, elections
are counted by kind, gauges follow the committed image, and the incremental partition
counts always equal a full walk of the image (in every shipped scenario too). The event
histograms are by event type, with every type's series there from 0, and a scrape from
another thread sees how long the event loop has been on an event while it is stuck in it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.request
from collections import Counter
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from controller.runtime.metrics import ELECTION_KINDS, EVENT_BUCKETS, EVENT_NAMES, ControllerMetrics
from controller.runtime.partition_gauges import PartitionHealth
from metactl.errors import MetactlError
from metadata_log.records import (
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.broker_controller import BrokerHeartbeatRequest
from protocol.messages.unions import ControllerRequest
from protocol.metrics_http import start_metrics_endpoint
from simulation.scenario import ScenarioRun
from simulation.scenario_format import load_scenario
from tests.observability.kit import REPO, Cluster

PDL = "metactl_potential_data_loss_events_total"
QUEUE = "metactl_event_queue_time_seconds"
PROCESSING = "metactl_event_processing_time_seconds"
AGE = "metactl_event_processing_age_seconds"


def gauges(c: Cluster) -> dict[str, float | None]:
    names = [
        "metactl_offline_partitions",
        "metactl_under_min_isr_partitions",
        "metactl_partitions_with_elr",
        "metactl_partitions_with_last_known_elr",
        "metactl_recovering_partitions",
        "metactl_unclean_recoveries_pending",
    ]
    return {n.removeprefix("metactl_"): c.value(n) for n in names}


def brokers(c: Cluster) -> dict[str, float | None]:
    return {
        s: c.value("metactl_brokers", state=s) for s in ("active", "fenced", "controlled_shutdown")
    }


def elections(c: Cluster) -> dict[str, float | None]:
    return {k: c.value("metactl_elections_total", kind=k) for k in ELECTION_KINDS}


def assert_counters_match_log(c: Cluster) -> None:
    """Every counter equals what the committed records say (the log is the oracle)."""
    kinds = Counter(
        r.election.value
        for r in c.committed
        if isinstance(r, PartitionChangeRecord) and r.election is not None
    )
    assert elections(c) == {k: float(kinds[k]) for k in ELECTION_KINDS}
    losses = Counter(
        (r.topic, r.strategy)
        for r in c.committed
        if isinstance(r, UncleanRecoveryRecord) and r.potential_data_loss
    )
    for (topic, strategy), n in losses.items():
        assert c.value(PDL, topic=topic, strategy=strategy) == n
    unclean = sum(1 for r in c.committed if isinstance(r, RegisterBrokerRecord) and not r.clean)
    assert c.value("metactl_unclean_registrations_total") == unclean


def by_event(c: Cluster, sample: str) -> dict[str, float]:
    """The value of `sample` for every event type that has the series."""
    return {
        s.labels["event"]: s.value
        for m in c.registry.collect()
        for s in m.samples
        if s.name == sample
    }


class Reported:
    """What the driver reports to `event_listeners` from now on, to check the event
    metrics against (the driver may add Ticks of its own: they count too)."""

    SAMPLES = ("metactl_events_total", QUEUE + "_count", PROCESSING + "_count")

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.seen: list[str] = []
        self.before = {name: by_event(c, name) for name in self.SAMPLES}
        c.ctl.event_listeners.append(lambda event, queued, processed: self.seen.append(event))

    @property
    def events(self) -> Counter[str]:
        return Counter(self.seen)

    def assert_counted(self) -> None:
        """Each event metric grew by exactly the events reported, type by type."""
        for name in self.SAMPLES:
            after, before = by_event(self.c, name), self.before[name]
            grown = {e: n - before.get(e, 0.0) for e, n in after.items()}
            assert {e: n for e, n in grown.items() if n} == self.events, name


def assert_health_matches_scan(metrics: ControllerMetrics) -> None:
    assert metrics.health.counts() == PartitionHealth.scan(metrics.ctl.committed_image)


@pytest.fixture
async def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = await Cluster.open(tmp_path)
    yield c
    await c.close()


async def test_balanced_unclean_recovery_is_one_potential_data_loss_event(
    cluster: Cluster,
) -> None:
    c = cluster
    # Worked example 5.3.3: RF 3, MinISR 2, a power outage, balanced recovery.
    await c.start_brokers(1, 2, 3)
    await c.create_topic("orders", [[1, 2, 3]], min_isr=2)
    c.logs.update({(1, "orders", 0): (0, 15), (2, "orders", 0): (0, 12), (3, "orders", 0): (0, 10)})
    # The series exists at 0 before any event, so increase() sees the first one.
    assert c.value(PDL, topic="orders", strategy="balanced") == 0
    assert c.value(PDL, topic="orders", strategy="manual") == 0
    assert elections(c) == dict.fromkeys(ELECTION_KINDS, 0.0)
    assert brokers(c) == {"active": 3, "fenced": 0, "controlled_shutdown": 0}
    assert c.value("metactl_build_info", version="0.1.0") == 1
    assert c.value("metactl_topics") == 1 and c.value("metactl_partitions") == 1

    for b in (1, 2, 3):
        await c.fence(b)
    assert gauges(c) == {
        "offline_partitions": 1,
        "under_min_isr_partitions": 1,
        "partitions_with_elr": 1,
        "partitions_with_last_known_elr": 0,
        "recovering_partitions": 0,
        "unclean_recoveries_pending": 0,
    }
    assert brokers(c) == {"active": 0, "fenced": 3, "controlled_shutdown": 0}
    assert elections(c)["isr"] == 2  # leader 1 -> 2 -> 3, then none

    for b in (1, 2, 3):
        await c.register(b, clean=False)
    assert c.value("metactl_unclean_registrations_total") == 3
    assert gauges(c) == {
        "offline_partitions": 1,
        "under_min_isr_partitions": 1,
        "partitions_with_elr": 0,
        "partitions_with_last_known_elr": 1,
        "recovering_partitions": 0,
        "unclean_recoveries_pending": 1,  # waiting for the LastKnownELR's logs
    }
    assert c.value(PDL, topic="orders", strategy="balanced") == 0

    with capture_logs() as logs:
        for b in (1, 2, 3):
            await c.unfence(b)
    assert c.value(PDL, topic="orders", strategy="balanced") == 1
    assert c.value(PDL, topic="orders", strategy="manual") == 0
    assert elections(c) == {"isr": 2, "elr": 0, "unclean_recovery": 1, "preferred": 0, "manual": 0}
    assert gauges(c) == {
        "offline_partitions": 0,
        "under_min_isr_partitions": 1,  # ISR [2] until the followers catch up
        "partitions_with_elr": 0,
        "partitions_with_last_known_elr": 0,
        "recovering_partitions": 1,
        "unclean_recoveries_pending": 0,
    }
    assert brokers(c) == {"active": 3, "fenced": 0, "controlled_shutdown": 0}
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert any(
        "potential data loss" in e["event"] and e["topic"] == "orders" and e["chosen"] == 2
        for e in warnings
    )
    assert c.value("metactl_last_committed_offset") == c.store.end_offset - 1
    assert c.value("metactl_log_end_offset") == c.ctl.image.end_offset
    assert_counters_match_log(c)
    assert_health_matches_scan(c.metrics)


async def test_manual_election_and_elr_election_are_counted(cluster: Cluster) -> None:
    c = cluster
    await c.start_brokers(1, 2)
    await c.create_topic("payments", [[1, 2]], min_isr=2, strategy="manual")
    assert c.value(PDL, topic="payments", strategy="manual") == 0
    # The leader's fence leaves ISR [2] below MinISR: 1 joins the ELR; then 2 is fenced.
    await c.fence(1)
    await c.fence(2)
    assert gauges(c)["partitions_with_elr"] == 1 and gauges(c)["offline_partitions"] == 1
    # A clean return of an ELR member: it is elected from the ELR (no data loss).
    await c.unfence(1)
    assert c.value("metactl_elections_total", kind="elr") == 1
    assert gauges(c)["offline_partitions"] == 0
    # Now lose both again, with unclean registrations: the manual strategy never acts...
    await c.fence(1)
    await c.register(1, clean=False)
    await c.register(2, clean=False)
    await c.unfence(1)
    await c.unfence(2)
    assert gauges(c)["offline_partitions"] == 1
    assert gauges(c)["unclean_recoveries_pending"] == 0
    # ...until an operator elects a replica: a potential data-loss event, strategy manual.
    await c.elect_unclean("payments", 0, replica=2)
    assert c.value(PDL, topic="payments", strategy="manual") == 1
    assert c.value("metactl_elections_total", kind="manual") == 1
    assert gauges(c)["offline_partitions"] == 0 and gauges(c)["recovering_partitions"] == 1
    assert_counters_match_log(c)
    assert_health_matches_scan(c.metrics)


async def test_latency_histograms_and_event_counts(cluster: Cluster) -> None:
    c = cluster
    reported = Reported(c)
    await c.start_brokers(1, 2, 3)
    await c.ctl.drain()  # a Tick: an event without records
    assert reported.events["RegisterBroker"] == 3 and reported.events["UnfenceBroker"] == 3
    assert reported.events["Tick"] >= 1
    reported.assert_counted()
    for histogram in (QUEUE, PROCESSING):
        for event in reported.events:
            count = c.value(histogram + "_count", event=event)
            assert c.value(histogram + "_bucket", event=event, le="+Inf") == count
            assert c.value(histogram + "_bucket", event=event, le="30.0") is not None
    assert (c.value(PROCESSING + "_sum", event="RegisterBroker") or 0) > 0
    commits = c.value("metactl_commit_latency_seconds_count")
    assert commits is not None and 1 <= commits <= 6  # group commit may merge appends
    assert (c.value("metactl_commit_latency_seconds_sum") or 0) > 0
    inf = c.value("metactl_commit_latency_seconds_bucket", le="+Inf")
    assert inf == commits


async def test_every_event_type_has_its_histogram_series_from_0(cluster: Cluster) -> None:
    """rate() and histogram_quantile() need a sample before an event type's first event:
    a series that appeared with it would hide that event (the first slow CreateTopic of a
    controller's life, say)."""
    c = cluster
    requests = {t.__name__ for t in get_args(ControllerRequest)}
    assert requests | {"Tick", "CreateTopicSlice"} <= set(EVENT_NAMES)
    assert EVENT_BUCKETS[-1] == 30.0 and 0.25 in EVENT_BUCKETS and 1.0 in EVENT_BUCKETS
    for histogram in (QUEUE, PROCESSING):
        assert set(by_event(c, histogram + "_count")) == set(EVENT_NAMES)
        assert c.value(histogram + "_count", event="FenceBroker") == 0
        assert c.value(histogram + "_bucket", event="FenceBroker", le="1.0") == 0
    await c.start_brokers(1)
    await c.fence(1)
    assert c.value(QUEUE + "_count", event="FenceBroker") == 1
    assert c.value(PROCESSING + "_bucket", event="FenceBroker", le="+Inf") == 1


async def test_every_event_the_driver_reports_was_created_at_0(cluster: Cluster) -> None:
    """Whatever the driver reports, continuations of work larger than one event included,
    is one of `EVENT_NAMES`; each histogram counts exactly the events reported."""
    c = cluster
    reported = Reported(c)
    await c.start_brokers(1, 2, 3)
    await c.submit(
        BrokerHeartbeatRequest(
            broker_id=1, broker_epoch=c.epoch(1), metadata_offset=c.ctl.image.end_offset
        )
    )
    # Larger than one event's work (1,000 partitions): the rest comes as continuations.
    await c.create_topic("big", [[1, 2, 3]] * 1_001, min_isr=2)
    await c.fence(1)
    await c.ctl.drain()
    requests = {t.__name__ for t in get_args(ControllerRequest)}
    kinds = set(reported.events)
    assert kinds - requests - {"Tick"}, f"no continuation was reported: {kinds}"
    assert kinds <= set(EVENT_NAMES)
    reported.assert_counted()


def scrape_age(address: str) -> float:
    """metactl_event_processing_age_seconds as an HTTP scrape sees it."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == AGE:
                return float(s.value)
    raise AssertionError(f"{AGE} is not served")


async def test_a_scrape_sees_the_age_of_an_event_that_holds_the_loop(cluster: Cluster) -> None:
    """The histograms hear of an event once it ends; while one holds the event loop, the
    HTTP server's threads still serve, and the age they read grows."""
    c = cluster
    assert c.value(AGE) == 0  # between events
    endpoint = start_metrics_endpoint(c.registry, "127.0.0.1:0", None)
    scraped: list[float] = []

    def scrape_twice() -> None:
        scraped.append(scrape_age(endpoint.address))
        scraped.append(scrape_age(endpoint.address))

    def hold_the_loop(event: str, queued: float, processed: float) -> None:
        # Called on the event loop, inside the event: it stays blocked until another
        # thread has scraped twice (the join's bound only keeps a broken server from
        # hanging the test).
        if event == "FenceBroker":
            scraper = threading.Thread(target=scrape_twice)
            scraper.start()
            scraper.join(timeout=60)

    c.ctl.event_listeners.append(hold_the_loop)
    try:
        await c.start_brokers(1)
        await c.fence(1)
    finally:
        c.ctl.event_listeners.remove(hold_the_loop)
        await asyncio.to_thread(endpoint.stop)
    assert len(scraped) == 2, "the scrapes did not finish while the loop was held"
    assert 0 < scraped[0] <= scraped[1]
    assert c.value(AGE) == 0  # the event ended: nothing is running


async def test_metrics_of_a_reopened_log_start_from_its_image(tmp_path: Path) -> None:
    c = await Cluster.open(tmp_path)
    await c.start_brokers(1, 2, 3)
    await c.create_topic("a", [[1, 2, 3]], min_isr=2)
    await c.create_topic("b", [[1, 2, 3]], min_isr=2, strategy="proactive")
    await c.fence(1)
    await c.fence(2)
    await c.close()
    # A restarted controller: counters start at 0, gauges come from the loaded image, and
    # every topic's data-loss series exists (at 0) before its first event.
    c = await Cluster.open(tmp_path)
    try:
        assert c.value(PDL, topic="a", strategy="balanced") == 0
        assert c.value(PDL, topic="b", strategy="proactive") == 0
        assert c.value(PDL, topic="b", strategy="manual") == 0
        assert c.value("metactl_under_min_isr_partitions") == 2
        assert c.value("metactl_partitions_with_elr") == 2
        assert brokers(c) == {"active": 1, "fenced": 2, "controlled_shutdown": 0}
        assert c.value("metactl_elections_total", kind="isr") == 0
        assert c.value("metactl_last_committed_offset") == c.store.end_offset - 1
    finally:
        await c.close()


async def test_registry_is_per_controller_and_exposition_is_clean(cluster: Cluster) -> None:
    text = generate_latest(cluster.registry).decode()
    assert "_created" not in text
    assert "python_gc" not in text  # nothing from the global default registry
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0]
        assert name.startswith("metactl_"), line
        assert "partition=" not in line  # no per-partition labels
    # A second set of metrics on the same controller, in another registry, is independent.
    other = ControllerMetrics.attach(cluster.ctl, CollectorRegistry())
    try:
        await cluster.start_brokers(1)
        assert other.registry.get_sample_value("metactl_brokers", {"state": "active"}) == 1
    finally:
        other.detach()
    assert other.on_commit not in cluster.ctl.commit_listeners


SCENARIOS = sorted((REPO / "simulation" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_incremental_counts_match_the_image_in_every_scenario(
    path: Path, tmp_path: Path
) -> None:
    scenario = load_scenario(path)
    run = ScenarioRun(scenario, tmp_path)
    await run.open()
    metrics = ControllerMetrics.attach(run.controller, CollectorRegistry())
    try:
        await run.setup()
        for step in scenario.steps:
            if step.action in ("expect", "expect_error"):
                continue
            with contextlib.suppress(MetactlError):
                await run.do(step)
            if metrics.ctl is not run.controller:  # the scenario restarted the controller
                metrics = ControllerMetrics.attach(run.controller, CollectorRegistry())
            assert_health_matches_scan(metrics)
            pending = metrics.registry.get_sample_value("metactl_unclean_recoveries_pending")
            assert pending == len(run.controller.tracker.pending)
        losses = sum(
            v
            for (name, labels, v) in _samples(metrics.registry)
            if name == PDL and labels.get("topic")
        )
        assert losses <= run.potential_data_loss  # equal unless the controller restarted
    finally:
        await run.close()


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for m in registry.collect() for s in m.samples]
