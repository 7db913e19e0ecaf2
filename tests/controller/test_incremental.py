"""Incremental recovery evaluation against the full pass, and the work budget's slices
against the unsliced rules.

Two controllers take the same events. One evaluates incrementally, as the step does: only
what each event changed, the answered partitions and the due wake-ups. The other is made
to look at everything before every step (its backlog is `EVERYTHING`: every leaderless
partition, every note and every pending recovery). They must write the same records,
send the same inspections and keep the same pending recoveries: a partition the
incremental scope forgot (a broker change that did not queue its partitions, an answer
or a window's end not looked at) shows as a difference.

The budget's slices are compared the same way: a controller whose events each do one
partition of work, drained with `settle`, must reach the same image and pending
recoveries as one that does everything in one step.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.config import ControllerConfig
from controller.core.recovery.builtin import BalancedPolicy, ProactivePolicy
from controller.core.recovery.policy import PendingRecovery
from controller.core.recovery.tracker import Inspection
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle, step
from controller.core.work import EVERYTHING
from metactl.errors import MetactlError
from metadata_image.image import ClusterImage
from protocol.messages.admin import CreateTopic
from protocol.messages.broker_controller import RegisterBroker, RegisterBrokerResponse
from protocol.messages.internal import FenceBroker, ReplicaLogInfo, UnfenceBroker
from tests.controller.testkit import POLICIES

CONFIG = ControllerConfig(unclean_recovery_window_ms=100, default_replication_factor=3)
BROKERS = (1, 2, 3, 4)

# An action: ("fence", b) | ("register", b, clean) | ("unfence", b) | ("answer", i, leo)
# | ("tick", ms)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("fence"), st.sampled_from(BROKERS)),
        st.tuples(st.just("register"), st.sampled_from(BROKERS), st.booleans()),
        st.tuples(st.just("unfence"), st.sampled_from(BROKERS)),
        st.tuples(st.just("answer"), st.integers(0, 50), st.integers(0, 5)),
        st.tuples(st.just("tick"), st.integers(1, 150)),
    ),
    max_size=40,
)


class Run:
    """One controller stepping events; `full` makes it look at everything every step."""

    def __init__(self, *, full: bool, budget: int | None = None, drain: bool = False) -> None:
        self.rules = Rules(CONFIG, POLICIES, work_budget=budget)
        self.full = full
        self.drain = drain
        self.state = ControllerState(ClusterImage())
        self.now = 0
        self.records: list[list[Any]] = []
        self.inspections: list[Inspection] = []

    def submit(self, event: Event) -> StepResult | None:
        state = self.state
        if self.full:
            state = msgspec.structs.replace(state, backlog=EVERYTHING)
        try:
            if self.drain:
                result = settle(state, event, self.now, self.rules)
            else:
                result = step(state, event, self.now, self.rules)
        except MetactlError:
            return None
        self.state = result.state
        self.records.append(result.records)
        self.inspections.extend(result.inspections)
        return result

    def pending(self) -> dict[tuple[str, int], PendingRecovery]:
        return dict(self.state.tracker.pending.items())


def play(run: Run, script: list[tuple[Any, ...]]) -> None:
    for b in BROKERS:
        r = run.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}-0"))
        assert r is not None and isinstance(r.response, RegisterBrokerResponse)
        run.submit(UnfenceBroker(broker_id=b, broker_epoch=r.response.broker_epoch))
    for name, strategy in (("bal", "balanced"), ("pro", "proactive"), ("man", "manual")):
        run.submit(
            CreateTopic(name=name, partitions=5, replication_factor=3, min_isr=2,
                        recovery_strategy=strategy)
        )  # fmt: skip
    incarnations = 0
    for action in script:
        image = run.state.image
        match action:
            case ("fence", b):
                run.submit(FenceBroker(broker_id=b))
            case ("register", b, clean):
                incarnations += 1
                existing = image.broker(b)
                previous = existing.epoch if clean and existing is not None else None
                run.submit(
                    RegisterBroker(
                        broker_id=b, incarnation_id=f"b{b}-{incarnations}", previous_epoch=previous
                    )
                )
            case ("unfence", b):
                existing = image.broker(b)
                if existing is not None:
                    run.submit(UnfenceBroker(broker_id=b, broker_epoch=existing.epoch))
            case ("answer", i, leo):
                asked = sorted(
                    (x.topic, x.partition, x.broker_id, x.broker_epoch) for x in run.inspections
                )
                if asked:
                    topic, partition, broker, epoch = asked[i % len(asked)]
                    run.submit(
                        ReplicaLogInfo(
                            broker_id=broker,
                            broker_epoch=epoch,
                            topic=topic,
                            partition=partition,
                            last_leader_epoch=leo,
                            log_end_offset=leo * 10 + broker,
                        )
                    )
            case ("tick", ms):
                run.now += ms
                run.submit(Tick())


@settings(max_examples=150, deadline=None)
@given(script=actions)
def test_incremental_evaluation_equals_the_full_pass(script: list[tuple[Any, ...]]) -> None:
    incremental, full = Run(full=False), Run(full=True)
    play(incremental, script)
    play(full, script)
    assert incremental.records == full.records
    key = lambda i: (i.topic, i.partition, i.broker_id, i.broker_epoch)  # noqa: E731
    assert sorted(incremental.inspections, key=key) == sorted(full.inspections, key=key)
    assert incremental.pending() == full.pending()
    assert incremental.state.tracker.next_wake == full.state.tracker.next_wake


@settings(max_examples=100, deadline=None)
@given(script=actions)
def test_one_partition_per_event_reaches_what_one_step_does(
    script: list[tuple[Any, ...]],
) -> None:
    whole, sliced = Run(full=False, drain=True), Run(full=False, budget=1, drain=True)
    play(whole, script)
    play(sliced, script)
    assert sliced.state.image.partitions == whole.state.image.partitions

    # Broker epochs are offsets, which the sliced run's markers move; the rest agrees.
    def brokers(run: Run) -> dict[int, tuple[bool, bool, bool]]:
        return {
            b.broker_id: (b.fenced, b.in_controlled_shutdown, b.last_registration_clean)
            for b in run.state.image.brokers.values()
        }

    assert brokers(sliced) == brokers(whole)
    assert sliced.pending().keys() == whole.pending().keys()


def test_a_step_looks_only_at_what_it_changed() -> None:
    """With recoveries pending, an event that changes nothing looks at no partition: the
    old pass re-decided every pending recovery on every step (a planted copy of it, which
    adds the pending ones to the scope, fails here)."""
    looked: list[str] = []

    class CountingBalanced(BalancedPolicy):
        def decide(self, image: Any, p: Any, pending: Any, now_ms: int) -> Any:
            looked.append(p.topic)
            return super().decide(image, p, pending, now_ms)

    class CountingProactive(ProactivePolicy):
        def decide(self, image: Any, p: Any, pending: Any, now_ms: int) -> Any:
            looked.append(p.topic)
            return super().decide(image, p, pending, now_ms)

    policies = {**POLICIES, "balanced": CountingBalanced(), "proactive": CountingProactive()}
    run = Run(full=False)
    run.rules = Rules(CONFIG, policies, work_budget=None)
    play(run, [("fence", 1), ("fence", 2), ("fence", 3), ("register", 1, False)])
    assert run.pending(), "the script leaves recoveries pending"
    assert looked, "and their policies decided"
    looked.clear()
    run.now += 1
    result = run.submit(Tick())
    assert result is not None and result.records == []
    assert looked == []


def test_a_batch_of_answers_is_taken_whole_or_not_at_all() -> None:
    """LogInfoAnswers (one broker's GetReplicaLogInfo response): every answer is recorded
    in one event; one out of range or from a stale epoch refuses them all."""
    import pytest

    from controller.core.step import LogInfoAnswers
    from metactl.errors import InvalidRequestError, StaleBrokerEpochError

    run = Run(full=False)
    play(run, [("fence", 1), ("fence", 2), ("fence", 3), ("register", 1, False), ("unfence", 1)])
    b1 = run.state.image.brokers[1]
    asked = sorted({(i.topic, i.partition) for i in run.inspections if i.broker_id == 1})
    assert len(asked) >= 2, "the script asks broker 1 for several logs"

    def answer(tp: tuple[str, int], epoch: int = b1.epoch, leo: int = 5) -> ReplicaLogInfo:
        return ReplicaLogInfo(
            broker_id=1, broker_epoch=epoch, topic=tp[0], partition=tp[1],
            last_leader_epoch=0, log_end_offset=leo,
        )  # fmt: skip

    state = run.state
    for bad, error in (
        (answer(asked[1], leo=1 << 63), InvalidRequestError),
        (answer(asked[1], epoch=b1.epoch - 1), StaleBrokerEpochError),
    ):
        with pytest.raises(error):
            step(state, LogInfoAnswers((answer(asked[0]), bad)), run.now, run.rules)
    result = step(state, LogInfoAnswers(tuple(answer(tp) for tp in asked)), run.now, run.rules)
    for tp in asked:
        pr = result.state.tracker.pending.get(tp)
        assert pr is None or 1 in pr.answers  # answered: recovered, or still waiting
