"""`metactl chaos run`: real processes, real faults, and a check of every acknowledged
record (docs/chaos.md).

One run: start a controller (or, with `--etcd M --controllers N`, an M-member etcd
cluster and N controllers on one metadata log in it) and B brokers (`chaos_procs`),
create a topic, produce with acks=all from in-process producers (the client code of
`metactl produce`: `Leaders`, `Connections`, `leader_request`, `AckedLog`; a batch counts
only once its line is fsynced in the acked log), inject a seeded fault plan
(`chaos_plan`), heal, read every partition through ReadLog from its leader and fetch the
metadata log (`chaos_read`), scrape the controllers' metrics, and classify every
acknowledged record (`chaos_check`).

A sampler runs every `SAMPLE_S`. It reads the committed metadata end offset, which
becomes the `bound` of every batch acknowledged before the read left (the checker's
"reported after the acknowledgement" rule): from the controller's DescribeCluster on a
SQLite log, from etcd itself (`state/end`, a linearizable read) on an etcd log, because
a standby's answer may lag the log and a bound too early could excuse a silent loss. Its
DescribeCluster's leaderless partitions give a sampled unavailability figure beside the
one computed from the log.

Every controller's /metrics is scraped every `SCRAPE_S`, just before every fault on a
controller or an etcd member, and at the end. `metactl_potential_data_loss_events_total`
counts what one *term* committed (it starts at 0 in each process, and a controller's
counters go when it stops being the active one), so the runner keeps, per term (the
controller, its pid, and its `metactl_controller_failovers_total`), the largest value
seen while that controller was active, and reports the sum over terms beside the
UncleanRecoveryRecord count (docs/chaos.md, "The metric across restarts and failovers").

Cancelling `ChaosRun.execute` (SIGINT in the CLI) stops producing and faulting; the
processes are always stopped (`finally`), and `report()` then gives a partial report.

This module owns the orchestration. It must not decide process details (`chaos_procs`),
the plan (`chaos_plan`) or a record's fate (`chaos_check`), and touches nothing of the
brokers' or the controller's internals: only their wire protocol, signals and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from controller.core.config import ControllerConfig
from metactl.errors import InvalidConfigurationError, InvalidRequestError, MetactlError
from metadata_log.records import NO_LEADER
from ops.chaos_check import TOPIC, counter_sum, gauge_value
from ops.chaos_plan import CONTROLLER_OPS, ETCD_OPS, Step, random_plan
from ops.chaos_procs import Proc, Processes, Timing, port_plan
from ops.chaos_read import POLL_S, fetch_metadata, read_logs
from ops.client import call
from ops.data_client import Connections, Leaders, leader_request
from ops.data_cmds import AckedLog
from ops.procs import await_active_brokers
from ops.run_progress import Mode as ProgressMode
from ops.run_progress import Progress
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

if TYPE_CHECKING:
    from metadata_log.etcd.client import Etcd

SAMPLE_S = 0.2
SCRAPE_S = 0.5
TARGET_WAIT_S = 10.0  # how long a fault waits for its target role (an election)
PRODUCE_RETRY = RetryPolicy(attempts=4, base_s=0.05, cap_s=0.5)
METRIC = "metactl_potential_data_loss_events"
ACTIVE = "metactl_controller_active"
FAILOVERS = "metactl_controller_failovers"


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
    controllers: int = 1
    etcd: int = 0  # etcd members (0: the controller's SQLite log)
    base_port: int | None = None  # every port from here on (None: free ones)
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
        if self.controllers < 1 or self.etcd < 0:
            raise bad("--controllers must be at least 1, --etcd at least 0")
        if self.controllers > 1 and self.etcd == 0:
            raise bad(f"{self.controllers} controllers need a shared log: add --etcd 3 (or 1)")

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
        progress_mode: ProgressMode = "lines",
    ) -> None:
        self.cfg = cfg
        self.progress = progress
        self.on_started = on_started
        self.root = cfg.data_dir.resolve()
        self.procs = Processes(
            root=self.root,
            brokers=cfg.brokers,
            strategy=cfg.strategy,
            elr=cfg.eligible_leader_replicas,
            unclean_leader_election=cfg.unclean_leader_election,
            ports=port_plan(
                cfg.base_port, controllers=cfg.controllers, etcd=cfg.etcd, brokers=cfg.brokers
            ),
            etcd_members=cfg.etcd,
            timing=cfg.timing,
        )
        self.bar = Progress(
            "chaos run",
            cfg.duration_s,
            unit="s",
            mode=progress_mode,
            stream=progress,
        )
        self.active: int | None = 1 if cfg.controllers == 1 else None  # the active controller
        # The data-loss counter per term, (controller, pid, failovers): the largest value
        # scraped while that controller was active.
        self.term_metric: dict[tuple[str, int, int], float] = {}
        self.etcd_client: Etcd | None = None
        self.leaders: list[Leaders] = []
        self.acked_path = self.root / "acked.jsonl"
        self.acks: list[tuple[int, int, int, int]] = []  # partition, base, count, epoch
        self.bounds: list[int | None] = []
        self.refused: Counter[str] = Counter()
        self.faults: list[dict[str, Any]] = []
        self.skipped = 0
        self.lossy_pending: dict[int, bool] = {}
        self.metric_scrape_failures = 0
        self.scraped = False  # some controller's counter was read at least once
        self.restart_failures: list[str] = []
        self.unexpected_exits: list[dict[str, Any]] = []
        self.sampled_ms = 0.0
        self.phase = "starting"
        self.interrupted = False
        self.t0 = time.monotonic()
        self.produce_s = 0.0
        self.fault_phase_s = 0.0
        self.fault_start = 0.0
        self.results: dict[str, Any] = {}
        self._restores: set[asyncio.Task[None]] = set()

    # --- helpers --------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        self.bar.note(f"[{time.monotonic() - self.t0:7.2f}s] {msg}")

    def active_first(self) -> str:
        """Every controller's address, the one believed active first (clients try the
        first address first, and a standby's reads may lag)."""
        order = sorted(self.procs.controllers, key=lambda i: i != self.active)
        return ",".join(self.procs.address_of(i) for i in order)

    async def request(self, body: Message, timeout_s: float = 5.0) -> Message:
        """A write (or a read that must be current): to the active controller, following
        NOT_CONTROLLER and riding a failover until `timeout_s` (`ops.client.call`)."""
        return await call(self.active_first(), body, timeout_s)

    async def describe(self) -> DescribeClusterResponse | None:
        """DescribeCluster from the controller believed active (one try, 2 s)."""
        try:
            r = await request_once(
                self.active_first(), DescribeClusterRequest(topic=TOPIC), timeout_s=2.0
            )
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

    async def scrape(self, i: int) -> float | None:
        """Controller `i`'s /metrics: notes its term's data-loss counter (while it is the
        active one) and whether it is active; returns the counter (None: not active or
        no answer). A paused or stopped controller is not asked."""
        proc = self.procs.controllers[i]
        pid = proc.pid
        if proc.state != "up" or pid is None:
            return None
        url = f"http://{self.procs.metrics_of(i)}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return str(resp.read().decode())

        try:
            text = await asyncio.to_thread(get)
        except (OSError, ValueError):
            self.metric_scrape_failures += 1
            return None
        if gauge_value(text, ACTIVE) != 1.0:
            if self.active == i and self.cfg.controllers > 1:
                self.active = None
            return None
        self.active = i
        term = int(gauge_value(text, FAILOVERS + "_total") or 0)
        value = counter_sum(text, METRIC)
        key = (proc.name, pid, term)
        self.term_metric[key] = max(self.term_metric.get(key, 0.0), value)
        self.scraped = True
        return value

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(i) for i in self.procs.controllers))

    async def await_active(self, timeout_s: float = 30.0) -> None:
        """Scrape every controller until one says it is the active one (after the last
        controller fault an election may still be under way: the heal's answers, and the
        final term's counter, are that controller's)."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.scrape_all()
            if self.active is not None or time.monotonic() > deadline:
                return
            await asyncio.sleep(POLL_S)  # polling an observable state: an election

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
        extra = " ".join(f"{k}={v}" for k, v in detail.items())
        self.say(f"fault: {kind} {target} {extra}".rstrip())

    # --- start ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        p = self.procs
        if p.etcd is not None:
            self.say(f"starting a {self.cfg.etcd}-member etcd cluster")
            await p.start_etcd()
            from metadata_log.etcd.client import Etcd, EtcdTarget

            assert p.url is not None
            # The admin's etcd certificate, given explicitly: METACTL_ETCD_* play no part.
            target = EtcdTarget.parse(p.url, tls=p.etcd_tls)
            self.etcd_client = await Etcd.connect(target, timeout_s=2.0)
        await asyncio.gather(*(p.start_controller(i) for i in p.controllers))
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
        r = await self.request(CreateTopicsRequest(topics=[spec]), 30.0)
        assert isinstance(r, CreateTopicsResponse)
        if r.results[0].error_code:
            res = r.results[0]
            raise InvalidRequestError(f"topic creation failed: {res.error_code}: {res.message}")
        await self.scrape_all()
        await self.wait_for(
            lambda r: (
                len(r.partitions) == cfg.partitions
                and all(x.leader != NO_LEADER and len(x.isr) == cfg.rf for x in r.partitions)
            ),
            "every partition led with a full ISR",
            60.0,
        )
        info: dict[str, Any] = {
            "data_dir": str(self.root),
            "controller": p.address,
            "pids": p.started_pids(),
        }
        log = ""
        if p.url is not None:
            info["metadata_log"] = p.url
            flags = p.etcd_tls.flags() if p.etcd_tls is not None else []
            info["etcd_tls_flags"] = flags  # what `metactl log dump --data-dir URL` needs
            log = f", metadata log {' '.join([p.url, *flags])}"
        pids = ", ".join(f"{name}={pid}" for name, pid in info["pids"].items())
        self.say(f"started: data dir {self.root}, controller {p.address}{log}; pids {pids}")
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
            leaders = Leaders(self.active_first(), TOPIC, PRODUCE_RETRY)
            self.leaders.append(leaders)
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

    async def etcd_end(self) -> int | None:
        """The etcd log's committed end offset as etcd holds it now (`state/end`, read
        linearizably: never earlier than any acknowledgement before the read); None if
        etcd did not answer."""
        from metadata_log.etcd.layout import read_state

        assert self.etcd_client is not None
        try:
            _, end, _ = await read_state(self.etcd_client)
        except MetactlError:
            return None
        return end

    async def sample(self) -> None:
        last: tuple[float, int] | None = None
        bounded = 0
        while True:
            n = len(self.acks)  # acknowledged (and logged) before the reads leave
            if self.etcd_client is None:
                r = await self.describe()
                end = None if r is None else r.committed_offset
            else:
                end = await self.etcd_end()
                r = await self.describe()
            if end is not None:
                for i in range(bounded, n):
                    self.bounds[i] = end
                bounded = n
            now = time.monotonic()
            if r is not None:
                leaderless = sum(1 for p in r.partitions if p.leader == NO_LEADER)
                if last is not None:
                    self.sampled_ms += last[1] * (now - last[0]) * 1000
                last = (now, leaderless)
            self.show()
            await asyncio.sleep(SAMPLE_S)  # the sampling cadence

    async def watch_exits(self) -> None:
        """A process that exits without a fault (a crash, or a controller that gives up)
        is a finding: noted in `unexpected_exits` with its status, and restarted."""
        p = self.procs
        for i, proc in p.controllers.items():
            if proc.state in ("up", "paused") and proc.popen is not None and not proc.alive():
                self.exited(proc)
                self._spawn_restore(1.0, functools.partial(self.restart_controller, i))
        for b, proc in p.broker.items():
            if proc.state in ("up", "paused") and proc.popen is not None and not proc.alive():
                self.exited(proc)
                self._spawn_restore(1.0, functools.partial(self.restart_broker, b))

    def exited(self, proc: Proc) -> None:
        assert proc.popen is not None
        status = proc.popen.returncode
        t = round(time.monotonic() - self.t0, 2)
        self.unexpected_exits.append({"t": t, "process": proc.name, "status": status})
        self.say(f"!! {proc.name} exited by itself (status {status}); restarting it")
        proc.state = "down"
        proc.release()

    async def scrape_loop(self) -> None:
        while True:
            await self.watch_exits()
            await self.scrape_all()
            for leaders in self.leaders:
                leaders.controller = self.active_first()
            await asyncio.sleep(SCRAPE_S)  # the scraping cadence

    def show(self) -> None:
        counts = Counter(f["kind"] for f in self.faults)
        ha = sum(n for k, n in counts.items() if k in CONTROLLER_OPS + ETCD_OPS)
        acked = sum(a[2] for a in self.acks)
        status = f"{self.phase}, {len(self.faults)} faults"
        if self.cfg.controllers > 1 or self.cfg.etcd:
            status += f" ({ha} on controllers/etcd)"
        status += f", {acked:,} acknowledged"
        elapsed = self.fault_phase_s or (
            time.monotonic() - self.fault_start if self.fault_start else 0.0
        )
        done = min(elapsed, self.cfg.duration_s)
        # The fault phase's end is known; the heal and the check take what they take.
        left = self.cfg.duration_s - done if self.phase == "faults" else None
        self.bar.update(done, status, left_s=left)

    # --- faults -------------------------------------------------------------------------------

    async def restart_broker(self, b: int) -> None:
        proc = self.procs.broker[b]
        if proc.state != "down":
            return
        lossy = self.lossy_pending.pop(b, False)
        self.say(f"restart broker {b}" + (" with --lose-unflushed" if lossy else ""))
        await self.procs.start_broker(b, lose_unflushed=lossy)

    async def restart_controller(self, i: int = 1) -> None:
        proc = self.procs.controllers[i]
        if proc.state != "down":
            return
        self.say(f"restart {proc.name}")
        try:
            await self.procs.start_controller(i)
        except (RuntimeError, OSError) as exc:
            self.restart_failures.append(f"{proc.name}: {exc}")
            self.say(f"{proc.name} did not restart: {exc}; the heal tries again")

    async def restart_etcd(self, i: int) -> None:
        if self.procs.etcd_state.get(i) != "down":
            return
        assert self.procs.etcd is not None
        name = self.procs.etcd.members[i].name
        self.say(f"restart {name}")
        try:
            await self.procs.restart_etcd(i)
        except RuntimeError as exc:
            self.restart_failures.append(f"{name}: {exc}")
            self.say(f"{name} did not restart: {exc}; the heal tries again")

    async def resume(self, proc: Proc) -> None:
        if proc.state == "paused":
            self.procs.resume(proc)
            self.say(f"resume {proc.name}")

    async def resume_etcd(self, i: int) -> None:
        if self.procs.etcd_state.get(i) == "paused":
            self.procs.resume_etcd(i)
            assert self.procs.etcd is not None
            self.say(f"resume {self.procs.etcd.members[i].name}")

    async def controller_target(self, s: Step) -> int | None:
        """The controller a step aims at (None: none fits: the step is skipped). The
        active one is waited for while a failover is under way (up to `TARGET_WAIT_S`)."""
        p = self.procs
        deadline = time.monotonic() + TARGET_WAIT_S
        while True:
            await self.scrape_all()  # who is active now (and every term's counter, first)
            if s.controller is not None:
                return s.controller if p.controllers[s.controller].state == "up" else None
            i = self.active
            if i is not None and p.controllers[i].state == "up":
                break
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(POLL_S)  # polling an observable state: an election
        if s.role == "standby":
            ups = [j for j, c in p.controllers.items() if c.state == "up" and j != i]
            return random.Random(f"{self.cfg.seed}:{len(self.faults)}").choice(ups) if ups else None
        return i

    async def etcd_target(self, s: Step) -> int | None:
        """The etcd member a step aims at (None: none fits), the leader waited for while
        the members elect one (up to `TARGET_WAIT_S`)."""
        p = self.procs
        if s.member is not None:
            return s.member - 1 if p.etcd_state.get(s.member - 1) == "up" else None
        deadline = time.monotonic() + TARGET_WAIT_S
        while (leader := await asyncio.to_thread(p.etcd_leader)) is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(POLL_S)  # polling an observable state: an election
        if s.role == "follower":
            ups = [i for i, st in p.etcd_state.items() if st == "up" and i != leader]
            if leader is None or not ups:
                return None
            return random.Random(f"{self.cfg.seed}:{len(self.faults)}").choice(ups)
        return leader if leader is not None and p.etcd_state.get(leader) == "up" else None

    async def controller_fault(self, s: Step) -> None:
        p = self.procs
        i = await self.controller_target(s)
        if i is None:
            self.skipped += 1
            return
        proc = p.controllers[i]
        role = "active" if i == self.active else "standby"
        detail: dict[str, Any] = {}
        if self.cfg.controllers > 1:
            detail["role"] = role
        if s.op == "pause_controller":
            p.pause(proc)
            self._fault("pause_controller", proc.name, pause_s=s.pause_s, **detail)
            self._spawn_restore(s.pause_s, lambda: self.resume(proc))
            return
        await p.kill(proc)
        if self.active == i and self.cfg.controllers > 1:
            self.active = None
        self._fault("kill_controller", proc.name, **detail)
        if s.down_s is not None:
            self._spawn_restore(s.down_s, lambda: self.restart_controller(i))

    async def etcd_fault(self, s: Step) -> None:
        p = self.procs
        if p.etcd is None:
            self.skipped += 1
            return
        i = await self.etcd_target(s)
        if i is None:
            self.skipped += 1
            return
        await self.scrape_all()  # a term may end with what follows: its counter first
        name = p.etcd.members[i].name
        leader = await asyncio.to_thread(p.etcd_leader)
        role = "leader" if i == leader else "follower"
        if s.op == "pause_etcd":
            p.pause_etcd(i)
            self._fault("pause_etcd", name, role=role, pause_s=s.pause_s)
            self._spawn_restore(s.pause_s, lambda: self.resume_etcd(i))
            return
        await p.kill_etcd(i)
        self._fault("kill_etcd", name, role=role)
        if s.down_s is not None:
            self._spawn_restore(s.down_s, lambda: self.restart_etcd(i))

    async def step(self, s: Step) -> None:
        p = self.procs
        if s.op == "sleep":
            await asyncio.sleep(s.s)  # the schedule's own timing
            return
        if s.op in CONTROLLER_OPS:
            await self.controller_fault(s)
            return
        if s.op in ETCD_OPS:
            await self.etcd_fault(s)
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
                controllers=cfg.controllers,
                etcd=cfg.etcd,
            )
        start = self.fault_start = time.monotonic()
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
        for i in list(p.etcd_state):
            await self.resume_etcd(i)
        for attempt in range(3):
            for i in list(p.etcd_state):
                await self.restart_etcd(i)
            for proc in p.controllers.values():
                await self.resume(proc)
            for i in p.controllers:
                await self.restart_controller(i)
            if all(c.state == "up" for c in p.controllers.values()) and all(
                st == "up" for st in p.etcd_state.values()
            ):
                break
            await asyncio.sleep(1.0 + attempt)  # before trying what failed again
        for proc in p.broker.values():
            await self.resume(proc)
        await asyncio.gather(*(self.restart_broker(b) for b in p.broker))
        cfg = self.cfg
        await self.await_active()

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
            self.show()
            await self.start()
            self.phase = "faults"
            background = [
                asyncio.create_task(self.sample()),
                asyncio.create_task(self.scrape_loop()),
            ]
            producers = asyncio.create_task(self.produce())
            background.append(producers)
            t = time.monotonic()
            await self.run_faults()
            producers.cancel()
            await asyncio.gather(producers, return_exceptions=True)
            self.produce_s = time.monotonic() - t
            self.phase = "healing"
            self.show()
            self.say("healing")
            await self.heal()
            self.phase = "checking"
            self.show()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.await_active()
            address = self.active_first()
            committed, errors = await read_logs(address)
            records, snapshot_at = await fetch_metadata(address)
            await self.await_active()  # the final term's counter, once more
            self.results = {
                "committed": committed,
                "read_errors": errors,
                "records": records,
                "snapshot_at": snapshot_at,
                "final_metric": sum(self.term_metric.values()) if self.scraped else None,
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
            if self.etcd_client is not None:
                with contextlib.suppress(MetactlError, OSError):
                    await asyncio.shield(self.etcd_client.close())
            await asyncio.shield(self.procs.stop_all())
            self.show()
            self.bar.close()

    def report(self) -> dict[str, Any]:
        from ops.chaos_report import build_report

        return build_report(self)
