"""Line charts as inline SVG, drawn by qrc: no plotting library, no script, no network. Used for the
quality-vs-bits curve of the mixed-precision benchmark and the memory timeline of a compile report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 960, 420
LEFT, RIGHT, TOP, BOTTOM = 72, 160, 24, 48
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart: points, and whether it is drawn as steps."""
    name: str
    points: tuple[tuple[float, float], ...]
    markers_only: bool = False  # single measurements (uniform baselines) are dots, not a line
    step: bool = False  # a planned value held until the next point (a staircase)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.4g}"


def line_chart(series: Sequence[Series], x_label: str, y_label: str, title: str = "",
               y_format=_label, y_floor: float | None = None) -> str:
    """An SVG document: one polyline (or a row of dots) per series, with axes, ticks and a legend.
    `y_floor` starts the y axis there (0 for memory) instead of at the smallest value."""
    xs = [x for s in series for x, _ in s.points] or [0.0, 1.0]
    ys = [y for s in series for _, y in s.points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys) if y_floor is None else min(y_floor, min(ys)), max(ys)
    y1 += (y1 - y0) * 0.05  # headroom: the highest line stays inside the frame, under a tick
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0 or 1) * 0.1, y1 + abs(y1 or 1) * 0.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
           f'height="{HEIGHT}" font-family="sans-serif" font-size="11" role="img">']
    if title:
        out.append(f"<title>{escape(title)}</title>")
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    for t in _ticks(x0, x1):
        out.append(f'<line x1="{px(t):.1f}" y1="{TOP + plot_h}" x2="{px(t):.1f}" y2="{TOP + plot_h + 4}" stroke="#888"/>'
                   f'<text x="{px(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{escape(_label(t))}</text>')
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{LEFT - 4}" y1="{py(t):.1f}" x2="{LEFT + plot_w}" y2="{py(t):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{escape(y_format(t))}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        points = sorted(s.points)
        if s.step:
            stairs = []
            for j, (x, y) in enumerate(points):
                stairs.append((x, y))
                if j + 1 < len(points):
                    stairs.append((points[j + 1][0], y))
            points_text = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in stairs)
        else:
            points_text = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        cls = escape(s.name)
        if not s.markers_only and len(points) > 1:
            out.append(f'<polyline class="series" data-name="{cls}" data-points="{len(points)}" fill="none" '
                       f'stroke="{color}" stroke-width="1.5" points="{points_text}"/>')
        else:
            out.append(f'<g class="series" data-name="{cls}" data-points="{len(points)}">' + "".join(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"/>' for x, y in points) + "</g>")
        ly = TOP + 14 + 16 * i
        out.append(f'<line x1="{WIDTH - RIGHT + 12}" y1="{ly - 4}" x2="{WIDTH - RIGHT + 32}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="3"/><text x="{WIDTH - RIGHT + 38}" y="{ly}">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
