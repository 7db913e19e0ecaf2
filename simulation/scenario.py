"""The scenario runner: a deterministic what-if tool over the real controller and log.

A scenario file (YAML) names a config, brokers, topics and steps. The runner drives the
real `controller.runtime.driver.Controller` on a real metadata log with a virtual clock and
simulated brokers (they heartbeat implicitly, answer log inspections instantly while
active, and register/unfence when told). No network is involved.

This module parses and validates files (`load_scenario`), runs them (`run_scenario`)
and reports each step as a `StepReport`; printing belongs to `ops.scenario_cmds`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import Inspection
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from metactl.errors import MetactlError, ScenarioError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage, PartitionState, parse_tp, tp_name
from metadata_log.records import (
    NO_LEADER,
    ElectionKind,
    LeaderRecoveryState,
    MetadataRecord,
)
from metadata_log.store import LogStore, open_store
from protocol.messages import (
    AlterPartition,
    ControlledShutdown,
    ControllerRequest,
    CreateTopic,
    ElectLeader,
    FenceBroker,
    IsrMember,
    RegisterBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

# --- file format ------------------------------------------------------------------------


class _Spec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class BrokerSpec(_Spec, frozen=True):
    id: int
    rack: str | None = None


class TopicSpec(_Spec, frozen=True):
    name: str
    partitions: list[list[int]]
    min_insync_replicas: int | None = None
    unclean_recovery_strategy: str | None = None


class AlterPartitionStep(_Spec, frozen=True):
    partition: str
    isr: list[int]
    leader: int | None = None
    partition_epoch: int | None = None
    leader_epoch: int | None = None
    member_epochs: dict[int, int] = {}


class RegisterStep(_Spec, frozen=True):
    broker: int
    clean: bool | None = None
    previous_epoch: int | None = None


class RestartStep(_Spec, frozen=True):
    broker: int
    clean: bool


class ReplicaLogStep(_Spec, frozen=True):
    broker: int
    partition: str
    last_leader_epoch: int = 0
    log_end_offset: int = 0


class ElectStep(_Spec, frozen=True):
    partition: str
    type: Literal["preferred", "unclean"]
    replica: int | None = None


class CreateTopicStep(_Spec, frozen=True):
    name: str
    replication_factor: int | None = None
    partitions: int | None = None
    assignments: list[list[int]] | None = None
    min_insync_replicas: int | None = None
    unclean_recovery_strategy: str | None = None


class ExpectStep(_Spec, frozen=True):
    partition: str | None = None
    broker: int | None = None
    leader: int | msgspec.UnsetType | None = msgspec.UNSET  # null: expect no leader
    leader_epoch: int | None = None
    partition_epoch: int | None = None
    isr: list[int] | None = None
    elr: list[int] | None = None
    last_known_elr: list[int] | None = None
    recovering: bool | None = None
    recovery_pending: list[int] | bool | None = None
    min_isr: int | None = None
    replicas: list[int] | None = None
    epoch: int | None = None
    fenced: bool | None = None
    controlled_shutdown: bool | None = None


STEP_TYPES: dict[str, Any] = {
    "alter_partition": AlterPartitionStep,
    "fence": int,
    "controlled_shutdown": int,
    "register": RegisterStep,
    "unfence": int,
    "restart": RestartStep,
    "replica_log": ReplicaLogStep,
    "advance_ms": int,
    "elect": ElectStep,
    "create_topic": CreateTopicStep,
    "restart_controller": None,
    "snapshot": None,
    "expect": ExpectStep,
    "expect_error": str,
}


class Step(msgspec.Struct, frozen=True):
    index: int
    action: str
    arg: Any


class Scenario(msgspec.Struct, frozen=True):
    config: ControllerConfig
    brokers: list[BrokerSpec]
    topics: list[TopicSpec]
    steps: list[Step]
    source: str = ""


def _convert(value: Any, type_: Any, where: str) -> Any:
    try:
        return msgspec.convert(value, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    text = Path(path).read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return parse_scenario(doc, source=str(path))


def parse_scenario(doc: Any, source: str = "") -> Scenario:
    if not isinstance(doc, dict):
        raise ScenarioError(
            f"{source}: a scenario is a mapping with config, brokers, topics, steps"
        )
    unknown = set(doc) - {"config", "brokers", "topics", "steps", "description"}
    if unknown:
        raise ScenarioError(f"{source}: unknown top-level field(s) {sorted(unknown)}")
    config = _convert(doc.get("config") or {}, ControllerConfig, "config")
    brokers = [
        _convert({"id": b} if isinstance(b, int) else b, BrokerSpec, f"brokers[{i}]")
        for i, b in enumerate(doc.get("brokers") or [])
    ]
    topics = [_convert(t, TopicSpec, f"topics[{i}]") for i, t in enumerate(doc.get("topics") or [])]
    raw_steps = doc.get("steps") or []
    if not isinstance(raw_steps, list):
        raise ScenarioError("steps: expected a list")
    steps: list[Step] = []
    for i, raw in enumerate(raw_steps, start=1):
        if isinstance(raw, str) and raw in {"restart_controller", "snapshot"}:
            steps.append(Step(i, raw, None))
            continue
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ScenarioError(
                f"step {i}: expected one action as a single-key mapping, got {raw!r}"
            )
        ((action, arg),) = raw.items()
        if action not in STEP_TYPES:
            raise ScenarioError(
                f"step {i}: unknown action {action!r} (known: {', '.join(STEP_TYPES)})"
            )
        type_ = STEP_TYPES[action]
        value = None if type_ is None else _convert(arg, type_, f"step {i} ({action})")
        if isinstance(value, ExpectStep) and (value.partition is None) == (value.broker is None):
            raise ScenarioError(f"step {i} (expect): give exactly one of `partition` or `broker`")
        if isinstance(value, ExpectStep | AlterPartitionStep | ReplicaLogStep | ElectStep):
            _check_tp(value.partition, f"step {i} ({action}): field `partition`")
        if isinstance(value, RegisterStep) and value.clean is None and value.previous_epoch is None:
            raise ScenarioError(f"step {i} (register): give `clean` or `previous_epoch`")
        if action == "expect_error" and not steps:
            raise ScenarioError(f"step {i} (expect_error): there is no previous step")
        steps.append(Step(i, action, value))
    return Scenario(config=config, brokers=brokers, topics=topics, steps=steps, source=source)


def _check_tp(name: str | None, where: str) -> None:
    if name is None:
        return
    try:
        parse_tp(name)
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


# --- reports ----------------------------------------------------------------------------


class PartitionReport(msgspec.Struct, frozen=True):
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


class BrokerReport(msgspec.Struct, frozen=True):
    epoch: int
    fenced: bool
    controlled_shutdown: bool


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


# --- running ----------------------------------------------------------------------------


class _SimulatedBrokers:
    """Brokers that answer log inspections at once, from `replica_log` steps (default 0, 0)."""

    def __init__(self) -> None:
        self.logs: dict[tuple[int, str, int], tuple[int, int]] = {}
        self.outbox: list[Inspection] = []
        self.incarnations: dict[int, int] = {}

    def incarnation(self, broker: int) -> str:
        n = self.incarnations.get(broker, 0) + 1
        self.incarnations[broker] = n
        return f"broker-{broker}-incarnation-{n}"

    def on_inspection(self, inspection: Inspection) -> None:
        self.outbox.append(inspection)


class ScenarioRun:
    def __init__(self, scenario: Scenario, data_dir: Path) -> None:
        self.scenario = scenario
        self.data_dir = data_dir
        self.clock = VirtualClock(0)
        self.sim = _SimulatedBrokers()
        self.store: LogStore | None = None
        self.ctl: Controller | None = None
        self.step_events: list[dict[str, Any]] = []
        self.potential_data_loss = 0

    @property
    def controller(self) -> Controller:
        assert self.ctl is not None
        return self.ctl

    async def open(self) -> None:
        self.store = await open_store(self.data_dir)
        self.ctl = await Controller.open(self.store, config=self.scenario.config, clock=self.clock)
        self.ctl.inspection_sinks.append(self.sim.on_inspection)
        self.ctl.commit_listeners.append(self._on_commit)

    async def close(self) -> None:
        if self.ctl is not None:
            await self.ctl.close()
        if self.store is not None:
            await self.store.close()
        self.ctl = self.store = None

    def _on_commit(
        self, offset: int, records: Sequence[MetadataRecord], delta: MetadataDelta, now_ms: int
    ) -> None:
        self.step_events.extend(delta_events(delta))
        self.potential_data_loss += sum(
            1 for r in delta.unclean_recoveries if r.potential_data_loss
        )

    async def submit(self, request: ControllerRequest) -> Any:
        response = await self.controller.submit(request)
        await self._answer_inspections()
        return response

    async def _answer_inspections(self) -> None:
        while self.sim.outbox:
            insp = self.sim.outbox.pop(0)
            b = self.controller.image.broker(insp.broker_id)
            if b is None or not b.active or b.epoch != insp.broker_epoch:
                continue  # a replica answers only while its broker is active
            lle, leo = self.sim.logs.get((insp.broker_id, insp.topic, insp.partition), (0, 0))
            try:
                await self.controller.submit(
                    ReplicaLogInfo(
                        broker_id=insp.broker_id,
                        broker_epoch=insp.broker_epoch,
                        topic=insp.topic,
                        partition=insp.partition,
                        last_leader_epoch=lle,
                        log_end_offset=leo,
                    )
                )
            except MetactlError:
                continue

    def epoch(self, broker: int) -> int:
        b = self.controller.image.broker(broker)
        return -1 if b is None else b.epoch

    async def setup(self) -> None:
        for b in self.scenario.brokers:
            await self.submit(
                RegisterBroker(
                    broker_id=b.id, incarnation_id=self.sim.incarnation(b.id), rack=b.rack
                )
            )
            await self.submit(UnfenceBroker(broker_id=b.id, broker_epoch=self.epoch(b.id)))
        for t in self.scenario.topics:
            await self.submit(
                CreateTopic(
                    name=t.name,
                    assignments=t.partitions,
                    min_isr=t.min_insync_replicas,
                    recovery_strategy=t.unclean_recovery_strategy,
                )
            )

    async def advance(self, ms: int) -> None:
        target = self.clock.now_ms() + ms
        while (d := self.controller.next_deadline_ms) is not None and d <= target:
            self.clock.set(max(d, self.clock.now_ms()))
            await self.submit_tick()
        self.clock.set(target)
        await self.submit_tick()

    async def submit_tick(self) -> None:
        await self.controller.tick()
        await self._answer_inspections()

    async def register(self, broker: int, previous_epoch: int | None) -> None:
        await self.submit(
            RegisterBroker(
                broker_id=broker,
                incarnation_id=self.sim.incarnation(broker),
                previous_epoch=previous_epoch,
            )
        )

    async def do(self, step: Step) -> str:
        """Carry out one step; returns a short detail line."""
        a, arg = step.action, step.arg
        image: ClusterImage = self.controller.image
        if a == "fence":
            await self.submit(FenceBroker(broker_id=arg, reason="scenario"))
        elif a == "unfence":
            await self.submit(UnfenceBroker(broker_id=arg, broker_epoch=self.epoch(arg)))
        elif a == "controlled_shutdown":
            r = await self.submit(ControlledShutdown(broker_id=arg, broker_epoch=self.epoch(arg)))
            return f"can_stop={r.can_stop}"
        elif a == "register":
            prev = arg.previous_epoch
            if prev is None and arg.clean:
                prev = self.epoch(arg.broker)
            await self.register(arg.broker, prev)
        elif a == "restart":
            b = image.broker(arg.broker)
            previous = self.epoch(arg.broker) if arg.clean else None
            if b is not None and not b.fenced:
                await self.submit(FenceBroker(broker_id=arg.broker, reason="scenario_restart"))
            await self.register(arg.broker, previous)
            await self.submit(
                UnfenceBroker(broker_id=arg.broker, broker_epoch=self.epoch(arg.broker))
            )
        elif a == "replica_log":
            topic, part = parse_tp(arg.partition)
            self.sim.logs[(arg.broker, topic, part)] = (arg.last_leader_epoch, arg.log_end_offset)
        elif a == "advance_ms":
            if arg < 0:
                raise ScenarioError(f"step {step.index} (advance_ms): time cannot go back")
            await self.advance(arg)
        elif a == "alter_partition":
            await self.submit(self._alter(image, arg))
        elif a == "elect":
            topic, part = parse_tp(arg.partition)
            r = await self.submit(
                ElectLeader(
                    topic=topic, partition=part, election_type=arg.type, replica=arg.replica
                )
            )
            return f"leader={r.leader}"
        elif a == "create_topic":
            r = await self.submit(
                CreateTopic(
                    name=arg.name,
                    partitions=arg.partitions,
                    replication_factor=arg.replication_factor,
                    assignments=arg.assignments,
                    min_isr=arg.min_insync_replicas,
                    recovery_strategy=arg.unclean_recovery_strategy,
                )
            )
            return f"assignments={r.assignments}"
        elif a == "restart_controller":
            await self.close()
            await self.open()
            await self.submit_tick()  # pending recoveries start over from the reloaded image
        elif a == "snapshot":
            offset = await self.controller.write_snapshot()
            return f"snapshot at offset {offset}"
        return ""

    def _alter(self, image: ClusterImage, arg: AlterPartitionStep) -> AlterPartition:
        topic, part = parse_tp(arg.partition)
        p = image.partition((topic, part))
        leader = arg.leader if arg.leader is not None else (p.leader if p else NO_LEADER)
        return AlterPartition(
            topic=topic,
            partition=part,
            leader=leader,
            broker_epoch=arg.member_epochs.get(leader, self.epoch(leader)),
            partition_epoch=(
                arg.partition_epoch
                if arg.partition_epoch is not None
                else (p.partition_epoch if p else 0)
            ),
            leader_epoch=arg.leader_epoch,
            isr=[
                IsrMember(broker_id=b, broker_epoch=arg.member_epochs.get(b, self.epoch(b)))
                for b in arg.isr
            ],
        )


def check_expectation(
    exp: ExpectStep, parts: dict[str, PartitionReport], brokers: dict[str, BrokerReport]
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

    if exp.partition is not None:
        p = parts.get(exp.partition)
        if p is None:
            return [f"partition {exp.partition} does not exist"]
        if exp.leader is not msgspec.UNSET:
            cmp("leader", exp.leader, p.leader)
        for field in ("leader_epoch", "partition_epoch", "recovering", "min_isr"):
            want = getattr(exp, field)
            if want is not None:
                cmp(field, want, getattr(p, field))
        for field in ("isr", "elr", "last_known_elr"):
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
    else:
        b = brokers.get(str(exp.broker))
        if b is None:
            return [f"broker {exp.broker} is not registered"]
        for field in ("epoch", "fenced", "controlled_shutdown"):
            want = getattr(exp, field)
            if want is not None:
                cmp(field, want, getattr(b, field))
    return diffs


async def run_scenario(
    scenario: Scenario,
    data_dir: Path | None = None,
    on_step: Callable[[StepReport], None] | None = None,
) -> tuple[list[StepReport], Summary]:
    """Run every step; never raises for a step's own error (that is reported)."""
    with tempfile.TemporaryDirectory(prefix="metactl-scenario-") as tmp:
        run = ScenarioRun(scenario, data_dir or Path(tmp))
        await run.open()
        try:
            await run.setup()
            reports: list[StepReport] = []
            failed = 0
            last_error: str | None = None
            for step in scenario.steps:
                run.step_events = []
                error: str | None = None
                failures: list[str] = []
                detail = ""
                if step.action == "expect_error":
                    if last_error != step.arg:
                        outcome = "succeeded" if last_error is None else f"failed with {last_error}"
                        failures.append(
                            f"expected the previous step to fail with {step.arg}, it {outcome}"
                        )
                elif step.action != "expect":
                    try:
                        detail = await run.do(step)
                    except MetactlError as exc:
                        error = exc.code
                        detail = exc.message
                parts, brokers = snapshot_state(run.controller)
                if step.action == "expect":
                    failures.extend(check_expectation(step.arg, parts, brokers))
                # An error is expected only if the next step says so.
                nxt = scenario.steps[step.index] if step.index < len(scenario.steps) else None
                if error is not None and (nxt is None or nxt.action != "expect_error"):
                    failures.append(f"unexpected error {error}: {detail}")
                failed += len(failures) > 0
                report = StepReport(
                    step=step.index,
                    action=step.action,
                    ok=error is None and not failures,
                    error=error,
                    partitions=parts,
                    brokers=brokers,
                    events=run.step_events,
                    failures=failures,
                    detail=detail,
                )
                reports.append(report)
                if on_step is not None:
                    on_step(report)
                if step.action not in ("expect", "expect_error"):
                    last_error = error
            store = run.store
            assert store is not None
            summary = Summary(
                steps=len(scenario.steps),
                failed_expectations=failed,
                log_end_offset=store.end_offset,
                potential_data_loss_events=run.potential_data_loss,
            )
            return reports, summary
        finally:
            await run.close()
