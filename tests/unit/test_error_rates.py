"""`perfsuite selftest error-rates`: perfsuite ab's error rates on a runner.

From the 2-core VM's stored detection records (their unchanged sessions are
A/A sessions) the figures are derived and checked against the records
themselves; measured ones come from real A/B sessions of stood-in launches
(tests/unit/test_ab.py's FakeLaunches), in launch rounds, as the detection
benchmark's tests measure theirs."""

import json
import statistics
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.cli import main as cli
from perfsuite.report import error_rates as table
from perfsuite.report.html import render_html
from perfsuite.report.markdown import summary_markdown
from perfsuite.schemas.results import load
from perfsuite.selftest import detection
from perfsuite.selftest import error_rates as rates
from perfsuite.stats.windows import detectable_change
from tests.unit.test_ab import fake_launches

DATA = Path(__file__).resolve().parents[1] / "data"
QUIET = DATA / "cpu-2026-11-26" / "ab-detection-20.json"
NOISY = DATA / "cpu-2026-11-28" / "ab-detection-5.json"
SMOKE = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
QUIET_ROW = ["smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", "0/20", "16/20", "20/20 (5 % slower)",
             "0.81 % (0.27-3.93 %)", "2.4"]


def measured(tmp_path, sessions=2, **settings):
    return rates.measure_error_rates([SMOKE], sessions, 0.10, tmp_path,
                                     **{"mode": "launches", "tolerance": 0.05, "log": lambda line: None,
                                        **settings})


def test_the_quiet_days_record_gives_its_a_a_sessions_as_error_rates():
    """README's and ab-measured.md's figures of the 2-core VM: 20 A/A sessions."""
    record = json.loads(QUIET.read_text())
    out = rates.from_detection(record, 0.05, str(QUIET))
    unchanged = [s for s in record["sessions"] if s["condition"] == "unchanged"]
    slow5 = [s for s in record["sessions"] if s["condition"] == "slow5"]
    cell = out["cells"][SMOKE]
    assert cell["sessions"] == len(unchanged) == 20
    assert cell["false_calls"] == sum(s["verdict"] in ("regressed", "improved") for s in unchanged) == 0
    assert cell["same"] == sum(s["verdict"] == "same" for s in unchanged) == 16
    assert cell["injected"] == {"fraction": 0.05, "sessions": len(slow5), "regressed": 20}
    half_widths = sorted(detectable_change(s["ci_low"], s["ci_high"]) for s in unchanged)
    assert cell["detectable"] == pytest.approx(statistics.median(half_widths), abs=1e-6)
    assert cell["detectable_spread"] == pytest.approx([half_widths[0], half_widths[-1]], abs=1e-6)
    walls = [s["wall_s"] for s in unchanged + slow5]
    assert cell["minutes_per_verdict"] == pytest.approx(statistics.median(walls) / 60, abs=0.005)
    assert table.rows(out) == [QUIET_ROW]
    assert (out["host"]["cpu"], out["host"]["cores"], out["host"]["commit"][:7]) == ("AMD EPYC", 2, "4cb5192")
    assert out["confidence"][SMOKE] == pytest.approx(0.98333, abs=1e-5)


def test_a_recorded_detectable_change_is_its_intervals_half_width():
    """The noisy day's sessions said their detectable change: the rule the
    quiet day's figures are derived by gives the same."""
    record = json.loads(NOISY.read_text())
    for session in record["sessions"]:
        assert session["detectable"] == pytest.approx(detectable_change(session["ci_low"], session["ci_high"]),
                                                      rel=1e-9)
    cell = rates.from_detection(record)["cells"][SMOKE]
    assert (cell["sessions"], cell["false_calls"], cell["same"]) == (5, 0, 0)
    assert cell["injected"] == {"fraction": 0.05, "sessions": 5, "regressed": 5}
    assert [round(x * 100, 2) for x in cell["detectable_spread"]] == [3.25, 7.6]
    assert (round(cell["detectable"] * 100, 2), cell["minutes_per_verdict"]) == (4.06, 3.17)  # ab-measured.md


def test_a_slowdown_the_record_does_not_hold_is_refused_naming_those_it_does():
    with pytest.raises(ValueError, match=r"holds no session slowed by 0.02 \(it holds 0.05, 0.1\)"):
        rates.from_detection(json.loads(QUIET.read_text()), 0.02, str(QUIET))
    with pytest.raises(ValueError, match="neither sessions nor trials"):
        rates.from_detection({"schema": "perfsuite.ab/1"})


