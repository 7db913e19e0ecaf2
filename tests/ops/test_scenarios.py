"""Every shipped scenario passes, and the runner's CLI keeps its output and exit contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metactl.errors import ScenarioError
from ops.cli import main
from simulation.scenario import run_scenario
from simulation.scenario_format import Scenario, load_scenario, parse_scenario

SCENARIOS = sorted((Path(__file__).parents[2] / "simulation" / "scenarios").glob("*.yaml"))


def missing_expectation(scenario: Scenario) -> str | None:
    """Why a shipped scenario proves nothing, or None: it needs at least one `expect` step
    (an `expect_error` only checks the previous step's error, not the outcome)."""
    if any(step.action == "expect" for step in scenario.steps):
        return None
    return (
        f"{scenario.source or 'scenario'} has no `expect` step: a shipped scenario must state"
        " the outcome it demonstrates (add e.g. `- expect: {partition: t-0, leader: 1}`)"
    )


def test_the_reference_examples_and_cases_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    for required in (
        "worked-5.2.2-clean-elr-recovery",
        "worked-5.3.3-balanced-recovery",
        "kip966-how-it-works",
    ):
        assert required in names
    assert sum(1 for n in names if n.startswith("case-")) == 7
    assert sum(1 for n in names if n.startswith("error-")) >= 13


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
async def test_shipped_scenario_holds(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    problem = missing_expectation(scenario)
    assert problem is None, problem
    reports, summary = await run_scenario(scenario, tmp_path)
    failures = [f"step {r.step}: {f}" for r in reports for f in r.failures]
    assert failures == []
    assert summary.failed_expectations == 0
    assert summary.steps == len(reports)


def test_a_scenario_without_expect_is_reported() -> None:
    steps: list[object] = [{"fence": 1}, {"elect": {"partition": "t-0", "type": "preferred"}}]
    doc = {"brokers": [1, 2, 3], "topics": [{"name": "t", "partitions": [[1, 2, 3]]}]}
    problem = missing_expectation(parse_scenario({**doc, "steps": steps}, source="x.yaml"))
    assert problem is not None
    assert problem.startswith("x.yaml has no `expect` step")
    # expect_error alone does not count: it checks an error, not the outcome.
    steps.append({"expect_error": "ELECTION_NOT_NEEDED"})
    assert missing_expectation(parse_scenario({**doc, "steps": steps})) is not None
    steps.append({"expect": {"partition": "t-0", "leader": 2}})
    assert missing_expectation(parse_scenario({**doc, "steps": steps})) is None


def _run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    status = main(["scenario", "run", *args])
    out = capsys.readouterr()
    return status, out.out.splitlines(), out.err


def test_json_output_of_the_balanced_example(capsys: pytest.CaptureFixture[str]) -> None:
    path = next(p for p in SCENARIOS if p.stem == "worked-5.3.3-balanced-recovery")
    status, lines, _ = _run_cli(capsys, str(path), "--json")
    assert status == 0
    steps = [json.loads(line) for line in lines[:-1]]
    summary = json.loads(lines[-1])["summary"]
    assert summary["failed_expectations"] == 0
    assert summary["potential_data_loss_events"] == 1
    assert summary["steps"] == len(steps)
    recovery = [e for s in steps for e in s["events"] if e["type"] == "unclean_recovery"]
    assert recovery == [
        {
            "type": "unclean_recovery",
            "partition": "orders-0",
            "strategy": "balanced",
            "chosen": 2,
            "candidates": [
                {"broker": 2, "last_leader_epoch": 0, "log_end_offset": 12},
                {"broker": 3, "last_leader_epoch": 0, "log_end_offset": 10},
            ],
            "potential_data_loss": True,
        }
    ]
    elections = [e for s in steps for e in s["events"] if e["type"] == "election"]
    assert [e["kind"] for e in elections] == ["isr", "isr", "unclean_recovery"]
    final = steps[-1]["partitions"]["orders-0"]
    assert final["leader"] == 2 and final["recovering"] is True
    assert set(final) == {
        "replicas", "leader", "leader_epoch", "partition_epoch", "isr", "elr",
        "last_known_elr", "recovering", "recovery_pending", "min_isr",
    }  # fmt: skip
    assert steps[-1]["brokers"]["2"] == {"epoch": 15, "fenced": False, "controlled_shutdown": False}


def test_failed_expectation_exits_1_with_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "brokers: [1, 2, 3]\n"
        "topics: [{name: t, partitions: [[1, 2, 3]], min_insync_replicas: 2}]\n"
        "steps:\n"
        "  - fence: 1\n"
        "  - expect: {partition: t-0, leader: 3, isr: [2, 3]}\n"
    )
    status, lines, _ = _run_cli(capsys, str(f))
    assert status == 1
    assert any("leader: expected 3, got 2" in line for line in lines)
    assert "1 failed" in lines[-1]


def test_unexpected_step_error_counts_as_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "brokers: [1]\ntopics: [{name: t, partitions: [[1]]}]\n"
        "steps:\n  - elect: {partition: t-0, type: preferred}\n"
    )
    status, lines, _ = _run_cli(capsys, str(f), "--json")
    assert status == 1
    step = json.loads(lines[0])
    assert step["ok"] is False and step["error"] == "ELECTION_NOT_NEEDED"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("steps:\n  - fence: one\n", "step 1 (fence)"),
        ("steps:\n  - fence: 1\n  - alter_partition: {partition: t-0, isr: x}\n", "$.isr"),
        ("steps:\n  - teleport: 1\n", "step 1: unknown action 'teleport'"),
        ("steps:\n  - expect: {leader: 1}\n", "exactly one of `partition` or `broker`"),
        ("steps:\n  - replica_log: {broker: 1, partition: orders}\n", "field `partition`"),
        ("config: {unclean_recovery_strategy: 7}\n", "config"),
        ("steps: [", "not valid YAML"),
        ("steps:\n  - expect_error: STALE_BROKER_EPOCH\n", "there is no previous step"),
    ],
)
def test_invalid_file_exits_2_naming_step_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    status, _, err = _run_cli(capsys, str(f))
    assert status == 2
    assert message in err


