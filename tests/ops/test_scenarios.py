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
