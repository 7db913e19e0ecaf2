"""`metactl log export`, `metactl audit JOB` and `metactl simulate history` end to end.

The audit commands reuse the session-wide Spark session (getOrCreate).
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pandas as pd
import pytest

import ops.audit_cmds
import ops.cli
from audit.jobs.common import fmt_time
from audit.logread import iter_batches, log_info, log_time_bounds
from metactl.errors import InvalidConfigurationError
from metadata_log.records import decode_batch, record_type
from metadata_log.sqlite_format import LOG_FILE_NAME
from ops.audit_cmds import flap_window_ms
from ops.export_cmds import input_from_args, window_time

pytestmark = pytest.mark.slow

BALANCED = "worked-5.3.3-balanced-recovery"


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command starts (or reuses) a Spark session."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started before the inputs were checked")

    monkeypatch.setattr("audit.spark.get_session", refuse)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = ops.cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_export_then_audit_from_parquet(
    spark: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario_logs: dict[str, Path]
) -> None:
    data = scenario_logs["worked-5.3.3-balanced-recovery"]
    pq = tmp_path / "pq"
    status, out, _ = _run(capsys, "log", "export", "--data-dir", str(data), "--parquet", str(pq))
    assert status == 0 and "exported 24 records" in out
    status, _, err = _run(capsys, "log", "export", "--data-dir", str(data), "--parquet", str(pq))
    assert status == 1 and "--overwrite" in err
    report = tmp_path / "report"
    status, out, _ = _run(
        capsys,
        "audit",
        "unclean-recoveries",
        "--parquet",
        str(pq),
        "--out",
        str(report),
        "--format",
        "csv",
    )
    assert status == 0
    assert "won on offset by 2" in out
    table = pd.read_csv(report / "unclean_recoveries.csv")
    assert table[["chosen", "runner_up", "margin_kind", "margin"]].values.tolist() == [
        [2, 3, "offset", 2]
    ]
    html = (report / "report.html").read_text()
    assert "http" not in html.split("<body>")[1].replace("http://www.w3.org", "")
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert svgs
    for svg in svgs:
        ElementTree.fromstring(svg)  # well-formed: browsers draw it without a network
    assert (report / "summary.txt").read_text().startswith("unclean-recoveries audit")


@pytest.mark.parametrize("job", ["elections", "offline", "brokers", "unclean-recoveries"])
def test_each_job_writes_parquet_and_a_report(
    spark: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    scenario_logs: dict[str, Path],
    job: str,
) -> None:
    # Two clusters: a manual recovery (no candidates) beside a balanced one (two).
    data = ",".join(
        str(scenario_logs[n])
        for n in ("manual-operator-election", "worked-5.3.3-balanced-recovery")
    )
    extra = ["--flap-window", "1h"] if job == "brokers" else []
    status, out, _ = _run(capsys, "audit", job, "--data-dir", data, "--out", str(tmp_path), *extra)
    assert status == 0, out
    assert out.startswith(f"{job} audit of")
    assert list(tmp_path.glob("*.parquet"))
    assert (tmp_path / "report.html").exists()


def test_invariants_exit_status(
    spark: Any,
    capsys: pytest.CaptureFixture[str],
    crafted_log: Path,
    scenario_logs: dict[str, Path],
) -> None:
    status, out, _ = _run(capsys, "audit", "invariants", "--data-dir", str(crafted_log))
    assert status == 1 and "unclean_replica_in_elr" in out
    healthy = scenario_logs["kip966-how-it-works"]
    status, out, _ = _run(capsys, "audit", "invariants", "--data-dir", str(healthy))
    assert status == 0 and "violations: 0" in out


def test_bad_input_is_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, no_spark: None
) -> None:
    missing = tmp_path / "missing"
    status, _, err = _run(capsys, "audit", "brokers", "--data-dir", str(missing))
    # Named, one line, the "not found" status, both places tried, and before Spark.
    assert status == 4 and err.startswith("error: LOG_DIR_NOT_FOUND:")
    assert err.count("\n") == 1 and str(missing) in err and str(missing / "controller") in err
    status, _, err = _run(capsys, "audit", "offline", "--parquet", str(missing))
    assert status == 4 and err.startswith("error: ENOENT:") and str(missing) in err
    status, _, err = _run(
        capsys, "log", "export", "--data-dir", str(missing), "--parquet", str(tmp_path / "pq")
    )
    assert status == 4 and err.startswith("error: LOG_DIR_NOT_FOUND:")


def test_a_parquet_url_is_left_to_spark() -> None:
    # Only local paths can be checked here; hdfs:// and s3a:// are the cluster's to read.
    args = argparse.Namespace(data_dir=None, parquet="hdfs://nn:8020/metactl/pq", cluster=None)
    assert input_from_args(args, None, None).parquet == "hdfs://nn:8020/metactl/pq"
    args.parquet = "file:///nonexistent/pq"
    with pytest.raises(FileNotFoundError):
        input_from_args(args, None, None)


def test_flap_window_takes_since_durations_and_bare_seconds() -> None:
    # --since's durations (one parser), and what --flap-window always took besides.
    assert [flap_window_ms(t) for t in ("10m", "1h", "30s", "1d", "250ms")] == [
        600_000,
        3_600_000,
        30_000,
        86_400_000,
        250,
    ]
    assert flap_window_ms("90") == 90_000 and flap_window_ms(" 1.5 ") == 1_500
    assert flap_window_ms("10min") == flap_window_ms("10 min") == 600_000
    for bad in ("0", "-5m", "10 minutes", "m", "", "1e3"):
        with pytest.raises(InvalidConfigurationError, match=r"^INVALID_CONFIG: --flap-window "):
            flap_window_ms(bad)


def test_bad_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], scenario_logs: dict[str, Path], no_spark: None
) -> None:
    data = str(scenario_logs["manual-operator-election"])
    status, _, err = _run(capsys, "audit", "brokers", "--data-dir", data, "--flap-window", "soon")
    assert status == 2 and err.startswith("error: INVALID_CONFIG: --flap-window 'soon': expected")
    assert "duration" in err
    # Zero is refused before Spark starts (the job itself would refuse it only then).
    status, _, err = _run(capsys, "audit", "brokers", "--data-dir", data, "--flap-window", "0s")
    assert status == 2 and err.startswith("error: INVALID_CONFIG: --flap-window '0s':")
    status, _, err = _run(capsys, "audit", "elections", "--data-dir", data, "--since", "noon")
    assert status == 2 and err.startswith("error: INVALID_CONFIG: --since 'noon': expected")
    # The buckets method reads an export's buckets: refused for a data directory.
    status, _, err = _run(capsys, "audit", "invariants", "--data-dir", data, "--method", "buckets")
    assert status == 2 and err.startswith("error: INVALID_CONFIG: --method buckets")


def test_a_data_dir_with_a_cluster_master_is_refused_before_spark(
    capsys: pytest.CaptureFixture[str], scenario_logs: dict[str, Path], no_spark: None
) -> None:
    data = str(scenario_logs["manual-operator-election"])
    for master in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077", "yarn"):
        status, _, err = _run(capsys, "audit", "elections", "--data-dir", data, "--master", master)
        assert status == 2 and err.startswith("error: INVALID_CONFIG:"), err
        assert err.count("\n") == 1 and "--parquet" in err and "log export" in err


def test_cluster_data_dir_or_controller_dir(
    spark: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    scenario_logs: dict[str, Path],
) -> None:
    # `cluster up` keeps the controller's log in DATA/controller: both paths work, and the
    # cluster is named after the path typed.
    cluster = tmp_path / "prod"
    (cluster / "controller").mkdir(parents=True)
    shutil.copy(scenario_logs[BALANCED] / LOG_FILE_NAME, cluster / "controller" / LOG_FILE_NAME)
    for given, name in ((cluster, "prod"), (cluster / "controller", "controller")):
        status, out, err = _run(capsys, "audit", "unclean-recoveries", "--data-dir", str(given))
        assert status == 0, err
        assert f"{name}/orders-0" in out and "won on offset by 2" in out
    pq = tmp_path / "pq"
    status, out, _ = _run(capsys, "log", "export", "--data-dir", str(cluster), "--parquet", str(pq))
    assert status == 0 and "exported 24 records of prod" in out


def test_progress_lines_follow_every_job(
    spark: Any, capsys: pytest.CaptureFixture[str], scenario_logs: dict[str, Path]
) -> None:
    data = str(scenario_logs[BALANCED])
    status, out, err = _run(capsys, "audit", "elections", "--data-dir", data, "--progress", "lines")
    assert status == 0 and out.startswith("elections audit of")
    started = re.findall(r"^spark job (\d+) started: (\S.*) \((\d+) tasks\)$", err, re.M)
    ended = re.findall(r"^spark job (\d+) succeeded: (\d+)/(\d+) tasks in", err, re.M)
    assert started and sorted(j for j, _, _ in started) == sorted(j for j, _, _ in ended)
    # Each named for the audit's step that started it (issue 34), not a call site.
    assert all(name.startswith("elections: ") and ".py:" not in name for _, name, _ in started)
    assert all(done == total and int(total) > 0 for _, done, total in ended)
    # Nothing but progress on stderr: the first line at once, then a line per job event.
    assert err.startswith("starting Spark (local[*])…\n")
    assert err.count("\n") == 1 + len(started) + len(ended)
    assert re.search(r"\(\d+\.\d s on local\[\*\], of which \d+\.\d s starting Spark\)", out)
    # Off (the default away from a terminal): nothing on stderr.
    status, _, err = _run(capsys, "audit", "elections", "--data-dir", data)
    assert status == 0 and err == ""


@pytest.mark.parametrize(
    "job", ["elections", "unclean-recoveries", "offline", "brokers", "invariants"]
)
def test_every_job_takes_a_window(
    spark: Any,
    capsys: pytest.CaptureFixture[str],
    sim_log: tuple[Path, Any],
    job: str,
) -> None:
    path, _ = sim_log
    lo, hi = log_time_bounds(log_info(path).path)
    assert lo is not None and hi is not None
    since, until = lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3
    status, out, err = _run(
        capsys, "audit", job, "--data-dir", str(path), "--since", str(since), "--until", str(until)
    )
    assert status == 0, err
    assert f"({fmt_time(since)} .. {fmt_time(until)})" in out.splitlines()[0]
    if job == "elections":
        expected = _count(path, since, until, "PartitionChange", "election")
        assert expected > 0 and _number(r"^elections: ([\d,]+)", out) == expected
    if job == "unclean-recoveries":
        expected = _count(path, since, until, "UncleanRecovery")
        found = _number(r"^unclean recoveries \(potential data-loss events\): ([\d,]+)", out)
        assert expected > 0 and found == expected


def test_since_a_duration_back_from_now(
    spark: Any, capsys: pytest.CaptureFixture[str], sim_log: tuple[Path, Any]
) -> None:
    path, _ = sim_log
    lo, _hi = log_time_bounds(log_info(path).path)
    assert lo is not None
    days = (time.time() * 1000 - lo) // 86_400_000  # the log starts before this many days ago
    everything = _count(path, lo, 2**62, "PartitionChange", "election")
    for since, expected in ((f"{days + 2:.0f}d", everything), ("1h", 0)):
        status, out, err = _run(
            capsys, "audit", "elections", "--data-dir", str(path), "--since", since
        )
        assert status == 0, err
        assert _number(r"^elections: ([\d,]+)", out) == expected
    assert window_time("10m", now_ms=1_000_000) == 400_000
    assert window_time("2026-01-01T00:00Z") == 1_767_225_600_000 == window_time("1767225600000")


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text, re.M)
    assert found is not None, text
    return int(found[1].replace(",", ""))


def _count(path: Path, since: int, until: int, tag: str, field: str | None = None) -> int:
    """Records of one type (with `field` set) whose batch time is in [since, until),
    counted straight from the log, without the audit code."""
    info = log_info(path)
    n = 0
    for chunk in iter_batches(info.path, info.start_offset, info.end_offset):
        for _base, _n, ts, payload in chunk:
            if since <= ts < until:
                n += sum(
                    1
                    for r in decode_batch(payload)
                    if record_type(r) == tag and (field is None or getattr(r, field) is not None)
                )
    return n


def test_simulate_history(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "hist"
    args = [
        "simulate",
        "history",
        "--brokers",
        "4",
        "--partitions",
        "12",
        "--days",
        "0.25",
        "--out",
        str(out_dir),
        "--seed",
        "3",
        "--quiet",
    ]
    status, out, _ = _run(capsys, *args)
    assert status == 0 and "records/s" in out
    assert (out_dir / LOG_FILE_NAME).exists()
    status, out, _ = _run(capsys, "log", "verify", "--data-dir", str(out_dir))
    assert status == 0
    status, _, err = _run(capsys, *args)
    assert status == 1 and "already holds a metadata log" in err


def test_a_large_sqlite_log_gets_a_parquet_hint(
    spark: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    scenario_logs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One line says when an export would be faster: a data directory of at least
    PARQUET_HINT_RECORDS records (lowered here), never a Parquet input or a small log."""
    data = str(scenario_logs[BALANCED])
    status, out, _ = _run(capsys, "audit", "brokers", "--data-dir", data)
    assert status == 0 and "hint:" not in out  # 24 records
    monkeypatch.setattr(ops.audit_cmds, "PARQUET_HINT_RECORDS", 20)
    status, out, _ = _run(capsys, "audit", "brokers", "--data-dir", data)
    hints = [line for line in out.splitlines() if line.startswith("hint:")]
    assert status == 0 and len(hints) == 1
    assert "24 records read from SQLite" in hints[0]
    assert f"metactl log export --data-dir {data} --parquet OUT" in hints[0]
    pq = tmp_path / "pq"
    assert _run(capsys, "log", "export", "--data-dir", data, "--parquet", str(pq))[0] == 0
    status, out, _ = _run(capsys, "audit", "brokers", "--parquet", str(pq))
    assert status == 0 and "hint:" not in out


