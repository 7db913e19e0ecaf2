"""The automatic preferred-leader balance (controller/core/leader_balance.py) through the
one event step: Kafka's per-broker ratio and strict threshold, the schedule (a check an
interval after leadership leaves a preferred replica, again while any is left so, none
while balanced), the work budget per event, the off switch, and the preferred replicas
it must skip (fenced, out of the ISR, shutting down). A property test checks a whole
check against an independent model on random clusters and budgets."""

from __future__ import annotations

import math
from fractions import Fraction

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.config import ControllerConfig
from controller.core.leader_balance import Check, LeaderBalance, balance_step, over_threshold
from controller.core.step import ControllerState, Rules, StepResult, Tick, settle, step
from controller.core.work import EMPTY_BACKLOG, SWEEP_SCAN
from metactl.errors import InvalidConfigurationError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ElectionKind,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.admin import CreateTopic
from protocol.messages.internal import ControlledShutdown, FenceBroker
from tests.controller.testkit import POLICIES, Cluster

CONTROLLER = settings.get_profile("metactl-controller")
INTERVAL_S = 5
INTERVAL = INTERVAL_S * 1000
CONFIG = ControllerConfig(leader_imbalance_check_interval_seconds=INTERVAL_S)

Spec = tuple[tuple[int, ...], tuple[int, ...], int]  # (replicas, ISR, leader)


def image(
    topics: dict[str, list[Spec]],
    *,
    active: tuple[int, ...] = (1, 2, 3),
    fenced: tuple[int, ...] = (),
    shutting_down: tuple[int, ...] = (),
) -> ClusterImage:
    """An image straight from records: brokers active, fenced or in controlled shutdown,
    and topics of partitions with the given replicas, ISR and leader."""
    records: list[MetadataRecord] = []
    for b in (*active, *shutting_down, *fenced):
        records.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=b))
        if b not in fenced:
            records.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=b))
    for b in shutting_down:
        records.append(
            BrokerRegistrationChangeRecord(broker_id=b, broker_epoch=b, in_controlled_shutdown=True)
        )
    for name, specs in topics.items():
        records.append(TopicRecord(name=name, topic_id=f"id-{name}", partitions=len(specs)))
        for i, (replicas, isr, leader) in enumerate(specs):
            records.append(
                PartitionRecord(
                    topic=name, partition=i, replicas=list(replicas), isr=list(isr), leader=leader
                )
            )
    return replay(ClusterImage(), records)


def due_now(img: ClusterImage, due_ms: int = 0) -> ControllerState:
    """A state whose check is due at `due_ms`, with no recovery work queued."""
    return ControllerState(
        img, backlog=EMPTY_BACKLOG, balance=LeaderBalance(due_ms=due_ms, started=True)
    )


def run_check(
    state: ControllerState, rules: Rules, now: int = 0, max_steps: int = 10_000
) -> tuple[ControllerState, list[StepResult]]:
    """Ticks at `now` until the check under way (or due) ends; every step's result."""
    results = [step(state, Tick(), now, rules)]
    while not results[-1].state.idle:
        assert len(results) < max_steps, "the check never ends"
        results.append(step(results[-1].state, Tick(), now, rules))
    return results[-1].state, results


def leaders(img: ClusterImage, topic: str = "t") -> list[int]:
    return [img.partitions[(topic, i)].leader for i in range(img.topics[topic].partitions)]


def balance_records(results: list[StepResult]) -> list[PartitionChangeRecord]:
    out = [r for res in results for r in res.records]
    assert all(isinstance(r, PartitionChangeRecord) for r in out)
    return out  # type: ignore[return-value]


# --- the threshold -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "not_led", "percentage", "over"),
    [
        (10, 1, 10, False),  # exactly 10 %: not above
        (10, 2, 10, True),
        (1, 1, 10, True),
        (3, 0, 0, False),  # nothing to move back, even at 0 %
        (3, 1, 0, True),
        (4, 4, 100, False),  # 100 %: never above
        (0, 0, 10, False),  # preferred for nothing
    ],
)
def test_the_ratio_must_be_above_the_percentage(
    preferred: int, not_led: int, percentage: int, over: bool
) -> None:
    assert over_threshold(preferred, not_led, percentage) is over


@settings(CONTROLLER)
@given(st.integers(1, 10_000), st.data(), st.integers(0, 100))
def test_the_ratio_is_exact(preferred: int, data: st.DataObject, percentage: int) -> None:
    not_led = data.draw(st.integers(0, preferred))
    expected = Fraction(not_led, preferred) > Fraction(percentage, 100)
    assert over_threshold(preferred, not_led, percentage) is expected


