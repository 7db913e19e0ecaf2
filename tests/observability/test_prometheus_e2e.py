"""End to end with a real Prometheus: Debian's `prometheus` scrapes a running controller
service every second and evaluates grafana/alerts.yml; a power outage followed by unclean
registrations drives a balanced unclean recovery through the wire protocol (the
controller asks the brokers' own TCP listeners for their logs), and the
MetactlPotentialDataLoss alert fires for the right topic and strategy. Every query of the
dashboard is then run against the same Prometheus, and the event histograms arrive by
event type. The real-process variant runs the whole cluster with mutual TLS, and
Prometheus scrapes it with the viewer's certificate."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from clients.controller import Security
from controller.core.config import ControllerConfig
from controller.runtime.metrics import EVENT_NAMES
from controller.runtime.service import ControllerService
from localcluster.certs import default_names, init_certs
from metadata_log.records import UncleanRecoveryRecord
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    PartitionState,
)
from protocol.tls import ADMIN, TlsIdentity
from tests.observability.kit import (
    GRAFANA,
    NO_PROMETHEUS,
    PROMETHEUS,
    LogInfoBroker,
    Proc,
    PrometheusServer,
    free_port,
    render_prometheus_config,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS),
]

TIMEOUT_S = 90.0
POLL_S = 0.25
T = TypeVar("T")


async def eventually(what: str, probe: Callable[[], T | None], timeout_s: float = TIMEOUT_S) -> T:
    """Poll `probe` (run in a thread: it may block on HTTP) until it returns a value."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await asyncio.to_thread(probe)
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(POLL_S)  # the polling interval


