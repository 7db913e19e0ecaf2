"""`metactl simulate faults`: the oracle finds no silent loss under KIP-966, and must find
it when the guarantees are taken away (the mutants, classic mode).

Fixed seeds, virtual time: every number here is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from ops.cli import main
from simulation.faults import FaultsSummary, run_faults, run_schedule, shrink
from simulation.faults_schedule import (
    Fault,
    Mode,
    Schedule,
    dump_replay,
    generate,
    load_replay,
    schedule_seed,
)

SEED = 1
SCHEDULES = 200  # the main claim: KIP-966 with balanced recovery loses nothing silently
FEW = 60  # enough for the weakened variants to lose data


_RUNS: dict[tuple[Mode, int], FaultsSummary] = {}


def runs(mode: Mode, schedules: int = FEW) -> FaultsSummary:
    """`run_faults` with the fixed seed, once per mode and size for the whole module."""
    key = (mode, schedules)
    if key not in _RUNS:
        _RUNS[key] = run_faults(schedules=schedules, seed=SEED, mode=mode)
    return _RUNS[key]


@pytest.fixture(scope="module")
def elr_balanced() -> FaultsSummary:
    return runs(Mode(), SCHEDULES)


def test_elr_balanced_loses_nothing_silently(elr_balanced: FaultsSummary) -> None:
    s = elr_balanced
    assert s.schedules == SCHEDULES
    assert s.acknowledged > 10_000
    assert s.lost_silent == 0, s.lines()
    assert s.invariant_violations == 0, s.lines()
    assert s.present + s.lost_reported + s.unreadable == s.acknowledged
    # The schedules are hard enough: records are lost, and every loss is reported.
    assert s.unclean_recoveries > 0
    assert s.lost_reported > 0
    assert s.unavailable_partition_seconds > 0


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
    s = runs(Mode(lie_clean_shutdown=True))
    assert s.lost_silent > 0
    # The lie hides every unclean restart: nothing is recovered, nothing reported.
    assert s.unclean_recoveries == 0


def test_mutant_hw_below_min_isr_loses_silently() -> None:
    s = runs(Mode(hw_ignores_min_isr=True))
    assert s.lost_silent > 0


def test_classic_mode_loses_the_last_replica_standing() -> None:
    s = runs(Mode(eligible_leader_replicas=False))
    assert s.lost_silent > 0
    assert s.unclean_recoveries == 0
    assert s.invariant_violations == 0, s.lines()


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
    assert s.present + s.lost_reported == s.acknowledged


def test_an_isr_join_below_the_high_watermark_loses_silently() -> None:
    """A finding of this simulator: the broker stub let a follower rejoin the ISR on its
    last fetch being caught up, without Kafka's check that its log reaches the leader's
    high watermark; `replication.join_floor` now requires it. The old rule, as mutant (c),
    still loses records silently on the schedule that found it."""
    sched = generate(schedule_seed(SEED, 32))  # found by a run of SCHEDULES schedules
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


def test_cli_unreadable_replay_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", "faults", "--replay", str(tmp_path / "missing.json")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "metactl-faults-schedule"}')
    assert main(["simulate", "faults", "--replay", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err