# --- a broker comes back -----------------------------------------------------------------


def test_a_returning_broker_gets_its_preferred_leaderships_back_without_elect() -> None:
    c = Cluster(CONFIG)
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2]])
    assert c.state.balance == LeaderBalance(due_ms=INTERVAL, started=True)  # a new state
    c.now = INTERVAL
    assert c.evaluate().records == []  # balanced: the check finds nothing
    assert c.state.balance == LeaderBalance(due_ms=None, started=True)
    assert c.last is not None and c.last.wake_ms is None
    c.now = 10_000
    c.fence(1)  # leadership leaves broker 1: a check is scheduled an interval later
    assert leaders(c.image) == [2, 2, 3, 3]
    assert c.state.balance.due_ms == 10_000 + INTERVAL == c.last.wake_ms
    c.restart(1, clean=True)
    for i in (0, 3):
        c.alter(sorted(c.p("t", i).isr | {1}), "t", i)  # caught up: back in the ISR
    c.now = 10_000 + INTERVAL - 1
    assert c.evaluate().records == [] and leaders(c.image) == [2, 2, 3, 3]  # not yet due
    c.now = 10_000 + INTERVAL
    result = c.evaluate()
    assert leaders(c.image) == [1, 2, 3, 1]
    assert [(r.partition, r.leader, r.election, r.reason) for r in result.records] == [
        (0, 1, ElectionKind.PREFERRED, ChangeReason.LEADER_BALANCE),
        (3, 1, ElectionKind.PREFERRED, ChangeReason.LEADER_BALANCE),
    ]
    assert all(r.isr is None for r in result.records)  # rule 8: the ISR stays
    # Balanced again: nothing scheduled, no deadline for the driver.
    assert c.state.balance == LeaderBalance(due_ms=None, started=True)
    assert result.wake_ms is None


def test_an_unavailable_preferred_replica_is_skipped_and_checked_again() -> None:
    """Fenced, out of the ISR, or in controlled shutdown: the partition stays as it is, and
    a check follows an interval later while it is left so."""
    img = image(
        {
            "t": [
                ((4, 1), (1, 4), 1),  # 4 fenced (in the ISR still: classic rules)
                ((5, 1), (1,), 1),  # 5 active, out of the ISR
                ((6, 1), (1, 6), 1),  # 6 in controlled shutdown
                ((2, 1), (1, 2), 1),  # 2 active and in the ISR: elected
            ]
        },
        active=(1, 2, 5),
        fenced=(4,),
        shutting_down=(6,),
    )
    rules = Rules(CONFIG, POLICIES)
    state, results = run_check(due_now(img), rules, now=7)
    assert [(r.partition, r.leader) for r in balance_records(results)] == [(3, 2)]
    assert leaders(state.image) == [1, 1, 1, 2]
    assert state.balance == LeaderBalance(due_ms=7 + INTERVAL, started=True)
    assert results[-1].wake_ms == 7 + INTERVAL


def test_a_broker_at_the_percentage_is_left_alone_one_above_is_balanced() -> None:
    # Broker 1 is preferred for 10 partitions and leads 9 (10 %): not above 10 %.
    nine = [((1, 2), (1, 2), 1)] * 9
    img = image({"t": [*nine, ((1, 2), (1, 2), 2)]})
    state, results = run_check(due_now(img), Rules(CONFIG, POLICIES))
    assert balance_records(results) == []
    assert state.balance.due_ms == INTERVAL  # left imbalanced: checked again
    # 20 %: above; the partition comes back.
    img = image({"t": [*nine[:8], ((1, 2), (1, 2), 2), ((1, 2), (1, 2), 2)]})
    state, results = run_check(due_now(img), Rules(CONFIG, POLICIES))
    assert [(r.partition, r.leader) for r in balance_records(results)] == [(8, 1), (9, 1)]
    assert state.balance.due_ms is None
    # A lower percentage acts at 10 % too; the threshold is per broker.
    low = Rules(msgspec.structs.replace(CONFIG, leader_imbalance_per_broker_percentage=5), POLICIES)
    img = image({"t": [*nine, ((1, 2), (1, 2), 2)], "u": [((2, 1), (1, 2), 1)]})
    state, results = run_check(due_now(img), low)
    assert [(r.topic, r.partition) for r in balance_records(results)] == [("t", 9), ("u", 0)]


