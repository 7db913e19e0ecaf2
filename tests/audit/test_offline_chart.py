"""The offline audit's stacked chart counts each minute once (issue 22, item 9).

A known history, in virtual time: RF 3, MinISR 2; two followers fenced at t=0 (ISR [1],
under MinISR, led by 1), the leader fenced at 15.6 s (offline, still under MinISR), back
at 31.2 s. So 0.52 min under MinISR, of which 0.26 min offline: stacking "offline" on
"under MinISR" drew 0.78 min, the figure the issue reported. The chart stacks offline
and under-MinISR-while-led instead, 0.26 + 0.26 = 0.52: the time the partition was
offline or under MinISR. Checked on both per-partition passes: the plain one (data
directories) and the numpy timelines (a Parquet export's buckets), without Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from audit import plain, plain_offline
from audit.export import export_parquet
from audit.export_layout import read_manifest
from audit.jobs import offline, offline_result
from audit.logread import log_info, log_time_bounds
from audit.spark import AuditInput
from ops.cli import main

HISTORY = """\
description: offline and under MinISR, overlapping (the audit chart's double count)
brokers: [1, 2, 3]
topics:
  - {name: orders, partitions: [[1, 2, 3]], min_insync_replicas: 2}
steps:
  - fence: 2
  - fence: 3
  - expect: {partition: orders-0, leader: 1, isr: [1]}
  - advance_ms: 15600
  - fence: 1
  - expect: {partition: orders-0, leader: null}
  - advance_ms: 15600
  - restart: {broker: 1, clean: true}
  - expect: {partition: orders-0, leader: 1}
"""
OFFLINE_MS = 15_600
UNDER_MS = 31_200  # 0.52 min: from t=0 to the end, 31.2 s (the last record)
LED_UNDER_MS = UNDER_MS - OFFLINE_MS


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chart")
    (root / "history.yaml").write_text(HISTORY)
    data = root / "known"
    assert main(["scenario", "run", str(root / "history.yaml"), "--data-dir", str(data)]) == 0
    return data


def charted(monkeypatch: pytest.MonkeyPatch, per: pd.DataFrame) -> dict[str, list[float]]:
    """The series `_result` draws, for the per-partition table `per`."""
    drawn: list[dict[str, list[float]]] = []

    def bar_chart(labels: Any, series: dict[str, list[float]], **kwargs: Any) -> str:
        drawn.append(series)
        assert kwargs["title"] == offline_result.CHART_TITLE
        return ""

    monkeypatch.setattr(offline_result, "bar_chart", bar_chart)
    offline._result(AuditInput.of(["unused"]), per, 20)
    assert len(drawn) == 1
    return drawn[0]


def check(per: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    row = per.iloc[0]
    assert (row.offline_ms, row.under_min_isr_ms, row.under_min_isr_led_ms) == (
        OFFLINE_MS,
        UNDER_MS,
        LED_UNDER_MS,
    )
    series = charted(monkeypatch, per)
    assert series == {
        "offline (min)": [pytest.approx(0.26)],
        "under MinISR, led (min)": [pytest.approx(0.26)],
    }
    total = sum(s[0] for s in series.values())
    assert total == pytest.approx(0.52) and total == pytest.approx(UNDER_MS / 60_000)


def test_the_plain_pass_charts_each_minute_once(
    history: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    per = plain.run_jobs([history], ["offline"]).results["offline"].tables["offline_partitions"]
    assert (per.iloc[0].offline_ms, per.iloc[0].under_min_isr_ms) == (OFFLINE_MS, UNDER_MS)
    end = log_time_bounds(log_info(history).path)[1]
    table = plain_offline.offline_bucket(
        [(log_info(history).path, history.name)],
        bucket=0,
        buckets=1,
        ends={history.name: end},
        since_ms=None,
        until_ms=None,
    )
    check(table, monkeypatch)


def test_the_timelines_of_an_export_chart_each_minute_once(
    history: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "pq"
    export_parquet([str(history)], out, workers=1)
    manifest = read_manifest(str(out))
    assert manifest is not None
    ends = manifest.last_ms()
    batches = [
        offline.bucket_timelines(
            str(out.resolve()), b, ends=ends, since_ms=None, aborted={}, until_ms=None
        )
        for b in range(manifest.buckets)
    ]
    tables = [b.to_pandas() for b in batches if b is not None and b.num_rows]
    assert len(tables) == 1
    check(tables[0], monkeypatch)
