"""`metactl roll`: a rolling restart of a running `cluster up` cluster's brokers, one at a
time, in the order the controller plans (issue 34).

`Roll.run` asks the controller for its roll plan (PlanRoll, `planning.roll`: an order
that keeps every partition at or above MinISR while each broker is down, and the
partitions each step awaits back in an ISR). If it blocks a broker to roll, nothing is
touched: the answer's `blocked` plan says which partitions block which brokers. Else,
step by step:

1. it asks `cluster up`, through its control socket (`localcluster.control`), to restart
   the step's broker: a controlled shutdown (SIGTERM), its exit awaited, then a start
   with its recorded command line (`localcluster.restarts`: the supervisor owns the
   processes, and finishes a restart it began whatever becomes of this client);
2. it waits until the broker is back in the ISR of every partition the step awaits
   (DescribeCluster of their topics every `POLL_S`, progress every `PROGRESS_EVERY_S`,
   REQUEST_TIMED_OUT after `timeout_s`);
3. it reads every partition's ISR against its MinISR, and plans again before the next
   step (the cluster may have moved on): a broker to roll that the new plan blocks, or
   that went down meanwhile, stops the roll, saying why. A broker chosen out of the
   plan's order (`brokers`, a subset) is checked first with PlanRestart: its clean
   restart must leave every partition at or above MinISR, with a leader.

Ctrl-C (KeyboardInterrupt) during a restart waits for `cluster up` to finish it (a
second Ctrl-C leaves it to `cluster up`, which finishes it anyway) and starts the broker
if it is not running; at any other stage no broker is down. Either way the roll stops
with `RollInterrupted`, which says where.

It asks and waits; the processes are the supervisor's, the plan the controller's, and
what it prints its caller's (`say`, one line per stage). It must not import the CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from clients.admin import pages
from clients.controller import INSECURE, Security, ask
from localcluster.control import RECORD_FILE
from localcluster.control import ask as ask_cluster_up
from metactl.errors import (
    InvalidConfigurationError,
    InvalidRequestError,
    MetactlError,
    NetworkError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from protocol.client import RpcClient
from protocol.messages.admin import DescribeClusterRequest, PartitionState
from protocol.messages.plan import (
    MAX_PLAN_LIST_ITEMS,
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
    RollStep,
)
from protocol.messages.unions import Message
from protocol.tls import ADMIN, TlsIdentity

__all__ = ["Roll", "RollInterrupted", "RollResult", "StepDone", "Target"]

POLL_S: Final = 0.25  # how often a step's partitions are looked at
PROGRESS_EVERY_S: Final = 2.0  # the most often a waiting step says how far it is
ASK_S: Final = 30.0  # each answer of the controller, retries included
# A restart's answer: the broker's stop (`localcluster.children.STOP_TIMEOUT_S`, 30 s),
# then its start (the supervisor's READY_TIMEOUT_S, 60 s), and a margin.
RESTART_ANSWER_S: Final = 120.0
SHOWN: Final = 8  # partitions a line names at most


@dataclass(frozen=True)
class Target:
    """The `cluster up` running on `data_dir`, from its record."""

    data_dir: Path
    bootstrap: str
    security: Security
    pid: int

    @classmethod
    def of(cls, data_dir: Path) -> Target:
        """NETWORK_EXCEPTION when no `cluster up` runs on `data_dir`."""
        record_path = data_dir / RECORD_FILE
        none = (
            f"no `metactl cluster up` is running on {data_dir}: `make run` or `metactl "
            f"cluster up --data-dir {data_dir}` starts the whole cluster"
        )
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NetworkError(none) from None
        except ValueError as exc:
            raise InvalidRequestError(f"{record_path}: unreadable: {exc}") from None
        pid = int(record.get("pid") or 0)
        if pid <= 0 or not _alive(pid):
            raise NetworkError(none + f" (the one recorded in {record_path}, pid {pid}, is gone)")
        if "tls_dir" in record:
            tls = record["tls_dir"]
        else:  # recorded by an older `cluster up`: its certificates, if it made them
            tls = str(data_dir / "certs") if (data_dir / "certs").is_dir() else None
        security = INSECURE if tls is None else Security(TlsIdentity.from_dir(Path(tls), ADMIN))
        return cls(data_dir, ",".join(record["controllers"]), security, pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class StepDone:
    """One broker restarted and back in its ISRs."""

    broker_id: int
    pid_before: int
    pid: int
    stop_status: str  # "exit status 0", "killed by SIGKILL"
    clean: bool  # stopped by its controlled shutdown, in time
    stopped_s: float  # from its SIGTERM to its exit
    restart_s: float  # from the request to its READY line, its stop included
    awaited: int  # partitions awaited back in an ISR
    rejoined_s: float  # from READY until back in every one
    below_min_isr: int  # partitions below MinISR after the step (of all)


@dataclass
class RollResult:
    """What a roll did: its steps, and the plan that stopped it, if one did."""

    brokers: list[int] = field(default_factory=list)  # to roll, in the first plan's order
    steps: list[StepDone] = field(default_factory=list)
    blocked: PlanRollResponse | None = None  # the plan that blocks the rest
    why: str = ""  # what stopped it, if anything did
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.blocked is None and not self.why

    def to_json(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "steps": [asdict(s) for s in self.steps],
            "stopped": self.why or None,
            "seconds": round(self.seconds, 3),
        }


class RollInterrupted(KeyboardInterrupt):
    """Ctrl-C during a roll, once the broker being restarted (if any) is seen to."""

    def __init__(self, result: RollResult, where: str) -> None:
        super().__init__(where)
        self.result = result
        self.where = where


class Roll:
    """A roll of `brokers` (None: every active one) of the `cluster up` `target`."""

    def __init__(
        self,
        target: Target,
        *,
        brokers: Sequence[int] | None,
        timeout_s: float,
        say: Callable[[str], None],
    ) -> None:
        self.target = target
        self.wanted = list(dict.fromkeys(brokers)) if brokers is not None else None
        self.timeout_s = timeout_s
        self.say = say
        self.result = RollResult()

    # --- the roll -----------------------------------------------------------------------

    def run(self) -> RollResult:
        """The roll, to its end or to what stops it (`RollResult.blocked`, `.why`);
        RollInterrupted on Ctrl-C, a named error if the controller or `cluster up`
        fails it."""
        began = time.monotonic()
        result = self.result
        try:
            plan = self._plan()
            remaining = self._chosen(plan)
            result.brokers = list(remaining)
            blocked = [b for b in remaining if b in plan.blocked]
            if blocked:
                result.blocked = plan
                result.why = (
                    f"broker(s) {', '.join(map(str, blocked))} cannot be restarted without "
                    "taking a partition below MinISR, in any order: nothing was restarted"
                )
                return result
            self._head(plan, remaining)
            while remaining:
                if result.steps:
                    plan = self._plan()
                step = self._next(plan, remaining)
                if step is None:
                    return result
                result.steps.append(self._step(step, len(result.steps) + 1, len(result.brokers)))
                remaining.remove(step.broker_id)
        except RollInterrupted:
            raise
        except KeyboardInterrupt:
            raise RollInterrupted(result, self._where("no broker is down")) from None
        finally:
            result.seconds = time.monotonic() - began
        return result

    def _where(self, state: str, *, during: bool = False) -> str:
        done, total = len(self.result.steps), len(self.result.brokers)
        when = f"during step {done + 1}" if during else f"after {done} step(s)"
        return f"the roll stopped {when} of {total}; {state}"

    def _chosen(self, plan: PlanRollResponse) -> list[int]:
        """The brokers to roll, in the plan's order (its steps, then the blocked)."""
        order = [s.broker_id for s in plan.steps]
        order += [b for b in plan.blocked if b not in order]
        if self.wanted is None:
            return order
        down = {n.broker_id: n.reason for n in plan.not_rolled}
        for b in self.wanted:
            if b in down:
                raise InvalidRequestError(
                    f"broker {b} is {_down(down[b])}: it cannot be rolled "
                    f"(`metactl broker start --id {b}` brings a stopped one back)"
                )
            if b not in order:
                known = ", ".join(map(str, sorted(order + list(down)))) or "none"
                raise InvalidConfigurationError(
                    f"--brokers: the cluster has no broker {b} (its brokers: {known})"
                )
        return [b for b in order if b in self.wanted]

    def _head(self, plan: PlanRollResponse, remaining: list[int]) -> None:
        t = self.target
        self.say(
            f"Rolling {len(remaining)} broker(s) of the cluster up on {t.data_dir} (pid "
            f"{t.pid}), one at a time, planned from the committed log at offset "
            f"{plan.end_offset}: {', '.join(map(str, remaining))} (planned again before each "
            "step)"
        )
        if self.wanted is None:
            for n in plan.not_rolled:
                self.say(f"  not rolled: broker {n.broker_id} ({_down(n.reason)})")
        if plan.under_min_isr.count:
            self.say(
                f"  {plan.under_min_isr.count} partition(s) below MinISR before the roll: "
                "the brokers in their ISRs wait until they are back"
            )

    def _next(self, plan: PlanRollResponse, remaining: list[int]) -> RollStep | None:
        """The next step: the plan's first for a broker still to roll (one out of the
        plan's order checked with PlanRestart first); None, with the reason recorded,
        when the plan blocks a broker still to roll, one went down, or none may go."""
        result = self.result
        down = {n.broker_id: n.reason for n in plan.not_rolled}
        gone = [b for b in remaining if b in down]
        if gone:
            b = gone[0]
            result.why = (
                f"broker {b} is {_down(down[b])} now: the roll stops here; bring it back "
                f"(`metactl broker start --id {b}`) and roll again"
            )
            return None
        blocked = [b for b in remaining if b in plan.blocked]
        if blocked:  # the cluster moved on since the roll began: stop, and say how
            result.blocked = plan
            result.why = (
                f"broker(s) {', '.join(map(str, blocked))} cannot be restarted now without "
                "taking a partition below MinISR"
            )
            return None
        unsafe: list[int] = []
        for i, s in enumerate(plan.steps):
            if s.broker_id not in remaining:
                continue
            if i == 0 or self._safe_now(s.broker_id):
                return s
            unsafe.append(s.broker_id)
        result.why = (
            f"broker(s) {', '.join(map(str, unsafe or remaining))} cannot be restarted "
            "now without taking a partition below MinISR or leaving one without a leader "
            f"(`metactl plan restart --broker {(unsafe or remaining)[0]}` says which)"
        )
        return None

    def _safe_now(self, broker_id: int) -> bool:
        r = self._ask(PlanRestartRequest(broker_id=broker_id, limit=0))
        if not isinstance(r, PlanRestartResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__}")
        c = r.clean
        return not (c.under_min_isr.count or c.leader_lost.count or c.unclean_recovery.count)

    # --- one step -----------------------------------------------------------------------

    def _step(self, step: RollStep, k: int, total: int) -> StepDone:
        b = step.broker_id
        self.say(
            f"step {k}/{total}: broker {b} ({step.leads} leader(s) move off it, "
            f"{step.at_min_isr} partition(s) at MinISR while it is down; "
            f"{step.await_count} to await back in ISR)"
        )
        self.say(f"  broker {b}: controlled shutdown, then a start…")
        began = time.monotonic()
        try:
            answer = ask_cluster_up(self.target.data_dir, {"restart_broker": b}, RESTART_ANSWER_S)
        except KeyboardInterrupt:
            state = self._undo(b)
            raise RollInterrupted(self.result, self._where(state, during=True)) from None
        restart_s = time.monotonic() - began
        stopped = answer.get("stopped") or {}
        fields = _ready_fields(str(answer.get("ready", "")))
        self.say(
            f"  broker {b} stopped ({float(stopped.get('seconds', 0.0)):.1f} s, "
            f"{stopped.get('status', '?')}"
            + ("" if stopped.get("clean") else "; NOT a controlled shutdown: it comes back unclean")
            + ")"
        )
        self.say(
            f"  broker {b} started again (pid {answer.get('pid')}, epoch "
            f"{fields.get('epoch', '?')}; ready {restart_s:.1f} s after the request)"
        )
        awaits = {(g.topic, p) for g in step.awaits for p in g.partitions}
        ready_at = time.monotonic()
        try:
            below = asyncio.run(self._rejoin(b, awaits, step.await_count))
        except KeyboardInterrupt:
            state = f"broker {b} runs again; its partitions take it back into their ISRs"
            raise RollInterrupted(self.result, self._where(state, during=True)) from None
        return StepDone(
            broker_id=b,
            pid_before=int(stopped.get("pid", 0)),
            pid=int(answer.get("pid", 0)),
            stop_status=str(stopped.get("status", "")),
            clean=bool(stopped.get("clean")),
            stopped_s=float(stopped.get("seconds", 0.0)),
            restart_s=round(restart_s, 3),
            awaited=len(awaits),
            rejoined_s=round(time.monotonic() - ready_at, 3),
            below_min_isr=below,
        )

    def _undo(self, broker_id: int) -> str:
        """After Ctrl-C during broker `broker_id`'s restart: what became of it, once
        `cluster up` has finished the restart (it does, whatever becomes of this
        client), and the broker started if it does not run."""
        self.say(
            f"interrupted: cluster up finishes broker {broker_id}'s restart (it never leaves "
            "it down); waiting for it (Ctrl-C again leaves it to cluster up)"
        )
        data = self.target.data_dir
        try:
            seen = ask_cluster_up(data, {"await_broker": broker_id}, RESTART_ANSWER_S)
            if not seen.get("running"):
                seen = ask_cluster_up(data, {"start_broker": broker_id}, RESTART_ANSWER_S)
        except KeyboardInterrupt:
            return f"cluster up goes on restarting broker {broker_id}"
        except MetactlError as exc:
            return f"broker {broker_id}: {exc.code}: {exc.message}"
        return f"broker {broker_id} runs (pid {seen.get('pid')})"

    async def _rejoin(self, broker_id: int, awaits: set[tuple[str, int]], count: int) -> int:
        """Once `broker_id` is back in the ISR of every partition of `awaits` (those
        deleted meanwhile aside): how many partitions are below MinISR, each said."""
        target = self.target
        began = time.monotonic()
        deadline = began + self.timeout_s
        if count > len(awaits):  # more than a plan lists (MAX_PLAN_LIST_ITEMS)
            self.say(f"  (the plan lists {len(awaits)} of the {count} partitions: those awaited)")
        async with target.security.controller_client(target.bootstrap) as client:
            said = began
            while True:
                states = await _partitions(client, sorted({topic for topic, _ in awaits}))
                short = sorted(
                    tp for tp in awaits if tp in states and broker_id not in states[tp].isr
                )
                now = time.monotonic()
                if not short:
                    self.say(
                        f"  broker {broker_id} back in the ISR of {len(awaits)} partition(s) "
                        f"({now - began:.1f} s)"
                    )
                    break
                if now >= deadline:
                    raise RequestTimedOutError(
                        f"broker {broker_id} is not back in the ISR of {_names(short)} after "
                        f"{self.timeout_s:g} s: the roll stops here (broker {broker_id} runs; "
                        "`metactl describe --under-replicated-partitions` shows what is short)"
                    )
                if now - said >= PROGRESS_EVERY_S:
                    done = len(awaits) - len(short)
                    self.say(
                        f"  broker {broker_id} back in {done} of {len(awaits)} ISR(s); "
                        f"waiting for {_names(short)}"
                    )
                    said = now
                await asyncio.sleep(POLL_S)
            every = await _partitions(client, None)
        below = sorted(tp for tp, p in every.items() if len(p.isr) < p.min_isr)
        if below:
            listed = ", ".join(
                f"{t}-{i} (ISR {','.join(map(str, every[(t, i)].isr)) or '-'}, MinISR "
                f"{every[(t, i)].min_isr})"
                for t, i in below[:SHOWN]
            )
            more = f" and {len(below) - SHOWN} more" if len(below) > SHOWN else ""
            self.say(f"  below MinISR now: {len(below)} partition(s): {listed}{more}")
        else:
            self.say(f"  every partition at or above MinISR ({len(every)} partition(s))")
        return len(below)

    # --- asking the controller ------------------------------------------------------------

    def _plan(self) -> PlanRollResponse:
        r = self._ask(PlanRollRequest(limit=MAX_PLAN_LIST_ITEMS))
        if not isinstance(r, PlanRollResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__}")
        return r

    def _ask(self, body: Message) -> Message:
        t = self.target

        async def one() -> Message:
            async with t.security.controller_client(t.bootstrap) as client:
                return await ask(client, body, ASK_S)

        return asyncio.run(one())


