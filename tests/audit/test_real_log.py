"""The audits over a real cluster's log (issue 34): a clean stop is not an outage, and a
topic deleted and created again under its name is two topics.

The log (`tests.audit.real_logs`): ``orders`` created, broker 3 killed (``pinned-0``, on
broker 3 alone, offline for good; ``orders-1`` elects a leader), ``orders`` deleted and
created again, then every broker stopped cleanly and the controller after them. Every
job is run from the data directory, from its Parquet export (the bucket paths), and by
the plain pass (``offline`` and ``elections`` from the export read as rows too): the
same answers, and the right ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from audit import plain
from audit.export import export_parquet
from audit.jobs import elections, invariants, offline, unclean
from audit.lifecycle import Lifecycle, LifecycleTracker
from audit.spark import AuditInput
from tests.audit.real_logs import ORDERS, PINNED, StoppedLog
from tests.audit.test_jobs import _same_result

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(
    spark: Any, stopped: StoppedLog, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Each job's result from the data directory, checked equal to the same job's from
    the Parquet export (buckets; and rows, for the jobs whose row paths classify a stop),
    and to the plain pass's."""
    pq = tmp_path_factory.mktemp("stopped-export") / "pq"
    export_parquet([str(stopped.data_dir)], pq)
    rows = AuditInput.of(parquet=str(pq))
    object.__setattr__(rows, "_manifest", False)  # an export of another layout: row paths
    base = plain.run_jobs([stopped.data_dir])
    out = {}
    modules = {
        "elections": elections,
        "unclean-recoveries": unclean,
        "offline": offline,
        "invariants": invariants,
    }
    for job, module in modules.items():
        got = module.run(spark, AuditInput.of(str(stopped.data_dir)))
        _same_result(got, module.run(spark, AuditInput.of(parquet=str(pq))), f"{job} (Parquet)")
        if job in ("elections", "offline"):
            _same_result(got, module.run(spark, rows), f"{job} (rows)")
        _same_result(got, base.results[job], f"{job} (plain)", dtypes=False)
        out[job] = got
    return out


def test_the_log_ends_with_a_clean_stop(stopped: StoppedLog) -> None:
    """What the audits rely on, from the log itself: the final shutdown starts at the
    first controlled shutdown after the last broker came up, and the two generations of
    ``orders`` have their ids."""
    tracker = LifecycleTracker()
    from audit.logread import log_info
    from audit.transactions import committed_batches

    info = log_info(stopped.data_dir)
    first_shutdown = None
    for base, ts, records in committed_batches(info.path, info.start_offset, info.end_offset):
        tracker.feed_batch("c", base, ts, records)
        for i, r in enumerate(records):
            if first_shutdown is None and getattr(r, "in_controlled_shutdown", None):
                first_shutdown = (base + i, ts)
    life = tracker.result()
    assert first_shutdown is not None
    assert (life.stops["c"].offset, life.stops["c"].ts_ms) == first_shutdown
    gens = life.generations[("c", ORDERS)]
    assert [tid for _, tid in gens] == [stopped.first_orders_id, stopped.second_orders_id]
    assert ("c", stopped.first_orders_id) in life.removed
    assert ("c", stopped.second_orders_id) not in life.removed
    assert life.label("c", ORDERS, stopped.second_orders_id).endswith(
        f"(topic id {stopped.second_orders_id})"
    )
    assert life.label("c", PINNED, stopped.pinned_id) == PINNED


def test_a_clean_stop_is_not_an_outage(results: dict[str, Any], stopped: StoppedLog) -> None:
    res = results["offline"]
    intervals = res.tables["offline_intervals"]
    by_topic = {
        (r.topic, r.topic_id, r.partition): (r.ended, r.open, r.outage)
        for r in intervals.itertuples(index=False)
    }
    second = stopped.second_orders_id
    assert by_topic == {
        (PINNED, stopped.pinned_id, 0): ("open", True, True),  # broker 3 killed: an outage
        (ORDERS, second, 0): ("stopped", False, False),  # the clean stop took the leaders
        (ORDERS, second, 1): ("stopped", False, False),
        (ORDERS, second, 2): ("stopped", False, False),
    }
    per = res.tables["offline_partitions"].set_index(["topic", "topic_id", "partition"])
    assert bool(per.loc[(PINNED, stopped.pinned_id, 0), "offline_now"])
    assert per.loc[(PINNED, stopped.pinned_id, 0), "offline_intervals"] == 1
    stopped_rows = per.loc[ORDERS].loc[second]
    assert not stopped_rows["offline_now"].any() and stopped_rows["offline_at_stop"].all()
    assert (stopped_rows["offline_intervals"] == 0).all() and (
        stopped_rows["offline_ms"] == 0
    ).all()
    s = res.stats
    assert (s["intervals"], s["open_intervals"], s["stopped_intervals"]) == (1, 1, 3)
    assert s["partitions_with_offline"] == 1
    assert s["stopped_at_ms"].keys() == {stopped.data_dir.name}
    text = "\n".join(res.summary)
    assert "offline intervals: 1 (1 still open)" in text
    assert "was stopped cleanly at" in text and "3 partition(s) lost their leader" in text
    now = [line for line in res.summary if "offline now" in line]
    assert len(now) == 1 and f"/{PINNED}-0:" in now[0]  # not the stopped partitions


