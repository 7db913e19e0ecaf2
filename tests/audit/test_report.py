"""The HTML report: round axis ticks, tables that wrap (no Spark needed)."""

from __future__ import annotations

import math
import re
from itertools import pairwise

import pandas as pd
import pytest

from audit.report import bar_chart, nice_ticks, page, table_html


def is_round_axis(ticks: list[float]) -> bool:
    """From 0 in equal steps of 1, 2 or 5 times a power of ten."""
    if len(ticks) < 2 or ticks[0] != 0:
        return False
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    equal = all(math.isclose(b - a, step) for a, b in pairwise(ticks))
    return equal and any(math.isclose(mantissa, m) for m in (1, 2, 5))


@pytest.mark.parametrize(
    "peak", [1, 3, 7, 9, 12, 100, 270, 338, 450, 999, 1001, 12_345, 99_999, 2.5e6, 0.3]
)
def test_ticks_are_round_and_cover_the_peak(peak: float) -> None:
    ticks = nice_ticks(peak)
    assert is_round_axis(ticks), ticks
    assert ticks[-1] >= peak and ticks[-2] < peak  # covers it, no empty step above
    assert 3 <= len(ticks) <= 6 or (peak <= 1 and len(ticks) == 2)


def test_the_round_check_catches_the_old_quarter_ticks() -> None:
    # The report used to label peak * (0, .25, .5, .75, 1): 0/84.5/169/253.5/338.
    assert not is_round_axis([338 * f for f in (0, 0.25, 0.5, 0.75, 1.0)])
    assert is_round_axis(nice_ticks(338))


def test_a_chart_labels_only_round_ticks() -> None:
    svg = bar_chart(["a", "b", "c"], {"x": [120, 338, 40], "y": [10, 0, 5]}, title="t")
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    axis = [lab for lab in labels if lab not in ("a", "b", "c")]
    assert axis == ["0", "100", "200", "300", "400"]


def test_wide_tables_wrap_inside_the_page() -> None:
    wide = pd.DataFrame({"candidates": ["[" + ",".join(str(i) for i in range(400)) + "]"]})
    html = table_html(wide)
    assert html.startswith('<div class="table"><table>') and html.endswith("</table></div>")
    css = page("t", [], [html])
    assert re.search(r"td \{[^}]*overflow-wrap: anywhere", css)
    assert re.search(r"\.table \{[^}]*overflow-x: auto", css)
