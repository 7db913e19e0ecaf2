"""The durable, event-sourced metadata log: record types, stores and snapshots.

This package owns how records are encoded, stored, checked and read back. It knows
nothing of the controller's rules: it never interprets what a record means.
"""
