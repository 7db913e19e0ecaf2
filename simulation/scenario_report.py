"""What the scenario runner reports after each step, and how expectations are checked.

A `StepReport` holds the state after a step (every partition as a `PartitionReport`,
every broker as a `BrokerReport`), the step's elections and unclean recoveries (from the
committed deltas, `delta_events`) and the differences between an `expect` step and that
state (`check_expectation`); a `Summary` closes a run.

This module only describes and compares state. It must not change the controller or
submit anything to it, nor print (printing belongs to `ops.scenario_cmds`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from controller.runtime.driver import Controller
from metadata_image.delta import MetadataDelta
from metadata_image.image import PartitionState, tp_name
from metadata_log.records import NO_LEADER, ElectionKind, LeaderRecoveryState
from simulation.scenario_format import ExpectStep


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
