"""`metactl chaos run`: real processes, real faults, and a check of every acknowledged
record (docs/chaos.md).

One run: start a controller and N brokers (`chaos_procs`), create a topic, produce with
acks=all from in-process producers (the client code of `metactl produce`: `Leaders`,
`Connections`, `leader_request`, `AckedLog`; a batch counts only once its line is
fsynced in the acked log), inject a seeded fault plan (`chaos_plan`), heal, read every
partition through ReadLog from its leader and fetch the metadata log (`chaos_read`),
scrape the controller's metrics, and classify every acknowledged record (`chaos_check`).

A sampler asks DescribeCluster every `SAMPLE_S`: its answer's committed metadata end
offset becomes the `bound` of every batch acknowledged before the request left (the
checker's "reported after the acknowledgement" rule), and its leaderless partitions
give a sampled unavailability figure beside the one computed from the log.

The controller's `metactl_potential_data_loss_events_total` resets when it restarts, so
/metrics is scraped just before every controller kill and at the end, and the sum is
reported beside the UncleanRecoveryRecord count.

Cancelling `ChaosRun.execute` (SIGINT in the CLI) stops producing and faulting; the
processes are always stopped (`finally`), and `report()` then gives a partial report.

This module owns the orchestration. It must not decide process details (`chaos_procs`),
the plan (`chaos_plan`) or a record's fate (`chaos_check`), and touches nothing of the
brokers' or the controller's internals: only their wire protocol, signals and /metrics.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from controller.core.config import ControllerConfig
from metactl.errors import InvalidConfigurationError, InvalidRequestError, MetactlError
from metadata_log.records import NO_LEADER
from ops.chaos_check import TOPIC, counter_sum
from ops.chaos_plan import Step, random_plan
from ops.chaos_procs import Proc, Processes, Timing
from ops.chaos_read import POLL_S, fetch_metadata, read_logs
from ops.data_client import Connections, Leaders, leader_request
from ops.data_cmds import AckedLog
from ops.etcd_local import free_ports
from ops.procs import await_active_brokers
from protocol.client import RetryPolicy, request_once
from protocol.messages import (
    ACKS_ALL,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
    Message,
    ProduceRequest,
    ProduceResponse,
)

SAMPLE_S = 0.2
PRODUCE_RETRY = RetryPolicy(attempts=4, base_s=0.05, cap_s=0.5)
METRIC = "metactl_potential_data_loss_events"


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    data_dir: Path
    brokers: int = 5
    partitions: int = 6
    rf: int = 3
    min_isr: int = 2
    strategy: str = "balanced"
    eligible_leader_replicas: bool = True
    unclean_leader_election: bool = False
    lossy_kills: int = 4
    duration_s: float = 60.0
    seed: int = 0
    schedule: list[Step] | None = None  # None: a random plan from the seed
    producers: int = 3
    batch: int = 20
    operator_elect: bool = False
    heal_timeout_s: float = 60.0
    timing: Timing = field(default_factory=Timing)

    def validate(self) -> None:
        def bad(msg: str) -> InvalidRequestError:
            return InvalidRequestError(msg)

        if self.brokers < 1:
            raise bad(f"--brokers must be >= 1, got {self.brokers}")
        if self.partitions < 1:
            raise bad(f"--partitions must be >= 1, got {self.partitions}")
        if not 1 <= self.rf <= self.brokers:
            raise bad(f"--rf must be in 1..--brokers ({self.brokers}), got {self.rf}")
        if not 1 <= self.min_isr <= self.rf:
            raise bad(f"--min-isr must be in 1..--rf ({self.rf}), got {self.min_isr}")
        if self.lossy_kills < 0:
            raise bad(f"--lossy-kills must be >= 0, got {self.lossy_kills}")
        if self.duration_s < 0:
            raise bad(f"--duration must be >= 0, got {self.duration_s}")
        if self.producers < 1 or self.batch < 1:
            raise bad("--producers and --batch must be >= 1")
        try:  # the controller's own check of the rule mode
            ControllerConfig(
                eligible_leader_replicas=self.eligible_leader_replicas,
                unclean_leader_election=self.unclean_leader_election,
            )
        except InvalidConfigurationError as exc:
            raise InvalidConfigurationError(
                f"{exc.message} (--unclean-leader-election needs "
                "--eligible-leader-replicas disabled)"
            ) from None
        if self.operator_elect and self.strategy != "manual":
            raise bad("--operator-elect only applies to --strategy manual")

    @property
    def mode(self) -> str:
        if self.eligible_leader_replicas:
            return "kip-966"
        return "classic+unclean-election" if self.unclean_leader_election else "classic"


class ChaosRun:
    def __init__(
        self,
        cfg: ChaosConfig,
        *,
        progress: TextIO = sys.stderr,
        on_started: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.progress = progress
        self.on_started = on_started
        self.root = cfg.data_dir.resolve()
        controller_port, metrics_port = free_ports(2)
        self.procs = Processes(
            root=self.root,
            address=f"127.0.0.1:{controller_port}",
            metrics=f"127.0.0.1:{metrics_port}",
            brokers=cfg.brokers,
            strategy=cfg.strategy,
            elr=cfg.eligible_leader_replicas,
            unclean_leader_election=cfg.unclean_leader_election,
            timing=cfg.timing,
        )
        self.acked_path = self.root / "acked.jsonl"
        self.acks: list[tuple[int, int, int, int]] = []  # partition, base, count, epoch
        self.bounds: list[int | None] = []
        self.refused: Counter[str] = Counter()
        self.faults: list[dict[str, Any]] = []
        self.skipped = 0
        self.lossy_pending: dict[int, bool] = {}
        self.metric_before_restarts = 0.0
        self.metric_scrape_failures = 0
        self.sampled_ms = 0.0
        self.phase = "starting"
        self.interrupted = False
        self.t0 = time.monotonic()
        self.produce_s = 0.0
        self.fault_phase_s = 0.0
        self.results: dict[str, Any] = {}
        self._restores: set[asyncio.Task[None]] = set()

    # --- helpers --------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.2f}s] {msg}", file=self.progress, flush=True)

    async def request(self, body: Message, timeout_s: float = 5.0) -> Message:
        return await request_once(self.procs.address, body, timeout_s=timeout_s)

    async def describe(self) -> DescribeClusterResponse | None:
        try:
            r = await self.request(DescribeClusterRequest(topic=TOPIC), 2.0)
        except (MetactlError, OSError, TimeoutError):
            return None
        return r if isinstance(r, DescribeClusterResponse) else None

    async def wait_for(
        self, check: Callable[[DescribeClusterResponse], bool], what: str, timeout_s: float
    ) -> DescribeClusterResponse | None:
        """Poll DescribeCluster until `check` holds; None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = await self.describe()
            if r is not None and check(r):
                return r
            await asyncio.sleep(POLL_S)  # polling an observable state
        self.say(f"gave up waiting for {what} after {timeout_s:.0f} s")
        return None

    async def scrape(self) -> float | None:
        url = f"http://{self.procs.metrics}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return str(resp.read().decode())

        try:
            return counter_sum(await asyncio.to_thread(get), METRIC)
        except (OSError, ValueError):
            self.metric_scrape_failures += 1
            return None

    def _spawn_restore(self, delay_s: float, action: Callable[[], Any]) -> None:
        async def later() -> None:
            await asyncio.sleep(delay_s)  # the fault's planned duration
            await action()

        task = asyncio.create_task(later())
        self._restores.add(task)
        task.add_done_callback(self._restores.discard)

    def _fault(self, kind: str, target: str, **detail: Any) -> None:
        t = round(time.monotonic() - self.t0, 2)
        self.faults.append({"t": t, "kind": kind, "target": target, **detail})
        self.say(f"fault: {kind} {target} {detail or ''}".rstrip())

    # --- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        p = self.procs
        await p.start_controller()
        await asyncio.gather(*(p.start_broker(b) for b in p.broker))
        cfg = self.cfg
        await await_active_brokers(p.address, cfg.brokers)
        spec = CreateTopic(
            name=TOPIC,
            partitions=cfg.partitions,
            replication_factor=cfg.rf,
            min_isr=cfg.min_isr,
            recovery_strategy=cfg.strategy if cfg.eligible_leader_replicas else None,
        )
        r = await self.request(CreateTopicsRequest(topics=[spec]), 10.0)
        assert isinstance(r, CreateTopicsResponse)
        if r.results[0].error_code:
            res = r.results[0]
            raise InvalidRequestError(f"topic creation failed: {res.error_code}: {res.message}")
        await self.wait_for(
            lambda r: (
                len(r.partitions) == cfg.partitions
                and all(x.leader != NO_LEADER and len(x.isr) == cfg.rf for x in r.partitions)
            ),
            "every partition led with a full ISR",
            60.0,
        )
        info = {"data_dir": str(self.root), "controller": p.address, "pids": p.started_pids()}
        self.say(f"started: {info}")
        if self.on_started is not None:
            self.on_started(info)

    # --- producing and sampling -------------------------------------------------------------

    async def produce_partition(self, leaders: Leaders, log: AckedLog, partition: int) -> None:
        conns = Connections()
        req = ProduceRequest(
            topic=TOPIC, partition=partition, acks=ACKS_ALL, count=self.cfg.batch, timeout_ms=2000
        )
        try:
            while True:
                try:
                    resp = await leader_request(
                        leaders, conns, partition, req, timeout_s=5.0, retry=PRODUCE_RETRY
                    )
                except (MetactlError, OSError, TimeoutError) as exc:
                    self.refused[getattr(exc, "code", type(exc).__name__)] += 1
                    await asyncio.sleep(0.05)  # back off before the next batch
                    continue
                if not isinstance(resp, ProduceResponse):
                    self.refused["UNEXPECTED_RESPONSE"] += 1
                    continue
                log.append(resp, ACKS_ALL)  # durable first ...
                self.acks.append((resp.partition, resp.base_offset, resp.count, resp.leader_epoch))
                self.bounds.append(None)  # ... then it counts
        finally:
            await conns.close()

    async def produce(self) -> None:
        log = AckedLog(self.acked_path)
        groups: dict[int, list[int]] = {}
        for part in range(self.cfg.partitions):
            groups.setdefault(part % self.cfg.producers, []).append(part)

        async def producer(parts: list[int]) -> None:
            leaders = Leaders(self.procs.address, TOPIC, PRODUCE_RETRY)
            while True:
                try:
                    await leaders.refresh()
                    break
                except (MetactlError, OSError, TimeoutError):
                    await asyncio.sleep(0.2)  # the controller may be restarting
            await asyncio.gather(*(self.produce_partition(leaders, log, x) for x in parts))

        try:
            await asyncio.gather(*(producer(g) for g in groups.values()))
        finally:
            log.close()

    async def sample(self) -> None:
        last: tuple[float, int] | None = None
        bounded = 0
        while True:
            n = len(self.acks)  # acknowledged (and logged) before the request leaves
            r = await self.describe()
            now = time.monotonic()
            if r is not None:
                for i in range(bounded, n):
                    self.bounds[i] = r.committed_offset
                bounded = n
                leaderless = sum(1 for p in r.partitions if p.leader == NO_LEADER)
                if last is not None:
                    self.sampled_ms += last[1] * (now - last[0]) * 1000
                last = (now, leaderless)
            await asyncio.sleep(SAMPLE_S)  # the sampling cadence

    # --- faults -------------------------------------------------------------------------------

    async def restart_broker(self, b: int) -> None:
        proc = self.procs.broker[b]
        if proc.state != "down":
            return
        lossy = self.lossy_pending.pop(b, False)
        self.say(f"restart broker {b}" + (" with --lose-unflushed" if lossy else ""))
        await self.procs.start_broker(b, lose_unflushed=lossy)

    async def restart_controller(self) -> None:
        if self.procs.controller.state == "down":
            self.say("restart controller")
            await self.procs.start_controller()

    async def resume(self, proc: Proc) -> None:
        if proc.state == "paused":
            self.procs.resume(proc)
            self.say(f"resume {proc.name}")

    async def step(self, s: Step) -> None:
        p = self.procs
        if s.op == "sleep":
            await asyncio.sleep(s.s)  # the schedule's own timing
            return
        if s.op == "kill_controller":
            if p.controller.state != "up":
                self.skipped += 1
                return
            before = await self.scrape()
            if before is not None:
                self.metric_before_restarts += before
            await p.kill(p.controller)
            self._fault("kill_controller", "controller", metric_before=before)
            if s.down_s is not None:
                self._spawn_restore(s.down_s, self.restart_controller)
            return
        assert s.broker is not None
        proc = p.broker[s.broker]
        if s.op == "restart":
            await self.restart_broker(s.broker)
            return
        if proc.state != "up":
            self.skipped += 1
            return
        if s.op == "pause":
            p.pause(proc)
            self._fault("pause", proc.name, pause_s=s.pause_s)
            self._spawn_restore(s.pause_s, lambda: self.resume(proc))
            return
        sig = signal.SIGTERM if s.op == "term" else signal.SIGKILL
        await p.kill(proc, sig)
        self.lossy_pending[s.broker] = s.op == "kill" and s.lossy
        self._fault(s.kind(), proc.name)
        if s.await_fenced:
            b = s.broker
            await self.wait_for(
                lambda r: any(x.broker_id == b and x.fenced for x in r.brokers),
                f"broker {b} fenced",
                30.0,
            )
        if s.down_s is not None:
            b = s.broker
            self._spawn_restore(s.down_s, lambda: self.restart_broker(b))

    async def run_faults(self) -> None:
        cfg = self.cfg
        plan = cfg.schedule
        if plan is None:
            plan = random_plan(
                random.Random(cfg.seed),
                brokers=cfg.brokers,
                rf=cfg.rf,
                duration_s=cfg.duration_s,
                lossy_kills=cfg.lossy_kills,
                session_s=cfg.timing.session_ms / 1000,
            )
        start = time.monotonic()
        for s in plan:
            if s.at_s is not None:
                await asyncio.sleep(max(0.0, start + s.at_s - time.monotonic()))  # plan time
            await self.step(s)
        await asyncio.sleep(max(0.0, start + cfg.duration_s - time.monotonic()))  # duration
        self.fault_phase_s = time.monotonic() - start

    # --- heal ------------------------------------------------------------------------

    async def heal(self) -> None:
        while self._restores:
            await asyncio.gather(*list(self._restores), return_exceptions=True)
        p = self.procs
        await self.restart_controller()
        for proc in p.broker.values():
            await self.resume(proc)
        await asyncio.gather(*(self.restart_broker(b) for b in p.broker))
        cfg = self.cfg

        def settled(r: DescribeClusterResponse) -> bool:
            return all(
                x.leader != NO_LEADER or x.recovery_pending == [] for x in r.partitions
            ) and all(not b.fenced for b in r.brokers)

        r = await self.wait_for(
            settled, "a leader (or an operator's decision) everywhere", cfg.heal_timeout_s
        )
        if r is not None and cfg.operator_elect:
            await self.operator_elect(r)
        await self.wait_for(
            lambda r: all(
                x.leader != NO_LEADER and len(x.isr) == len(x.replicas) for x in r.partitions
            ),
            "full ISRs",
            20.0 if r is not None else 1.0,
        )

    async def operator_elect(self, r: DescribeClusterResponse) -> None:
        """What an operator without log inspection would do: elect the first live
        replica of the LastKnownELR, else of the assignment."""
        live = {b.broker_id for b in r.brokers if not b.fenced}
        for x in r.partitions:
            if x.leader != NO_LEADER:
                continue
            choice = next((b for b in [*x.last_known_elr, *x.replicas] if b in live), None)
            if choice is None:
                continue
            req = ElectLeader(
                topic=TOPIC, partition=x.partition, election_type="unclean", replica=choice
            )
            try:
                await self.request(req, 10.0)
                self.say(f"operator: elected {choice} for {TOPIC}-{x.partition}")
            except MetactlError as exc:
                self.say(f"operator: election for {TOPIC}-{x.partition} failed: {exc}")
        await self.wait_for(
            lambda r: all(x.leader != NO_LEADER for x in r.partitions),
            "the operator's leaders",
            20.0,
        )

    # --- the whole run --------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to the end (or until cancelled); processes are always stopped."""
        background: list[asyncio.Task[None]] = []
        try:
            self.phase = "starting"
            await self.start()
            self.phase = "faults"
            background = [asyncio.create_task(self.sample())]
            producers = asyncio.create_task(self.produce())
            background.append(producers)
            t = time.monotonic()
            await self.run_faults()
            producers.cancel()
            await asyncio.gather(producers, return_exceptions=True)
            self.produce_s = time.monotonic() - t
            self.phase = "healing"
            self.say("healing")
            await self.heal()
            self.phase = "checking"
            committed, errors = await read_logs(self.procs.address)
            records, snapshot_at = await fetch_metadata(self.procs.address)
            final = await self.scrape()
            self.results = {
                "committed": committed,
                "read_errors": errors,
                "records": records,
                "snapshot_at": snapshot_at,
                "final_metric": final,
                "end_ms": int(time.time() * 1000),
            }
            self.phase = "done"
        except asyncio.CancelledError:
            self.interrupted = True
            if self.produce_s == 0.0:
                self.produce_s = time.monotonic() - self.t0
        finally:
            for task in [*background, *self._restores]:
                task.cancel()
            await asyncio.gather(*background, *self._restores, return_exceptions=True)
            self.say("stopping every process")
            await asyncio.shield(self.procs.stop_all())

    def report(self) -> dict[str, Any]:
        from ops.chaos_report import build_report

        return build_report(self)
