"""The `metactl` command line: thin commands over the log, the core and the services.

Commands (`*_cmds.py`) parse arguments, call into the package that owns the work (the
log, the image, the controller, `clients`, `eventfeed`, `localcluster`, `chaos`,
`simulation`, `audit`) and print. Beside them, only the CLI's own plumbing: the entry
point and exit table (cli.py), the flags that reach a cluster (client.py) or a log
(paths.py), and helpers (times.py: --since and durations; run_progress.py: progress
bars; reassign_plan.py: the reassignment file and --verify's verdicts). They hold no
rules of their own, and nothing imports this package.
"""
