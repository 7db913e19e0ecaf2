"""The audit jobs. Each module's ``run(spark, AuditInput, ...)`` returns a `JobResult`."""

from __future__ import annotations

JOBS = ("elections", "unclean-recoveries", "offline", "brokers", "invariants")

MODULES = {
    "elections": "audit.jobs.elections",
    "unclean-recoveries": "audit.jobs.unclean",
    "offline": "audit.jobs.offline",
    "brokers": "audit.jobs.brokers",
    "invariants": "audit.jobs.invariants",
}
