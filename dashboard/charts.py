"""Server-rendered SVG charts: no JavaScript, nothing fetched at run time.

Every function returns a SafeString holding one <svg>. Inputs are plain numbers; every piece
of text is escaped. Colours come from CSS classes (static/dashboard/dashboard.css) so the
charts follow the page's palette.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from memory.services.context_budget import COMPONENTS

PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#8c8c8c",
    "#499894",
]
# Each budget component keeps one colour wherever it is drawn (legend, bar, manifest), whichever
# components a build happens to use: the colour follows the name, never the position.
COMPONENT_COLOURS = {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(COMPONENTS)}
# Manifest item kinds drawn in their component's colour.
KIND_COMPONENT = {
    "system_part": "system",
    "pinned_fact": "pinned_facts",
    "memory": "memories",
    "user_profile": "user_profile",
}


def component_colour(name: str) -> str:
    """The fixed colour of a component (or a manifest kind, or a score signal); a name not known
    in advance gets a colour derived from the name itself, so it is stable across builds too."""
    name = KIND_COMPONENT.get(name, name)
    if name in COMPONENT_COLOURS:
        return COMPONENT_COLOURS[name]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def share_text(*, used: int, limit: int) -> str:
    """`used` as a share of `limit`, the one way the dashboard writes a budget percentage."""
    return f"{used / limit * 100:.1f} %" if limit > 0 else "—"


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


SINGLE_POINT_PAD_SECONDS = 30.0  # the time either side of a lone point, so it sits mid-chart


def _tokens(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}"


def gauge(*, used: int, limit: int, threshold: float = 0.85, width: int = 420) -> SafeString:
    """A horizontal gauge: the bar is `used` of `limit`, a line marks `threshold` (e.g. 85 %)."""
    height, bar_y, bar_h = 56, 18, 18
    ratio = used / limit if limit > 0 else 0.0
    fill_w = min(ratio, 1.0) * width
    level = "ok" if ratio < threshold else ("warn" if ratio < 1.0 else "over")
    x_line = threshold * width
    pct = share_text(used=used, limit=limit)
    return mark_safe(
        f'<svg class="chart gauge" role="img" viewBox="0 0 {width + 2} {height}" width="{width + 2}" '
        f'aria-label="budget {escape(pct)} of {limit} tokens">'
        f'<rect class="gauge-track" x="1" y="{bar_y}" width="{width}" height="{bar_h}" rx="3"/>'
        f'<rect class="gauge-fill gauge-{level}" x="1" y="{bar_y}" width="{fill_w:.1f}" '
        f'height="{bar_h}" rx="3"/>'
        f'<line class="gauge-threshold" x1="{x_line + 1:.1f}" x2="{x_line + 1:.1f}" y1="{bar_y - 6}" '
        f'y2="{bar_y + bar_h + 6}"/>'
        f'<text class="chart-label" x="{x_line + 1:.1f}" y="{bar_y - 8}" text-anchor="middle">'
        f"{_fmt(threshold * 100)} %</text>"
        f'<text class="chart-label" x="1" y="{height - 2}">0</text>'
        f'<text class="chart-label" x="{width + 1}" y="{height - 2}" text-anchor="end">'
        f"limit {_tokens(limit)}</text>"
        f'<text class="chart-value" x="{width / 2:.0f}" y="{height - 2}" text-anchor="middle">'
        f"{_tokens(used)} tokens · {escape(pct)}</text>"
        "</svg>"
    )


def stacked_bar(*, parts: Sequence[tuple[str, int]], limit: int, width: int = 420) -> SafeString:
    """One bar split into named parts (tokens per component), scaled to `limit`, with a legend.
    Each part is drawn in its component's fixed colour (`component_colour`)."""
    bar_h = 22
    total = sum(value for _, value in parts)
    scale = max(limit, total, 1)
    x = 1.0
    rects = []
    legend = []
    for index, (name, value) in enumerate(parts):
        colour = component_colour(name)
        w = value / scale * width
        rects.append(
            f'<rect x="{x:.1f}" y="1" width="{w:.1f}" height="{bar_h}" fill="{colour}">'
            f"<title>{escape(name)}: {value} tokens</title></rect>"
        )
        x += w
        row, col = divmod(index, 3)
        lx, ly = 1 + col * (width / 3), bar_h + 18 + row * 16
        legend.append(
            f'<rect x="{lx:.0f}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text class="chart-label" x="{lx + 14:.0f}" y="{ly}">{escape(name)} {_tokens(value)}</text>'
        )
    rows = (len(parts) + 2) // 3
    height = bar_h + 12 + rows * 16 + 4
    return mark_safe(
        f'<svg class="chart stacked" role="img" viewBox="0 0 {width + 2} {height}" width="{width + 2}" '
        f'aria-label="budget by component">'
        f'<rect class="gauge-track" x="1" y="1" width="{width}" height="{bar_h}"/>'
        + "".join(rects)
        + "".join(legend)
        + "</svg>"
    )


