"""Automatic preferred-leader balance (Kafka's `auto.leader.rebalance.enable`): when the
controller checks leadership balance, and which preferred elections a check makes.

Owns the balance's schedule and its checks in progress (`LeaderBalance`, soft state the
step keeps in `ControllerState`), and the decision of each check. The elections are rule
8's own (`partition_handlers.preferred_change`, what `metactl elect --election-type
preferred` runs), written with the reason `leader_balance` so that the log, the feed and
the metrics tell them from an operator's.

The rules, Kafka's with its names and defaults (docs/lifecycle.md, "Automatic leader
balance", says where metactl differs):

* A partition's preferred replica is the first of its replicas. A broker's imbalance
  ratio is the share of the partitions whose preferred replica it is that it does not
  lead (leaderless ones included). A check runs a preferred election for each partition
  whose preferred broker's ratio is above `leader.imbalance.per.broker.percentage` (10),
  where the preferred replica is an active (unfenced, not shutting down) ISR member; the
  others are skipped and stay as they are.
* When, as KRaft's QuorumController schedules it: a check is due
  `leader.imbalance.check.interval.seconds` (300) after the controller first sees a
  partition that its preferred replica does not lead (or after it starts: its state is
  new, nothing is known), and again an interval after a check that leaves any partition
  so. While leadership is balanced nothing is scheduled.
* A check is cut to the work budget: it is done a slice per Tick, first a count of every
  partition (at most `SWEEP_SCAN` x the budget looked at per event, a bounded stretch in
  topic-name order, as `work.Sweep` walks), then the elections (at most the budget per
  event: KRaft's `maxElectionsPerImbalance` is 1,000, the default budget), with the
  next Tick stepped at once while a check is under way (`LeaderBalance.busy`).

Must not: do IO, read a clock (time comes in as `now_ms`), write records inside a
transaction or while the step holds (the step says when it may: `may_elect`), or look at
more than a bounded stretch of partitions in one event.
"""

from __future__ import annotations

from typing import Final

import immutables
import msgspec

from controller.core.config import ControllerConfig
from controller.core.partition_handlers import preferred_change
from controller.core.work import SWEEP_SCAN
from metactl.errors import PreferredLeaderNotAvailableError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_log.records import ChangeReason, MetadataRecord

_UNBOUNDED: Final = 1 << 62  # a step without a work budget does a whole phase


class Check(msgspec.Struct, frozen=True, gc=False):
    """One check in progress: a walk over the image's topics (their names when it began,
    in name order; a topic's partitions are read as it is now, so a deleted one is
    skipped and a grown one read whole) from a position, first counting (`electing` is
    None), then electing for the brokers in `electing`."""

    topics: tuple[str, ...]
    topic_index: int = 0
    position: int = 0
    # broker -> partitions whose preferred replica it is, and how many of those it does
    # not lead (the counting phase's sums so far).
    preferred: immutables.Map[int, int] = immutables.Map()
    not_led: immutables.Map[int, int] = immutables.Map()
    electing: frozenset[int] | None = None
    elected: int = 0
    # A partition lost its preferred leader while the check was under way: check again
    # an interval after this one, whatever this one finds.
    changed: bool = False


class LeaderBalance(msgspec.Struct, frozen=True, gc=False):
    """The balance's schedule: when the next check is due (None: none is scheduled), the
    check under way, and whether this state has seen a step yet (a new controller state,
    after a start, failover or revert, schedules a check at its first step)."""

    due_ms: int | None = None
    check: Check | None = None
    started: bool = False

    @property
    def busy(self) -> bool:
        """A check is under way: the driver steps Ticks until it ends."""
        return self.check is not None

    @property
    def wake_ms(self) -> int | None:
        """When the driver should step a Tick for the balance (None: it need not)."""
        return self.due_ms if self.check is None else None


def over_threshold(preferred: int, not_led: int, percentage: int) -> bool:
    """Kafka's test: not_led / preferred > percentage / 100 (exact, in integers)."""
    return preferred > 0 and not_led * 100 > percentage * preferred


def balance_step(
    balance: LeaderBalance,
    image: ClusterImage,
    delta: MetadataDelta,
    *,
    now_ms: int,
    config: ControllerConfig,
    budget: int | None,
    may_elect: bool,
) -> tuple[LeaderBalance, list[MetadataRecord]]:
    """The balance's part of one step: note what `delta` (the step's changes, `image`
    after them) means for the schedule, then, if `may_elect` (a Tick outside any
    transaction, with no recovery work in this step) and a check is due or under way, do
    its next slice. Returns the new state and the slice's elections (for the step to
    replay after the rest)."""
    if not config.auto_leader_rebalance_enable:
        return balance, []
    interval_ms = config.leader_imbalance_check_interval_seconds * 1000
    balance = _note(balance, image, delta, now_ms + interval_ms)
    if not may_elect:
        return balance, []
    check = balance.check
    if check is None:
        if balance.due_ms is None or now_ms < balance.due_ms:
            return balance, []
        check = Check(tuple(sorted(image.topics)))
    n = _UNBOUNDED if budget is None else budget
    if check.electing is None:
        check = _count(image, check, SWEEP_SCAN * n, config.leader_imbalance_per_broker_percentage)
        records: list[MetadataRecord] = []
    else:
        check, records = _elect(image, check, SWEEP_SCAN * n, n)
    if check.electing is not None and check.topic_index >= len(check.topics):
        # The last phase is done: check again later while any partition is left
        # imbalanced (unelectable, or under the threshold), as KRaft reschedules.
        left = sum(check.not_led.values()) > check.elected
        due = now_ms + interval_ms if left or check.changed else None
        return LeaderBalance(due_ms=due, started=True), records
    return LeaderBalance(due_ms=None, check=check, started=True), records


