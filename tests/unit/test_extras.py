"""perfsuite's extras (llm, postgres): pyproject.toml and perfsuite.extras name
the same packages, and wherever one is missing (an LLM cell, a postgresql://
history, ``perfsuite doctor``) the user reads one sentence naming it, never a
traceback. A missing module is played by ``sys.modules[name] = None``, which
both ``import`` and ``importlib.util.find_spec`` then take for absent."""

import importlib
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from perfsuite import cells, extras
from perfsuite.cli import main as cli
from perfsuite.doctor import checks as doctor
from perfsuite.doctor import facts as doctor_facts
from perfsuite.history.schema import resolve_url
from perfsuite.history.store import History, HistoryError
from perfsuite.launch import launch

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]


def hide(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


# -- pyproject.toml and perfsuite.extras agree ------------------------------------

def test_every_extra_of_pyproject_is_named_with_the_packages_it_installs():
    optional = {name: [Requirement(r) for r in reqs] for name, reqs in PYPROJECT["optional-dependencies"].items()}
    assert set(optional) - {"test"} == set(extras.EXTRAS)
    for name, extra in extras.EXTRAS.items():
        # each module perfsuite looks for is a distribution of the same name, listed in the extra
        assert set(extra.modules) == {r.name for r in optional[name]}, name


def test_the_test_extra_brings_every_other_extra():
    (own,) = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["test"] if Requirement(r).name == "perfsuite"]
    assert own.extras == set(extras.EXTRAS)


def test_the_plain_install_pins_nothing_exactly_and_brings_no_extra():
    required = [Requirement(r) for r in PYPROJECT["dependencies"]]
    names = {r.name for r in required}
    optional = {Requirement(r).name for name, reqs in PYPROJECT["optional-dependencies"].items() for r in reqs
                if name != "test"}
    assert not names & optional
    assert "apache-otava" not in names  # it pins numpy==2.2.0: change points are perfsuite.history.edivisive
    assert not [str(r) for r in required if any(s.operator in ("==", "===") for s in r.specifier)]


# -- the sentence ---------------------------------------------------------------------

@pytest.mark.parametrize("extra", sorted(extras.EXTRAS))
def test_the_sentence_names_the_extra_its_install_line_and_what_is_missing(extra):
    first, *more = extras.EXTRAS[extra].modules
    text = extras.message(extra, [first])
    assert text.startswith(extras.EXTRAS[extra].needs + f" perfsuite's {extra} extra: ")
    assert f"pip install 'perfsuite[{extra}]'" in text and f"({first} is not installed)" in text
    if more:
        assert f"({first}, {more[0]} are not installed)" in extras.message(extra, [first, more[0]])


def test_require_raises_an_import_error_naming_what_is_missing(monkeypatch):
    extras.require("llm")  # the test extra installs it
    hide(monkeypatch, "torchao", "regex")
    assert extras.missing("llm") == ["torchao", "regex"]
    with pytest.raises(ImportError) as raised:
        extras.require("llm")
    assert isinstance(raised.value, extras.MissingExtra)
    assert raised.value.extra == "llm" and raised.value.missing == ["torchao", "regex"]
    assert str(raised.value) == extras.message("llm", ["torchao", "regex"])
    assert extras.workload_problem("llm") == str(raised.value)
    assert extras.workload_problem("image") is None


# -- LLM cells without the llm extra ----------------------------------------------------

def test_the_llm_workload_module_raises_the_sentence_not_torchtunes_import_error(monkeypatch):
    hide(monkeypatch, "torchtune")
    monkeypatch.delitem(sys.modules, "perfsuite.workloads.llm", raising=False)
    with pytest.raises(extras.MissingExtra, match=r"the LLM cells need perfsuite's llm extra"):
        importlib.import_module("perfsuite.workloads.llm")


def test_an_llm_cell_without_the_extra_is_an_error_that_launches_nothing(monkeypatch, tmp_path):
    hide(monkeypatch, "torchtune", "omegaconf")
    cell = cells.select(tier="smoke", workload="llm")[0]
    result = launch.run_cell(cell, tmp_path)
    sentence = extras.message("llm", ["torchtune", "omegaconf"])
    assert result["status"] == "error" and result["reason"] == sentence
    assert result["ranks"] == [] and result["metrics"] == {}  # no rank ran
    assert (Path(result["dir"]) / "output.log").read_text().strip() == sentence


def test_perfsuite_run_of_an_llm_cell_without_the_extra_fails_with_one_sentence(monkeypatch, tmp_path, capsys):
    hide(monkeypatch, "torchtune")
    cell = cells.select(tier="smoke", workload="llm")[0]
    code = cli.main(["run", cell.id, "--out", str(tmp_path / "run"), "--history", "off", "--no-probe"])
    out = capsys.readouterr()
    assert code == 1
    assert f"{cell.id}  ERROR  {extras.message('llm', ['torchtune'])}" in out.out
    assert "Traceback" not in out.out + out.err