def test_the_budget_bounds_each_event() -> None:
    """At most a budget of elections per event, and at most SWEEP_SCAN x budget
    partitions looked at; the driver's Ticks follow at once while a check is under way."""
    n = 2 * SWEEP_SCAN + 5
    specs: list[Spec] = [((1, 2), (1, 2), 2)] * n
    rules = Rules(CONFIG, POLICIES, work_budget=2)
    state, results = run_check(due_now(image({"t": specs})), rules)
    # Counting 37 partitions takes two steps of 32 looks; then 18 of 2 elections, 1 of 1.
    assert [len(r.records) for r in results] == [0, 0] + [2] * (n // 2) + [1]
    assert all(not r.state.idle for r in results[:-1])
    assert leaders(state.image) == [1] * n and state.balance.due_ms is None
    # Unbounded (tests of the unsliced rules): one step counts, one elects.
    state, results = run_check(
        due_now(image({"t": specs})), Rules(CONFIG, POLICIES, work_budget=None)
    )
    assert [len(r.records) for r in results] == [0, n]


def test_off_by_flag_nothing_is_scheduled_nor_elected() -> None:
    off = msgspec.structs.replace(CONFIG, auto_leader_rebalance_enable=False)
    c = Cluster(off)
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1]])
    c.fence(1)
    c.restart(1, clean=True)
    c.alter([1, 2, 3], "t", 0)
    for now in (INTERVAL, 10 * INTERVAL, 1000 * INTERVAL):
        result = c.evaluate(now)
        assert result.records == [] and result.wake_ms is None
    assert c.state.balance == LeaderBalance() and leaders(c.image) == [2, 2]
    # Even a state with a check due or under way (another controller's settings) stays.
    img = image({"t": [((1, 2), (1, 2), 2)]})
    rules = Rules(off, POLICIES)
    under_way = ControllerState(
        img, backlog=EMPTY_BACKLOG, balance=LeaderBalance(check=Check(("t",)), started=True)
    )
    for state in (due_now(img), under_way):
        result = step(state, Tick(), INTERVAL, rules)
        assert result.records == [] and result.state.balance == state.balance


def test_nothing_is_scheduled_while_balanced_and_a_new_imbalance_schedules() -> None:
    c = Cluster(CONFIG)
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1]])
    c.evaluate(INTERVAL)
    assert c.state.balance == LeaderBalance(due_ms=None, started=True)
    # An ISR change that leaves the leaders as they are schedules nothing.
    c.now = 2 * INTERVAL
    c.alter([1, 2])
    assert c.state.balance.due_ms is None and c.last is not None and c.last.wake_ms is None
    # A leader moving away from its preferred replica does, an interval later.
    c.fence(2)
    assert c.view("t", 1)[0] == 3
    assert c.state.balance.due_ms == 3 * INTERVAL == c.last.wake_ms
    # Once scheduled, later changes do not move it.
    c.now = 2 * INTERVAL + 1
    c.fence(1)
    assert c.state.balance.due_ms == 3 * INTERVAL
    # Records replayed outside a step (a tool's own) leave the schedule as it is.
    absorbed, _ = c.state.absorb([])
    assert absorbed.balance == c.state.balance


def test_a_change_during_a_check_makes_it_check_again() -> None:
    """A partition the count has passed loses its preferred leader: the check counts it
    as balanced, ends, and still schedules another an interval on."""
    t_specs: list[Spec] = [((1, 2), (1, 2), 1)] * SWEEP_SCAN
    img = image({"a": [((3, 1), (1, 3), 3)], "t": t_specs})
    rules = Rules(CONFIG, POLICIES, work_budget=1)
    first = step(due_now(img), Tick(), 0, rules)
    check = first.state.balance.check
    assert check is not None and (check.topic_index, check.position) == (1, SWEEP_SCAN - 1)
    fenced = step(first.state, FenceBroker(broker_id=3), 0, rules)  # a-0: leader 3 -> 1
    assert fenced.state.image.partitions[("a", 0)].leader == 1 and fenced.records
    check = fenced.state.balance.check
    assert check is not None and check.changed and (check.topic_index, check.position) == (1, 15)
    state, results = run_check(fenced.state, rules, now=50)
    assert balance_records(results) == []  # broker 3 is fenced: nothing to elect anyway
    assert state.balance == LeaderBalance(due_ms=50 + INTERVAL, started=True)


