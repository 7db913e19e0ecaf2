"""The audit jobs against logs whose answers are known (scenarios, crafted, simulated)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from audit import plain
from audit.export import export_parquet
from audit.export_layout import MANIFEST
from audit.jobs import brokers, elections, invariants, offline, unclean
from audit.spark import AuditInput

pytestmark = pytest.mark.slow

BALANCED = "worked-5.3.3-balanced-recovery"
MANUAL = "manual-operator-election"
PROACTIVE = "proactive-recovery-window"


def _one(df: pd.DataFrame) -> Any:
    assert len(df) == 1, df
    return df.iloc[0]


@pytest.fixture(scope="module")
def parquet_of(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[tuple[str, ...], str] = {}

    def export(*dirs: Path) -> str:
        key = tuple(str(d) for d in dirs)
        if key not in cache:
            out = tmp_path_factory.mktemp("export") / "pq"
            export_parquet(list(key), out)
            cache[key] = str(out)
        return cache[key]

    return export


# --- unclean-recoveries --------------------------------------------------------------------


def test_balanced_example_has_one_recovery_won_on_offset(
    spark: Any, scenario_logs: dict[str, Path]
) -> None:
    res = unclean.run(spark, AuditInput.of(str(scenario_logs[BALANCED])))
    r = _one(res.tables["unclean_recoveries"])
    assert (r.topic, r.partition, r.strategy, r.trigger) == (
        "orders",
        0,
        "balanced",
        "isr_and_elr_empty",
    )
    assert r.chosen == 2 and r.runner_up == 3
    assert (r.chosen_last_leader_epoch, r.chosen_log_end_offset) == (0, 12)
    assert (r.runner_up_last_leader_epoch, r.runner_up_log_end_offset) == (0, 10)
    assert (r.margin_kind, r.margin) == ("offset", 2)
    assert [(c["broker"], c["last_leader_epoch"], c["log_end_offset"]) for c in r.candidates] == [
        (2, 0, 12),
        (3, 0, 10),
    ]
    assert r.time_to_recovery_ms == 0 and r.potential_data_loss
    assert res.stats["recoveries"] == 1
    assert any("won on offset by 2" in line for line in res.summary)


def test_manual_and_proactive_recoveries(spark: Any, scenario_logs: dict[str, Path]) -> None:
    inp = AuditInput.of([str(scenario_logs[MANUAL]), str(scenario_logs[PROACTIVE])])
    table = unclean.run(spark, inp).tables["unclean_recoveries"].set_index("cluster")
    manual = table.loc[MANUAL]
    assert (manual.strategy, manual.trigger, manual.chosen) == ("manual", "operator", 1)
    assert manual.margin_kind == "not_reported" and len(manual.candidates) == 0
    assert manual.time_to_recovery_ms == 60_000  # offline at t=0, elected after 60 s
    proactive = table.loc[PROACTIVE]
    assert (proactive.strategy, proactive.trigger) == ("proactive", "elr_all_fenced")
    assert (proactive.chosen, proactive.margin_kind) == (3, "uncontested")
    assert proactive.time_to_recovery_ms == 1000  # the decision window


def test_recoveries_agree_with_the_plain_pass(spark: Any, sim_log: tuple[Path, Any]) -> None:
    path, report = sim_log
    table = unclean.run(spark, AuditInput.of(str(path))).tables["unclean_recoveries"]
    base = plain.run(path, invariants=False)
    assert report.unclean_recoveries == len(base.recoveries) == len(table) > 0
    cols = ["offset", "chosen", "runner_up", "margin_kind", "margin", "time_to_recovery_ms"]
    got = table[cols].astype(object).where(table[cols].notna(), None).values.tolist()
    want = [[r[c] for c in cols] for r in base.recoveries]
    assert got == want


# --- elections -----------------------------------------------------------------------------


def test_elections_of_the_balanced_example(spark: Any, scenario_logs: dict[str, Path]) -> None:
    res = elections.run(spark, AuditInput.of(str(scenario_logs[BALANCED])))
    assert res.stats["by_kind"] == {"isr": 2, "unclean_recovery": 1}
    imbalance = _one(res.tables["imbalance"])
    assert (imbalance.partition, imbalance.leader, imbalance.preferred) == (0, 2, 1)
    assert res.stats["imbalanced"] == 1 and res.stats["offline"] == 0
    per_broker = res.tables["leaders_by_broker"].set_index("broker")
    assert per_broker.loc[2, "leads"] == 1 and per_broker.loc[1, "preferred_for"] == 1


def test_election_counts_agree_with_the_log(spark: Any, sim_log: tuple[Path, Any]) -> None:
    path, _ = sim_log
    res = elections.run(spark, AuditInput.of(str(path)), bucket="hour")
    df = spark.read.format("metactl").load(str(path))
    want = {
        r["election_kind"]: r["count"]
        for r in df.where("election_kind IS NOT NULL").groupBy("election_kind").count().collect()
    }
    assert res.stats["by_kind"] == want
    assert res.tables["elections_by_bucket"]["elections"].sum() == sum(want.values())
    assert res.stats["partitions"] == 60


# --- offline -------------------------------------------------------------------------------


def test_offline_intervals_of_known_scenarios(spark: Any, scenario_logs: dict[str, Path]) -> None:
    inp = AuditInput.of([str(scenario_logs[MANUAL]), str(scenario_logs[BALANCED])])
    res = offline.run(spark, inp)
    per = res.tables["offline_partitions"].set_index("cluster")
    manual = per.loc[MANUAL]
    assert manual.offline_intervals == 1 and manual.offline_ms == 60_000
    assert manual.offline_max_ms == 60_000 and not manual.offline_now
    assert manual.under_min_isr_ms == 60_000  # ISR [3] at t=0 until the AlterPartition
    balanced = per.loc[BALANCED]
    # Offline and recovered at the same millisecond (the scenario's clock stands still):
    # listed, but no outage.
    assert balanced.offline_intervals == 0 and balanced.offline_ms == 0
    intervals = res.tables["offline_intervals"].sort_values("duration_ms")
    assert intervals["duration_ms"].tolist() == [0, 60_000]
    assert intervals["outage"].tolist() == [False, True]
    assert (intervals["ended"] == "leader").all() and not intervals["open"].any()
    assert res.stats["intervals"] == 1 and res.stats["instant_intervals"] == 1


def test_offline_window_clips(spark: Any, scenario_logs: dict[str, Path]) -> None:
    inp = AuditInput.of(str(scenario_logs[MANUAL]), since_ms=20_000, until_ms=50_000)
    per = _one(offline.run(spark, inp).tables["offline_partitions"])
    # The elected leader arrives at 60 s, after the window: offline all 30 s of it.
    assert per.offline_ms == 30_000 and per.under_min_isr_ms == 30_000


# --- brokers -------------------------------------------------------------------------------


def test_brokers_of_the_balanced_example(spark: Any, scenario_logs: dict[str, Path]) -> None:
    res = brokers.run(spark, AuditInput.of(str(scenario_logs[BALANCED])))
    table = res.tables["brokers"].set_index("broker")
    assert list(table.index) == [1, 2, 3]
    assert table["fences"].tolist() == [1, 1, 1]
    assert table["unfences"].tolist() == [2, 2, 2]
    assert table["unclean_registrations"].tolist() == [1, 1, 1]
    assert res.stats["flapping"] == []
    flappy = brokers.run(spark, AuditInput.of(str(scenario_logs[BALANCED])), flap_fences=0)
    assert flappy.stats["flapping"] == [1, 2, 3]


def test_broker_counts_agree_with_the_log(spark: Any, sim_log: tuple[Path, Any]) -> None:
    path, _ = sim_log
    df = spark.read.format("metactl").load(str(path))
    lo, hi = 1_767_225_600_000 + 3_600_000, 1_767_225_600_000 + 12 * 3_600_000
    res = brokers.run(spark, AuditInput.of(str(path), since_ms=lo, until_ms=hi))
    window = df.where(f"unix_millis(timestamp) >= {lo} AND unix_millis(timestamp) < {hi}")
    fences = dict(window.where("record_type = 'FenceBroker'").groupBy("broker").count().collect())
    unclean_regs = window.where("record_type = 'RegisterBroker' AND NOT clean").count()
    table = res.tables["brokers"].set_index("broker")
    assert {b: n for b, n in table["fences"].items() if n} == fences
    assert res.stats["unclean_registrations"] == unclean_regs


# --- the metadata lifecycle in the other jobs ----------------------------------------------


def test_elections_and_brokers_follow_the_lifecycle(spark: Any, crafted_log: Path) -> None:
    """Imbalance at the end reads a reassignment's replicas (its preferred leader) and
    leaves out a deleted topic; the brokers table counts unregistrations."""
    inp = AuditInput.of(str(crafted_log))
    final = elections.run(spark, inp)
    imbalance = final.tables["imbalance"]
    assert "healthy-deleted" not in set(imbalance["topic"])  # its leader 82 != 81
    assert "healthy-reassign" not in set(imbalance["topic"])  # preferred 65 after the move
    assert "leader-outside" in set(imbalance["topic"])  # what imbalance does flag still is
    table = brokers.run(spark, inp).tables["brokers"].set_index("broker")
    assert table.loc[54, "unregistrations"] == 1 and table.loc[74, "unregistrations"] == 1
    assert table["unregistrations"].sum() == 2


# --- invariants ----------------------------------------------------------------------------


# The KIP-966 invariants do not hold under the classic rules by design: in this scenario
# an uncleanly registered broker stays the last ISR member and is elected again (the
# silent loss KIP-966 prevents), which the audit must flag.
CLASSIC_LOSS = "classic-last-replica-standing"


def test_every_shipped_scenario_is_healthy(spark: Any, scenario_logs: dict[str, Path]) -> None:
    res = invariants.run(spark, AuditInput.of([str(p) for p in scenario_logs.values()]))
    found = res.tables["violations"]
    flagged = {(c, r) for c, r in zip(found["cluster"], found["rule"], strict=True)}
    # Exactly that finding: every other scenario is clean.
    assert flagged == {(CLASSIC_LOSS, "unclean_replica_in_isr")}, res.summary
    assert res.exit_status == 1
    assert res.stats["partitions"] >= len(scenario_logs) - 8  # error scenarios may have none


def test_crafted_violations_are_each_caught(spark: Any, crafted_log: Path) -> None:
    from tests.audit.logs import CRAFTED, EXPECTED

    res = invariants.run(spark, AuditInput.of(str(crafted_log)))
    found = res.tables["violations"]
    got = sorted(zip(found["topic"], found["offset"], found["rule"], found["broker"], strict=True))
    want = sorted((t, o, r, b) for t, o, r, b in EXPECTED)
    normalised = [(t, o, r, None if pd.isna(b) else int(b)) for t, o, r, b in got]
    assert normalised == want
    assert set(found["rule"]) == {r for r in CRAFTED.values() if r is not None}
    assert res.exit_status == 1
    base = plain.run(crafted_log, recoveries=False)
    assert sorted((v.topic, v.offset, v.rule, v.broker) for v in base.violations) == want


def test_violations_are_reported_in_the_window(spark: Any, crafted_log: Path) -> None:
    from tests.audit.logs import EXPECTED

    everything = invariants.run(spark, AuditInput.of(str(crafted_log))).tables["violations"]
    cut = everything["timestamp"].sort_values().iloc[len(everything) // 2]
    since = int(pd.Timestamp(cut, tz="UTC").value // 1_000_000)
    later = invariants.run(spark, AuditInput.of(str(crafted_log), since_ms=since))
    assert 0 < len(later.tables["violations"]) < len(EXPECTED)
    assert set(later.tables["violations"]["offset"]) == {
        o for o, t in zip(everything["offset"], everything["timestamp"], strict=True) if t >= cut
    }


def test_simulated_history_is_healthy(spark: Any, sim_log: tuple[Path, Any]) -> None:
    path, report = sim_log
    assert report.records > 3000 and report.unclean_recoveries > 0
    res = invariants.run(spark, AuditInput.of(str(path)))
    assert res.stats["violations"] == 0, res.summary
    base = plain.run(path, recoveries=False)
    assert res.stats["records"] == base.checked and res.stats["partitions"] == 60


# --- every source, every method and the plain pass give the same answers ---------------


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame, what: str = "", *, dtypes: bool = True) -> None:
    pd.testing.assert_frame_equal(
        a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=dtypes, obj=what
    )


def _same_result(a: Any, b: Any, what: str, *, dtypes: bool = True) -> None:
    """Two results of one job: the same summary (but its first line, naming the input),
    statistics and tables (of the same types, unless not `dtypes`: the plain pass's)."""
    assert a.summary[1:] == b.summary[1:], what
    assert a.stats == b.stats, what
    assert a.tables.keys() == b.tables.keys(), what
    for name in a.tables:
        _frames_equal(a.tables[name], b.tables[name], f"{what}: {name}", dtypes=dtypes)


JOB_MODULES = {
    "elections": elections,
    "unclean-recoveries": unclean,
    "offline": offline,
    "brokers": brokers,
    "invariants": invariants,
}


def test_every_job_gives_the_same_answers_from_every_source(
    spark: Any,
    scenario_logs: dict[str, Path],
    crafted_log: Path,
    sim_log: tuple[Path, Any],
    parquet_of: Any,
) -> None:
    """Data directories (the SQLite data source), their Parquet export (buckets) and the
    plain single-process pass: every table, summary and statistic of every job equal."""
    dirs = [scenario_logs[BALANCED], scenario_logs[MANUAL], crafted_log, sim_log[0]]
    from_dirs = AuditInput.of([str(d) for d in dirs])
    from_pq = AuditInput.of(parquet=parquet_of(*dirs))
    base = plain.run_jobs([str(d) for d in dirs])
    for job, module in JOB_MODULES.items():
        spark_dirs = module.run(spark, from_dirs)
        _same_result(spark_dirs, module.run(spark, from_pq), f"{job} (Parquet)")
        _same_result(spark_dirs, base.results[job], f"{job} (plain)", dtypes=False)
        assert spark_dirs.tables[next(iter(spark_dirs.tables))].shape[0] > 0, job
    assert base.results["invariants"].stats["violations"] > 0  # the comparison covers findings


def test_windowed_answers_are_the_same_from_every_source(
    spark: Any, crafted_log: Path, sim_log: tuple[Path, Any], parquet_of: Any
) -> None:
    """A window [since, until) cuts the same events in the plain pass as on Parquet."""
    dirs = [str(crafted_log), str(sim_log[0])]
    since, until = 1_767_225_600_000 + 3 * 3_600_000, 1_767_225_600_000 + 20 * 3_600_000
    from_pq = AuditInput.of(
        parquet=parquet_of(crafted_log, sim_log[0]), since_ms=since, until_ms=until
    )
    base = plain.run_jobs(dirs, ["offline", "brokers", "elections"], since_ms=since, until_ms=until)
    whole = plain.run_jobs(dirs, ["offline"])
    for job in ("offline", "brokers", "elections"):
        _same_result(JOB_MODULES[job].run(spark, from_pq), base.results[job], job, dtypes=False)
    assert base.results["offline"].stats != whole.results["offline"].stats  # it did cut


def test_every_invariant_method_agrees(
    spark: Any, crafted_log: Path, sim_log: tuple[Path, Any], parquet_of: Any
) -> None:
    """logs (data directories), rows (Spark's shuffle, from data directories and from
    Parquet) and buckets (the export's): the same violations and statistics, which are
    the crafted log's planted ones."""
    from tests.audit.logs import EXPECTED

    dirs = AuditInput.of([str(crafted_log), str(sim_log[0])])
    pq = AuditInput.of(parquet=parquet_of(crafted_log, sim_log[0]))
    logs = invariants.run(spark, dirs, method="logs")
    found = logs.tables["violations"]
    crafted = found[found["cluster"] == crafted_log.name]
    got = sorted(
        (t, o, r, None if pd.isna(b) else int(b))
        for t, o, r, b in zip(
            crafted["topic"], crafted["offset"], crafted["rule"], crafted["broker"], strict=True
        )
    )
    assert got == sorted(EXPECTED)
    for inp, method in ((dirs, "rows"), (pq, "rows"), (pq, "buckets")):
        other = invariants.run(spark, inp, method=method)
        _frames_equal(found, other.tables["violations"], method)
        assert logs.stats == other.stats, method
    with pytest.raises(ValueError, match="buckets"):
        invariants.run(spark, dirs, method="buckets")


def test_an_export_without_its_manifest_takes_the_row_paths(
    spark: Any,
    crafted_log: Path,
    sim_log: tuple[Path, Any],
    parquet_of: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parquet of another layout (an older export, another producer): no buckets, so every
    job reads rows through Spark (markers and time bounds scanned, a shuffle by partition
    where a job replays partitions): the same answers as the buckets."""
    exported = parquet_of(crafted_log, sim_log[0])
    with_buckets = {
        job: module.run(spark, AuditInput.of(parquet=exported))
        for job, module in JOB_MODULES.items()
    }
    monkeypatch.setattr(AuditInput, "manifest", lambda self: None)
    rows = AuditInput.of(parquet=exported)
    assert invariants.pick_method(rows) == "rows"
    for job, module in JOB_MODULES.items():
        _same_result(with_buckets[job], module.run(spark, rows), f"{job} (rows)")


@pytest.mark.filterwarnings("ignore:toPandas attempted Arrow optimization")
def test_an_export_the_executors_cannot_read_fails_loudly(
    spark: Any, crafted_log: Path, parquet_of: Any, tmp_path: Path
) -> None:
    """The driver read the manifest; an executor that cannot see the export (not a shared
    path) must fail the job, never report an empty, healthy history."""
    copy = tmp_path / "pq"
    shutil.copytree(parquet_of(crafted_log), copy)
    inp = AuditInput.of(parquet=str(copy))
    assert inp.manifest() is not None
    (copy / MANIFEST).unlink()
    with pytest.raises(Exception, match=r"LOG_DIR_NOT_FOUND: the Parquet export .* not readable"):
        invariants.run(spark, inp)
