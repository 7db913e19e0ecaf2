"""Writing a job's result: tables as Parquet or CSV, a summary text and a static HTML page.

The HTML needs no network: charts are inline SVG drawn here (bars, stacked by series),
tables are plain HTML. CSV cannot hold arrays or structs, so such cells are written as
JSON text there; Parquet keeps them typed.

It sees a job's result only through `JobOutput` (what `audit.jobs.common.JobResult`
holds), so that the jobs use it and it uses none of them. It computes nothing.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


class JobOutput(Protocol):
    """What `write_outputs` writes of a job's result (`audit.jobs.common.JobResult`)."""

    @property
    def job(self) -> str: ...

    @property
    def tables(self) -> Mapping[str, pd.DataFrame]: ...

    @property
    def summary(self) -> Sequence[str]: ...

    @property
    def html(self) -> Sequence[str]: ...


PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)


def _json_cell(v: Any) -> Any:
    if v is None:
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, list | dict | tuple):
        return json.dumps(_plain(v), separators=(",", ":"))
    return v


def _iso(v: Any) -> Any:
    if v is None or pd.isna(v):
        return None
    return pd.Timestamp(v).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _plain(v: Any) -> Any:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def write_table(df: pd.DataFrame, path_stem: Path, fmt: str) -> Path:
    if fmt == "csv":
        out = df.copy()
        for col in out.columns:
            if pd.api.types.is_datetime64_any_dtype(out[col]):
                out[col] = out[col].map(_iso)
            elif out[col].dtype == object:
                out[col] = out[col].map(_json_cell)
        path = path_stem.with_suffix(".csv")
        out.to_csv(path, index=False)
        return path
    path = path_stem.with_suffix(".parquet")
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:  # numpy arrays from Spark: plain lists for Arrow
            out[col] = out[col].map(lambda v: None if v is None else _plain(v))
    pq.write_table(pa.Table.from_pandas(out, preserve_index=False), path)
    return path


def write_outputs(result: JobOutput, out_dir: str | Path, fmt: str = "parquet") -> list[Path]:
    """Write every table, summary.txt and report.html to `out_dir`; returns the paths."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"unknown output format {fmt!r} (parquet or csv)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_table(df, out / name, fmt) for name, df in result.tables.items()]
    summary = out / "summary.txt"
    summary.write_text("\n".join(result.summary) + "\n")
    report = out / "report.html"
    report.write_text(page(f"metactl audit: {result.job}", result.summary, result.html))
    return [*paths, summary, report]


# --- HTML ------------------------------------------------------------------------------


def page(title: str, summary: Sequence[str], sections: Sequence[str]) -> str:
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    summary_html = html.escape("\n".join(summary))
    body = "\n".join(sections)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.15em; margin-top: 2em; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
.table {{ max-width: 100%; overflow-x: auto; }}
table {{ border-collapse: collapse; font-size: 0.85em; max-width: 100%; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }}
td {{ overflow-wrap: anywhere; word-break: break-word; max-width: 40em; }}
th {{ background: #f0f0f0; }} td.l, th.l {{ text-align: left; }}
.note {{ color: #666; font-size: 0.85em; }}
svg text {{ font-family: system-ui, sans-serif; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="note">generated {made}</p>
<pre>{summary_html}</pre>
{body}
</body></html>
"""


