"""`metactl simulate faults`: the oracle finds no silent loss under KIP-966, and must find
it when the guarantees are taken away (the mutants, classic mode, planted bugs in the
lifecycle paths), with the lifecycle operations interleaved with the faults.

Fixed seeds, virtual time: every number here is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from controller.core.partition_change import complete_reassignment, move_replicas
from metadata_image import replay
from metadata_image.builder import Builder
from metadata_image.image import ClusterImage
from metadata_image.record_replay import replace_partition
from metadata_image.state import PartitionState
from metadata_log.records import ClearElrRecord, PartitionChangeRecord
from ops.cli import main
from simulation.faults import FaultsSummary, run_faults, run_schedule, shrink
from simulation.faults_cluster import TOPIC
from simulation.faults_schedule import (
    LIFECYCLE_OPS,
    Fault,
    Mode,
    Op,
    Schedule,
    dump_replay,
    generate,
    load_replay,
    schedule_seed,
)
from simulation.faults_sim import FaultSim

SEED = 1
SCHEDULES = 200  # the main claim: KIP-966 with balanced recovery loses nothing silently
FEW = 60  # enough for the weakened variants to lose data


_RUNS: dict[tuple[Mode, int, int], FaultsSummary] = {}


def runs(mode: Mode, schedules: int = FEW, lifecycle_ops: int = LIFECYCLE_OPS) -> FaultsSummary:
    """`run_faults` with the fixed seed, once per mode and size for the whole module."""
    key = (mode, schedules, lifecycle_ops)
    if key not in _RUNS:
        _RUNS[key] = run_faults(
            schedules=schedules, seed=SEED, mode=mode, lifecycle_ops=lifecycle_ops
        )
    return _RUNS[key]


def accounted(s: FaultsSummary) -> bool:
    """Every acknowledged record is classified exactly once."""
    lost = s.lost_reported + s.lost_silent + s.lost_classic
    return s.present + lost + s.unreadable + s.deleted == s.acknowledged


@pytest.fixture(scope="module")
def elr_balanced() -> FaultsSummary:
    return runs(Mode(), SCHEDULES)


def test_elr_balanced_loses_nothing_silently(elr_balanced: FaultsSummary) -> None:
    s = elr_balanced
    assert s.schedules == SCHEDULES
    assert s.acknowledged > 10_000
    assert s.lost_silent == 0, s.lines()
    assert s.invariant_violations == 0, s.lines()
    assert accounted(s)
    # The schedules are hard enough: records are lost, and every loss is reported.
    assert s.unclean_recoveries > 0
    assert s.lost_reported > 0
    assert s.unavailable_partition_seconds > 0


def test_the_lifecycle_is_interleaved_with_the_faults(elr_balanced: FaultsSummary) -> None:
    """The ELR claim above holds with every kind of lifecycle op applied, reassignments
    both completed (by the simulated leader's ISR expansion) and cancelled, and deleted
    topics' records set aside rather than counted as lost."""
    done = elr_balanced.lifecycle
    for kind in (
        "topic_min_isr",
        "cluster_min_isr",
        "reassign",
        "cancel_reassignment",
        "add_partitions",
        "delete_topic",
        "recreate_topic",
        "unregister",
        "reassignment started",
        "reassignment completed",
        "reassignment cancelled",
        "reassignment completed at once",
    ):
        assert done.get(kind, 0) > 0, (kind, done)
    assert done["recreate_topic"] == done["delete_topic"]
    assert 0 < elr_balanced.deleted < elr_balanced.acknowledged // 4


@pytest.mark.parametrize("strategy", ["proactive", "manual"])
def test_other_strategies_report_every_loss(strategy: str) -> None:
    s = runs(Mode(strategy=strategy))
    assert s.lost_silent == 0, s.lines()
    assert s.invariant_violations == 0, s.lines()
    assert s.lost_reported > 0
    if strategy == "manual":
        # Nothing recovers by itself: the operator elects once the cluster has healed.
        assert s.operator_elections == s.unclean_recoveries > 0


def test_manual_waits_longer_than_proactive() -> None:
    proactive = runs(Mode(strategy="proactive"))
    manual = runs(Mode(strategy="manual"))
    assert manual.unavailable_partition_seconds > proactive.unavailable_partition_seconds


def test_mutant_lying_about_clean_shutdown_loses_silently() -> None:
    assert runs(Mode(lie_clean_shutdown=True)).lost_silent > 0
    # The lie hides every unclean restart: nothing is recovered, nothing reported (with
    # the lifecycle off: a cleared ELR or an unregistered broker can leave a partition
    # without a candidate, and that recovery is reported whatever the restarts say).
    s = runs(Mode(lie_clean_shutdown=True), lifecycle_ops=0)
    assert s.lost_silent > 0
    assert s.unclean_recoveries == 0


def test_mutant_hw_below_min_isr_loses_silently() -> None:
    s = runs(Mode(hw_ignores_min_isr=True))
    assert s.lost_silent > 0


def test_classic_mode_loses_the_last_replica_standing() -> None:
    s = runs(Mode(eligible_leader_replicas=False))
    assert s.lost_silent > 0
    assert s.invariant_violations == 0, s.lines()
    # The classic rules report nothing (the lifecycle's feature cycles switch to KIP-966's
    # rules for a while, whose recoveries are reported: without the lifecycle, none).
    s = runs(Mode(eligible_leader_replicas=False), lifecycle_ops=0)
    assert s.lost_silent > 0
    assert s.unclean_recoveries == 0


def test_classic_unclean_election_is_reported() -> None:
    mode = Mode(eligible_leader_replicas=False, unclean_leader_election=True)
    s = runs(mode)
    assert s.unclean_recoveries > 0
    assert s.lost_reported > 0
    # Far fewer partition-seconds without a leader than waiting for the ISR.
    classic = runs(Mode(eligible_leader_replicas=False))
    assert s.unavailable_partition_seconds < classic.unavailable_partition_seconds


@pytest.mark.parametrize(
    "mode",
    [Mode(eligible_leader_replicas=False), Mode(lie_clean_shutdown=True)],
    ids=["classic", "lie-clean-shutdown"],
)
def test_without_page_cache_loss_nothing_is_lost_silently(mode: Mode) -> None:
    """No false alarms: the silent losses above need a lost page cache. Without lossy
    kills (plain kills, shutdowns and partitions only) even the classic rules and the
    lying mutant keep every acknowledged record."""
    s = run_faults(schedules=40, seed=SEED, mode=mode, lossy_kills=0)
    assert s.acknowledged > 0
    assert s.lost_silent == 0, s.lines()
    assert s.present + s.lost_reported + s.deleted == s.acknowledged


def test_an_isr_join_below_the_high_watermark_loses_silently() -> None:
    """A finding of this simulator: the broker stub let a follower rejoin the ISR on its
    last fetch being caught up, without Kafka's check that its log reaches the leader's
    high watermark; `replication.join_floor` now requires it. The old rule, as mutant (c),
    still loses records silently on the schedule that found it."""
    # Found by a run of SCHEDULES schedules, before the lifecycle ops and the failovers
    # were interleaved.
    sched = generate(schedule_seed(SEED, 32), lifecycle_ops=0, failovers=0)
    assert run_schedule(sched, Mode()).lost_silent == 0
    assert run_schedule(sched, Mode(isr_join_ignores_hw=True)).lost_silent > 0


# --- one hand-made schedule: the Last Replica Standing -------------------------------------


LAST_REPLICA_STANDING = Schedule(
    seed=7,
    brokers=3,
    partitions=1,
    # Followers 2 and 3 cannot fetch: the ISR shrinks to the leader, 1. Then 1 dies and
    # loses its page cache: acknowledged records are on 2 and 3 only.
    faults=[
        Fault(at_ms=5_000, kind="isolate", broker=2, scope="brokers", for_ms=20_000),
        Fault(at_ms=5_000, kind="isolate", broker=3, scope="brokers", for_ms=20_000),
        Fault(at_ms=12_000, kind="lossy_kill", broker=1, for_ms=3_000),
    ],
    flush_ms=[60_000, 1_000, 1_000],
)


def test_last_replica_standing_classic_loses_elr_does_not() -> None:
    classic = run_schedule(LAST_REPLICA_STANDING, Mode(eligible_leader_replicas=False))
    elr = run_schedule(LAST_REPLICA_STANDING, Mode())
    assert classic.acknowledged > 0 and elr.acknowledged > 0
    assert classic.lost_silent > 0
    assert elr.lost_silent == elr.lost_reported == 0
    assert elr.present == elr.acknowledged
    assert elr.unclean_recoveries == 0  # a clean election from the ELR


def test_last_replica_standing_without_faults_loses_nothing() -> None:
    quiet = msgspec.structs.replace(LAST_REPLICA_STANDING, faults=[])
    out = run_schedule(quiet, Mode(eligible_leader_replicas=False))
    assert out.acknowledged > 0
    assert out.present == out.acknowledged
    assert out.unavailable_partition_ms == 0


# --- determinism, shrinking, replay files ---------------------------------------------------


def test_runs_are_deterministic() -> None:
    sched = generate(schedule_seed(SEED, 3))
    assert generate(schedule_seed(SEED, 3)) == sched
    mode = Mode(eligible_leader_replicas=False)
    assert run_schedule(sched, mode) == run_schedule(sched, mode)
    a = run_faults(schedules=5, seed=9, mode=mode).to_json()
    b = run_faults(schedules=5, seed=9, mode=mode).to_json()
    for timing in ("elapsed_s", "schedules_per_s"):
        a.pop(timing), b.pop(timing)
    assert a == b


def test_schedules_depend_on_the_seed_and_the_lossy_kills() -> None:
    assert generate(schedule_seed(1, 0)) != generate(schedule_seed(2, 0))
    for k in (0, 1, 3):
        faults = generate(schedule_seed(1, 0), k).faults
        assert sum(f.kind == "lossy_kill" for f in faults) == k


def test_shrink_keeps_the_failure_and_drops_faults() -> None:
    mode = Mode(eligible_leader_replicas=False)
    big = msgspec.structs.replace(
        LAST_REPLICA_STANDING,
        faults=[
            *LAST_REPLICA_STANDING.faults,
            Fault(at_ms=1_000, kind="shutdown", broker=3, for_ms=1_000),
            Fault(at_ms=25_000, kind="cut", broker=2, peer=3, for_ms=2_000),
        ],
    )
    assert run_schedule(big, mode).lost_silent > 0
    small = shrink(big, mode)
    assert len(small.faults) < len(big.faults)
    assert run_schedule(small, mode).lost_silent > 0
    assert any(f.kind == "lossy_kill" for f in small.faults)


def test_replay_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    mode = Mode(eligible_leader_replicas=False)
    dump_replay(path, mode, LAST_REPLICA_STANDING, {"note": "hand-made"})
    doc = load_replay(path)
    assert doc.mode == mode
    assert doc.schedule == LAST_REPLICA_STANDING
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(path.read_text()), "format": "other"}))
    with pytest.raises(ValueError, match="not a version 1"):
        load_replay(bad)


