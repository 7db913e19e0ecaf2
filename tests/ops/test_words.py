"""What the commands say (issue 22, item 8): the classic-mode feed tells the silent-loss
path as it is (the broker stays in the ISR after an UNCLEAN restart and is elected from
it); candidates print in one order (ascending) in `describe` and in the feed;
`topics create` prints a one-line summary (`--verbose` the assignment)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from controller.core.config import ControllerConfig
from eventfeed.feed import SILENT_LOSS_NOTE, Feed
from eventfeed.lines import describe_record
from eventfeed.view import View
from metadata_image.image import ClusterImage
from metadata_log.records import (
    ELR_FEATURE,
    FeatureLevelRecord,
    MetadataRecord,
    RecoveryCandidate,
    UncleanRecoveryRecord,
)
from ops.admin_cmds import creation_summary
from ops.cli import main
from ops.describe_cmds import recovery_note
from ops.paths import open_log
from protocol.messages.admin import RecoverySummary
from tests.controller.testkit import Cluster

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "simulation" / "scenarios"


@dataclass(frozen=True)
class Entry:
    offset: int
    timestamp_ms: int
    record: MetadataRecord


def feed_lines(tmp_path: Path, scenario: str, first: list[Entry]) -> list[str]:
    """The scenario's log as `events` tells it, after the entries `first` (e.g. the level
    a controller pins on a new log), with offsets moved along."""
    data = tmp_path / scenario
    argv = ["scenario", "run", str(SCENARIOS / f"{scenario}.yaml"), "--data-dir", str(data)]
    assert main(argv) == 0

    async def read() -> list[Entry]:
        async with await open_log(data) as store:
            return [
                Entry(len(first) + e.offset, e.timestamp_ms, e.record)
                async for chunk in store.iter_chunks(0)
                for e in chunk
            ]

    return [e.text for e in Feed(since_ms=0).add([*first, *asyncio.run(read())])]


def test_the_classic_feed_says_the_broker_stayed_in_the_isr_and_was_elected_from_it(
    tmp_path: Path,
) -> None:
    # The scenario's log records no feature level (the runner's config is static): the
    # feed reads the classic rules from the state, a fenced broker left in an ISR.
    lines = feed_lines(tmp_path, "classic-last-replica-standing", [])
    registered = next(x for x in lines if "registered at epoch 12" in x)
    assert "UNCLEAN restart; classic rules: it stays in the ISR of 1 partition(s)" in registered
    assert "out of ISR and ELR" not in " ".join(lines)
    elected = next(x for x in lines if "leader none→1" in x)
    assert elected == "orders-0 leader none→1 (isr)" + SILENT_LOSS_NOTE


def test_the_feed_follows_the_finalized_level(tmp_path: Path) -> None:
    classic = [Entry(0, 0, FeatureLevelRecord(name=ELR_FEATURE, level=0))]
    lines = feed_lines(tmp_path, "classic-last-replica-standing", classic)
    assert any("classic rules: it stays in the ISR of 1 partition(s)" in x for x in lines)
    assert sum(SILENT_LOSS_NOTE in x for x in lines) == 1
    # KIP-966: an unclean registration takes the broker out of its ISRs and ELRs, and
    # nothing is elected silently.
    for scenario in ("worked-5.2.2-clean-elr-recovery", "kip966-how-it-works"):
        lines = feed_lines(tmp_path / "elr", scenario, [])
        unclean = [x for x in lines if "UNCLEAN restart" in x]
        assert unclean and all("(UNCLEAN restart: out of ISR and ELR)" in x for x in unclean)
        assert not any(SILENT_LOSS_NOTE in x for x in lines)


def registration_words(config: ControllerConfig, *, fence_isr_member: bool) -> str:
    """What the feed says of broker 3's UNCLEAN restart in a log the core wrote (as
    older logs, without a feature record): RF 3, MinISR 2, broker 3 fenced out of an ISR
    still at MinISR (so in no ELR), or broker 3 in no ISR at all (the leader shrank it
    before the fence)."""
    c = Cluster(config)
    c.start(1, 2, 3)
    c.create("demo", replication_factor=3, min_isr=2)
    if not fence_isr_member:
        assert c.p("demo").leader != 3
        c.alter(sorted(c.p("demo").isr - {3}), "demo")
        assert 3 not in c.p("demo").isr
    c.fence(3)
    c.restart(3, clean=False)
    assert not any(isinstance(r, FeatureLevelRecord) for r in c.log)
    entries = [Entry(i, 1_000 + i, r) for i, r in enumerate(c.log)]
    lines = [e.text for e in Feed().add(entries)]
    return next(x for x in lines if x.startswith("broker 3 registered at epoch") and "UNCLEAN" in x)


def test_a_log_without_a_feature_record_reads_as_classic_where_the_broker_is_in_no_isr() -> None:
    # Issue 22: an older classic-mode log (no feature record) said "out of ISR and ELR"
    # of a broker in no ISR, as if KIP-966 had taken it out; the classic rules never do.
    classic = ControllerConfig(eligible_leader_replicas=False)
    for fence_isr_member in (True, False):
        words = registration_words(classic, fence_isr_member=fence_isr_member)
        assert words.endswith("(UNCLEAN restart; classic rules: in no ISR)"), words
    # The same log under KIP-966 once it shows an ELR: its words are KIP-966's.
    elr = ControllerConfig(eligible_leader_replicas=True)
    c = Cluster(elr)
    c.start(1, 2, 3)
    c.create("demo", replication_factor=3, min_isr=2)
    c.fence(3)
    c.fence(2)  # ISR [1] below MinISR: 2 goes to the ELR
    c.restart(3, clean=False)
    assert not any(isinstance(r, FeatureLevelRecord) for r in c.log)
    lines = [e.text for e in Feed().add([Entry(i, 1_000 + i, r) for i, r in enumerate(c.log)])]
    words = next(x for x in lines if x.startswith("broker 3 registered") and "UNCLEAN" in x)
    assert words.endswith("(UNCLEAN restart: out of ISR and ELR)"), lines


def test_candidates_print_in_ascending_order_everywhere() -> None:
    summary = RecoverySummary(
        chosen=3, strategy="proactive", candidates=[3, 2], at_ms=0, age_ms=1000
    )
    assert recovery_note(summary).startswith("chose 3 of [2,3] (proactive)")
    record = UncleanRecoveryRecord(
        topic="demo",
        partition=0,
        strategy="proactive",
        candidates=[
            RecoveryCandidate(broker_id=3, last_leader_epoch=1, log_end_offset=9),
            RecoveryCandidate(broker_id=2, last_leader_epoch=1, log_end_offset=7),
        ],
        chosen=3,
        trigger="elr_all_fenced",
    )
    text = describe_record(record, View(ClusterImage()))
    assert text is not None
    assert text.startswith("demo-0 UNCLEAN RECOVERY: chose 3 of replicas [2,3] that reported")


def test_topics_create_prints_a_summary_whatever_the_size() -> None:
    assignments = [[(i + j) % 30 + 1 for j in range(3)] for i in range(10_000)]
    line = creation_summary("big", "id-1", assignments)
    assert line == (
        "Created topic big (id-1): 10000 partition(s), replication factor 3, replicas on "
        "broker(s) 1-30 (--verbose prints the assignment)"
    )
    assert creation_summary("t", "id-2", [[1, 2], [2, 4]], hint=False).endswith(
        "replication factor 2, replicas on broker(s) 1,2,4"
    )
