"""The chaos runner behind `metactl chaos run` (docs/chaos.md): real processes, seeded
faults under acks=all load, and a check of every acknowledged record.

The run (runner.py) over its settings (config.py), its processes (processes.py, on the
local cluster's etcd, certificates and child helpers), its fault plan (plan.py) carried
out by faults.py, the controllers as it watches them (watch.py), the read-back
(read.py), the classification of every acknowledged record (check.py) and the report
(report.py).

It must not import the CLI (`ops`): the command parses, calls and prints.
"""
