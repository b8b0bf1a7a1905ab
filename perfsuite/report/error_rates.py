"""A runner's published error rates as a short table, for the run's page and
its job summary (``perfsuite report RUN --error-rates FILE``).

``perfsuite selftest error-rates`` writes the file (error-rates.json, schema
``SCHEMA``): per cell, how often unchanged code (A/A sessions: side B the
same as side A) was called regressed or improved, and same; how often side
B slowed by an injected fraction was called regressed; the smallest change
a session resolved (its interval's half-width) and the minutes a verdict
took. This module reads it; the selftest that measures it comes later in
the data flow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA = "perfsuite.error-rates/1"
# What each cell of the file holds; the report and a pull request's comment read these.
CELL_KEYS = ("sessions", "false_calls", "same", "injected", "detectable", "detectable_spread",
             "minutes_per_verdict")
TITLE = "Error rates of perfsuite ab on this runner"
HEADER = ["cell", "A/A called regressed or improved", "A/A called same", "injected slowdown called regressed",
          "smallest detectable change (median, range)", "minutes a verdict"]


def load_error_rates(path: Path | str) -> dict[str, Any]:
    """error-rates.json, its schema and every cell's figures checked; a
    ValueError that says what is wrong and what writes the file."""
    path = Path(path)
    writes = "`perfsuite selftest error-rates` writes it"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror or err}); {writes}") from err
    except ValueError as err:
        raise ValueError(f"{path} is not JSON ({err}); {writes}") from err
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA or not isinstance(data.get("cells"), dict):
        raise ValueError(f"{path} is not an error-rates file (schema {schema!r}, not {SCHEMA!r}); {writes}")
    for cell_id, cell in data["cells"].items():
        missing = [key for key in CELL_KEYS if not isinstance(cell, dict) or key not in cell]
        if missing:
            raise ValueError(f"{path}: cell {cell_id} lacks {', '.join(missing)}; {writes} again")
    return data


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f} %"


def _detectable(cell: Mapping[str, Any]) -> str:
    spread = cell.get("detectable_spread")
    text = _percent(cell.get("detectable"))
    if spread and None not in spread:
        text += f" ({spread[0] * 100:.2f}-{spread[1] * 100:.2f} %)"
    return text


def rows(data: Mapping[str, Any]) -> list[list[str]]:
    """One row a cell, in the order of ``HEADER``."""
    out = []
    for cell_id, cell in (data.get("cells") or {}).items():
        n, injected = cell["sessions"], cell["injected"] or {}
        minutes = cell.get("minutes_per_verdict")
        fraction = injected.get("fraction")
        out.append([cell_id, f"{cell['false_calls']}/{n}", f"{cell['same']}/{n}",
                    f"{injected.get('regressed')}/{injected.get('sessions')}"
                    + (f" ({fraction * 100:.3g} % slower)" if fraction is not None else ""),
                    _detectable(cell), "–" if minutes is None else f"{minutes:.1f}"])
    return out


def caption(data: Mapping[str, Any]) -> str:
    """What the figures are and where they were measured, in a sentence or two."""
    host = data.get("host") or {}
    machine = ", ".join(str(x) for x in (host.get("gpu") or host.get("cpu"),
                                         f"{host['cores']} cores" if host.get("cores") else None,
                                         f"torch {host['torch']}" if host.get("torch") else None,
                                         f"perfsuite {str(host['commit'])[:7]}" if host.get("commit") else None,
                                         host.get("date")) if x)
    tolerance = (data.get("settings") or {}).get("tolerance")
    return ("A/A: side B the same code as side A, so any call is false; detectable: the A/A sessions' "
            "interval half-width. " + (f"Judged at ±{tolerance * 100:.3g} %. " if tolerance else "")
            + (f"Measured on {machine}." if machine else "")).strip()


def table_context(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The report template's values (None: no section)."""
    if not data:
        return None
    return {"title": TITLE, "caption": caption(data), "header": HEADER, "rows": rows(data)}
