"""The `--path-to-json-file` of `metactl elect`, in `kafka-leader-election.sh`'s format:
`{"partitions": [{"topic": "t", "partition": 0}]}`, and metactl's `replica` per partition
for an UNCLEAN election. Its numbers are JSON integers within Java's int
(`ops.reassign_plan.Int32`).

Read by `ops.admin_cmds` when `elect` runs (its parser does not import msgspec). Pure but
for reading the file: a bad document is INVALID_CONFIG naming it; no requests, no printing.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from metactl.errors import InvalidConfigurationError
from metadata_image.state import TopicPartition
from ops.reassign_plan import Int32


class JsonPartition(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    partition: Int32  # a JSON integer within Java's int (not true, 1.0 or "1")
    replica: Int32 | None = None  # metactl's: the replica of an UNCLEAN election


class JsonFile(msgspec.Struct):
    partitions: list[JsonPartition]


def read_election_file(path: Path) -> list[tuple[TopicPartition, int | None]]:
    """The file's partitions, each with its replica (None if not given), in order;
    INVALID_CONFIG for a bad document, no partitions or a partition listed twice."""
    try:
        doc = msgspec.json.decode(path.read_bytes(), type=JsonFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidConfigurationError(
            f"--path-to-json-file {path}: {exc} (expected "
            '{"partitions": [{"topic": "t", "partition": 0}, ...]})'
        ) from None
    seen: set[TopicPartition] = set()
    out = []
    for p in doc.partitions:
        tp = (p.topic, p.partition)
        if tp in seen:
            raise InvalidConfigurationError(
                f"--path-to-json-file {path}: {p.topic}-{p.partition} is listed twice"
            )
        seen.add(tp)
        out.append((tp, p.replica))
    if not out:
        raise InvalidConfigurationError(f"--path-to-json-file {path}: no partitions")
    return out
