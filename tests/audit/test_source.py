"""The metactl data source, the row builder behind it and the Parquet export."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from audit.export import export_parquet
from audit.export_layout import MANIFEST, bucket_file_glob, read_manifest
from audit.logread import iter_batches, log_info, log_time_bounds
from audit.rows import RowBuilder, read_arrow
from audit.schema import COLUMN_NAMES, FIELD_SOURCES, POSITIONAL
from audit.selection import NOT_NULL
from metactl.errors import CorruptLogError
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ConfigRecord,
    ElectionKind,
    FenceBrokerRecord,
    LeaderRecoveryState,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    decode_batch,
    record_type,
)
from metadata_log.sqlite_store import SqliteLogStore

pytestmark = pytest.mark.slow


def _expected_rows(path: Path, cluster: str) -> list[dict[str, Any]]:
    """Rows derived independently: decode_batch + to_builtins, mapped by FIELD_SOURCES."""
    info = log_info(path)
    rows = []
    for chunk in iter_batches(info.path, info.start_offset, info.end_offset):
        for base, _count, ts, payload in chunk:
            for i, rec in enumerate(decode_batch(payload)):
                tag = record_type(rec)
                fields = msgspec.to_builtins(rec)
                row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
                row.update(cluster=cluster, offset=base + i, timestamp=ts, record_type=tag)
                for col, sources in FIELD_SOURCES.items():
                    src = sources.get(tag)
                    if src is not None:
                        row[col] = msgspec.to_builtins(getattr(rec, src))
                if tag == "BrokerRegistrationChange":
                    if fields.get("in_controlled_shutdown"):
                        row["reason"] = "controlled_shutdown"
                    elif fields.get("fenced") is not None:
                        row["reason"] = "fenced" if fields["fenced"] else "unfenced"
                if row["candidates"] is not None:
                    row["candidates"] = [
                        {
                            "broker": c["broker_id"],
                            "last_leader_epoch": c["last_leader_epoch"],
                            "log_end_offset": c["log_end_offset"],
                        }
                        for c in row["candidates"]
                    ]
                rows.append(row)
    return rows


def _normalise(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for col in ("timestamp", "offline_since"):
        v = out.get(col)
        if v is not None and not isinstance(v, int):
            out[col] = int(v.timestamp() * 1000)
    return out


def test_row_builder_matches_full_decoding(sim_log: tuple[Path, Any]) -> None:
    """Every column of every record, through the projected decoders, equals decode_batch's."""
    path, _ = sim_log
    info = log_info(path)
    built = [
        _normalise(r)
        for b in read_arrow(info.path, 0, info.end_offset, RowBuilder("sim", validate=True))
        for r in b.to_pylist()
    ]
    expected = _expected_rows(path, "sim")
    assert len(built) == info.end_offset == len(expected)
    assert built == expected


def test_selected_columns_types_and_filters_are_subsets(sim_log: tuple[Path, Any]) -> None:
    path, _ = sim_log
    info = log_info(path)
    full = [
        _normalise(r)
        for b in read_arrow(info.path, 0, info.end_offset, RowBuilder("s"))
        for r in b.to_pylist()
    ]
    cols = ("offset", "record_type", "topic", "partition", "leader", "chosen")
    builder = RowBuilder(
        "s",
        cols,
        frozenset({"PartitionChange", "UncleanRecovery"}),
        any_of=[("record_type", "UncleanRecovery"), ("leader", -1)],
    )
    got = [r for b in read_arrow(info.path, 0, info.end_offset, builder) for r in b.to_pylist()]
    want = [
        {c: r[c] for c in cols}
        for r in full
        if r["record_type"] == "UncleanRecovery"
        or (r["record_type"] == "PartitionChange" and r["leader"] == -1)
    ]
    assert got == want
    assert any(r["record_type"] == "UncleanRecovery" for r in got)


