"""A local cluster on this machine: `metactl cluster up`'s supervisor and what it runs.

The supervisor (supervisor.py: start, supervise, restart a broker, stop in order) and its
children (children.py, their logs made readable in child_log.py), its record and control
socket for `metactl broker start` (control.py), the data directories it formats
(storage.py), the Prometheus configuration it writes (scrape_config.py), a local etcd
cluster (etcd.py, also run by the chaos runner, the HA tests and the benchmarks), the
cluster's certificates (certs.py) and plain child-process helpers (procs.py).

It runs real processes and decides nothing about metadata. It must not import the CLI
(`ops`) nor the chaos runner (`chaos`): the CLI calls it, and prints.
"""