def test_the_detection_benchmarks_own_file_gives_the_figures_of_its_sessions(tmp_path, monkeypatch):
    """What `verdict-detection --ab` writes (ab-detection.json, trials of
    conditions) derives alike: each trial's unchanged session is an A/A one."""
    fake_launches(monkeypatch)
    detection.measure_ab_detection(trials=2, work_dir=tmp_path, mode="launches", tolerance=0.05,
                                   log=lambda line: None)
    saved = json.loads((tmp_path / "ab-detection.json").read_text())
    cell = rates.from_detection(saved, 0.10)["cells"][SMOKE]
    unchanged = [t["conditions"]["unchanged"] for t in saved["trials"]]
    assert cell["sessions"] == 2 and cell["same"] == sum(s["verdict"] == "same" for s in unchanged)
    assert cell["injected"] == {"fraction": 0.10, "sessions": 2, "regressed": 2}
    assert cell["detectable"] == pytest.approx(statistics.median(s["detectable"] for s in unchanged), abs=1e-6)


def test_error_rates_json_holds_the_schema_and_keys_a_pull_request_comment_reads(tmp_path, monkeypatch):
    fake_launches(monkeypatch)
    lines = []
    out = measured(tmp_path, log=lines.append)
    saved = json.loads((tmp_path / "error-rates.json").read_text())
    assert saved["schema"] == "perfsuite.error-rates/1" == table.SCHEMA
    assert {"cpu", "gpu", "cores", "torch", "commit"} <= set(saved["host"]) and saved["host"]["cores"]
    cell = saved["cells"][SMOKE]
    assert set(cell) == set(table.CELL_KEYS)
    assert set(cell["injected"]) == {"fraction", "sessions", "regressed"}
    assert (cell["sessions"], cell["false_calls"], cell["same"]) == (2, 0, 2)
    assert cell["injected"] == {"fraction": 0.10, "sessions": 2, "regressed": 2}
    assert 0 < cell["detectable_spread"][0] <= cell["detectable"] <= cell["detectable_spread"][1]
    assert cell["minutes_per_verdict"] >= 0
    assert table.load_error_rates(tmp_path / "error-rates.json") == saved
    assert out["file"] == str(tmp_path / "error-rates.json") and len(lines) == 4
    sessions = tmp_path / SMOKE.replace("/", "-")
    slowed = json.loads((sessions / "injected1" / "ab.json").read_text())
    assert slowed["settings"]["sides"]["B"]["workload_options"] == {"fault": "slow:*:0:0.1"}
    assert json.loads((sessions / "aa1" / "ab.json").read_text())["settings"]["sides"]["B"]["workload_options"] == {}


def test_resume_goes_on_from_the_sessions_a_stopped_run_left(tmp_path, monkeypatch):
    fake_launches(monkeypatch)
    real, started = rates.run_ab_session, []

    def stopped_at_the_third(cell, folder, *args, **kwargs):
        started.append(folder.name)
        if len(started) == 3:
            raise KeyboardInterrupt
        return real(cell, folder, *args, **kwargs)

    monkeypatch.setattr(rates, "run_ab_session", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        measured(tmp_path)
    path = tmp_path / "error-rates.json"
    first, first_host = (json.loads(path.read_text())[k] for k in ("per_session", "host"))
    assert [(s["kind"], s["index"]) for s in first] == [("aa", 0), ("injected", 0)]
    with pytest.raises(ValueError, match="already holds 2 session"):
        measured(tmp_path)
    with pytest.raises(ValueError, match="tolerance: 0.05 there, 0.1 now"):
        measured(tmp_path, tolerance=0.1, resume=True)

    started.clear()
    out = measured(tmp_path, resume=True)
    assert started == ["injected1", "aa1"]  # only the sessions not done, the order alternating
    assert out["per_session"][:2] == first
    assert [(s["kind"], s["index"]) for s in out["per_session"]][2:] == [("injected", 1), ("aa", 1)]
    assert out["cells"][SMOKE]["sessions"] == 2 == out["cells"][SMOKE]["injected"]["sessions"]
    assert json.loads(path.read_text())["per_session"] == out["per_session"]

    older = json.loads(path.read_text())  # measured before ab looked only where the orders weigh alike
    del older["settings"]["looks"]
    path.write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"looks: None there, \[2, 4\] now"):
        measured(tmp_path, resume=True)
    older["settings"]["looks"] = [2, 4]
    path.write_text(json.dumps(older))

    moved = json.loads(path.read_text())
    moved["host"]["cpu"] = "another CPU"
    path.write_text(json.dumps(moved))
    with pytest.raises(ValueError, match="measured on another machine"):
        measured(tmp_path, sessions=3, resume=True)
    moved["host"]["cpu"] = first_host["cpu"]
    moved["host"]["commit"] = "0" * 40  # the sessions so far, by another version of perfsuite
    path.write_text(json.dumps(moved))
    with pytest.raises(ValueError, match="by perfsuite at commit 0000000 there, .* here: one rate is one version's"):
        measured(tmp_path, sessions=3, resume=True)