def test_data_source_reads_the_balanced_example(spark: Any, scenario_logs: dict[str, Path]) -> None:
    path = scenario_logs["worked-5.3.3-balanced-recovery"]
    df = spark.read.format("metactl").load(str(path))
    assert tuple(df.columns) == COLUMN_NAMES
    rows = {r["offset"]: r for r in df.collect()}
    assert sorted(rows) == list(range(24))
    assert {r["cluster"] for r in rows.values()} == {"worked-5.3.3-balanced-recovery"}
    rec = rows[22]
    assert rec["record_type"] == "UncleanRecovery"
    assert (rec["topic"], rec["partition"], rec["strategy"], rec["chosen"]) == (
        "orders",
        0,
        "balanced",
        2,
    )
    assert [tuple(c) for c in rec["candidates"]] == [(2, 0, 12), (3, 0, 10)]
    assert rec["potential_data_loss"] is True and rec["trigger"] == "isr_and_elr_empty"
    change = rows[16]
    assert change["reason"] == "unclean_registration" and change["broker"] == 2
    assert (change["elr"], change["last_known_elr"], change["isr"]) == ([3], [2], None)
    assert rows[14]["record_type"] == "RegisterBroker" and rows[14]["clean"] is False
    assert rows[7]["replicas"] == [1, 2, 3] and rows[7]["min_isr"] == 2


def test_input_partitions_split_the_log_without_loss(spark: Any, sim_log: tuple[Path, Any]) -> None:
    path, report = sim_log
    df = (
        spark.read.format("metactl")
        .option("partitions", "7")
        .option("columns", "offset")
        .load(str(path))
    )
    assert df.rdd.getNumPartitions() == 7
    offsets = sorted(r["offset"] for r in df.collect())
    assert offsets == list(range(report.records))


def test_several_directories_and_cluster_names(spark: Any, scenario_logs: dict[str, Path]) -> None:
    a = scenario_logs["worked-5.3.3-balanced-recovery"]
    b = scenario_logs["kip966-how-it-works"]
    counts = dict(
        spark.read.format("metactl").load(f"{a},{b}").groupBy("cluster").count().collect()
    )
    assert counts == {a.name: 24, b.name: 20}
    named = (
        spark.read.format("metactl")
        .option("paths", f"{a},{b}")
        .option("cluster", "east,west")
        .option("columns", "cluster,offset")
        .load()
    )
    assert dict(named.groupBy("cluster").count().collect()) == {"east": 24, "west": 20}


def test_corrupt_batch_is_reported(tmp_path: Path, scenario_logs: dict[str, Path]) -> None:
    src = scenario_logs["kip966-how-it-works"] / "metadata.log.sqlite"
    copy = tmp_path / "metadata.log.sqlite"
    with sqlite3.connect(src) as a, sqlite3.connect(copy) as b:
        a.backup(b)
        b.execute(
            "UPDATE batches SET payload = CAST(payload || x'00' AS BLOB) WHERE base_offset = 6"
        )
    with pytest.raises(CorruptLogError, match="CRC"):
        list(read_arrow(copy, 0, 100, RowBuilder("x")))


