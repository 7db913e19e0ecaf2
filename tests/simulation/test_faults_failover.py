"""Controller failover in `metactl simulate faults`: a standby takes over from the durable
log as `controller.runtime` does (the session grace, pending recoveries started over,
an unfinished metadata transaction aborted), with the same event step.

The hand-made schedule: 3 brokers, 2 partitions, work budget 1 (every fence is a
transaction of two slices); broker 1 is killed at 2 s and fenced by session expiry some
9-10 s later; a `mid_transaction` failover armed at 6 s strikes inside that fence, after
its first slice is durable. The new controller must abort it, and the controller's state
must be the replay of the durable log. A planted bug, a takeover that does not abort the
transaction the log ends inside (`controller.runtime.driver.unfinished_transaction_abort`
returning None, the code on disk untouched), must be caught.

Fixed seeds, virtual time: every number here is deterministic.
"""

from __future__ import annotations

import msgspec
import pytest

from controller.runtime import driver
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
)
from simulation.faults import run_faults
from simulation.faults_schedule import Fault, Mode, Schedule, generate
from simulation.faults_sim import FaultSim

SLICED = Mode(work_budget=1)

TORN_FENCE = Schedule(
    seed=1,
    brokers=3,
    partitions=2,
    faults=[
        Fault(at_ms=2_000, kind="kill", broker=1, for_ms=15_000),
        Fault(at_ms=6_000, kind="failover", broker=0, for_ms=2_000, mid_transaction=True),
    ],
    flush_ms=[1_000, 1_000, 1_000],
    drop=0.0,
    max_delay_ms=5,
)


def markers(sim: FaultSim) -> list[tuple[int, str]]:
    kinds = (BeginTransactionRecord, EndTransactionRecord, AbortTransactionRecord)
    return [(i, type(r).__name__) for i, r in enumerate(sim.durable) if isinstance(r, kinds)]


def test_a_failover_inside_a_transaction_aborts_it_and_state_is_the_log_replay() -> None:
    sim = FaultSim(TORN_FENCE, SLICED)
    takeovers: list[bool] = []
    take_over = sim._take_over

    def checked(arg: None) -> None:
        take_over(arg)
        # Right after the takeover: the new controller's image is the durable log's replay.
        replayed = replay_log(LogReplay(), sim.durable)
        takeovers.append(replayed.transaction is None and replayed.image == sim.core.image)

    sim._take_over = checked  # type: ignore[method-assign,assignment]
    out = sim.run()
    assert out.failovers == 1 and out.aborted_transactions == 1
    assert takeovers == [True]
    assert out.violations == [] and out.lost_silent == 0
    # The fence's transaction: begun, its first slice durable, aborted by the next
    # controller, then fenced again after the grace in a transaction that ends.
    found = markers(sim)
    aborted = [i for i, kind in found if kind == "AbortTransactionRecord"]
    assert len(aborted) == 1
    begin = max(i for i, kind in found if kind == "BeginTransactionRecord" and i < aborted[0])
    assert getattr(sim.durable[begin], "name", "") == "FenceBroker 1"
    assert aborted[0] - begin >= 2  # the begin marker and the first slice's record(s)
    assert any(kind == "EndTransactionRecord" and i > aborted[0] for i, kind in found)
    # Nothing of the aborted slice took effect: the state is the replay of the log.
    replayed = replay_log(LogReplay(), sim.durable)
    assert replayed.transaction is None and replayed.image == sim.core.image
    assert sim.core.image.end_offset == len(sim.durable)
    # Broker 1, fenced by the new controller after its grace, came back at 17 s.
    assert sim.core.image.brokers[1].fenced is False


def test_a_failover_gives_sessions_grace_and_restarts_recoveries() -> None:
    """The takeover starts from `ControllerState(image)`: no pending recovery, everything
    queued for evaluation; and fresh broker sessions."""
    sim = FaultSim(TORN_FENCE, SLICED)
    seen: list[tuple[int, bool, object]] = []
    take_over = sim._take_over

    def look(arg: None) -> None:
        old_sessions = sim.sessions
        take_over(arg)
        seen.append((sim.now, sim.sessions is not old_sessions, sim.core.tracker.pending))

    sim._take_over = look  # type: ignore[method-assign,assignment]
    sim.run()
    assert len(seen) == 1
    now, fresh, pending = seen[0]
    assert fresh and not pending
    assert now >= 8_000  # armed at 6 s, struck inside the fence, then 2 s without one


def test_planted_bug_a_takeover_that_does_not_abort_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert FaultSim(TORN_FENCE, SLICED).run().violations == []
    monkeypatch.setattr(driver, "unfinished_transaction_abort", lambda state: None)
    out = FaultSim(TORN_FENCE, SLICED).run()
    assert out.failed
    assert any(
        v.startswith(("log_replay", "state_differs_from_log_replay")) for v in out.violations
    )


def test_a_plain_failover_writes_no_abort() -> None:
    plain = msgspec.structs.replace(
        TORN_FENCE,
        faults=[
            TORN_FENCE.faults[0],
            msgspec.structs.replace(TORN_FENCE.faults[1], mid_transaction=False),
        ],
    )
    sim = FaultSim(plain, SLICED)
    out = sim.run()
    assert out.failovers == 1 and out.aborted_transactions == 0 and out.violations == []
    assert not any(kind == "AbortTransactionRecord" for _, kind in markers(sim))


def test_failovers_come_from_their_own_stream() -> None:
    """`failovers=0` gives exactly the schedules of before; with failovers, the same
    schedule plus failover faults."""
    for seed in (3, 11, 2026):
        base = generate(seed, failovers=0)
        more = generate(seed, failovers=2)
        assert [f for f in more.faults if f.kind != "failover"] == base.faults
        assert sum(f.kind == "failover" for f in more.faults) == 2
        assert more.ops == base.ops
        assert all(
            f.broker == 0 and 500 <= f.for_ms <= 3_000 for f in more.faults if f.kind == "failover"
        )


def test_elr_with_failovers_loses_nothing_silently_and_aborts_transactions() -> None:
    s = run_faults(schedules=60, seed=1, mode=SLICED, failovers=2)
    assert s.failovers > 60 and s.aborted_transactions > 0
    assert s.lost_silent == 0 and s.invariant_violations == 0, s.failures
    lost = s.lost_reported + s.lost_silent + s.lost_classic
    assert s.present + lost + s.unreadable + s.deleted == s.acknowledged


def test_planted_bug_is_caught_by_random_schedules_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "unfinished_transaction_abort", lambda state: None)
    s = run_faults(schedules=30, seed=1, mode=SLICED, failovers=2)
    assert s.failing_schedules > 0 and s.invariant_violations > 0