def _note(
    balance: LeaderBalance, image: ClusterImage, delta: MetadataDelta, due: int
) -> LeaderBalance:
    """Schedule a check at `due` for a new state, or when `delta` shows a partition its
    preferred replica does not lead and none is scheduled; during a check, remember that
    one did. O(changed partitions) at most, and nothing once a check is scheduled."""
    if not balance.started:
        return LeaderBalance(due_ms=due, started=True)
    check = balance.check
    if balance.due_ms is not None or (check is not None and check.changed):
        return balance
    if not _imbalanced(image, delta):
        return balance
    if check is not None:
        return msgspec.structs.replace(balance, check=msgspec.structs.replace(check, changed=True))
    return msgspec.structs.replace(balance, due_ms=due)


def _imbalanced(image: ClusterImage, delta: MetadataDelta) -> bool:
    partitions = image.partitions
    for tp in delta.partitions:  # a deleted topic's are not in it (`MetadataDelta`)
        p = partitions[tp]
        if p.leader != p.replicas[0]:
            return True
    return False


def _count(image: ClusterImage, check: Check, looks: int, percentage: int) -> Check:
    """The counting phase's next stretch; at its end, the brokers above the threshold
    (the electing phase starts from the first topic again)."""
    preferred: dict[int, int] = {}
    not_led: dict[int, int] = {}
    names, ti, pos = check.topics, check.topic_index, check.position
    topics, partitions = image.topics, image.partitions
    while ti < len(names) and looks > 0:
        name = names[ti]
        t = topics.get(name)
        count = t.partitions if t is not None else 0
        end = min(count, pos + looks)
        for p in partitions.of_topic(name, range(pos, end)):
            b = p.replicas[0]
            preferred[b] = preferred.get(b, 0) + 1
            if p.leader != b:
                not_led[b] = not_led.get(b, 0) + 1
        looks -= max(0, end - pos)
        pos = end
        if pos >= count:
            ti, pos = ti + 1, 0
    counted = check.preferred.mutate()
    for b, n in preferred.items():
        counted[b] = counted.get(b, 0) + n
    behind = check.not_led.mutate()
    for b, n in not_led.items():
        behind[b] = behind.get(b, 0) + n
    done = msgspec.structs.replace(
        check, topic_index=ti, position=pos, preferred=counted.finish(), not_led=behind.finish()
    )
    if ti < len(names):
        return done
    over = frozenset(
        b for b, n in done.not_led.items() if over_threshold(done.preferred[b], n, percentage)
    )
    # Nobody above the threshold: nothing to elect, the check ends here.
    start = 0 if over else len(names)
    return msgspec.structs.replace(done, topic_index=start, position=0, electing=over)


def _elect(
    image: ClusterImage, check: Check, looks: int, budget: int
) -> tuple[Check, list[MetadataRecord]]:
    """The electing phase's next stretch: a preferred election (rule 8) for each partition
    led by another broker than its preferred one, where that one is above the threshold;
    at most `budget` of them."""
    assert check.electing is not None
    electing = check.electing
    records: list[MetadataRecord] = []
    names, ti, pos = check.topics, check.topic_index, check.position
    topics, partitions = image.topics, image.partitions
    while ti < len(names) and looks > 0 and len(records) < budget:
        name = names[ti]
        t = topics.get(name)
        count = t.partitions if t is not None else 0
        end = min(count, pos + looks)
        start, stopped = pos, False
        for p in partitions.of_topic(name, range(start, end)):
            b = p.replicas[0]
            if b in electing and p.leader != b:
                try:
                    change = preferred_change(image, p)
                except PreferredLeaderNotAvailableError:
                    continue  # not an active ISR member: it stays as it is
                records.append(msgspec.structs.replace(change, reason=ChangeReason.LEADER_BALANCE))
                if len(records) >= budget:
                    pos, stopped = p.partition + 1, True
                    break
        if not stopped:
            pos = end
        looks -= max(0, pos - start)
        if pos >= count:
            ti, pos = ti + 1, 0
    check = msgspec.structs.replace(
        check, topic_index=ti, position=pos, elected=check.elected + len(records)
    )
    return check, records