def test_unknown_strategy_is_rejected_before_running() -> None:
    with pytest.raises(ScenarioError, match="config"):
        parse_scenario({"config": {"no_such_setting": 1}})


async def test_data_dir_keeps_a_log_that_verifies(tmp_path: Path) -> None:
    from metadata_log.sqlite_store import SqliteLogStore

    path = next(p for p in SCENARIOS if p.stem == "kip966-how-it-works")
    _, summary = await run_scenario(load_scenario(path), tmp_path)
    store = await SqliteLogStore.open(tmp_path, create=False)
    try:
        assert store.end_offset == summary.log_end_offset
        report = await store.verify()
        assert report.records == summary.log_end_offset
    finally:
        await store.close()


# --- the metadata lifecycle (issue 19) ---------------------------------------------------

LIFECYCLE = (
    "lifecycle-topic-min-isr-clears-elr",
    "lifecycle-cluster-min-isr-clears-all",
    "lifecycle-cluster-default-cannot-be-deleted",
    "lifecycle-min-isr-above-rf",
    "lifecycle-elr-downgrade-clears",
    "lifecycle-elr-upgrade-tracks-from-isr",
    "lifecycle-delete-recreate-new-id",
    "lifecycle-add-partitions",
    "lifecycle-add-partitions-decrease-refused",
    "lifecycle-reassign-complete-moves-leader",
    "lifecycle-reassign-cancel",
    "lifecycle-reassign-during-outage-never-unsafe",
    "lifecycle-unregister-fenced",
    "lifecycle-unregister-active-refused",
    "lifecycle-pending-recovery-cleared",
)
LIFECYCLE_STEPS = {
    "alter_config",
    "delete_config",
    "upgrade_feature",
    "downgrade_feature",
    "delete_topic",
    "add_partitions",
    "reassign",
    "cancel_reassignment",
    "unregister",
}


def test_one_lifecycle_scenario_per_rule_is_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert set(LIFECYCLE) <= names
    used = {
        step.action
        for p in SCENARIOS
        if p.stem.startswith("lifecycle-")
        for step in load_scenario(p).steps
    }
    assert used >= LIFECYCLE_STEPS


_BASE = (
    "brokers: [1, 2, 3, 4]\n"
    "topics: [{name: t, partitions: [[1, 2, 3]], min_insync_replicas: 2}]\n"
    "steps:\n"
)


async def _failures(tmp_path: Path, steps: str) -> list[str]:
    f = tmp_path / "s.yaml"
    f.write_text(_BASE + steps)
    reports, _ = await run_scenario(load_scenario(f), tmp_path / "data")
    return [x for r in reports for x in r.failures]