def test_listing_cells_and_image_cells_do_not_need_the_llm_extra(monkeypatch, capsys):
    hide(monkeypatch, "torchtune", "torchao", "omegaconf", "regex")
    assert cli.main(["list", "--tier", "smoke"]) == 0
    listed = capsys.readouterr().out.split()
    assert {c.id for c in cells.select(tier="smoke")} == set(listed)
    assert all(extras.workload_problem(c.workload) is None for c in cells.select(tier="smoke", workload="image"))


# -- a PostgreSQL history without the postgres extra -------------------------------------

URL = "postgresql://perf:secret@db.example/perf"


def test_a_postgresql_url_without_a_driver_names_the_postgres_extra(monkeypatch):
    hide(monkeypatch, "psycopg", "psycopg2")
    with pytest.raises(HistoryError) as raised:
        History(URL)
    text = str(raised.value)
    assert extras.message("postgres", ["psycopg"]) in text
    assert "secret" not in text  # the password stays hidden


def test_psycopg_serves_a_postgresql_url_where_psycopg2_is_absent(monkeypatch):
    hide(monkeypatch, "psycopg2")
    assert resolve_url(URL) == URL.replace("postgresql://", "postgresql+psycopg://")  # the test extra has psycopg
    hide(monkeypatch, "psycopg")
    with pytest.raises(HistoryError, match=r"perfsuite\[postgres\]"):
        resolve_url("postgresql+psycopg://perf@db.example/perf")


def test_history_changes_on_such_a_url_is_one_line(monkeypatch, capsys):
    hide(monkeypatch, "psycopg", "psycopg2")
    code = cli.main(["history", "changes", "--url", URL])
    out = capsys.readouterr()
    assert code != 0
    assert extras.message("postgres", ["psycopg"]) in out.err + out.out
    assert "Traceback" not in out.err + out.out


# -- perfsuite doctor ---------------------------------------------------------------------

def _played(monkeypatch, missing):
    monkeypatch.setattr(doctor_facts, "extras_missing", lambda: {n: missing.get(n, []) for n in extras.EXTRAS})


def test_doctor_warns_that_the_tiers_llm_cells_will_fail_without_the_extra(monkeypatch):
    _played(monkeypatch, {"llm": ["torchtune"]})
    tier_cells = cells.select(tier="smoke")
    check = doctor.check_extras("smoke", tier_cells, None)
    llm_cells = sum(c.workload == "llm" for c in tier_cells)
    assert check.status == doctor.WARN and llm_cells
    assert check.message.startswith(f"{llm_cells} LLM cell(s) of the smoke tier will fail (torchtune not installed)")
    assert extras.message("llm") in check.fix
    image_only = [c for c in tier_cells if c.workload == "image"]
    assert doctor.check_extras("smoke", image_only, None).status == doctor.OK


def test_doctor_says_which_extras_are_installed(monkeypatch):
    _played(monkeypatch, {})
    check = doctor.check_extras("smoke", cells.select(tier="smoke"), None)
    assert check.status == doctor.OK and check.message == f"{', '.join(extras.EXTRAS)} installed"
    _played(monkeypatch, {"postgres": ["psycopg"]})
    check = doctor.check_extras("smoke", cells.select(tier="smoke"), "/tmp/history.sqlite")
    assert check.status == doctor.OK
    assert f"postgres not installed ({extras.EXTRAS['postgres'].needs} it)" in check.message


def test_doctor_warns_of_a_postgresql_history_it_cannot_reach(monkeypatch):
    _played(monkeypatch, {"postgres": ["psycopg"]})
    hide(monkeypatch, "psycopg", "psycopg2")
    check = doctor.check_extras("smoke", cells.select(tier="smoke"), URL)
    assert check.status == doctor.WARN and "secret" not in check.message
    assert "runs cannot be added to $PERFSUITE_HISTORY" in check.message
    assert extras.message("postgres") in check.fix


# -- work counters do not hang on the llm extra for the cells that do not use it ------------

def test_image_counters_match_without_torchtune_and_llm_counters_still_need_it():
    from perfsuite.judge.baselines import load_all
    from perfsuite.judge.lookup import find_counters

    sets = load_all()
    recorded = {c.cell: c for s in sets for c in s.counters if "torchtune" in c.versions}
    image = next(c for cell_id, c in recorded.items() if "/image/" in cell_id and cell_id in cells.matrix())
    llm = next(c for cell_id, c in recorded.items() if "/llm/" in cell_id and cell_id in cells.matrix())
    for entry, should_match in ((image, True), (llm, False)):
        params = cells.get(entry.cell).params()
        without_llm_extra = {k: v for k, v in entry.versions.items() if k not in ("torchtune", "torchao")}
        found, why = find_counters(params, without_llm_extra, sets)
        assert (found is not None) is should_match, (entry.cell, why)
        assert find_counters(params, dict(entry.versions), sets)[0] is not None  # the recorded stack itself
