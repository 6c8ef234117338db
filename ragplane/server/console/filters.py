"""Jinja filters: numbers, sizes and times as an operator reads them."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import jinja2


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isinf(x):
            return "∞"
        return f"{x:.{digits}g}" if abs(x) < 1e6 else f"{x:,.0f}"
    return str(x)


def when(t: float | None) -> str:
    if not t:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def ago(t: float | None) -> str:
    if not t:
        return "never"
    s = max(0.0, time.time() - t)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def duration(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def install(env: jinja2.Environment) -> None:
    env.filters.update(size=size, num=num, when=when, ago=ago, duration=duration,
                       tojson_compact=lambda v: json.dumps(v, sort_keys=True, default=str))