def test_fewer_injected_sessions_alternate_while_they_last_and_a_resume_may_ask_for_them(tmp_path, monkeypatch):
    fake_launches(monkeypatch)
    real, started = rates.run_ab_session, []

    def counted(cell, folder, *args, **kwargs):
        started.append(folder.name)
        return real(cell, folder, *args, **kwargs)

    monkeypatch.setattr(rates, "run_ab_session", counted)
    lines = []
    out = measured(tmp_path, sessions=3, injected=1, log=lines.append)
    assert started == ["aa0", "injected0", "aa1", "aa2"]
    assert out["cells"][SMOKE]["sessions"] == 3 and out["cells"][SMOKE]["injected"]["sessions"] == 1
    assert out["planned"] == {SMOKE: {"aa": 3, "injected": 1}}
    assert lines[1].startswith(f"{SMOKE} 10% slower session 1/1 -> ") and f"{SMOKE} A/A session 3/3 -> " in lines[3]
    assert rates.figure_lines(out)[1] == f"{SMOKE}: 3 A/A sessions"
    started.clear()
    out = measured(tmp_path, sessions=3, injected=2, resume=True)  # the counts are no setting: more may follow
    assert started == ["injected1"] and out["cells"][SMOKE]["injected"]["sessions"] == 2
    with pytest.raises(ValueError, match="--injected -1: give 0 or more"):
        measured(tmp_path / "other", injected=-1)


