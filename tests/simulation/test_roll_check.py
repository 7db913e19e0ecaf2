"""The roll checker (simulation/roll_check.py) against the planner (planning/roll.py).

A plan's steps, followed through the controller's core step by step as the brokers
would carry them out (its own events, the controller's work budget), never take a
partition below its floor; a planted bug (a plan that restarts a broker the planner
found blocked, or restarts a blocked broker before the lagging replica that frees it)
is caught at that step, naming the partition; a plan that awaits a partition the broker
cannot be back in is caught too. A property test does the same for random clusters.
"""

from __future__ import annotations

import os

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.config import ControllerConfig
from planning.restart import plan_restart
from planning.roll import plan_roll
from protocol.messages.plan import PlanRollResponse, RollStep, TopicPartitions
from simulation.roll_check import Violation, check_roll
from tests.controller.testkit import Cluster

NOW = 1_000_000
EXAMPLES = int(os.environ.get("METACTL_HYPOTHESIS_EXAMPLES", "60"))


def planned(c: Cluster) -> PlanRollResponse:
    return plan_roll(c.image, rules=c.rules, now_ms=NOW)


def blocked_cluster() -> Cluster:
    """b: replicas [1,2], MinISR 2 (blocks 1 and 2); d: replicas [3,4,1], MinISR 2."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("b", assignments=[[1, 2]], min_isr=2)
    c.create("d", assignments=[[3, 4, 1]], min_isr=2)
    return c


def test_the_plan_of_a_healthy_cluster_keeps_min_isr_at_every_core_step() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", partitions=30, replication_factor=3, min_isr=2)
    plan = planned(c)
    check = check_roll(c.image, plan.steps, rules=c.rules, now_ms=NOW)
    assert check.ok, check
    assert check.steps == 3 and check.core_steps >= 3 * 4


def test_a_planted_step_that_restarts_a_blocking_broker_is_caught() -> None:
    c = blocked_cluster()
    plan = planned(c)
    assert [s.broker_id for s in plan.steps] == [4, 3] and plan.blocked == [1, 2]
    assert check_roll(c.image, plan.steps, rules=c.rules, now_ms=NOW).ok
    for bad in (1, 2):
        planted = [*plan.steps, RollStep(broker_id=bad, leads=0, at_min_isr=0, await_count=0,
                                         awaits=[])]  # fmt: skip
        check = check_roll(c.image, planted, rules=c.rules, now_ms=NOW)
        assert not check.ok
        (v,) = check.violations
        assert (v.step, v.broker_id, v.event, v.topic, v.partition) == (
            2, bad, "controlled shutdown", "b", 0
        )  # fmt: skip
        assert (v.isr_before, v.isr, v.min_isr) == ([1, 2], [3 - bad], 2)


def test_a_planted_order_that_skips_the_lagging_replica_is_caught() -> None:
    """a: replicas [1,2,3], ISR [1,2] (3 lags), MinISR 2: the plan is [3, 2, 1]; 1 before
    3 takes a-0 to ISR [2]."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("a", assignments=[[1, 2, 3]], min_isr=2)
    c.alter([1, 2], topic="a")
    plan = planned(c)
    assert [s.broker_id for s in plan.steps] == [3, 2, 1]
    assert check_roll(c.image, plan.steps, rules=c.rules, now_ms=NOW).ok
    swapped = [plan.steps[2], plan.steps[0], plan.steps[1]]
    check = check_roll(c.image, swapped, rules=c.rules, now_ms=NOW)
    assert check.violations[0] == Violation(
        step=0, broker_id=1, event="controlled shutdown", topic="a", partition=0,
        isr_before=[1, 2], isr=[2], min_isr=2, leader_before=1, leader=2,
    )  # fmt: skip


def test_an_await_the_broker_cannot_meet_is_caught_and_a_down_broker_refused() -> None:
    c = blocked_cluster()
    plan = planned(c)
    wrong = msgspec.structs.replace(
        plan.steps[0], awaits=[TopicPartitions(topic="b", partitions=[0])]
    )  # broker 4 hosts no replica of b-0
    check = check_roll(c.image, [wrong], rules=c.rules, now_ms=NOW)
    assert [(m.step, m.broker_id, m.topic, m.partition) for m in check.missing] == [(0, 4, "b", 0)]
    c.fence(4)
    check = check_roll(c.image, plan.steps, rules=c.rules, now_ms=NOW)
    assert check.steps == 0 and check.refused and "broker 4" in check.refused[0]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """KIP-966's rules or the classic ones (with or without their unclean leader
    election); 3-5 brokers; 1-3 topics of 1-4 partitions, random placement, RF and
    MinISR; then some ISRs shrunk by their leaders (lagging followers), a broker or two
    fenced (one maybe back cleanly), one maybe in controlled shutdown."""
    n = draw(st.integers(3, 5))
    brokers = list(range(1, n + 1))
    elr = draw(st.booleans())
    unclean = not elr and draw(st.booleans())  # the classic unclean leader election
    c = Cluster(ControllerConfig(eligible_leader_replicas=elr, unclean_leader_election=unclean))
    c.start(*brokers)
    for t in range(draw(st.integers(1, 3))):
        rf = draw(st.integers(1, 3))
        parts = [draw(st.permutations(brokers))[:rf] for _ in range(draw(st.integers(1, 4)))]
        c.create(f"t{t}", assignments=parts, min_isr=draw(st.integers(1, rf)))
    for tp in sorted(c.image.partitions):
        p = c.image.partitions[tp]
        if draw(st.booleans()) and len(p.isr) > 1:
            keep = [b for b in sorted(p.isr) if b == p.leader or draw(st.booleans())]
            c.alter(keep, topic=tp[0], partition=tp[1])
    for b in draw(st.lists(st.sampled_from(brokers), max_size=2, unique=True)):
        c.fence(b)
        if draw(st.booleans()):
            c.restart(b, clean=draw(st.booleans()))
    if draw(st.booleans()):
        b = draw(st.sampled_from(brokers))
        if c.image.is_active(b):
            c.shutdown(b)
    return c


@settings(
    max_examples=EXAMPLES, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(c=clusters())
def test_random_clusters_plans_hold_and_blocked_brokers_are_truly_blocked(c: Cluster) -> None:
    plan = planned(c)
    active = sorted(b for b in c.image.brokers if c.image.is_active(b))
    rolled = [s.broker_id for s in plan.steps]
    assert sorted(rolled + plan.blocked) == active  # every active broker, once
    check = check_roll(c.image, plan.steps, rules=c.rules, now_ms=NOW)
    assert check.ok, check
    # Each blocked broker, restarted once the roll is done, sinks a partition it blocks on.
    for b in plan.blocked:
        planted = [*plan.steps, RollStep(broker_id=b, leads=0, at_min_isr=0, await_count=0,
                                         awaits=[])]  # fmt: skip
        bad = check_roll(c.image, planted, rules=c.rules, now_ms=NOW)
        hit = {(v.topic, v.partition) for v in bad.violations if v.broker_id == b}
        blocks = {(p.topic, p.partition) for p in plan.blocking if b in p.blocks}
        assert hit and hit <= blocks, (b, bad.violations, plan.blocking)
    # A broker whose clean restart now keeps every partition at or above MinISR, and
    # every leader, elected cleanly, is rolled.
    for b in active:
        clean = plan_restart(c.image, b, rules=c.rules, now_ms=NOW).clean
        if not (clean.under_min_isr.count or clean.leader_lost.count):
            assert b in rolled or clean.unclean_recovery.count
