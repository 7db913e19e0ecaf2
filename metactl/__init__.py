"""Shared foundations of metactl: the error hierarchy, version, logging set-up, the
settings layers of a process (`settings`), the one reader of numbers (`numbers`) and the
command prefix that keeps a child from outliving its parent (`processes`).

This package holds what every layer needs and nothing that belongs to one layer:
no log storage, no controller rules, no networking.
"""

__version__ = "0.1.0"