def _html_table(html: str, heading: str) -> list[dict[str, str]]:
    """The rows of the report's table under `heading`, as {column: cell text}."""
    part = html.split(f"<h2>{heading}</h2>", 1)[1].split("</table>", 1)[0]
    heads = re.findall(r"<th[^>]*>(.*?)</th>", part)
    rows = re.findall(r"<tr>(<td.*?)</tr>", part)
    return [dict(zip(heads, re.findall(r"<td[^>]*>(.*?)</td>", r), strict=True)) for r in rows]


def test_integer_ids_stay_integers(
    spark: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario_logs: dict[str, Path]
) -> None:
    """A column of ids with a null in it (a manual recovery has no runner-up) is not a
    column of floats (issue 34: ``runner_up 3.0`` in the report): not in the HTML, the
    CSV, nor the Parquet tables."""
    data = ",".join(
        str(scenario_logs[n])
        for n in ("manual-operator-election", "worked-5.3.3-balanced-recovery")
    )
    for fmt in ("parquet", "csv"):
        out = tmp_path / fmt
        status, _, err = _run(
            capsys, "audit", "unclean-recoveries", "--data-dir", data, "--out", str(out),
            "--format", fmt,
        )  # fmt: skip
        assert status == 0, err
        if fmt == "parquet":
            table = pd.read_parquet(out / "unclean_recoveries.parquet").set_index("cluster")
            assert str(table["runner_up"].dtype) == "Int64"
            assert table.loc[BALANCED, "runner_up"] == 3
            assert pd.isna(table.loc["manual-operator-election", "runner_up"])
        else:
            text = (out / "unclean_recoveries.csv").read_text()
            assert ",3," in text and "3.0" not in text
    cells = _html_table((out / "report.html").read_text(), "Events")
    by_cluster = {row["cluster"]: row for row in cells}
    assert by_cluster[BALANCED]["runner_up"] == "3"
    assert by_cluster[BALANCED]["time_to_recovery_ms"] == "0"
    assert by_cluster["manual-operator-election"]["runner_up"] == ""
    assert by_cluster["manual-operator-election"]["time_to_recovery_ms"] == "60000"