def section(title: str, *parts: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n" + "\n".join(parts)


def table_html(df: pd.DataFrame, max_rows: int = 200) -> str:
    if df.empty:
        return '<p class="note">(none)</p>'
    shown = df.head(max_rows)
    head = "".join(
        f'<th class="{_align(shown[c])}">{html.escape(str(c))}</th>' for c in shown.columns
    )
    rows = []
    for rec in shown.itertuples(index=False):
        cells = "".join(
            f'<td class="{_align(shown[c])}">{html.escape(_cell_text(v))}</td>'
            for c, v in zip(shown.columns, rec, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    more = (
        f'<p class="note">{len(df) - max_rows:,} more rows in the table file</p>'
        if len(df) > max_rows
        else ""
    )
    # Long cells (candidate lists, replica sets) wrap instead of widening the page; a
    # table still too wide scrolls inside its own box.
    return f'<div class="table"><table><tr>{head}</tr>{"".join(rows)}</table></div>{more}'


def _align(series: pd.Series) -> str:
    return "" if pd.api.types.is_numeric_dtype(series) else "l"


def _cell_text(v: Any) -> str:
    if v is None or v is pd.NA:  # pd.NA: a nullable Int64 column's null
        return ""
    if isinstance(v, float) and math.isnan(v):
        return ""
    if hasattr(v, "tolist") or isinstance(v, list | dict):
        return json.dumps(_plain(v), separators=(",", ":"), default=str)
    if isinstance(v, pd.Timestamp):
        return str(v.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])
    return str(v)


def bar_chart(
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str = "",
    y_label: str = "",
    width: int = 1000,
    height: int = 320,
    max_labels: int = 24,
) -> str:
    """Stacked vertical bars: one bar per label, one colour per series."""
    n = len(labels)
    if n == 0 or not series:
        return '<p class="note">(nothing to draw)</p>'
    left, right, top, bottom = 60, 150, 24, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(float(s[i] or 0) for s in series.values()) for i in range(n)]
    ticks = nice_ticks(max(totals))
    peak = ticks[-1]
    step = plot_w / n
    bar_w = max(1.0, step * 0.8)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f'<text x="{left}" y="16" font-size="13">{html.escape(title)}</text>',
    ]
    for tick in ticks:
        y = top + plot_h * (1 - tick / peak)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
            'stroke="#ddd" stroke-width="1"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{_num(tick)}</text>"
        )
    for i in range(n):
        x = left + i * step + (step - bar_w) / 2
        base = 0.0
        for k, (name, values) in enumerate(series.items()):
            v = float(values[i] or 0)
            if v <= 0:
                continue
            h = plot_h * v / peak
            y = top + plot_h * (1 - (base + v) / peak)
            colour = PALETTE[k % len(PALETTE)]
            tip = html.escape(f"{labels[i]} {name}: {_num(v)}")
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
            base += v
    every = max(1, math.ceil(n / max_labels))
    for i in range(0, n, every):
        x = left + i * step + step / 2
        y = top + plot_h + 12
        parts.append(
            f'<text x="{x:.1f}" y="{y}" font-size="10" text-anchor="end" '
            f'transform="rotate(-40 {x:.1f} {y})">{html.escape(str(labels[i]))}</text>'
        )
    if y_label:
        parts.append(
            f'<text x="14" y="{top + plot_h / 2}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 14 {top + plot_h / 2})">{html.escape(y_label)}</text>'
        )
    for k, name in enumerate(series):
        y = top + 14 * k
        colour = PALETTE[k % len(PALETTE)]
        parts.append(
            f'<rect x="{left + plot_w + 16}" y="{y}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + plot_w + 32}" y="{y + 9}" font-size="11">'
            f"{html.escape(str(name))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def nice_ticks(peak: float, most: int = 6) -> list[float]:
    """Axis ticks from 0 to at least `peak` in a round step (1, 2 or 5 times a power of
    ten), at most `most` of them: 0/100/200/300 for a peak of 270, never 112/225/338."""
    if not math.isfinite(peak) or peak <= 0:
        return [0.0, 1.0]
    raw = peak / (most - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if step < 1 and peak >= 1:
        step = 1.0  # counts: whole numbers
    count = math.ceil(peak / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def _num(v: float) -> str:
    """A number for an axis or a tooltip: 850, 2.5, 12.5k, 1.2M."""
    if v >= 1_000_000:
        return f"{v / 1_000_000:.3g}M"
    if v >= 10_000:
        return f"{v / 1000:.3g}k"
    if v >= 100 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.2g}"


def log_histogram(values_ms: Sequence[float], *, title: str) -> str:
    """Durations in power-of-ten buckets (<1 s, 1-10 s, ... , >= 1 d)."""
    edges = [
        (0, 1_000, "< 1 s"),
        (1_000, 10_000, "1-10 s"),
        (10_000, 60_000, "10 s-1 min"),
        (60_000, 600_000, "1-10 min"),
        (600_000, 3_600_000, "10 min-1 h"),
        (3_600_000, 86_400_000, "1 h-1 d"),
        (86_400_000, math.inf, ">= 1 d"),
    ]
    counts = [sum(1 for v in values_ms if lo <= v < hi) for lo, hi, _ in edges]
    return bar_chart(
        [label for _, _, label in edges],
        {"count": counts},
        title=title,
        y_label="count",
        width=700,
        height=280,
    )
