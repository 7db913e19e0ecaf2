"""Spark audits of the metadata log: a PySpark data source, a Parquet export and audit jobs.

* `audit.schema`: the flat, typed row schema every reader produces (one row per record).
* `audit.logread`: reads the SQLite log read-only with the stdlib (stored batches, bounds).
* `audit.selection`: the record filters (types, anyOf) a reader can apply to raw bytes.
* `audit.rows`: turns stored batches into Arrow record batches of that schema (used by
  the data source).
* `audit.source`: the Spark 4 Python data source ``metactl``
  (``spark.read.format("metactl").load("data-dir")``).
* `audit.export`: ``metactl log export``: the same rows as Parquet, laid out for the
  audits (partition records in buckets, the rest apart, a manifest), by parallel processes.
* `audit.buckets`: jobs over an export's buckets, one Spark task each, no shuffle.
* `audit.lifecycle`: what the audits key and classify by: topic generations (a topic
  deleted and created again is another topic) and the cluster's final clean shutdown.
* `audit.progress`: progress of an audit's Spark jobs, named for the audit's steps.
* `audit.jobs`: the audits (elections, unclean recoveries, offline time, brokers,
  invariants); `audit.rules` names the invariants, `audit.partition_checker` checks one
  partition's history against them and `audit.log_checker` feeds it a log's records:
  the checker they share with `audit.plain`, the single-process baseline of every job.
* `audit.tile`: large histories tiled from a simulated one (benchmarks, tests).
* `audit.standalone`: a Spark standalone cluster (master, workers) on this machine.

The history simulator that writes long logs for these audits is `simulation.history`.

Nothing here changes a log: every reader opens it read-only.
"""