async def _partitions(
    client: RpcClient, topics: list[str] | None
) -> dict[tuple[str, int], PartitionState]:
    """Every partition of `topics` (None: of every topic) as the controller has it
    committed; a topic deleted meanwhile has none."""
    out: dict[tuple[str, int], PartitionState] = {}
    wanted: list[str | None] = [None] if topics is None else list(topics)
    for topic in wanted:
        request = DescribeClusterRequest(topic=topic, broker_limit=0, recoveries_within_ms=0)
        try:
            async for page in pages(client, request, timeout_s=ASK_S):
                out.update(((p.topic, p.partition), p) for p in page.partitions)
        except UnknownTopicOrPartitionError:
            continue
    return out


def _down(reason: str) -> str:
    return "fenced: down already" if reason == "fenced" else "in controlled shutdown"


def _names(tps: Sequence[tuple[str, int]]) -> str:
    shown = ", ".join(f"{t}-{i}" for t, i in tps[:SHOWN])
    return shown + (f" and {len(tps) - SHOWN} more" if len(tps) > SHOWN else "")


def _ready_fields(ready: str) -> dict[str, str]:
    """``READY broker=3 epoch=57 ...`` as its fields."""
    return dict(p.split("=", 1) for p in ready.split()[1:] if "=" in p)
