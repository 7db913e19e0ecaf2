"""Process-wide settings, applied by entry points (the controller's `serve`, the
benchmarks, the test session), never on import: library code must not change the
process it is loaded into.
"""

from __future__ import annotations

import gc

from prometheus_client import disable_created_metrics


def configure_process() -> None:
    """prometheus_client: no `_created` companion series. They would double the series
    count of every counter and histogram, and nothing here reads them."""
    disable_created_metrics()  # type: ignore[no-untyped-call]


def freeze_heap() -> None:
    """Move everything alive now (above all a loaded image) out of the cyclic GC's
    generations, so full collections do not rescan millions of partition objects on
    every later change. Call once the long-lived state is built."""
    gc.collect()
    gc.freeze()
