"""Small charts as inline SVG, for the run report (`bulkembed.reporting.report`): no
script, no font or file from elsewhere, so the page is one self-contained file.

Each chart is an `<svg>` element of `WIDTH` x `HEIGHT` with its axes' extremes labelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 36
_COLOUR = "#3b6ea5"


def _figure(label: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>{''.join(body)}</svg>"
    )


def _number(value: float) -> str:
    """`1,234`, `12.5`, `0.97`, `4`: short enough for an axis."""
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _axes(x_label: str, y_label: str, x_range: tuple[float, float], top: float) -> list[str]:
    bottom, right = HEIGHT - _BOTTOM, WIDTH - _RIGHT
    return [
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="#444"/>',
        f'<line x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>',
        f'<text x="{_LEFT - 4}" y="{_TOP + 10}" font-size="11" text-anchor="end">'
        f"{_number(top)}</text>",
        f'<text x="{_LEFT - 4}" y="{bottom}" font-size="11" text-anchor="end">0</text>',
        f'<text x="{_LEFT}" y="{bottom + 14}" font-size="11">{_number(x_range[0])}</text>',
        f'<text x="{right}" y="{bottom + 14}" font-size="11" text-anchor="end">'
        f"{_number(x_range[1])}</text>",
        f'<text x="{(_LEFT + right) / 2}" y="{HEIGHT - 4}" font-size="12" '
        f'text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="12" y="{(_TOP + bottom) / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 12 {(_TOP + bottom) / 2})">{escape(y_label)}</text>',
    ]


def line_chart(
    label: str, x_label: str, y_label: str, points: Sequence[tuple[float, float]]
) -> str:
    """A line through `points` (x, y), x ascending."""
    if not points:
        return _figure(label, [])
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    low, high = min(xs), max(xs)
    top = max(max(ys), 1e-9)
    span = max(high - low, 1e-9)
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM
    path = " ".join(
        f"{_LEFT + (x - low) / span * plot_width:.1f},"
        f"{HEIGHT - _BOTTOM - y / top * plot_height:.1f}"
        for x, y in points
    )
    line = f'<polyline fill="none" stroke="{_COLOUR}" stroke-width="2" points="{path}"/>'
    return _figure(label, [*_axes(x_label, y_label, (low, high), top), line])


def bar_chart(label: str, bars: Sequence[tuple[str, float]], unit: str) -> str:
    """Horizontal bars, one per (name, value), with their values."""
    height = _TOP + 24 * max(1, len(bars)) + 8
    top = max([v for _, v in bars] + [1e-9])
    body = []
    for number, (name, value) in enumerate(bars):
        y = _TOP + 24 * number
        length = value / top * (WIDTH - 260)
        body += [
            f'<text x="150" y="{y + 14}" font-size="12" text-anchor="end">{escape(name)}</text>',
            f'<rect x="158" y="{y + 2}" width="{length:.1f}" height="16" fill="{_COLOUR}"/>',
            f'<text x="{162 + length:.1f}" y="{y + 14}" font-size="12">'
            f"{escape(_number(value))} {escape(unit)}</text>",
        ]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>{''.join(body)}</svg>"
    )


def histogram(label: str, x_label: str, values: Sequence[float], bins: int = 40) -> str:
    """How many of `values` fall in each of `bins` equal ranges."""
    if not values:
        return _figure(label, [])
    low, high = min(values), max(values)
    width = max((high - low) / bins, 1e-9)
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / width))] += 1
    top = max(counts)
    plot_width = (WIDTH - _LEFT - _RIGHT) / bins
    plot_height = HEIGHT - _TOP - _BOTTOM
    body = _axes(x_label, "documents", (low, high), top)
    for number, count in enumerate(counts):
        bar = count / top * plot_height
        body.append(
            f'<rect x="{_LEFT + number * plot_width:.1f}" y="{HEIGHT - _BOTTOM - bar:.1f}" '
            f'width="{max(plot_width - 1, 1):.1f}" height="{bar:.1f}" fill="{_COLOUR}"/>'
        )
    return _figure(label, body)
