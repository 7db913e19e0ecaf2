"""The flat audit schema: one row per metadata record, typed, nulls where not applicable.

Every reader (the ``metactl`` Spark data source, the Parquet export, the single-process
baseline) produces exactly these columns, so the audit jobs read either form. Columns map
onto record fields as `FIELD_SOURCES` says; ``cluster``, ``offset``, ``timestamp`` and
``record_type`` come from where the record sits (data directory, batch, tag).

Derived values (documented so that nobody has to guess):

* ``broker``: ``broker_id`` of the broker records; for a PartitionChange, the broker whose
  event caused the change.
* ``reason``: a PartitionChange's reason or a FenceBroker's; for a
  BrokerRegistrationChange, ``controlled_shutdown`` when it starts one, else ``fenced`` /
  ``unfenced`` when it changes the fenced flag; an AbortTransaction's reason.
* ``strategy``: an UncleanRecovery's strategy, or a Topic's per-topic strategy.
* ``topic``: a RemoveTopic's topic name (``topic_id`` its id); ``min_isr`` of a
  PartitionChange is the new effective MinISR (set when a reassignment changes the
  replication factor), of a ClearElr the new configured one (null: unchanged), of a Topic
  its own config (null: the cluster default's).
* ``first_partition`` / ``end_partition``: a ClearElr's range [first, end) of the topic's
  partitions (end null: to the last).
* ``resource_type``, ``resource_name``, ``config_name``, ``config_value``: a Config
  record (a topic's, or ``broker`` with an empty name: the cluster default; a null value
  deletes the config). ``feature`` / ``level``: a FeatureLevel record.
* ``timestamp``: the batch timestamp (ms) as a UTC timestamp; ``offline_since`` likewise
  from ``offline_since_ms``.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa

CLUSTER: Final = "cluster"
OFFSET: Final = "offset"
TIMESTAMP: Final = "timestamp"
RECORD_TYPE: Final = "record_type"

# (name, kind) in output order. Kinds: string, long, int, bool, ts, ints, candidates.
COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("cluster", "string"),
    ("offset", "long"),
    ("timestamp", "ts"),
    ("record_type", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("broker", "int"),
    ("leader", "int"),
    ("leader_epoch", "int"),
    ("partition_epoch", "int"),
    ("isr", "ints"),
    ("elr", "ints"),
    ("last_known_elr", "ints"),
    ("reason", "string"),
    ("election_kind", "string"),
    ("strategy", "string"),
    ("chosen", "int"),
    ("candidates", "candidates"),
    ("potential_data_loss", "bool"),
    ("clean", "bool"),
    ("recovery_state", "int"),
    ("min_isr", "int"),
    ("replicas", "ints"),
    ("trigger", "string"),
    ("offline_since", "ts"),
    # The metadata lifecycle (issue 19), after the columns above so that their positions
    # do not move.
    ("topic_id", "string"),
    ("adding_replicas", "ints"),
    ("removing_replicas", "ints"),
    ("first_partition", "int"),
    ("end_partition", "int"),
    ("resource_type", "string"),
    ("resource_name", "string"),
    ("config_name", "string"),
    ("config_value", "string"),
    ("feature", "string"),
    ("level", "int"),
)
COLUMN_NAMES: Final = tuple(name for name, _ in COLUMNS)
_KIND: Final = dict(COLUMNS)

# Columns that come from the record's position, not its fields.
POSITIONAL: Final = frozenset({CLUSTER, OFFSET, TIMESTAMP, RECORD_TYPE})

_PARTITION_STATE = ("Partition", "PartitionChange")

# column -> {record type tag -> field name in that record}
FIELD_SOURCES: Final[dict[str, dict[str, str]]] = {
    "topic": {
        "Topic": "name",
        "Partition": "topic",
        "PartitionChange": "topic",
        "UncleanRecovery": "topic",
        "ClearElr": "topic",
        "RemoveTopic": "name",
    },
    "partition": dict.fromkeys((*_PARTITION_STATE, "UncleanRecovery"), "partition"),
    "broker": {
        "PartitionChange": "broker",
        "RegisterBroker": "broker_id",
        "FenceBroker": "broker_id",
        "UnfenceBroker": "broker_id",
        "BrokerRegistrationChange": "broker_id",
        "UnregisterBroker": "broker_id",
    },
    "leader": dict.fromkeys(_PARTITION_STATE, "leader"),
    "leader_epoch": dict.fromkeys(_PARTITION_STATE, "leader_epoch"),
    "partition_epoch": dict.fromkeys(_PARTITION_STATE, "partition_epoch"),
    "isr": dict.fromkeys(_PARTITION_STATE, "isr"),
    "elr": dict.fromkeys(_PARTITION_STATE, "elr"),
    "last_known_elr": dict.fromkeys(_PARTITION_STATE, "last_known_elr"),
    "reason": {"PartitionChange": "reason", "FenceBroker": "reason", "AbortTransaction": "reason"},
    "election_kind": {"PartitionChange": "election"},
    "strategy": {"UncleanRecovery": "strategy", "Topic": "recovery_strategy"},
    "chosen": {"UncleanRecovery": "chosen"},
    "candidates": {"UncleanRecovery": "candidates"},
    "potential_data_loss": {"UncleanRecovery": "potential_data_loss"},
    "clean": {"RegisterBroker": "clean"},
    "recovery_state": dict.fromkeys(_PARTITION_STATE, "recovery_state"),
    "min_isr": {
        "Topic": "min_isr",
        "Partition": "min_isr",
        "PartitionChange": "min_isr",
        "ClearElr": "min_isr",
    },
    "replicas": dict.fromkeys(_PARTITION_STATE, "replicas"),
    "trigger": {"UncleanRecovery": "trigger"},
    "offline_since": {"UncleanRecovery": "offline_since_ms"},
    "topic_id": {"Topic": "topic_id", "RemoveTopic": "topic_id"},
    "adding_replicas": dict.fromkeys(_PARTITION_STATE, "adding_replicas"),
    "removing_replicas": dict.fromkeys(_PARTITION_STATE, "removing_replicas"),
    "first_partition": {"ClearElr": "first"},
    "end_partition": {"ClearElr": "end"},
    "resource_type": {"Config": "resource_type"},
    "resource_name": {"Config": "resource_name"},
    "config_name": {"Config": "name"},
    "config_value": {"Config": "value"},
    "feature": {"FeatureLevel": "name"},
    "level": {"FeatureLevel": "level"},
}

RECORD_TYPE_NAMES: Final = (
    "Topic",
    "Partition",
    "PartitionChange",
    "RegisterBroker",
    "FenceBroker",
    "UnfenceBroker",
    "BrokerRegistrationChange",
    "UncleanRecovery",
    "ClearElr",
    "RemoveTopic",
    "Config",
    "FeatureLevel",
    "UnregisterBroker",
    "NoOp",
    # Transaction markers (KIP-868). Rows (the source, the export) hold every record as
    # stored, those of aborted or unfinished transactions included; the audit jobs leave
    # those out (`audit.transactions`).
    "BeginTransaction",
    "EndTransaction",
    "AbortTransaction",
)


def check_columns(columns: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """Validate a column selection; None means every column. Output order is schema order."""
    if columns is None:
        return COLUMN_NAMES
    unknown = [c for c in columns if c not in _KIND]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; known: {', '.join(COLUMN_NAMES)}")
    wanted = set(columns)
    return tuple(c for c in COLUMN_NAMES if c in wanted)


def check_types(types: list[str] | tuple[str, ...] | None) -> frozenset[str] | None:
    """Validate a record-type selection; None means every type."""
    if types is None:
        return None
    unknown = [t for t in types if t not in RECORD_TYPE_NAMES]
    if unknown:
        raise ValueError(f"unknown record type(s) {unknown}; known: {', '.join(RECORD_TYPE_NAMES)}")
    return frozenset(types)


_CANDIDATE = pa.struct(
    [
        pa.field("broker", pa.int32()),
        pa.field("last_leader_epoch", pa.int32()),
        pa.field("log_end_offset", pa.int64()),
    ]
)
# Spark's Arrow conversion names list children "element"; a RecordBatch handed to Spark
# must match its expected schema exactly, so these are built the same way.
_ARROW_KIND: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "bool": pa.bool_(),
    "ts": pa.timestamp("us", tz="UTC"),
    "ints": pa.list_(pa.field("element", pa.int32())),
    "candidates": pa.list_(pa.field("element", _CANDIDATE)),
}


def column_kind(column: str) -> str:
    try:
        return _KIND[column]
    except KeyError:
        raise ValueError(f"unknown column {column!r}; known: {', '.join(COLUMN_NAMES)}") from None


def arrow_type(column: str) -> pa.DataType:
    return _ARROW_KIND[_KIND[column]]


def arrow_schema(columns: tuple[str, ...] = COLUMN_NAMES) -> pa.Schema:
    return pa.schema([pa.field(c, arrow_type(c)) for c in columns])


def spark_schema(columns: tuple[str, ...] = COLUMN_NAMES) -> Any:
    """The Spark StructType of the selected columns (built without a running session)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DataType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    candidate = StructType(
        [
            StructField("broker", IntegerType()),
            StructField("last_leader_epoch", IntegerType()),
            StructField("log_end_offset", LongType()),
        ]
    )
    kinds: dict[str, DataType] = {
        "string": StringType(),
        "long": LongType(),
        "int": IntegerType(),
        "bool": BooleanType(),
        "ts": TimestampType(),
        "ints": ArrayType(IntegerType()),
        "candidates": ArrayType(candidate),
    }
    return StructType([StructField(c, kinds[_KIND[c]], True) for c in columns])
