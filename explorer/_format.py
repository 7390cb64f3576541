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