def test_export_writes_the_same_rows_in_buckets(
    spark: Any, tmp_path: Path, sim_log: tuple[Path, Any], crafted_log: Path
) -> None:
    """The export's rows are the data source's; partition records are bucketed so that
    each partition's history is in one bucket, in offset order; the rest is apart; the
    manifest says so. Parallel tasks (a pool of processes) write the same rows."""
    path, report = sim_log
    out = tmp_path / "pq"
    result = export_parquet([str(path), str(crafted_log)], out, buckets=4)
    total = report.records + log_info(crafted_log).end_offset
    assert result.records == total and result.buckets == 4
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "kind=cluster", "kind=partition"]
    manifest = read_manifest(str(out))
    assert manifest is not None and manifest.buckets == 4
    assert manifest.clusters[path.name]["records"] == report.records
    assert manifest.last_ms()[path.name] == log_time_bounds(log_info(path).path)[1]

    # Each partition's records in exactly one bucket, in offset order there.
    seen: dict[tuple[str, str, int], int] = {}
    for bucket in range(4):
        files = sorted((out / "kind=partition").glob(bucket_file_glob(bucket)))
        assert files
        table = pq.read_table(files[0], columns=["cluster", "offset", "topic", "partition"])
        rows = table.to_pylist()
        assert {r["cluster"] for r in rows} <= {path.name, crafted_log.name}
        for cluster in {r["cluster"] for r in rows}:
            offsets = [r["offset"] for r in rows if r["cluster"] == cluster]
            assert offsets == sorted(offsets)
        for r in rows:
            key = (r["cluster"], r["topic"], r["partition"])
            assert seen.setdefault(key, bucket) == bucket
    assert len({k for k in seen if k[0] == path.name}) == 60
    kinds = pq.read_table(out / "kind=cluster", columns=["record_type"]).column(0).to_pylist()
    assert kinds and not set(kinds) & {"Partition", "PartitionChange", "UncleanRecovery"}

    # The same rows as the data source (Spark reads the layout; `kind` is its partitioning).
    from_parquet = spark.read.parquet(str(out)).drop("kind").orderBy("cluster", "offset")
    from_source = spark.read.format("metactl").load(f"{path},{crafted_log}")
    want = [r.asDict() for r in from_source.orderBy("cluster", "offset").collect()]
    assert [r.asDict() for r in from_parquet.collect()] == want

    # Several tasks in a pool of processes: the same rows, and the same manifest answers.
    pooled = export_parquet(
        [str(path), str(crafted_log)], tmp_path / "pooled", buckets=4, workers=2, task_records=2500
    )
    assert pooled.workers == 2 and pooled.files > result.files
    again = spark.read.parquet(str(tmp_path / "pooled")).drop("kind").orderBy("cluster", "offset")
    assert [r.asDict() for r in again.collect()] == want
    assert read_manifest(str(tmp_path / "pooled")) == manifest

    with pytest.raises(FileExistsError):
        export_parquet([str(path)], out)
    assert export_parquet([str(path)], out, overwrite=True).records == report.records


def _mixed_records(seed: int, counts: dict[str, int]) -> list[Any]:
    """Records of several types, shuffled: `counts` of PartitionChange ("pc", and "pc-wide",
    whose version does not fit an int64), Partition ("p"), UncleanRecovery ("ur") and
    broker, topic and config records ("cluster")."""
    rng = random.Random(seed)
    out: list[Any] = []
    for i in range(counts.get("pc", 0) + counts.get("pc-wide", 0)):
        out.append(
            PartitionChangeRecord(
                topic=f"t{i % 3}",
                partition=i % 7,
                reason=rng.choice(list(ChangeReason)),
                partition_epoch=i,
                leader_epoch=i // 2,
                election=rng.choice([None, *ElectionKind]),
                leader=rng.choice([None, -1, 1, 2]),
                isr=rng.choice([None, [], [1], [1, 2, 3]]),
                elr=rng.choice([None, [3]]),
                last_known_elr=rng.choice([None, [2, 3]]),
                recovery_state=rng.choice([None, *LeaderRecoveryState]),
                broker=rng.choice([None, 2]),
                replicas=rng.choice([None, [1, 2, 3, 4]]),
                adding_replicas=rng.choice([None, [4]]),
                removing_replicas=rng.choice([None, [1]]),
                min_isr=rng.choice([None, 2]),
                v=2**64 - 1 if i >= counts.get("pc", 0) else 1,
            )
        )
    for i in range(counts.get("p", 0)):
        out.append(PartitionRecord(topic=f"t{i % 3}", partition=i, replicas=[1, 2], isr=[2]))
    for i in range(counts.get("ur", 0)):
        out.append(
            UncleanRecoveryRecord(
                topic=f"t{i % 3}",
                partition=i % 7,
                strategy="balanced",
                candidates=[RecoveryCandidate(broker_id=1, last_leader_epoch=i, log_end_offset=9)],
                chosen=1,
                trigger="isr_and_elr_empty",
                offline_since_ms=rng.choice([None, 1_767_225_600_000 + i]),
            )
        )
    for i in range(counts.get("cluster", 0)):
        out.append(
            rng.choice(
                [
                    RegisterBrokerRecord(broker_id=i, incarnation_id="x", broker_epoch=i),
                    BrokerRegistrationChangeRecord(broker_id=i, broker_epoch=i, fenced=False),
                    FenceBrokerRecord(broker_id=i, broker_epoch=i),
                    TopicRecord(name=f"t{i}", topic_id=f"id{i}", partitions=7),
                    ConfigRecord(resource_type="topic", resource_name="t0", name="x", value="1"),
                ]
            )
        )
    rng.shuffle(out)
    return out