@pytest.mark.parametrize(
    ("steps", "failure"),
    [
        # Each new expectation, stated wrongly, is reported with what was found.
        ("  - delete_topic: t\n  - expect: {topic: t, exists: true}\n", "exists: expected True"),
        (
            "  - delete_topic: t\n  - create_topic: {name: t, replication_factor: 3}\n"
            "  - expect: {topic: t, topic_id_changed: false}\n",
            "topic_id_changed: expected False, got True",
        ),
        ("  - expect: {topic: t, topic_id_changed: true}\n", "topic_id_changed: expected True"),
        ("  - expect: {topic: t, partitions: 2}\n", "partitions: expected 2, got 1"),
        ("  - expect: {topic: t, min_insync_replicas: null}\n", "min_insync_replicas: expected"),
        (
            "  - fence: 4\n  - unregister: 4\n  - expect: {broker: 4, registered: true}\n",
            "registered: expected True, got False",
        ),
        (
            "  - expect: {feature: eligible.leader.replicas.version, level: 0}\n",
            "eligible.leader.replicas.version level: expected 0, got 1",
        ),
        (
            "  - expect: {cluster_default: true, min_insync_replicas: 2}\n",
            "min_insync_replicas: expected 2, got 1",
        ),
        (
            "  - reassign: {partition: t-0, replicas: [2, 3, 4]}\n"
            "  - expect: {partition: t-0, adding: [], removing: [], replicas: [2, 3, 4]}\n",
            "adding: expected [], got [4]",
        ),
        (
            "  - alter_config: {topic: t, set: {min.insync.replicas: 3}}\n"
            "  - expect: {partition: t-0, min_isr: 2}\n",
            "min_isr: expected 2, got 3",
        ),
        (
            "  - unregister: 1\n  - expect: {broker: 1, fenced: false}\n",
            "unexpected error INVALID_REQUEST",
        ),
    ],
)
async def test_lifecycle_expectations_catch_a_wrong_outcome(
    tmp_path: Path, steps: str, failure: str
) -> None:
    failures = await _failures(tmp_path, steps)
    assert any(failure in f for f in failures), failures


async def test_a_recreated_topic_is_told_apart_from_the_old_one(tmp_path: Path) -> None:
    steps = (
        "  - expect: {topic: t, topic_id_changed: false}\n"
        "  - delete_topic: t\n"
        "  - expect: {topic: t, exists: false}\n"
        "  - create_topic: {name: t, replication_factor: 3}\n"
        "  - expect: {topic: t, topic_id_changed: true}\n"
    )
    assert await _failures(tmp_path, steps) == []


def test_json_reports_reassignment_topics_and_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(_BASE + "  - reassign: {partition: t-0, replicas: [2, 3, 4]}\n")
    status, lines, _ = _run_cli(capsys, str(f), "--json")
    assert status == 0
    step = json.loads(lines[0])
    part = step["partitions"]["t-0"]
    assert part["replicas"] == [2, 3, 4, 1]
    assert (part["adding"], part["removing"]) == ([4], [1])
    assert set(step["topics"]["t"]) == {"topic_id", "partitions", "min_insync_replicas"}
    assert step["cluster"] == {
        "min_insync_replicas": 1,
        "features": {"eligible.leader.replicas.version": 1},
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("steps:\n  - alter_config: {set: {min.insync.replicas: 2}}\n", "exactly one of `topic`"),
        (
            "steps:\n  - delete_config: {topic: t, cluster_default: true}\n",
            "exactly one of `topic`",
        ),
        ("steps:\n  - reassign: {partition: t, replicas: [1]}\n", "field `partition`"),
        ("steps:\n  - cancel_reassignment: t\n", "step 1 (cancel_reassignment)"),
        ("steps:\n  - upgrade_feature: {name: x}\n", "step 1 (upgrade_feature)"),
        ("steps:\n  - expect: {topic: t, leader: 1}\n", "`leader` does not apply to a topic"),
        ("steps:\n  - expect: {broker: 1, exists: false}\n", "`exists` does not apply"),
        ("steps:\n  - expect: {feature: x}\n", "give the `level`"),
        ("steps:\n  - expect: {topic: t, broker: 1}\n", "exactly one of `partition` or `broker`"),
        ("steps:\n  - add_partitions: {topic: t}\n", "step 1 (add_partitions)"),
    ],
)
def test_invalid_lifecycle_steps_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    status, _, err = _run_cli(capsys, str(f))
    assert status == 2
    assert message in err