# --- the CLI ----------------------------------------------------------------------------------

KEYS = {
    "schedules",
    "acknowledged",
    "lost_reported",
    "lost_silent",
    "unavailable_partition_seconds",
    "unclean_recoveries",
}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    rc = main(["simulate", "faults", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


def test_cli_json_summary_and_exit_codes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    save = ["--save-dir", str(tmp_path)]
    rc, doc = _run(capsys, "--schedules", "10", "--seed", "1", "--json", *save)
    assert rc == 0
    assert doc.keys() >= KEYS
    assert doc["schedules"] == 10 and doc["lost_silent"] == 0
    rc, _ = _run(capsys, "--schedules", "10", "--seed", "1", "--json", "--expect-silent-loss")
    assert rc == 3
    classic = ["--eligible-leader-replicas", "disabled", "--json", *save, "--shrink-max", "1"]
    rc, doc = _run(capsys, "--schedules", "30", "--seed", "1", *classic)
    assert rc == 3 and isinstance(doc["lost_silent"], int) and doc["lost_silent"] > 0
    assert len(list(tmp_path.glob("faults-seed1-schedule*.json"))) == 1  # shrunk and saved
    rc, doc = _run(capsys, "--schedules", "30", "--seed", "1", "--expect-silent-loss", *classic)
    assert rc == 0


def test_cli_mutant_replay_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["--schedules", "40", "--seed", "1", "--json", "--save-dir", str(tmp_path)]
    rc, doc = _run(capsys, *args, "--mutant", "lie-clean-shutdown", "--shrink-max", "1")
    assert rc == 3
    failures = doc["failures"]
    assert isinstance(failures, list) and failures
    saved = [f for f in failures if f["file"]]
    assert len(saved) == 1
    assert saved[0]["faults_after"] <= saved[0]["faults_before"]
    replay_file = saved[0]["file"]
    rc, doc = _run(capsys, "--replay", replay_file, "--json")
    assert rc == 3
    assert doc["schedules"] == 1 and isinstance(doc["lost_silent"], int)
    assert doc["lost_silent"] > 0
    assert load_replay(Path(replay_file)).mode.lie_clean_shutdown


def test_cli_text_output_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "faults", "--schedules", "2", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert "lost silently: 0" in out and "schedules: 2" in out
    assert main(["simulate", "faults", "--unclean-leader-election", "--schedules", "1"]) == 2
    assert "classic-mode" in capsys.readouterr().err
    assert main(["simulate", "faults", "--schedules", "0"]) == 2
    assert main(["simulate", "faults", "--schedules", "1", "--lifecycle-ops", "-1"]) == 2
    assert "--lifecycle-ops" in capsys.readouterr().err


def test_cli_lifecycle_ops(capsys: pytest.CaptureFixture[str]) -> None:
    rc, on = _run(capsys, "--schedules", "5", "--seed", "3", "--json")
    assert rc == 0 and isinstance(on["lifecycle"], dict) and on["lifecycle"]
    rc, off = _run(capsys, "--schedules", "5", "--seed", "3", "--json", "--lifecycle-ops", "0")
    assert rc == 0 and off["lifecycle"] == {} and off["deleted"] == 0


def test_cli_unreadable_replay_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "faults", "--replay", str(tmp_path / "missing.json")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "metactl-faults-schedule"}')
    assert main(["simulate", "faults", "--replay", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err


# --- the lifecycle ops: schedules, the data plane, planted bugs ------------------------------


def test_lifecycle_ops_come_from_their_own_stream() -> None:
    """Turning the lifecycle off leaves the faults of a seed as they are, so the two
    kinds of run face the same faults; the ops themselves depend on the seed."""
    kinds: set[str] = set()
    for i in range(30):
        seed = schedule_seed(SEED, i)
        with_ops, without = generate(seed), generate(seed, lifecycle_ops=0)
        assert with_ops.faults == without.faults and without.ops == []
        assert len([o for o in with_ops.ops if o.kind != "cancel_reassignment"]) == LIFECYCLE_OPS
        assert all(o.at_ms < with_ops.fault_window_ms for o in with_ops.ops)
        kinds |= {o.kind for o in with_ops.ops}
    assert generate(schedule_seed(SEED, 0)).ops != generate(schedule_seed(SEED, 1)).ops
    assert kinds == {
        "topic_min_isr",
        "cluster_min_isr",
        "reassign",
        "cancel_reassignment",
        "add_partitions",
        "delete_topic",
        "unregister",
        "elr_feature_cycle",
    }


QUIET = Schedule(seed=5, brokers=4, partitions=1, faults=[], flush_ms=[1_000] * 4)


def test_a_new_replica_copies_and_a_removed_one_is_deleted() -> None:
    """events-0 moves from [1, 2, 3] to [4, 2, 3]: broker 4 starts empty and gets the log
    only by fetching it from the leader; broker 1's replica is deleted with its data. The
    move completes through the leader's own ISR expansion."""
    sched = msgspec.structs.replace(
        QUIET, ops=[Op(at_ms=10_000, kind="reassign", partition=0, replicas=[4, 2, 3])]
    )
    sim = FaultSim(sched, Mode())
    out = sim.run()
    tp = (TOPIC, 0)
    p = sim.core.image.partitions[tp]
    assert (p.replicas, p.adding, p.removing) == ((4, 2, 3), (), ())
    assert out.lifecycle == {
        "reassign": 1,
        "reassignment started": 1,
        "reassignment completed": 1,
    }
    assert tp not in sim.brokers[1].logs
    leader = sim.brokers[p.leader].logs[tp]
    copy = sim.brokers[4].logs[tp]
    assert copy.log_end_offset == leader.log_end_offset > 0
    assert copy.leader_epochs == leader.leader_epochs
    assert out.acknowledged > 0 and out.present == out.acknowledged


def test_a_deleted_topic_is_not_a_loss_and_its_successor_is_checked() -> None:
    """Deleting the topic makes its acknowledged records `deleted`, not lost; the topic
    created again gets a new id, starts empty on every broker, and the producers carry
    on against it: its records are checked like any others."""
    sched = msgspec.structs.replace(
        QUIET, ops=[Op(at_ms=10_000, kind="delete_topic", for_ms=1_000)]
    )
    sim = FaultSim(sched, Mode())
    out = sim.run()
    first_id = sim.acked[0][0]  # acknowledged before the delete
    new_id = sim.core.image.topics[TOPIC].topic_id
    assert new_id != first_id
    assert out.lifecycle == {"delete_topic": 1, "recreate_topic": 1}
    assert out.deleted > 0 and out.present > 0
    assert out.lost_silent == out.lost_reported == 0
    assert out.present + out.deleted == out.acknowledged
    assert {
        sim.brokers[b].topic_ids[(TOPIC, 0)] for b in sim.core.image.partitions[(TOPIC, 0)].replicas
    } == {new_id}
    # The oracle checks the new topic's records: they start again at offset 0.
    assert min(a[2] for a in sim.acked if a[0] == new_id) == 0


# Planted bug 1, MinISR path. Broker 1 dies (page cache kept) and broker 2 is cut off:
# the ISR shrinks to [3] and 2, which holds every acknowledged record, joins the ELR. The
# cluster default goes down to 1, so 3 acknowledges alone; then 3 dies losing its page
# cache. KIP-966 clears the ELR on the config change: 3 is the only candidate left, and
# recovering it is a reported loss. The planted bug keeps the ELR: 2 is elected cleanly
# and what 3 acknowledged alone is lost silently.
MIN_ISR_LOWERED = Schedule(
    seed=11,
    brokers=3,
    partitions=1,
    faults=[
        Fault(at_ms=3_000, kind="kill", broker=1, for_ms=40_000),
        Fault(at_ms=12_000, kind="isolate", broker=2, scope="all", for_ms=18_000),
        Fault(at_ms=26_000, kind="lossy_kill", broker=3, for_ms=2_000),
    ],
    ops=[Op(at_ms=23_000, kind="cluster_min_isr", value=1)],
    flush_ms=[1_000, 1_000, 60_000],
)


def _clear_keeps_elr(self: Builder, record: ClearElrRecord) -> None:
    """The planted bug: a ClearElrRecord applies the new MinISR but keeps the ELR."""
    t = self.topics[record.topic]
    end = t.partitions if record.end is None else min(record.end, t.partitions)
    for p in self.partitions.topic_states(record.topic, range(record.first, end)):
        configured = p.min_isr if record.min_isr is None else record.min_isr
        min_isr = min(configured, len(p.replicas))
        if min_isr != p.min_isr:
            new = replace_partition(
                p, elr=p.elr, lkelr=p.last_known_elr, min_isr=min_isr, bump=True
            )
            self.set_partition(p.tp, new, p)
            if self.delta is not None:
                self.delta.partitions.add(p.tp)


def test_planted_bug_min_isr_change_keeping_the_elr_loses_silently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    right = run_schedule(MIN_ISR_LOWERED, Mode())
    assert right.lifecycle == {"cluster_min_isr": 1}
    assert right.lost_silent == 0 and not right.violations
    assert right.lost_reported > 0  # 3's recovery: reported
    monkeypatch.setitem(replay._APPLY, ClearElrRecord, _clear_keeps_elr)
    wrong = run_schedule(MIN_ISR_LOWERED, Mode())
    assert wrong.lost_silent > 0
    # Without the config change the bug has nothing to keep: the ops are the trigger.
    assert run_schedule(msgspec.structs.replace(MIN_ISR_LOWERED, ops=[]), Mode()).lost_silent == 0


# Planted bug 2, reassignment path. events-0 moves from [1, 2, 3] to [4, 2, 3] and its
# leader dies 50 ms later (page cache kept), before 4 could fetch anything. Correctly, 4
# joins the ISR only by catching up (from the next leader, 2), and the move completes.
# The planted bug puts an adding replica straight into the ISR: 4, first in the new
# assignment, is elected cleanly with an empty log and the others truncate to it.
LEADER_DIES_DURING_MOVE = Schedule(
    seed=12,
    brokers=4,
    partitions=1,
    faults=[Fault(at_ms=10_050, kind="kill", broker=1, for_ms=10_000)],
    ops=[Op(at_ms=10_000, kind="reassign", partition=0, replicas=[4, 2, 3])],
    flush_ms=[1_000] * 4,
)


def test_planted_bug_adding_replica_in_the_isr_loses_silently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    right = run_schedule(LEADER_DIES_DURING_MOVE, Mode())
    assert right.lifecycle["reassignment completed"] == 1
    assert right.lost_silent == right.lost_reported == 0 and not right.violations

    def eager(
        image: ClusterImage,
        p: PartitionState,
        replicas: tuple[int, ...],
        adding: tuple[int, ...],
        removing: tuple[int, ...],
        **kwargs: Any,
    ) -> PartitionChangeRecord | None:
        change = move_replicas(image, p, replicas, adding, removing, **kwargs)
        if change is not None and change.adding_replicas:
            isr = set(p.isr if change.isr is None else change.isr) | set(change.adding_replicas)
            change = msgspec.structs.replace(change, isr=sorted(isr))
        return change

    monkeypatch.setattr("controller.core.lifecycle.move_replicas", eager)
    wrong = run_schedule(LEADER_DIES_DURING_MOVE, Mode())
    assert wrong.lost_silent > 0
    assert any(v.startswith("adding_replica_in_isr") for v in wrong.violations)
    # Without the leader's death the new replica catches up before anyone elects it.
    quiet = run_schedule(msgspec.structs.replace(LEADER_DIES_DURING_MOVE, faults=[]), Mode())
    assert quiet.lost_silent == 0 and quiet.acknowledged > 0


def test_planted_bug_completion_keeping_a_removed_replica_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A completion that leaves the removed replica in the ISR loses nothing here (the
    removed replica is never electable, and the leader's high watermark waits for it
    until the leader drops it), but the invariant checker fails the run."""
    sched = msgspec.structs.replace(LEADER_DIES_DURING_MOVE, faults=[])
    assert not run_schedule(sched, Mode()).failed

    def keeps(
        image: ClusterImage, p: PartitionState, **kwargs: Any
    ) -> PartitionChangeRecord | None:
        done = complete_reassignment(image, p, **kwargs)
        if done is not None:
            isr = set(p.isr if done.isr is None else done.isr) | set(p.removing)
            done = msgspec.structs.replace(done, isr=sorted(isr))
        return done

    monkeypatch.setattr("controller.core.partition_handlers.complete_reassignment", keeps)
    out = run_schedule(sched, Mode())
    assert out.failed
    assert any(v.startswith("member_outside_replicas") for v in out.violations)


def test_shrink_drops_lifecycle_ops_that_do_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(replay._APPLY, ClearElrRecord, _clear_keeps_elr)
    noisy = msgspec.structs.replace(
        MIN_ISR_LOWERED,
        ops=[
            Op(at_ms=2_500, kind="add_partitions", value=1),
            *MIN_ISR_LOWERED.ops,
            Op(at_ms=29_000, kind="topic_min_isr", value=2),
        ],
    )
    assert run_schedule(noisy, Mode()).lost_silent > 0
    small = shrink(noisy, Mode(), lambda out: out.lost_silent > 0)
    assert [o.kind for o in small.ops] == ["cluster_min_isr"]
    assert run_schedule(small, Mode()).lost_silent > 0


def test_a_replay_file_without_ops_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    dump_replay(path, Mode(), LAST_REPLICA_STANDING, {})
    doc = json.loads(path.read_text())
    doc["schedule"].pop("ops", None)
    path.write_text(json.dumps(doc))
    assert load_replay(path).schedule.ops == []
