"""Finds unclean-recovery policies through the `metactl.recovery_policies` entry points.

The built-ins are registered in pyproject.toml the same way a user's package registers
its own. This is the one place that reads package metadata; the pure core receives the
resulting mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from controller.core.recovery.builtin import BalancedPolicy, ManualPolicy, ProactivePolicy
from controller.core.recovery.policy import RecoveryPolicy
from metactl.errors import UnknownRecoveryPolicyError

GROUP = "metactl.recovery_policies"


def load_policies() -> dict[str, RecoveryPolicy]:
    found: dict[str, RecoveryPolicy] = {}
    for ep in entry_points(group=GROUP):
        cls = ep.load()
        policy: RecoveryPolicy = cls()
        if policy.name != ep.name:
            raise UnknownRecoveryPolicyError(
                f"entry point {ep.name!r} loads a policy named {policy.name!r}"
            )
        found[ep.name] = policy
    # Running from a source tree that was never installed: the built-ins still work.
    for builtin in (BalancedPolicy(), ProactivePolicy(), ManualPolicy()):
        found.setdefault(builtin.name, builtin)
    return found


def require(policies: Mapping[str, RecoveryPolicy], name: str) -> RecoveryPolicy:
    try:
        return policies[name]
    except KeyError:
        raise UnknownRecoveryPolicyError(
            f"unknown unclean recovery strategy {name!r}; known: {', '.join(sorted(policies))}"
        ) from None