async def _write_log(data_dir: Path, records: list[Any]) -> None:
    store = await SqliteLogStore.open(data_dir)
    try:
        i, ts = 0, 1_767_225_600_000
        while i < len(records):
            n = 1 + i % 5
            ts += 1000
            await store.append(records[i : i + n], timestamp_ms=ts)
            i += n
    finally:
        await store.close()


def test_export_rows_match_full_decoding(
    tmp_path: Path, sim_log: tuple[Path, Any], crafted_log: Path
) -> None:
    """No Spark: every row the export writes is decode_batch's record mapped by
    FIELD_SOURCES, whichever record type is the most common of a chunk (the others are
    written into its columns), with other records making up more or less of it, and with
    a field no column shows beyond int64; each bucket file in offset order."""
    mixes = {
        "pc-common": {"pc": 40, "p": 3, "ur": 3, "cluster": 2},
        "ur-common": {"ur": 15, "pc": 4, "p": 2, "cluster": 1},
        "p-common": {"p": 20, "pc": 4, "ur": 1, "cluster": 1},
        "cluster-heavy": {"pc": 10, "ur": 2, "cluster": 9},
        "wide-version": {"pc": 10, "pc-wide": 2, "p": 2},
        "no-partitions": {"cluster": 5},
    }
    dirs = {"sim": sim_log[0], "crafted": crafted_log}
    for seed, (name, counts) in enumerate(mixes.items()):
        dirs[name] = tmp_path / name
        asyncio.run(_write_log(dirs[name], _mixed_records(seed, counts)))
    out = tmp_path / "pq"
    export_parquet([str(d) for d in dirs.values()], out, clusters=list(dirs), buckets=4)
    got = (
        pq.read_table(out)
        .drop(["kind"])
        .sort_by([("cluster", "ascending"), ("offset", "ascending")])
    )
    expected = [row for name in sorted(dirs) for row in _expected_rows(dirs[name], name)]
    assert [_normalise(r) for r in got.to_pylist()] == expected
    for f in (out / "kind=partition").glob("*.parquet"):
        table = pq.read_table(f, columns=["cluster", "offset"])
        for name in set(table.column("cluster").to_pylist()):
            offsets = [r["offset"] for r in table.to_pylist() if r["cluster"] == name]
            assert offsets == sorted(offsets)


def test_unknown_options_are_refused(spark: Any, scenario_logs: dict[str, Path]) -> None:
    path = str(scenario_logs["kip966-how-it-works"])
    with pytest.raises(Exception, match="unknown column"):
        spark.read.format("metactl").option("columns", "offset,nope").load(path).collect()
    with pytest.raises(Exception, match="unknown record type"):
        spark.read.format("metactl").option("types", "Bogus").load(path).collect()
    assert not set(POSITIONAL) - set(COLUMN_NAMES)


@pytest.mark.parametrize(
    ("types", "any_of"),
    [
        ({"RegisterBroker", "FenceBroker", "UnfenceBroker", "BrokerRegistrationChange"}, ()),
        (
            {"PartitionChange", "UncleanRecovery"},
            (("record_type", "UncleanRecovery"), ("leader", -1)),
        ),
        ({"RegisterBroker"}, (("clean", False),)),
        ({"Partition", "PartitionChange"}, (("leader", NOT_NULL),)),
        (None, (("partition_epoch", 0), ("reason", "unclean_registration"))),
        (None, (("leader", -1),)),
    ],
)
def test_byte_prefilter_never_drops_a_selected_record(
    sim_log: tuple[Path, Any], crafted_log: Path, types: set[str] | None, any_of: Any
) -> None:
    cols = (
        "offset",
        "record_type",
        "topic",
        "partition",
        "leader",
        "clean",
        "partition_epoch",
        "reason",
    )
    for path in (sim_log[0], crafted_log):
        info = log_info(path)
        rows = []
        for prefilter in (True, False):
            builder = RowBuilder(
                "x",
                cols,
                None if types is None else frozenset(types),
                any_of=any_of,
                prefilter=prefilter,
            )
            rows.append(
                [
                    r
                    for b in read_arrow(info.path, 0, info.end_offset, builder)
                    for r in b.to_pylist()
                ]
            )
        assert rows[0] == rows[1]
        assert rows[0], "the condition should select something"