def instant_value(prom: PrometheusServer, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


def firing(prom: PrometheusServer, alertname: str) -> list[dict[str, Any]] | None:
    alerts = prom.api("alerts")["alerts"]
    mine = [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]
    return mine or None


def p99_events(prom: PrometheusServer) -> set[str]:
    """The event types with a p99 processing time over the last minute."""
    result = prom.query(
        "histogram_quantile(0.99, sum by (event, le) "
        "(rate(metactl_event_processing_time_seconds_bucket[1m])))"
    )
    return {r["metric"]["event"] for r in result if r["value"][1] != "NaN"}


def dashboard_queries() -> list[str]:
    doc = json.loads((GRAFANA / "metactl-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in doc["annotations"]["list"] if "expr" in a]
    return [
        e.replace("$job", ".*").replace("$__rate_interval", "5s").replace("$__range", "5m")
        for e in exprs
    ]


async def test_unclean_recovery_fires_the_potential_data_loss_alert(tmp_path: Path) -> None:
    config = ControllerConfig(
        unclean_recovery_strategy="balanced",
        broker_session_timeout_ms=1000,
        broker_heartbeat_interval_ms=100,
    )
    service = ControllerService(
        tmp_path / "controller", "127.0.0.1:0", config=config, metrics="127.0.0.1:0"
    )
    await service.start()
    brokers = [LogInfoBroker(b, service.address) for b in (1, 2, 3)]
    prom: PrometheusServer | None = None
    try:
        prom = await asyncio.to_thread(
            PrometheusServer.start,
            tmp_path / "prometheus",
            render_prometheus_config(service.metrics_address),
        )
        # Three brokers up, and a topic with RF 3 and MinISR 2 (worked example 5.3.3).
        for b in brokers:
            await b.start()
            await b.register(clean=True)
            b.start_heartbeats()
        ctl = service.controller
        await eventually(
            "3 active brokers",
            lambda: (
                True if sum(x.active for x in ctl.committed_image.brokers.values()) == 3 else None
            ),
        )
        conn = await RpcClient.open(*parse_address(service.address))
        try:
            r = await conn.request(
                CreateTopicsRequest(
                    topics=[CreateTopic(name="orders", assignments=[[1, 2, 3]], min_isr=2)]
                )
            )
        finally:
            await conn.close()
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
        for b, leo in zip(brokers, (15, 12, 10), strict=True):
            b.logs[("orders", 0)] = (0, leo)

        # Prometheus has scraped the topic's data-loss series at 0 and nothing fires.
        series = 'metactl_potential_data_loss_events_total{topic="orders", strategy="balanced"}'
        assert (
            await eventually("the data-loss series at 0", lambda: instant_value(prom, series)) == 0
        )
        assert await asyncio.to_thread(firing, prom, "MetactlPotentialDataLoss") is None

        # A power outage: every broker stops heartbeating and is fenced by session expiry.
        for b in brokers:
            await b.stop_heartbeats()
        await eventually(
            "all brokers fenced",
            lambda: True if all(x.fenced for x in ctl.committed_image.brokers.values()) else None,
        )
        assert ctl.committed_image.partitions[("orders", 0)].leader == -1
        # They come back without a clean-shutdown file: unclean registrations, then
        # heartbeats unfence them and the controller inspects the LastKnownELR's logs.
        for b in brokers:
            await b.register(clean=False)
        for b in brokers:
            b.start_heartbeats()
        await eventually(
            "the unclean recovery",
            lambda: True if ctl.committed_image.partitions[("orders", 0)].leader != -1 else None,
        )
        # Balanced chose the LastKnownELR member with the longest log.
        recoveries = [
            e.record
            for e in await service.store.read(0, 1000)  # type: ignore[union-attr]
            if isinstance(e.record, UncleanRecoveryRecord)
        ]
        assert len(recoveries) == 1
        rec = recoveries[0]
        best = max(rec.candidates, key=lambda c: (c.last_leader_epoch, c.log_end_offset))
        assert rec.chosen == best.broker_id == ctl.committed_image.partitions[("orders", 0)].leader
        assert sum(b.requests for b in brokers) >= 2  # answered over real TCP
        assert service.metrics is not None
        registry = service.metrics.registry
        labels = {"topic": "orders", "strategy": "balanced"}
        assert registry.get_sample_value("metactl_potential_data_loss_events_total", labels) == 1

        # The alert fires, for that topic and strategy.
        alerts = await eventually(
            "MetactlPotentialDataLoss firing", lambda: firing(prom, "MetactlPotentialDataLoss")
        )
        assert len(alerts) == 1
        alert = alerts[0]
        assert alert["labels"]["topic"] == "orders"
        assert alert["labels"]["strategy"] == "balanced"
        assert alert["labels"]["severity"] == "critical"
        assert alert["labels"]["job"] == "metactl-controller"
        assert "orders" in alert["annotations"]["summary"]
        assert "balanced" in alert["annotations"]["summary"]

        # Every dashboard query is valid PromQL for this Prometheus; the key ones agree.
        for expr in dashboard_queries():
            await asyncio.to_thread(prom.query, expr)
        # The event histograms are scraped by event type: the brokers' heartbeats have a
        # p99 of their own, and every type Prometheus sees is one created at 0.
        events = await eventually(
            "a p99 processing time for heartbeats",
            lambda: e if "BrokerHeartbeatRequest" in (e := p99_events(prom)) else None,
        )
        assert events <= set(EVENT_NAMES)
        age = await asyncio.to_thread(instant_value, prom, "metactl_event_processing_age_seconds")
        assert age is not None
        stat = 'sum(increase(metactl_potential_data_loss_events_total{job=~".*"}[5m]))'
        assert (await asyncio.to_thread(instant_value, prom, stat) or 0) >= 1
        active = await eventually(
            "3 active brokers in Prometheus",
            lambda: (
                v
                if (v := instant_value(prom, 'sum(metactl_brokers{state="active"})')) == 3
                else None
            ),
        )
        assert active == 3
    finally:
        if prom is not None:
            await asyncio.to_thread(prom.stop)
        for b in brokers:
            await b.close()
        await service.stop()


HEARTBEAT_MS = "200"
SESSION_MS = "1500"


async def describe(controller: str, security: Security) -> DescribeClusterResponse:
    conn = security.controller_client(controller)
    try:
        r = await conn.request(DescribeClusterRequest())
    finally:
        await conn.close()
    assert isinstance(r, DescribeClusterResponse)
    return r


async def wait_for_state(
    controller: str,
    security: Security,
    what: str,
    check: Callable[[DescribeClusterResponse], bool],
) -> DescribeClusterResponse:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        state = await describe(controller, security)
        if check(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last state: {state}")
        await asyncio.sleep(POLL_S)  # the polling interval


def settled(prom: PrometheusServer, expr: str, want: float) -> Callable[[], float | None]:
    return lambda: want if instant_value(prom, expr) == want else None


def fenced(broker_id: int) -> Callable[[DescribeClusterResponse], bool]:
    return lambda s: next(b for b in s.brokers if b.broker_id == broker_id).fenced


def orders(state: DescribeClusterResponse) -> PartitionState:
    return next(p for p in state.partitions if p.topic == "orders")


@pytest.mark.skipif(
    importlib.util.find_spec("brokers_stub.broker") is None, reason="brokers_stub is not there"
)
async def test_real_processes_power_outage_fires_the_alert(tmp_path: Path) -> None:
    """The same story with nothing in-process: `python -m controller --metrics` and three
    `python -m brokers_stub` processes (SIGKILLed, then restarted without their
    clean-shutdown file), all with mutual TLS and scraped by Prometheus over HTTPS with
    the viewer's certificate."""
    logs = tmp_path / "logs"
    certs = tmp_path / "certs"
    init_certs(certs, default_names([1, 2, 3]))
    tls = ["--tls-dir", str(certs)]
    admin = Security(TlsIdentity.from_dir(certs, ADMIN))
    listen = f"127.0.0.1:{free_port()}"
    controller = Proc(
        "controller",
        ["-m", "controller", "--data-dir", str(tmp_path / "controller"), "--listen", listen,
         "--metrics", "127.0.0.1:0", "--heartbeat-interval-ms", HEARTBEAT_MS,
         "--session-timeout-ms", SESSION_MS, "--unclean-recovery-strategy", "balanced", *tls],
        logs / "controller.log",
    )  # fmt: skip
    brokers: dict[int, Proc] = {}
    broker_metrics = {b: f"127.0.0.1:{free_port()}" for b in (1, 2, 3)}
    prom: PrometheusServer | None = None

    def start_broker(b: int) -> Proc:
        p = Proc(
            f"broker-{b}",
            ["-m", "brokers_stub", "--id", str(b), "--controller", listen,
             "--data-dir", str(tmp_path / f"broker-{b}"), "--heartbeat-interval-ms", HEARTBEAT_MS,
             "--flush-interval-ms", "200", "--metrics", broker_metrics[b], *tls],
            logs / f"broker-{b}.log",
        )  # fmt: skip
        brokers[b] = p
        p.await_ready()
        return p

    try:
        ready = await asyncio.wait_for(asyncio.to_thread(controller.await_ready), TIMEOUT_S)
        assert ready["listen"] == listen
        metrics = ready["metrics"]
        prom = await asyncio.to_thread(
            PrometheusServer.start,
            tmp_path / "prometheus",
            render_prometheus_config(metrics, brokers=list(broker_metrics.values()), certs=certs),
        )
        for b in (1, 2, 3):
            await asyncio.wait_for(asyncio.to_thread(start_broker, b), TIMEOUT_S)
        await wait_for_state(
            listen,
            admin,
            "3 active brokers",
            lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers),
        )
        conn = admin.controller_client(listen)
        try:
            r = await conn.request(
                CreateTopicsRequest(
                    topics=[CreateTopic(name="orders", assignments=[[1, 2, 3]], min_isr=2)]
                )
            )
        finally:
            await conn.close()
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
        await wait_for_state(listen, admin, "full ISR", lambda s: orders(s).isr == [1, 2, 3])
        series = 'metactl_potential_data_loss_events_total{topic="orders", strategy="balanced"}'
        assert (
            await eventually("the data-loss series at 0", lambda: instant_value(prom, series)) == 0
        )
        up = await eventually(
            "controller and brokers scraped",
            lambda: v if (v := instant_value(prom, 'sum(up{job=~"metactl-.*"})')) == 4 else None,
        )
        assert up == 4

        # Power outage: SIGKILL each broker, fenced one by one (ELR [2, 3]).
        for b in (1, 2, 3):
            assert await asyncio.to_thread(brokers.pop(b).stop, signal.SIGKILL) == -signal.SIGKILL
            await wait_for_state(listen, admin, f"broker {b} fenced", fenced(b))
        assert orders(await describe(listen, admin)).elr == [2, 3]
        # They restart without a clean-shutdown file: unclean registrations, LastKnownELR
        # [2, 3], and a balanced recovery once both have answered GetReplicaLogInfo.
        for b in (1, 2, 3):
            await asyncio.wait_for(asyncio.to_thread(start_broker, b), TIMEOUT_S)
        await wait_for_state(
            listen, admin, "a recovered leader", lambda s: orders(s).leader in (2, 3)
        )

        alerts = await eventually(
            "MetactlPotentialDataLoss firing", lambda: firing(prom, "MetactlPotentialDataLoss")
        )
        assert [(a["labels"]["topic"], a["labels"]["strategy"]) for a in alerts] == [
            ("orders", "balanced")
        ]
        # The counters agree: three unclean registrations, one unclean-recovery election.
        for expr, want in (
            ("metactl_unclean_registrations_total", 3.0),
            ('metactl_elections_total{kind="unclean_recovery"}', 1.0),
        ):
            assert await eventually(expr, settled(prom, expr, want)) == want
    finally:
        if prom is not None:
            await asyncio.to_thread(prom.stop)
        for p in brokers.values():
            await asyncio.to_thread(p.stop)
        await asyncio.to_thread(controller.stop)