def test_a_topic_created_again_is_another_topic(
    results: dict[str, Any], stopped: StoppedLog
) -> None:
    first, second = stopped.first_orders_id, stopped.second_orders_id
    per = results["offline"].tables["offline_partitions"]
    keys = {(r.topic, r.topic_id, r.partition) for r in per.itertuples(index=False)}
    assert keys == {
        (ORDERS, first, 0),
        (ORDERS, first, 1),
        (ORDERS, second, 0),
        (ORDERS, second, 1),
        (ORDERS, second, 2),
        (PINNED, stopped.pinned_id, 0),
    }
    assert results["offline"].stats["partitions"] == 6
    # The first generation, deleted while led, was never offline; the second's partitions
    # are not mixed with it.
    old = per[per["topic_id"] == first]
    assert (old["offline_intervals"] == 0).all() and not old["offline_at_stop"].any()
    res = results["elections"]
    by_topic = res.tables["elections_by_topic"].set_index(["topic", "topic_id"])
    assert by_topic.loc[(ORDERS, first), "isr"] == 1  # orders-1 when broker 3 was fenced
    # Off the broker that stopped first (1 leads two of them, 2 one; both stop at once).
    assert by_topic.loc[(ORDERS, second), "isr"] in (1, 2)
    assert any(f"{ORDERS} (topic id {first})" in line for line in res.summary)
    assert any(f"{ORDERS} (topic id {second})" in line for line in res.summary)
    inv = results["invariants"]
    assert inv.stats["partitions"] == 6 and inv.stats["violations"] == 0
    assert "topic_id" in results["unclean-recoveries"].tables["unclean_recoveries"].columns


def test_elections_do_not_count_a_stop_as_offline(
    results: dict[str, Any], stopped: StoppedLog
) -> None:
    res = results["elections"]
    s = res.stats
    # The deleted generation is gone; pinned is offline; orders stopped with the cluster.
    assert (s["partitions"], s["led"], s["offline"], s["stopped"]) == (4, 0, 1, 3)
    text = "\n".join(res.summary)
    assert "every leader is its partition's preferred replica" not in text
    assert "no partition has a leader at the end" in text
    assert "3 partition(s) without a leader since its shutdown (not offline)" in text
    assert "; 1 offline" in text


def test_a_window_before_the_stop_sees_no_stop(
    spark: Any, stopped: StoppedLog, tmp_path: Path
) -> None:
    """Cut before the controlled shutdowns (--until), the history ends with brokers 1
    and 2 up: no stop, and the second generation is led at the end."""
    life = plain.run_jobs([stopped.data_dir], ["offline"]).results["offline"].stats
    stop_ms = life["stopped_at_ms"][stopped.data_dir.name]
    cut = AuditInput.of(str(stopped.data_dir), until_ms=stop_ms)
    res = elections.run(spark, cut)
    assert (res.stats["stopped"], res.stats["offline"], res.stats["led"]) == (0, 1, 3)
    assert "was stopped cleanly" not in "\n".join(res.summary)
    # A copy of the log named otherwise is another cluster, stopped too.
    other = tmp_path / "other"
    shutil.copytree(stopped.data_dir, other)
    both = offline.run(spark, AuditInput.of([str(stopped.data_dir), str(other)]))
    assert both.stats["stopped_at_ms"].keys() == {stopped.data_dir.name, "other"}
    assert both.stats["stopped_intervals"] == 6


def test_an_empty_lifecycle_keeps_every_name() -> None:
    life = Lifecycle()
    assert life.topic_ids(["c"], ["t"], [5]).to_pylist() == [""]
    assert life.label("c", "t", "") == "t"
