"""Values as a person reads them on the report pages: numbers to significant
digits, bytes in binary units, times in ms, fractions in percent, UTC times;
the templates' filters, and the two helpers of report/ab.py's hand-built page.
"""

from __future__ import annotations

import datetime as _dt
import html
from typing import Any

from perfsuite.report import cellview as cv


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to `digits` significant digits; None as an en dash; text as is."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        number = cv.number(value)
        return "–" if number is None else f"{number:.{digits}g}"
    return str(value)


def fmt_bytes(value: Any) -> str:
    """A byte count in binary units: 995 MiB, 1.5 GiB (never 9.951e+08)."""
    number = cv.number(value)
    if number is None:
        return "–"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(number) >= scale:
            return f"{number / scale:.4g} {unit}"
    return f"{number:.0f} B"


def quantity(value: Any, unit: str | None = None, digits: int = 4) -> str:
    """A value with its unit in the unit a person reads: bytes in MiB/GiB,
    sub-second times in ms, fractions in percent."""
    unit = unit or ""
    number = cv.number(value)
    if number is None:
        return fmt(value, digits)
    if unit == "bytes":
        return fmt_bytes(number)
    if unit == "s" and abs(number) < 1:
        return f"{number * 1e3:.{digits}g} ms"
    if unit == "fraction":
        return f"{number * 100:.{digits}g} %"
    return f"{number:.{digits}g} {unit}".strip()


def td(value: Any, cls: str = "", digits: int = 4) -> str:
    """One table cell as a string (kept for report/ab.py's hand-built page)."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    classes = " ".join(c for c in (cls, "num" if numeric else "") if c)
    return f'<td class="{classes}">{esc(fmt(value, digits))}</td>'


def utc_time(stamp: Any) -> str:
    number = cv.number(stamp)
    if number is None:
        return "–"
    return _dt.datetime.fromtimestamp(number, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def sort_key(value: Any) -> str:
    """A cell's data-sort attribute: the raw number, so sorting is numeric."""
    number = cv.number(value)
    return "" if number is None else repr(number)

