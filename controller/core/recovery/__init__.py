"""Unclean recovery (rule 7): pluggable policies and the pure tracker that drives them.

`policy` defines the protocol a strategy implements, `builtin` holds balanced,
proactive and manual, `tracker` turns pending recoveries, log-inspection answers and
the clock into records, and `registry` finds policies through the
`metactl.recovery_policies` entry-point group.
"""