def test_a_topic_deleted_during_a_check_is_skipped_a_grown_one_read_whole() -> None:
    rules = Rules(CONFIG, POLICIES, work_budget=1)
    t_specs: list[Spec] = [((1, 2), (1, 2), 2)] * (SWEEP_SCAN + 3)
    img = image({"a": [((2, 1), (1, 2), 1)], "t": t_specs, "u": [((1, 2), (1, 2), 2)]})
    first = step(due_now(img), Tick(), 0, rules)
    check = first.state.balance.check
    assert check is not None and check.electing is None and check.topics == ("a", "t", "u")
    n = SWEEP_SCAN + 3
    changed, _ = first.state.absorb(
        [
            RemoveTopicRecord(name="u", topic_id="id-u"),
            TopicRecord(name="t", topic_id="id-t", partitions=n + 1),
            PartitionRecord(topic="t", partition=n, replicas=[1, 2], isr=[1, 2], leader=2),
        ]
    )
    _, results = run_check(changed, rules)
    assert [(r.topic, r.partition) for r in balance_records(results)] == [("a", 0)] + [
        ("t", i) for i in range(n + 1)
    ]
    # Deleted while electing: skipped too; grown while counting: its new partition counts.
    img = image({"t": [((1, 2), (1, 2), 2)] * 2, "u": [((2, 1), (1, 2), 1)]})
    counting = step(due_now(img), Tick(), 0, Rules(CONFIG, POLICIES, work_budget=None))
    electing = counting.state.balance.check
    assert electing is not None and electing.electing == frozenset({1, 2})
    gone, _ = counting.state.absorb([RemoveTopicRecord(name="t", topic_id="id-t")])
    _, results = run_check(gone, Rules(CONFIG, POLICIES, work_budget=None))
    assert [(r.topic, r.partition) for r in balance_records(results)] == [("u", 0)]


def test_recovery_work_and_transactions_come_first() -> None:
    img = image({"t": [((1, 2), (1, 2), 2)]})
    rules = Rules(CONFIG, POLICIES)
    # While the step holds (a transaction is open in the driver), a due check waits.
    held = step(msgspec.structs.replace(due_now(img), hold=True), Tick(), 0, rules)
    assert held.records == [] and held.state.balance == LeaderBalance(due_ms=0, started=True)
    # A step that evaluates recoveries leaves the check to the next Tick.
    fresh = ControllerState(img, balance=LeaderBalance(due_ms=0, started=True))  # EVERYTHING
    first = step(fresh, Tick(), 0, rules)
    assert first.records == [] and not first.state.idle
    state, _ = run_check(first.state, rules)
    assert leaders(state.image) == [1]
    # Only Ticks elect: a due check waits for the driver's Tick, whatever else arrives.
    c = Cluster(CONFIG)
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.shutdown(1)
    c.restart(1, clean=True)
    c.alter([1, 2])
    c.now = 10 * INTERVAL
    result = c.submit(CreateTopic(name="other", assignments=[[2, 1]]))
    assert not [r for r in result.records if isinstance(r, PartitionChangeRecord)]
    assert c.view()[0] == 2
    assert c.evaluate().records and c.view()[0] == 1
    # A controlled shutdown moves leadership off the broker: noted, checked later.
    c.run(ControlledShutdown(broker_id=1, broker_epoch=c.epoch(1)))
    assert c.state.balance.due_ms == 10 * INTERVAL + INTERVAL


def test_a_new_state_schedules_a_check_at_its_first_step() -> None:
    """After a start, a failover or a revert nothing is known: a check an interval on."""
    img = image({"t": [((1, 2), (1, 2), 2)]})
    rules = Rules(CONFIG, POLICIES)
    first = step(ControllerState(img, backlog=EMPTY_BACKLOG), Tick(), 1000, rules)
    assert first.records == [] and first.state.balance == LeaderBalance(
        due_ms=1000 + INTERVAL, started=True
    )
    assert first.wake_ms == 1000 + INTERVAL
    state, _ = run_check(first.state, rules, now=1000 + INTERVAL)
    assert leaders(state.image) == [1]


def test_the_wake_is_the_earlier_of_recovery_and_balance() -> None:
    img = image({"t": [((1, 2), (1, 2), 2)]})
    rules = Rules(CONFIG, POLICIES)
    result = step(due_now(img, due_ms=500), Tick(), 0, rules)
    assert result.next_deadline_ms is None and result.wake_ms == 500
    for recovery, wake in ((100, 100), (900, 500)):
        r = msgspec.structs.replace(result, next_deadline_ms=recovery)
        assert r.wake_ms == wake
    off = msgspec.structs.replace(result, state=ControllerState(img), next_deadline_ms=100)
    assert off.wake_ms == 100


