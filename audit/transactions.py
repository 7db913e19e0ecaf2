"""Which stored records the audits read: none of an aborted or unfinished transaction.

The controller's readers replay the log through `metadata_image.transactions`: records
between a `BeginTransactionRecord` and an `AbortTransactionRecord` never take effect, nor
do those of a transaction still open at the end of the log. The audits judge what took
effect, so they leave out exactly those records (the markers of such a transaction
included). Committed transactions are read record by record, like any other record.

Two forms of the same rule:

* `aborted_ranges`: the offset ranges to leave out, from a cluster's marker rows (the
  few ``BeginTransaction`` / ``EndTransaction`` / ``AbortTransaction`` rows), for the
  Spark jobs over rows (`audit.spark.AuditInput.load` filters them out);
* `committed`: a stream of decoded stored batches with those records left out, for the
  passes that decode every batch (`audit.plain`, the ``invariants`` job's ``logs``
  method, both through `committed_batches`, which reads and decodes a log's batches).
  It holds an open transaction's records until its end or abort marker.

Lenient where the controller's replay is strict (an audit reports, it does not refuse):
an end or abort marker outside a transaction is ignored, a begin inside one is part of
it. Pure but for `committed_batches` (which reads the log through `audit.logread`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from audit.logread import iter_batches
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    decode_batch,
)

__all__ = [
    "ABORT",
    "BEGIN",
    "END",
    "MARKER_TYPES",
    "OPEN_END",
    "aborted_ranges",
    "committed",
    "committed_batches",
]

BEGIN: Final = "BeginTransaction"
END: Final = "EndTransaction"
ABORT: Final = "AbortTransaction"
MARKER_TYPES: Final = (BEGIN, END, ABORT)
OPEN_END: Final = (1 << 63) - 1  # the last offset of a range left open at the log's end


def aborted_ranges(markers: Iterable[tuple[int, str]]) -> list[tuple[int, int]]:
    """Inclusive (first, last) offset ranges of the aborted transactions, and the
    unfinished trailing one (last = `OPEN_END`), from (offset, record type) markers."""
    out: list[tuple[int, int]] = []
    begin: int | None = None
    for offset, kind in sorted(markers):
        if kind == BEGIN:
            if begin is None:
                begin = offset
        elif begin is not None:
            if kind == ABORT:
                out.append((begin, offset))
            begin = None
    if begin is not None:
        out.append((begin, OPEN_END))
    return out


Batch = tuple[int, int, Sequence[Any]]  # (base offset, timestamp ms, records)


def committed(batches: Iterable[Batch]) -> Iterator[Batch]:
    """The stored batches in offset order, without the records of aborted or unfinished
    transactions: runs of consecutive records (base offset, timestamp, records)."""
    held: list[Batch] = []  # the open transaction's runs, its begin marker first
    for base, ts, records in batches:
        start = 0
        for i, r in enumerate(records):
            kind = type(r)
            if kind is BeginTransactionRecord:
                if not held:
                    if i > start:
                        yield base + start, ts, records[start:i]
                    held.append((base + i, ts, records[i:i]))  # opens the transaction
                    start = i
            elif kind is EndTransactionRecord or kind is AbortTransactionRecord:
                if not held:
                    continue  # stray marker: ignored
                run = (base + start, ts, records[start : i + 1])
                if kind is EndTransactionRecord:
                    for h in held:
                        if h[2]:
                            yield h
                    yield run
                held = []
                start = i + 1
        if start < len(records):
            run = (base + start, ts, records[start:])
            if held:
                held.append(run)
            else:
                yield run
    # A transaction still open here is unfinished: nothing of it is yielded.


def committed_batches(
    path: str | Path, start: int, end: int, until_ms: int | None = None
) -> Iterator[Batch]:
    """`committed` over the log file's stored batches in [start, end) (those stored
    before `until_ms` if given), decoded."""
    decoded = (
        (base, ts, decode_batch(payload))
        for chunk in iter_batches(path, start, end)
        for base, _count, ts, payload in chunk
        if until_ms is None or ts < until_ms
    )
    return committed(decoded)
