"""The scenario runner: a deterministic what-if tool over the real controller and log.

The runner drives the real `controller.runtime.driver.Controller` on a real metadata log
with a virtual clock and simulated brokers (they heartbeat implicitly, answer log
inspections instantly while active, and register/unfence when told). No network is
involved.

This module carries out the steps of a `Scenario` (`run_scenario`, `ScenarioRun`) and
reports each as a `StepReport`. The file format and its validation belong to
`simulation.scenario_format`, the report structs and expectation checks to
`simulation.scenario_report`, printing to `ops.scenario_cmds`. It must not have rules of
its own: every decision is the controller's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controller.core.recovery.tracker import Inspection
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from metactl.errors import MetactlError, ScenarioError, error_for_code
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.state import parse_tp
from metadata_log.backends import open_store
from metadata_log.records import BROKER_RESOURCE, NO_LEADER, TOPIC_RESOURCE, MetadataRecord
from metadata_log.store import LogStore
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
)
from protocol.messages.broker_controller import AlterPartition, IsrMember, RegisterBroker
from protocol.messages.internal import (
    ControlledShutdown,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)
from protocol.messages.unions import ControllerRequest
from simulation.scenario_format import (
    AlterConfigStep,
    AlterPartitionStep,
    DeleteConfigStep,
    Scenario,
    Step,
)
from simulation.scenario_report import (
    StepReport,
    Summary,
    TopicIds,
    check_expectation,
    delta_events,
    snapshot_state,
    snapshot_topics,
)


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
        elif a == "delete_topic":
            r = await self.submit(DeleteTopic(name=arg))
            return f"topic_id={r.topic_id}"
        elif a == "add_partitions":
            r = await self.submit(
                CreatePartitions(topic=arg.topic, count=arg.count, assignments=arg.assignments)
            )
            return f"assignments={getattr(r, 'assignments', None)}"
        elif a in ("alter_config", "delete_config"):
            r = await self.submit(self._configs(arg))
            return f"cleared_topics={r.cleared_topics}"
        elif a in ("upgrade_feature", "downgrade_feature"):
            r = await self.submit(
                UpdateFeature(
                    name=arg.name,
                    level=arg.level,
                    upgrade_type="upgrade" if a == "upgrade_feature" else "downgrade",
                )
            )
            return f"level={r.level} cleared_topics={r.cleared_topics}"
        elif a in ("reassign", "cancel_reassignment"):
            topic, part = parse_tp(arg.partition if a == "reassign" else arg)
            replicas = arg.replicas if a == "reassign" else None
            r = await self.submit(
                AlterPartitionReassignments(
                    reassignments=[Reassignment(topic=topic, partition=part, replicas=replicas)]
                )
            )
            for result in r.results:  # each partition succeeds or fails alone
                if result.error_code is not None:
                    raise error_for_code(result.error_code, result.message)
        elif a == "unregister":
            await self.submit(UnregisterBroker(broker_id=arg))
        elif a == "restart_controller":
            await self.close()
            await self.open()
            await self.submit_tick()  # pending recoveries start over from the reloaded image
        elif a == "snapshot":
            offset = await self.controller.write_snapshot()
            return f"snapshot at offset {offset}"
        return ""

    @staticmethod
    def _configs(arg: AlterConfigStep | DeleteConfigStep) -> AlterConfigs:
        if arg.topic is not None:
            kind, name = TOPIC_RESOURCE, arg.topic
        else:  # the cluster default is the broker resource with no name (--entity-default)
            kind, name = BROKER_RESOURCE, "" if arg.cluster_default else str(arg.broker)
        if isinstance(arg, DeleteConfigStep):
            return AlterConfigs(resource_type=kind, resource_name=name, delete_configs=[arg.name])
        return AlterConfigs(
            resource_type=kind,
            resource_name=name,
            set_configs={k: str(v) for k, v in arg.set_configs.items()},
            delete_configs=arg.delete,
        )

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
            topic_ids = TopicIds()
            topic_ids.see(snapshot_topics(run.controller)[0])
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
                topics, cluster = snapshot_topics(run.controller)
                topic_ids.see(topics)
                if step.action == "expect":
                    failures.extend(
                        check_expectation(
                            step.arg,
                            parts,
                            brokers,
                            topics=topics,
                            cluster=cluster,
                            topic_ids=topic_ids,
                        )
                    )
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
                    topics=topics,
                    cluster=cluster,
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