def test_settle_runs_a_due_check_to_its_end() -> None:
    specs: list[Spec] = [((1, 2), (1, 2), 2)] * 5
    result = settle(due_now(image({"t": specs})), Tick(), 0, Rules(CONFIG, POLICIES, work_budget=2))
    assert leaders(result.state.image) == [1] * 5 and result.state.idle
    assert len(result.records) == 5


def test_balance_step_without_a_check_due() -> None:
    img = image({"t": [((1, 2), (1, 2), 2)]})
    balance = LeaderBalance(due_ms=None, started=True)
    assert balance_step(
        balance, img, MetadataDelta(), now_ms=0, config=CONFIG, budget=None, may_elect=True
    ) == (balance, [])


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"leader_imbalance_check_interval_seconds": 0}, "must be at least 1, got 0"),
        ({"leader_imbalance_per_broker_percentage": -1}, "must be 0 to 100, got -1"),
        ({"leader_imbalance_per_broker_percentage": 101}, "must be 0 to 100, got 101"),
    ],
)
def test_bad_settings_are_named(fields: dict[str, int], words: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=words):
        ControllerConfig(**fields)  # type: ignore[arg-type]


# --- the property: a whole check against a model -----------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterImage, frozenset[int]]:
    brokers = list(range(1, draw(st.integers(1, 5)) + 1))
    active = frozenset(draw(st.sets(st.sampled_from(brokers))))
    topics: dict[str, list[Spec]] = {}
    for t in range(draw(st.integers(0, 3))):
        specs: list[Spec] = []
        for _ in range(draw(st.integers(1, 12))):
            order = draw(st.permutations(brokers))
            replicas = tuple(order[: draw(st.integers(1, len(brokers)))])
            isr = tuple(sorted(draw(st.sets(st.sampled_from(replicas), min_size=1))))
            leader = draw(st.sampled_from((*isr, NO_LEADER)))
            specs.append((replicas, isr, leader))
        topics[f"t{t}"] = specs
    fenced = tuple(b for b in brokers if b not in active)
    return image(topics, active=tuple(sorted(active)), fenced=fenced), active


@settings(CONTROLLER)
@given(
    clusters(),
    st.sampled_from([0, 10, 33, 50, 100]),
    st.sampled_from([1, 2, 3, 1000, None]),
)
def test_a_check_does_what_the_model_says(
    cluster: tuple[ClusterImage, frozenset[int]], percentage: int, budget: int | None
) -> None:
    img, active = cluster
    config = msgspec.structs.replace(CONFIG, leader_imbalance_per_broker_percentage=percentage)
    # The model: Kafka's per-broker counts over every partition, from the image before.
    parts = list(img.partitions.values())
    preferred: dict[int, int] = {}
    not_led: dict[int, int] = {}
    for p in parts:
        preferred[p.replicas[0]] = preferred.get(p.replicas[0], 0) + 1
        if p.leader != p.replicas[0]:
            not_led[p.replicas[0]] = not_led.get(p.replicas[0], 0) + 1
    over = {
        b
        for b in preferred
        if Fraction(not_led.get(b, 0), preferred[b]) > Fraction(percentage, 100)
    }
    expected = {
        p.tp: p.replicas[0]
        if p.replicas[0] in over and p.replicas[0] in p.isr and p.replicas[0] in active
        else p.leader
        for p in parts
    }
    state, results = run_check(
        due_now(img, due_ms=10), Rules(config, POLICIES, work_budget=budget), now=10
    )
    records = balance_records(results)
    for r in records:
        assert (r.reason, r.election, r.isr, r.elr) == (
            ChangeReason.LEADER_BALANCE, ElectionKind.PREFERRED, None, None,
        )  # fmt: skip
    assert {p.tp: p.leader for p in state.image.partitions.values()} == expected
    assert len(records) == len({(r.topic, r.partition) for r in records})  # once each
    # The budget: at most `budget` elections per event, and a bounded number of events.
    if budget is not None:
        assert max(len(r.records) for r in results) <= budget
        sweep = math.ceil(len(parts) / (SWEEP_SCAN * budget))
        assert len(results) <= 2 * sweep + math.ceil(len(records) / budget) + 2
    # Checked again an interval on exactly while any partition is left imbalanced.
    left = any(leader != tp_pref for tp_pref, leader in (
        (state.image.partitions[tp].replicas[0], leader) for tp, leader in expected.items()
    ))  # fmt: skip
    assert state.balance == LeaderBalance(due_ms=10 + INTERVAL if left else None, started=True)
