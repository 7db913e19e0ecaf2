"""`metactl log export`, `metactl audit JOB` and `metactl simulate history` end to end.

The command modules are added to `ops.cli.COMMAND_MODULES` here in case the CLI does not
list them yet; the audit commands reuse the session-wide Spark session (getOrCreate).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pandas as pd
import pytest

import ops.cli
from metadata_log.sqlite_format import LOG_FILE_NAME

pytestmark = pytest.mark.slow

MODULES = ("ops.export_cmds", "ops.audit_cmds", "ops.simulate_cmds")


@pytest.fixture(autouse=True)
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    names = list(ops.cli.COMMAND_MODULES)
    names += [m for m in MODULES if m not in names]
    monkeypatch.setattr(ops.cli, "COMMAND_MODULES", tuple(names))
    yield


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
    spark: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = _run(capsys, "audit", "brokers", "--data-dir", str(tmp_path / "missing"))
    assert status == 2 and err.startswith("error:")
    status, _, err = _run(
        capsys, "audit", "brokers", "--data-dir", str(tmp_path), "--flap-window", "soon"
    )
    assert status == 2 and "duration" in err


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
