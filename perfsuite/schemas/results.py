"""The results.json format, ``perfsuite.results/1`` (docs/reference/results.md):
its name and statuses, its JSON Schema (``SCHEMA_FILE``, shipped beside this
module), and the checks against it: ``validate`` and ``load`` for a whole
file, ``metrics_problem`` for one rank record's metrics.

A run object with its env and a list of cells; each cell has id, params,
status, reason, env, metrics (value, unit; step_time also samples and their
summary) and checks. Standard library only (jsonschema where a check runs):
a rank imports this module to check its record before it writes it.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

SCHEMA = "perfsuite.results/1"
STATUSES = ("ok", "failed", "error", "timeout", "skipped")
# The JSON Schema (draft 2020-12) of SCHEMA, shipped as package data, for
# other tools to validate results.json with.
SCHEMA_FILE = Path(__file__).resolve().parent / "results.schema.json"
MAX_PROBLEMS = 3  # schema problems a load error lists


def json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value



@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def metrics_problem(metrics: dict[str, Any]) -> str | None:
    """What the results schema would refuse in a record's ``metrics`` (a zero
    step time, a unit that is no string), as ``metrics/...: why``; None where
    nothing. Checked in the rank where the record is made, so one workload's
    bad value is its own cell's error, never the whole results.json's."""
    from jsonschema import Draft202012Validator

    schema = {"properties": {"metrics": {"$ref": "#/$defs/metrics"}}, "$defs": _validator().schema["$defs"]}
    errors = sorted(Draft202012Validator(schema).iter_errors({"metrics": json_safe(metrics)}),
                    key=lambda e: _path_key(e.absolute_path))
    return _problem(errors[0], {}) if errors else None


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               type(None): "null", int: "a number", float: "a number"}


def _cell_of(path: Any, data: Any) -> str:
    """`` (cell ID)`` where a JSON path is inside a cell that has an id."""
    path = list(path)
    if path[:1] == ["cells"] and len(path) > 1 and isinstance(path[1], int):
        entry = data["cells"][path[1]]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and path[2:] != ["id"]:
            return f" (cell {entry['id']})"
    return ""


def _problem(error: Any, data: Any) -> str:
    """One schema error as ``json/path: message``, a long value cut short."""
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    message = error.message
    if error.validator in ("exclusiveMinimum", "minimum") and "metrics" in error.absolute_path:
        bound = "not above" if error.validator == "exclusiveMinimum" else "below"  # say why, not only the bound
        message = (f"{error.instance!r} is {bound} {error.validator_value}: no ratio or verdict can be made "
                   "of a time, rate or memory size like that")
    if len(message) > 200:
        if error.validator == "type":
            kind = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
            expected = error.validator_value
            expected = expected if isinstance(expected, str) else "', '".join(expected)
            message = f"{kind} is not of type '{expected}'"
        else:
            message = message[:160] + " ..."
    return f"{where}: {message}{_cell_of(error.absolute_path, data)}"


def _path_key(where: Any) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in where)


def _non_finite(value: Any, where: tuple = ()) -> Any:
    """(path, value) of every NaN or infinity: Python's JSON reads them, and
    no verdict, ratio or log can be made of them."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, (*where, i))


def _beyond_schema(data: Any) -> list[tuple[tuple, str]]:
    """What JSON Schema cannot say: a cell id twice (which result would a
    verdict or a baseline take?), and NaN or infinities (written as null)."""
    out = [(where, f"{'/'.join(map(str, where))}: {json.dumps(value)} is not a finite number "
                   f"(perfsuite writes null where a value is not finite){_cell_of(where, data)}")
           for where, value in _non_finite(data)]
    first: dict[str, int] = {}
    cells = data.get("cells") if isinstance(data, dict) else None
    for i, entry in enumerate(cells if isinstance(cells, list) else []):
        cell_id = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(cell_id, str) and first.setdefault(cell_id, i) != i:
            out.append((("cells", i), f"cells/{i}: id {cell_id!r} repeats cells/{first[cell_id]}; "
                                      "a results.json holds each cell once: keep one of them"))
    return out


def validate(data: Any, path: Path | str = "results.json") -> None:
    """Raise ValueError naming ``path`` and the first problems (JSON path:
    message) when ``data`` is not a valid ``perfsuite.results/1`` document:
    its schema, and what the schema cannot say (``_beyond_schema``)."""
    problems = sorted([(tuple(e.absolute_path), _problem(e, data)) for e in _validator().iter_errors(data)]
                      + _beyond_schema(data),
                      key=lambda p: _path_key(p[0]))
    if not problems:
        return
    lines = [f"{path}: {problem}" for _, problem in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"... and {len(problems) - MAX_PROBLEMS} more problem(s)")
    lines.append(f"{path} does not match the {SCHEMA} schema ({SCHEMA_FILE}): it was edited or "
                 "written by another tool; fix the fields named above, or measure the run again "
                 "(pytest --perf-out DIR, or perfsuite run --out DIR)")
    raise ValueError("\n".join(lines))


def load(path: Path | str) -> dict[str, Any]:
    """A results.json (or a run directory holding one), checked against its
    schema (``SCHEMA_FILE``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no results file; run the suite with "
                                "--perf-out DIR first") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        kind = _JSON_TYPES.get(type(data), type(data).__name__)
        raise ValueError(f"{path}: a JSON {kind.split()[-1]}, expected an object with "
                         f"schema {SCHEMA!r}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    validate(data, path)
    return data
