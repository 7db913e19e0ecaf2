"""The maintenance pre-flight's messages (`metactl plan restart|roll`, issue 34): what the
operator asks the controller, and the plans it answers with, made by `planning` from its
committed image.

`PlanRestart` asks what a restart of one broker would do to its partitions, for a clean
restart (controlled shutdown, clean re-registration, unfence) and for an unclean one (a
crash: the broker is fenced when its session times out, then registers again without its
epoch). `PlanRoll` asks for an order in which to restart every broker, one at a time,
waiting for each one's partitions to take it back into their ISRs, that keeps every
partition at or above MinISR; or for the partitions that make it impossible.

Every list of partitions is whole in its count and holds at most `limit` partitions
(the request's, else the controller's `PLAN_LIST_ITEMS`), in (topic, partition) order, so
that no answer outgrows a frame however large the cluster.

Data only: no IO, no rules.
"""

# ruff: noqa: RUF012 (a default of [] on a msgspec Struct is a fresh list each time; ruff
# sees no Struct because `Msg` is defined in another module)

from __future__ import annotations

from typing import Final, Literal

import msgspec

from protocol.messages.base import Msg

PLAN_LIST_ITEMS: Final = 1000
"""Partitions a plan's list holds when the request names no `limit` (its count is whole)."""
MAX_PLAN_LIST_ITEMS: Final = 100_000
"""The largest `limit` a plan request may name."""


class PlanRestartRequest(Msg, tag="PlanRestart", frozen=True):
    """What a restart of `broker_id` would do now, clean and unclean (`metactl plan
    restart`). `limit`: the most partitions each list of the answer holds (None: the
    controller's `PLAN_LIST_ITEMS`; 0: counts only)."""

    broker_id: int
    limit: int | None = None


class PlanRollRequest(Msg, tag="PlanRoll", frozen=True):
    """An order in which to restart every broker (`metactl plan roll`). `limit`: as
    PlanRestartRequest's, for each step's partitions to await and the blocking ones."""

    limit: int | None = None


class RecoveryNeed(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What an unclean recovery of a partition would need, as its policy says.

    `strategy` is the topic's (balanced, proactive, manual; "classic" under the classic
    rules with unclean leader election on). `trigger` is the policy's reason to act
    ("isr_and_elr_empty", "elr_all_fenced"); None: the policy does not act. `awaiting`:
    the replicas whose logs the policy waits for; `window_ms`: how long a windowed policy
    (proactive) inspects before it elects.
    `until_return`: the recovery is pending only while the broker is down: its return
    ends it with a clean election (it is an ELR member), unless the window ends first.
    `operator`: no policy will elect (manual, a balanced recovery with an empty
    LastKnownELR, the classic rules): only an operator's unclean election
    (`metactl elect --election-type UNCLEAN`) gives the partition a leader. `chosen`: a
    replica the step elected uncleanly at once (the classic rules' unclean election)."""

    strategy: str
    trigger: str | None = None
    awaiting: list[int] = []
    window_ms: int | None = None
    until_return: bool = False
    operator: bool = False
    chosen: int | None = None


class PlannedPartition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One partition of a plan: as it is now (`*_before`) and as the plan's events leave it.

    `election` says how its leader after was chosen when it changed ("isr", "elr",
    "unclean_recovery"); `on_return` that it happens when the restarted broker is back
    (rule 4: an ELR member unfenced), not while it is down."""

    topic: str
    partition: int
    min_isr: int
    replicas: list[int]
    leader_before: int  # -1: none
    isr_before: list[int]
    leader: int  # -1: none
    isr: list[int]
    elr: list[int] = []
    last_known_elr: list[int] = []
    election: str | None = None
    on_return: bool = False
    recovery: RecoveryNeed | None = None


class PartitionList(msgspec.Struct, frozen=True, kw_only=True):
    """`count` partitions; the first `limit` of them (topic, partition order) listed."""

    count: int = 0
    partitions: list[PlannedPartition] = []


class RestartCase(msgspec.Struct, frozen=True, kw_only=True):
    """One way the broker restarts, and what it does to the partitions it hosts.

    `steps` names the events stepped through the controller's core, in order. While the
    broker is down: the partitions whose ISR is below MinISR (`under_min_isr`: acks=all
    producers are refused), those left without a leader (`leader_lost`); those whose new
    leader comes from the ELR (`elected_from_elr`, while it is down or on its return);
    and those with no clean leader left that need an unclean recovery, with what its
    policy needs (`unclean_recovery`)."""

    kind: Literal["clean", "unclean"]
    steps: list[str]
    under_min_isr: PartitionList
    leader_lost: PartitionList
    elected_from_elr: PartitionList
    unclean_recovery: PartitionList


class PlanRestartResponse(Msg, tag="PlanRestartResponse", frozen=True):
    """Both restarts of `broker_id`, planned from the committed image at `end_offset`:
    it hosts `replicas` partitions and leads `leads` of them."""

    broker_id: int
    end_offset: int
    replicas: int
    leads: int
    clean: RestartCase
    unclean: RestartCase


class TopicPartitions(msgspec.Struct, frozen=True, kw_only=True):
    """Partitions of one topic, ascending."""

    topic: str
    partitions: list[int]


class RollStep(msgspec.Struct, frozen=True, kw_only=True):
    """Restart `broker_id` (controlled shutdown, clean re-registration, unfence), then wait
    until it is back in the ISR of each of `awaits` (`await_count` partitions in all; the
    first `limit` listed) before the next step. While it is down, `leads` leaders move off
    it and `at_min_isr` partitions are exactly at MinISR (one more failure from refusing
    acks=all); none is below, and none is left without a leader."""

    broker_id: int
    leads: int
    at_min_isr: int
    await_count: int
    awaits: list[TopicPartitions]


class BlockingPartition(msgspec.Struct, frozen=True, kw_only=True):
    """A partition whose ISR would fall (or stay) below MinISR, or that would be left
    without a leader, if any of `blocks` went: as it is when the roll can go no further."""

    topic: str
    partition: int
    min_isr: int
    replicas: list[int]
    isr: list[int]
    leader: int
    blocks: list[int]


class NotRolled(msgspec.Struct, frozen=True, kw_only=True):
    """A broker the roll leaves out, and why ("fenced": it is down already;
    "controlled_shutdown": it is stopping)."""

    broker_id: int
    reason: str


class PlanRollResponse(Msg, tag="PlanRollResponse", frozen=True):
    """A roll planned from the committed image at `end_offset`.

    `steps` restart brokers one at a time, in order, each keeping every partition at or
    above MinISR (a partition already below it, `under_min_isr`, is never made worse).
    `blocked` are the brokers no order can restart that way, because of `blocking`
    (`blocking_count` partitions in all), as the image is once every step ran: empty when
    the roll is possible. `not_rolled` are the brokers left out."""

    end_offset: int
    steps: list[RollStep]
    blocked: list[int] = []
    blocking_count: int = 0
    blocking: list[BlockingPartition] = []
    not_rolled: list[NotRolled] = []
    under_min_isr: PartitionList = msgspec.field(default_factory=PartitionList)
