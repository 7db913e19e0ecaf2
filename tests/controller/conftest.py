"""Shared settings for the pure controller core's tests.

The Hypothesis profile is registered here but applied per test (``settings(CONTROLLER)``
in the test modules), so that loading this directory never changes the defaults of other
test packages. ``METACTL_HYPOTHESIS_EXAMPLES`` scales the example counts for a longer run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "metactl-controller",
    max_examples=int(os.environ.get("METACTL_HYPOTHESIS_EXAMPLES", "300")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