@dataclass(frozen=True)
class Marker:
    at: datetime
    label: str


def line_chart(
    *,
    points: Sequence[tuple[datetime, float]],
    limit: float | None = None,
    threshold: float | None = None,
    markers: Sequence[Marker] = (),
    width: int = 420,
    height: int = 160,
) -> SafeString:
    """Values over time with optional limit and threshold lines and vertical event markers.

    A single point (one build so far) sits in the middle, labelled with its value and time: at
    the left edge it would hide on the axis."""
    left, right, top, bottom = 40, 8, 8, 20
    plot_w, plot_h = width - left - right, height - top - bottom
    if not points:
        return mark_safe("")
    single = len(points) == 1
    pad = SINGLE_POINT_PAD_SECONDS if single else 0.0
    t0 = points[0][0].timestamp() - pad
    t1 = max(points[-1][0].timestamp() + pad, t0 + 1)
    y_max = max([v for _, v in points] + [limit or 0, 1])

    def sx(ts: float) -> float:
        return left + (ts - t0) / (t1 - t0) * plot_w

    def sy(value: float) -> float:
        return top + plot_h - value / y_max * plot_h

    parts = [
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>',
        f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>',
        f'<text class="chart-label" x="{left - 4}" y="{top + 8}" text-anchor="end">{_tokens(y_max)}</text>',
        f'<text class="chart-label" x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    if single:
        at, value = points[0]
        x, y = sx(at.timestamp()), sy(value)
        parts += [
            f'<text class="chart-label" x="{x:.1f}" y="{height - 4}" text-anchor="middle">'
            f"{at:%H:%M:%S}</text>",
            f'<text class="chart-value" x="{x:.1f}" y="{max(y - 8, top + 8):.1f}" text-anchor="middle">'
            f"{_tokens(value)}</text>",
        ]
    else:
        parts += [
            f'<text class="chart-label" x="{left}" y="{height - 4}">{points[0][0]:%H:%M:%S}</text>',
            f'<text class="chart-label" x="{left + plot_w}" y="{height - 4}" text-anchor="end">'
            f"{points[-1][0]:%H:%M:%S}</text>",
        ]
    if limit:
        parts.append(
            f'<line class="limit-line" x1="{left}" x2="{left + plot_w}" '
            f'y1="{sy(limit):.1f}" y2="{sy(limit):.1f}"/>'
        )
    if limit and threshold:
        y = sy(limit * threshold)
        parts.append(
            f'<line class="threshold-line" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
    for marker in markers:
        x = sx(marker.at.timestamp())
        if left <= x <= left + plot_w:
            parts.append(
                f'<line class="marker-line" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}">'
                f"<title>{escape(marker.label)} at {marker.at:%H:%M:%S}</title></line>"
                f'<circle class="marker-dot" cx="{x:.1f}" cy="{top + 3}" r="3">'
                f"<title>{escape(marker.label)}</title>"
                "</circle>"
            )
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{sx(t.timestamp()):.1f},{sy(v):.1f}" for i, (t, v) in enumerate(points)
    )
    parts.append(f'<path class="series" d="{path}"/>')
    radius = 4 if single else 2
    for t, v in points[-60:]:
        parts.append(
            f'<circle class="series-dot" cx="{sx(t.timestamp()):.1f}" cy="{sy(v):.1f}" r="{radius}"/>'
        )
    return mark_safe(
        f'<svg class="chart line" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'aria-label="over time">' + "".join(parts) + "</svg>"
    )


def sparkline(*, values: Sequence[float], width: int = 160, height: int = 32) -> SafeString:
    """A tiny bar chart (e.g. messages per minute over the last 30 minutes)."""
    if not values:
        return mark_safe("")
    top = max(max(values), 1)
    bar_w = width / len(values)
    bars = "".join(
        f'<rect class="spark" x="{i * bar_w:.1f}" y="{height - v / top * height:.1f}" '
        f'width="{max(bar_w - 1, 1):.1f}" height="{v / top * height:.1f}"><title>{_fmt(v)}</title></rect>'
        for i, v in enumerate(values)
    )
    return mark_safe(
        f'<svg class="chart sparkline" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" '
        f'aria-label="per minute">{bars}</svg>'
    )


def position_strip(
    *, items: Sequence[tuple[str, float, bool]], middle: tuple[float, float], width: int = 420
) -> SafeString:
    """Where items sit in a prompt (0 = start, 1 = end), with the risky `middle` band shaded
    (the context policy's middle_start..middle_end).

    `items` are (label, position 0..1, critical).
    """
    height = 40
    start, end = middle
    band = f"middle {start * 100:.0f}-{end * 100:.0f} %: easily lost"
    parts = [
        f'<rect class="gauge-track" x="1" y="12" width="{width}" height="12"/>',
        f'<rect class="risky-zone" x="{1 + start * width:.1f}" y="12" width="{(end - start) * width:.1f}" '
        f'height="12"><title>{band}</title></rect>',
        f'<text class="chart-label" x="1" y="{height - 2}">start</text>',
        f'<text class="chart-label" x="{width / 2:.0f}" y="{height - 2}" text-anchor="middle">middle</text>',
        f'<text class="chart-label" x="{width}" y="{height - 2}" text-anchor="end">end</text>',
    ]
    for label, position, critical in items:
        x = 1 + max(0.0, min(1.0, position)) * width
        cls = "pos-critical" if critical else "pos-item"
        parts.append(
            f'<circle class="{cls}" cx="{x:.1f}" cy="18" r="5"><title>{escape(label)} at '
            f"{position * 100:.0f} %</title></circle>"
        )
    return mark_safe(
        f'<svg class="chart positions" role="img" viewBox="0 0 {width + 2} {height}" width="{width + 2}" '
        f'aria-label="positions in the prompt">' + "".join(parts) + "</svg>"
    )


def contribution_bar(
    *, parts: Sequence[tuple[str, float]], full: float = 1.0, width: int = 160
) -> SafeString:
    """A small bar of how much each signal contributed to a score (on a 0..`full` scale)."""
    height = 12
    x = 0.0
    rects = []
    for name, value in parts:
        w = max(value, 0.0) / full * width if full else 0.0
        rects.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" '
            f'fill="{component_colour(name)}">'
            f"<title>{escape(name)}: {value:.3f}</title></rect>"
        )
        x += w
    return mark_safe(
        f'<svg class="chart contribution" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" '
        f'aria-label="score contributions">'
        f'<rect class="gauge-track" x="0" y="0" width="{width}" height="{height}"/>'
        + "".join(rects)
        + "</svg>"
    )
