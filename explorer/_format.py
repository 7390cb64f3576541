"""Number and PartitionSpec formatting shared by the views."""

from __future__ import annotations

import html
import math

from partex import format_bytes


fmt_bytes = format_bytes


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def fmt_pct(x: float | None) -> str:
    """0.4567 -> '45.7%'; small fractions keep two significant digits: '0.031%'."""
    if x is None or not math.isfinite(x):
        return "-"
    pct = x * 100
    if pct >= 10 or pct == 0:
        return f"{pct:.1f}%"
    return f"{pct:.2g}%"


def fmt_spec(spec: list) -> str:
    """A plan's JSON spec ([null, "model"]) as the PartitionSpec a user writes."""
    if not spec:
        return "P()"
    parts = []
    for entry in spec:
        if entry is None:
            parts.append("None")
        elif isinstance(entry, str):
            parts.append(repr(entry))
        else:
            parts.append("(" + ", ".join(repr(a) for a in entry) + ")")
    return f"P({', '.join(parts)})"


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def fmt_versus(time: float, other: float, name: str) -> str:
    """How a step time compares with another plan's, in words: '9.7× faster than the best
    baseline (zero3)', '1.3× slower than …', 'as fast as …' (within 0.5%)."""
    if not (time > 0 and other > 0 and math.isfinite(time) and math.isfinite(other)):
        return f"the best baseline is {name}"
    ratio = other / time
    if abs(ratio - 1) < 0.005:
        return f"as fast as the best baseline ({name})"
    word, x = ("faster", ratio) if ratio > 1 else ("slower", 1 / ratio)
    return f"{_times(x)}× {word} than the best baseline ({name})"


def _times(x: float) -> str:
    """1.234 -> '1.23', 9.71 -> '9.7', 123.4 -> '123'."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 2:
        return f"{x:.1f}"
    return f"{x:.2f}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> tuple[list[float], int]:
    """About ``count`` round ticks (1, 2 or 5 times a power of ten apart) covering
    [lo, hi], and the decimals that write every one of them differently."""
    span = hi - lo
    if not (math.isfinite(span) and span > 0):
        return [lo], max(0, 3 - math.floor(math.log10(abs(lo)))) if lo else 0
    raw = span / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [round(t, decimals + 2) for t in ticks], decimals
