"""The faults of a chaos run, carried out: each step of the plan (`chaos.plan`) applied
to the processes (`chaos.processes`), its planned end (a restart, a resume) scheduled,
and every fault logged with its time, kind, target and role.

A step aimed at a role (the active controller or a standby, the etcd leader or a
follower) is aimed at whoever holds it when the step runs (`chaos.watch` says which
controller is active; the members say which leads); a step that finds no target is
skipped and counted. A process that exits without a fault is a finding
(`unexpected_exits`), and restarted. `undo` brings everything back for the heal.

This module only injects faults and restores: it must not classify a record
(`chaos.check`) nor produce (`chaos.runner`).
"""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import time
from collections.abc import Callable
from typing import Any

from chaos.config import ChaosConfig
from chaos.plan import CONTROLLER_OPS, ETCD_OPS, Step, random_plan
from chaos.processes import Proc, Processes
from chaos.read import POLL_S
from chaos.watch import Watch

TARGET_WAIT_S = 10.0  # how long a fault waits for its target role (an election)


class Faults:
    """The faults injected so far (`log`), those skipped, and the restores pending."""

    def __init__(
        self,
        cfg: ChaosConfig,
        procs: Processes,
        watch: Watch,
        say: Callable[[str], None],
        t0: float,
    ) -> None:
        self.cfg = cfg
        self.procs = procs
        self.watch = watch
        self.say = say
        self.t0 = t0
        self.log: list[dict[str, Any]] = []
        self.skipped = 0
        self.lossy_pending: dict[int, bool] = {}
        self.restart_failures: list[str] = []
        self.unexpected_exits: list[dict[str, Any]] = []
        self.started_at = 0.0  # when the fault phase began (0: not yet)
        self.phase_s = 0.0  # how long it lasted, once over
        self.restores: set[asyncio.Task[None]] = set()

    def spawn_restore(self, delay_s: float, action: Callable[[], Any]) -> None:
        async def later() -> None:
            await asyncio.sleep(delay_s)  # the fault's planned duration
            await action()

        task = asyncio.create_task(later())
        self.restores.add(task)
        task.add_done_callback(self.restores.discard)

    def _fault(self, kind: str, target: str, **detail: Any) -> None:
        t = round(time.monotonic() - self.t0, 2)
        self.log.append({"t": t, "kind": kind, "target": target, **detail})
        extra = " ".join(f"{k}={v}" for k, v in detail.items())
        self.say(f"fault: {kind} {target} {extra}".rstrip())

    async def watch_exits(self) -> None:
        """A process that exits without a fault (a crash, or a controller that gives up)
        is a finding: noted in `unexpected_exits` with its status, and restarted."""
        p = self.procs
        for i, proc in p.controllers.items():
            if proc.state in ("up", "paused") and proc.popen is not None and not proc.alive():
                self.exited(proc)
                self.spawn_restore(1.0, functools.partial(self.restart_controller, i))
        for b, proc in p.broker.items():
            if proc.state in ("up", "paused") and proc.popen is not None and not proc.alive():
                self.exited(proc)
                self.spawn_restore(1.0, functools.partial(self.restart_broker, b))

    def exited(self, proc: Proc) -> None:
        assert proc.popen is not None
        status = proc.popen.returncode
        t = round(time.monotonic() - self.t0, 2)
        self.unexpected_exits.append({"t": t, "process": proc.name, "status": status})
        self.say(f"!! {proc.name} exited by itself (status {status}); restarting it")
        proc.state = "down"
        proc.release()

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
            await self.watch.scrape_all()  # who is active now (and every term's counter, first)
            if s.controller is not None:
                return s.controller if p.controllers[s.controller].state == "up" else None
            i = self.watch.active
            if i is not None and p.controllers[i].state == "up":
                break
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(POLL_S)  # polling an observable state: an election
        if s.role == "standby":
            ups = [j for j, c in p.controllers.items() if c.state == "up" and j != i]
            return random.Random(f"{self.cfg.seed}:{len(self.log)}").choice(ups) if ups else None
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
            return random.Random(f"{self.cfg.seed}:{len(self.log)}").choice(ups)
        return leader if leader is not None and p.etcd_state.get(leader) == "up" else None

    async def controller_fault(self, s: Step) -> None:
        p = self.procs
        i = await self.controller_target(s)
        if i is None:
            self.skipped += 1
            return
        proc = p.controllers[i]
        role = "active" if i == self.watch.active else "standby"
        detail: dict[str, Any] = {}
        if self.cfg.controllers > 1:
            detail["role"] = role
        if s.op == "pause_controller":
            p.pause(proc)
            self._fault("pause_controller", proc.name, pause_s=s.pause_s, **detail)
            self.spawn_restore(s.pause_s, lambda: self.resume(proc))
            return
        await p.kill(proc)
        if self.watch.active == i and self.cfg.controllers > 1:
            self.watch.active = None
        self._fault("kill_controller", proc.name, **detail)
        if s.down_s is not None:
            self.spawn_restore(s.down_s, lambda: self.restart_controller(i))

    async def etcd_fault(self, s: Step) -> None:
        p = self.procs
        if p.etcd is None:
            self.skipped += 1
            return
        i = await self.etcd_target(s)
        if i is None:
            self.skipped += 1
            return
        await self.watch.scrape_all()  # a term may end with what follows: its counter first
        name = p.etcd.members[i].name
        leader = await asyncio.to_thread(p.etcd_leader)
        role = "leader" if i == leader else "follower"
        if s.op == "pause_etcd":
            p.pause_etcd(i)
            self._fault("pause_etcd", name, role=role, pause_s=s.pause_s)
            self.spawn_restore(s.pause_s, lambda: self.resume_etcd(i))
            return
        await p.kill_etcd(i)
        self._fault("kill_etcd", name, role=role)
        if s.down_s is not None:
            self.spawn_restore(s.down_s, lambda: self.restart_etcd(i))

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
            self.spawn_restore(s.pause_s, lambda: self.resume(proc))
            return
        sig = signal.SIGTERM if s.op == "term" else signal.SIGKILL
        await p.kill(proc, sig)
        self.lossy_pending[s.broker] = s.op == "kill" and s.lossy
        self._fault(s.kind(), proc.name)
        if s.await_fenced:
            b = s.broker
            await self.watch.wait_for(
                lambda r: any(x.broker_id == b and x.fenced for x in r.brokers),
                f"broker {b} fenced",
                30.0,
            )
        if s.down_s is not None:
            b = s.broker
            self.spawn_restore(s.down_s, lambda: self.restart_broker(b))

    async def run(self) -> None:
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
        start = self.started_at = time.monotonic()
        for s in plan:
            if s.at_s is not None:
                await asyncio.sleep(max(0.0, start + s.at_s - time.monotonic()))  # plan time
            await self.step(s)
        await asyncio.sleep(max(0.0, start + cfg.duration_s - time.monotonic()))  # duration
        self.phase_s = time.monotonic() - start

    async def undo(self) -> None:
        """Every fault undone: the restores planned waited for, then every paused process
        resumed and every stopped one restarted (etcd, the controllers, then the brokers;
        etcd members and controllers tried again a few times)."""
        while self.restores:
            await asyncio.gather(*list(self.restores), return_exceptions=True)
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