def test_audit_all_of_a_stopped_cluster(
    spark: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, stopped: Any
) -> None:
    """`metactl audit all` over a real cluster stopped cleanly (tests/audit/real_logs.py),
    as the issue's tester ran it after `make run` and Ctrl-C."""
    status, out, err = _run(
        capsys, "audit", "all", "--data-dir", str(stopped.data_dir), "--out", str(tmp_path),
        "--progress", "lines",
    )  # fmt: skip
    assert status == 0, err
    assert "offline intervals: 1 (1 still open)" in out  # pinned-0, not the stopped ones
    assert "lost their leader in the shutdown, not counted as offline" in out
    assert "every leader is its partition's preferred replica" not in out
    assert "no partition has a leader at the end" in out
    names = re.findall(r"^spark job \d+ started: (.*) \(\d+ tasks\)$", err, re.M)
    assert names and all(".py:" not in n for n in names), names
    jobs = {n.split(":")[0] for n in names}
    assert jobs == {"elections", "unclean-recoveries", "offline", "brokers", "invariants"}
    intervals = pd.read_parquet(tmp_path / "offline" / "offline_intervals.parquet")
    assert sorted(intervals["ended"]) == ["open", "stopped", "stopped", "stopped"]
    html = (tmp_path / "elections" / "report.html").read_text()
    assert f"orders (topic id {stopped.second_orders_id})" in html