def test_a_session_stopped_by_ctrl_c_is_no_session_counted(tmp_path, monkeypatch):
    """ab ends a Ctrl-C'd session in order (ab.json says interrupted); the
    benchmarks' session raises it on, rather than count its verdict."""
    fake_launches(monkeypatch, stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        detection.run_ab_session(cells.get(SMOKE), tmp_path, None, mode="launches")
    assert json.loads((tmp_path / "ab.json").read_text())["interrupted"] is True


def test_a_fault_the_cell_cannot_take_is_refused_before_any_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("perfsuite.ab.session.run_cell", lambda *a, **kw: pytest.fail("launched"))
    code = cli.main(["selftest", "error-rates", "--cell", SMOKE, "--fault-kind", "gpu-sleep", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "needs a CUDA cell" in err and "Traceback" not in err
    assert not (tmp_path / "error-rates.json").exists()


def test_the_command_prints_and_writes_the_figures_of_a_stored_record(tmp_path, capsys):
    assert cli.main(["selftest", "error-rates", "--from-detection", str(QUIET), "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    words = said[said.index("perfsuite ab's error rates on"):]  # after the JSON
    figures = dict(line.split(":", 1) for line in words.splitlines() if line.startswith("  "))
    assert {label.strip(): value.strip() for label, value in figures.items()} == {
        "false calls (A/A called regressed or improved)": "0/20 (so the rate is below 13.9% at 95% confidence)",
        "A/A called same": "16/20",
        "5% slower B called regressed": "20/20",
        "smallest detectable change at 98.3% confidence": "0.81% (median; 0.27%-3.93%)",
        "minutes per verdict (median session)": "2.4"}
    assert "perfsuite ab's error rates on AMD EPYC, 2 cores, torch 2.14.0+cu130, judged at ±2%" in said
    loaded = table.load_error_rates(tmp_path / "error-rates.json")
    assert loaded["cells"][SMOKE]["same"] == 16 and loaded["settings"]["from_detection"] == str(QUIET)


@pytest.mark.parametrize(("false_calls", "n", "bound"), [(0, 40, "7.2%"), (1, 40, "11.3%"), (2, 40, "14.9%"),
                                                          (0, 10, "25.9%")])
def test_the_false_call_rates_bound_is_clopper_pearsons_one_sided_upper_limit(false_calls, n, bound):
    """With none in n the bound is 1 - 0.05^(1/n) (7.2 % after 40, as the explanation page derives)."""
    assert rates.false_call_bound(false_calls, n) == pytest.approx(float(bound[:-1]) / 100, abs=5e-4)


def test_the_report_and_the_job_summary_show_the_error_rates_table(tmp_path):
    path = tmp_path / "error-rates.json"
    path.write_text(json.dumps(rates.from_detection(json.loads(QUIET.read_text()), source=str(QUIET))))
    loaded = table.load_error_rates(path)
    run = load(DATA / "h100-2026-11-25" / "gate-image-g1.results.json")
    summary = summary_markdown(run, "gate", error_rates=loaded)
    assert f"### {table.TITLE}" in summary and "| " + " | ".join(QUIET_ROW) + " |" in summary
    assert "AMD EPYC, 2 cores" in summary
    assert table.TITLE not in summary_markdown(run, "gate")
    page = render_html(run, figures=[], error_rates=loaded)
    assert 'id="error-rates"' in page and all(f">{value}</td>" in page for value in QUIET_ROW)
    assert 'id="error-rates"' not in render_html(run, figures=[])


def test_a_file_that_is_no_error_rates_file_is_said_so(tmp_path):
    path = tmp_path / "error-rates.json"
    path.write_text(json.dumps({"schema": "perfsuite.ab/1", "cells": []}))
    with pytest.raises(ValueError, match="not an error-rates file .*selftest error-rates"):
        table.load_error_rates(path)
    path.write_text(json.dumps({"schema": table.SCHEMA, "cells": {SMOKE: {"sessions": 3}}}))
    with pytest.raises(ValueError, match=f"cell {SMOKE} lacks false_calls, same"):
        table.load_error_rates(path)
    with pytest.raises(ValueError, match="cannot read it"):
        table.load_error_rates(tmp_path / "none.json")


def test_a_resident_sessions_record_keeps_what_its_verdict_weighed_and_is_judged_again_by_its_looks(
        tmp_path, monkeypatch):
    """Each session in error-rates.json keeps its launch pairs' lead and ABBA
    quad log-ratios: judged again by the looks its settings name, each gives
    the verdict and interval it was given (as the stored records are)."""
    import math

    import numpy as np

    from perfsuite.ab.resident import PairRun
    from perfsuite.ab.verdicts import DECIDED, pair_look_confidence
    from tests.unit.conftest import CPU_ENV, judge_at_looks

    rng = np.random.default_rng(5)

    def fake_pair(cell, opts, dirs, *, quads, window_steps, first, **kwargs):
        slow = 1.0 + float(opts["B"].options.get("fault", "slow:*:0:0").split(":")[3])
        windows = [{"side": side, "value": 0.1 * (slow if side == "B" else 1.0) * math.exp(rng.normal(0, 0.03)),
                    "steps": [], "settling": quad == 0} for quad in range(quads + 1) for side in "ABBA"]
        ok = {"id": cell.id, "params": cell.params(), "env": CPU_ENV, "checks": [], "ranks": [],
              "status": "ok", "reason": None, "duration_s": 1.0,
              "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1] * 5}}}
        return PairRun({side: {**ok, "dir": str(dirs[side])} for side in "AB"}, windows, 0.5)

    monkeypatch.setattr("perfsuite.ab.session.run_pair", fake_pair)
    out = measured(tmp_path, sessions=3, mode="resident", tolerance=0.02)
    settings = out["settings"]
    assert settings["looks"] == [2, 4]
    for session in out["per_session"]:
        quads = [p["quad_log_ratios"] for p in session["pair_quads"]]
        assert len(quads) == session["pairs"] and all(len(q) == 16 for q in quads)
        # the windows' serial diagnostic, as ab.json keeps it: independent windows, near 0 both ways
        # (over two pairs of 16 quads each scatters by about 0.12)
        serial = session["serial"]
        assert serial["adjacent"] == session["pairs"] * (4 * 16 - 1)
        assert abs(serial["same_side"]) < 0.5 and abs(serial["across_sides"]) < 0.5, (session["kind"], serial)
        resident = {"max_pairs": 4, "looks": settings["looks"], "look_confidence": session["confidence"],
                    "within": settings["within"]}
        assert session["confidence"] == pytest.approx(pair_look_confidence(4))
        looks = judge_at_looks(quads, [p["first"] for p in session["pair_quads"]], settings["tolerance"], resident)
        assert all(look.verdict not in DECIDED for look in looks[:-1])
        assert looks[-1].verdict == session["verdict"]
        assert (looks[-1].ci_low, looks[-1].ci_high) == pytest.approx((session["ci_low"], session["ci_high"]))
    assert any(s["verdict"] == "regressed" for s in out["per_session"] if s["kind"] == "injected")
