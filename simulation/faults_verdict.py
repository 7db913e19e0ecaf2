"""The verdict of one ``metactl simulate faults`` run: what became of every acknowledged record.

`Outcome` is what one schedule produced: the counts the controller side and the faults
kept as the run went (refused requests, unclean recoveries, failovers, lifecycle ops) and
the verdict `verdict` adds at the end. Each acknowledged record is classified against the
final leader's log: present, lost and reported (a potential-data-loss report about its
topic id and partition came after it was acknowledged), lost under the classic rules
(in an ELR mode, a record a leader elected while a feature cycle had the classic rules
on may have overwritten: the classic rules' own loss, which a downgrade accepts), or lost
silently; a record of a topic id that no longer exists (deleted, whether or not its name
was created again) is counted as deleted, not checked: deleting a topic is not losing
its records; a record of a partition without a leader at the end is unreadable. The
audit's invariant violations are added too (but for the rules the classic rules break
by design, `CLASSIC_EXEMPT_RULES`, in a classic mode).

It must not run anything: it judges the state the run ended in, handed to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import msgspec

from audit.partition_checker import PartitionChecker
from brokers_stub.replica_log import ReplicaLog, epoch_at
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import NO_LEADER

# Rules of the audit that encode KIP-966 itself: classic mode breaks them by design. The
# classic rules also never empty an ISR, unregistering included (as Kafka's classic
# controller): the last member of an ISR stays when it is unregistered.
CLASSIC_EXEMPT_RULES: Final = frozenset(
    {"unclean_replica_in_isr", "unclean_replica_in_elr", "unregistered_broker_kept"}
)


class Outcome(msgspec.Struct, kw_only=True):
    """What one schedule produced."""

    acknowledged: int = 0
    present: int = 0
    lost_reported: int = 0
    lost_silent: int = 0
    # ELR modes: lost where a leader elected under the classic rules (a feature cycle's
    # downgrade window) may have overwritten it: the classic rules' documented loss.
    lost_classic: int = 0
    unreadable: int = 0  # acknowledged records of partitions without a leader at the end
    deleted: int = 0  # acknowledged records of a topic id deleted since (not checked)
    unavailable_partition_ms: int = 0
    unclean_recoveries: int = 0
    operator_elections: int = 0
    refused_requests: int = 0
    failovers: int = 0  # controller failovers (a standby took over from the durable log)
    aborted_transactions: int = 0  # transactions a failover left open, aborted by the next
    # Lifecycle ops applied and refused, by kind ("reassign", "reassign refused", ...),
    # and what became of reassignments ("reassignment completed", "... cancelled").
    lifecycle: dict[str, int] = {}
    violations: list[str] = []
    silent_examples: list[str] = []

    @property
    def failed(self) -> bool:
        return self.lost_silent > 0 or bool(self.violations)


def verdict(  # noqa: PLR0917 - the state a run ended in
    out: Outcome,
    image: ClusterImage,
    acked: Iterable[tuple[str, TopicPartition, int, int, int, int]],
    leader_log: Callable[[int, TopicPartition, str], ReplicaLog | None],
    reports: Mapping[tuple[str, int], Sequence[int]],
    classic_elections: Mapping[tuple[str, int], Sequence[int]],
    checkers: Iterable[PartitionChecker],
    *,
    elr: bool,
) -> Outcome:
    """Add to `out` the fate of every acknowledged record (`acked`: topic id, partition,
    start and end offsets, leader epoch, the sequence number of the event that
    acknowledged it) in the final `image`, and the invariant violations `checkers`
    found. `leader_log(broker, tp, topic_id)`: that broker's log of `tp` if it is of
    `topic_id`; `reports` and `classic_elections`: the sequence numbers of the
    potential-data-loss reports and of the elections under the classic rules, by topic
    id and partition; `elr`: the run's mode has the ELR on."""
    for _ in image.reassigning:
        what = "reassignment in progress at the end"
        out.lifecycle[what] = out.lifecycle.get(what, 0) + 1
    for topic_id, tp, start, end, epoch, seq in acked:
        out.acknowledged += end - start
        t = image.topics.get(tp[0])
        if t is None or t.topic_id != topic_id:
            out.deleted += end - start  # its topic was deleted: nothing to keep
            continue
        p = image.partitions[tp]
        if p.leader == NO_LEADER:
            out.unreadable += end - start
            continue
        log = leader_log(p.leader, tp, topic_id)
        if log is None:  # the leader does not hold the partition: all of it is gone
            log = ReplicaLog(topic=tp[0], partition=tp[1])
        missing = [
            offset
            for offset in range(start, end)
            if offset >= log.log_end_offset or epoch_at(log.leader_epochs, offset) != epoch
        ]
        out.present += end - start - len(missing)
        if any(r > seq for r in reports.get((topic_id, tp[1]), ())):
            out.lost_reported += len(missing)
            continue
        if any(r > seq for r in classic_elections.get((topic_id, tp[1]), ())):
            out.lost_classic += len(missing)
            continue
        out.lost_silent += len(missing)
        for offset in missing[: 5 - len(out.silent_examples)]:
            out.silent_examples.append(
                f"{tp[0]}-{tp[1]} offset {offset} epoch {epoch}: final leader "
                f"{p.leader} (epoch {p.leader_epoch}) has "
                f"{log.log_end_offset} records, epochs {log.leader_epochs}"
            )
    exempt = CLASSIC_EXEMPT_RULES if not elr else frozenset()
    out.violations += [
        f"{v.rule} at offset {v.offset} ({v.topic}-{v.partition}): {v.detail}"
        for checker in checkers
        for v in checker.out
        if v.rule not in exempt
    ]
    return out
