"""Child processes that do not outlive their parent: the one command prefix for it.

Owns `dies_with_parent`, used wherever the project starts a long-lived child (the local
cluster's controllers, brokers and etcd members, the tests' clusters, the audits' Spark
standalone master and workers), so that a parent killed by SIGKILL (a test run cut
short, an operator's kill -9) leaves no orphan. Must not start or signal anything itself.
"""

from __future__ import annotations

import shutil


def dies_with_parent(signal: str = "SIGTERM") -> list[str]:
    """A command prefix after which the child gets `signal` (SIGTERM by default) when its
    parent dies, even by SIGKILL (util-linux's setpriv; nothing where it is missing). The
    signal follows the thread that forks the child: start it from a thread that lives as
    long as it should. SIGKILL for a child that may be stopped (SIGSTOP) when its parent
    dies: a stopped process never acts on SIGTERM."""
    found = shutil.which("setpriv")
    return [found, "--pdeathsig", signal, "--"] if found else []
