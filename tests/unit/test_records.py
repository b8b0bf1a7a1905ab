"""The typed records (perfsuite.schemas.records) say what the files hold:
every key the JSON Schema names, every key stored runs and A/B sessions
hold, every field of a verdict; and the functions that hand records across
packages are annotated with them."""

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from perfsuite.schemas import records
from perfsuite.schemas.results import SCHEMA_FILE, STATUSES

DATA = Path(__file__).resolve().parents[1] / "data"
SCHEMA = json.loads(SCHEMA_FILE.read_text())


def keys(record: type) -> set[str]:
    return set(typing.get_type_hints(record))


def stored_runs() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(DATA.rglob("*.results.json"))]


def stored_ab_sessions() -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(DATA.rglob("ab*.json"))]
    return [s for s in found if s.get("schema", "").startswith("perfsuite.ab")]


def test_a_cell_result_names_every_key_of_the_schema_and_of_stored_runs():
    cell = SCHEMA["$defs"]["cell"]
    assert set(cell["properties"]) <= keys(records.CellResult)
    assert set(cell["required"]) <= keys(records.CellResult)
    runs = stored_runs()
    assert runs
    for run in runs:
        for result in run["cells"]:
            assert set(result) <= keys(records.CellResult), result["id"]
            for metric in result.get("metrics", {}).values():
                assert set(metric) <= keys(records.Metric), result["id"]
            assert set(result.get("counters") or {}) <= keys(records.Counters)
            for check in result.get("checks", []):
                assert set(check) <= keys(records.CheckRecord), check["name"]


def test_the_statuses_are_the_schemas():
    assert typing.get_args(records.Status) == STATUSES == tuple(SCHEMA["$defs"]["cell"]["properties"]["status"]["enum"])


def test_a_check_record_holds_every_field_of_a_verdict():
    from perfsuite.judge.checks import Verdict

    assert {f.name for f in dataclasses.fields(Verdict)} <= keys(records.CheckRecord)
    assert set(SCHEMA["$defs"]["checks"]["items"]["properties"]) <= keys(records.CheckRecord)


def test_an_ab_session_names_what_stored_sessions_hold():
    sessions = stored_ab_sessions()
    assert sessions
    for session in sessions:
        assert set(session) <= keys(records.ABRecord)
        for cell in session["cells"]:
            assert set(cell) <= keys(records.ABCellRecord), cell["id"]


def test_a_rank_record_names_what_the_worker_writes():
    import ast
    import inspect

    from perfsuite.rank import worker

    tree = ast.parse(inspect.getsource(worker))
    written = {node.slice.value for node in ast.walk(tree)
               if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
               and node.value.id == "record" and isinstance(node.slice, ast.Constant)}
    literal = {key.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
               and getattr(node.target, "id", None) == "record" and isinstance(node.value, ast.Dict)
               for key in node.value.keys if isinstance(key, ast.Constant)}
    assert written and literal and (written | literal) <= keys(records.RankRecord)


@pytest.mark.parametrize("where,name,returns", [
    ("perfsuite.results", "aggregate", "CellResult"),
    ("perfsuite.results", "merge_repeats", "CellResult"),
    ("perfsuite.results", "skipped_result", "CellResult"),
    ("perfsuite.launch.launch", "run_cell", "CellResult"),
    ("perfsuite.judge.judging", "judge", "list[CheckRecord]"),
])
def test_the_functions_that_hand_records_on_are_annotated_with_them(where, name, returns):
    import importlib

    function = getattr(importlib.import_module(where), name)
    assert function.__annotations__["return"] == returns, f"{where}.{name}"
