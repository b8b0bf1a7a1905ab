"""perfsuite ab's attribution: a cell regressed or improved gets one short
profiled launch a side after its judged launches, and the diff of the two
profiles in ab.json, the terminal and ab.html.

Launches are stood in for by test_ab's fake ``run_cell``; its profiled
launches (``profiler == "torch"``) return the stored torch.profiler
summaries of tests/fixtures/profiles/: side A's unchanged, side B's (a side
slowed by FAKE_SLOW) with a spin in the first Conv2d's forward."""

import json
import math
import re
import statistics
import sys

import numpy as np
import pytest

from perfsuite.ab import attributing
from perfsuite.ab import session as ab
from perfsuite.cli import ab as cli_ab
from perfsuite.cli import main as cli
from perfsuite.profiling.attribution import Attribution, attribute, markdown_attribution
from perfsuite.profiling.fallback import profile_only
from tests.unit.cellkit import tiny_image_cell
from tests.unit.test_ab import CPU_ENV, SMOKE_CELL, FakeLaunches, saved
from tests.unit.test_attribution import stored

CONV = "features.0.0 (Conv2d) forward"


class ProfilingLaunches(FakeLaunches):
    """FakeLaunches whose profiled launches return a stored profile summary;
    ``profile_fails``: side B's profiled launch ends in an error instead."""

    def __init__(self, profile_fails=None, **kwargs):
        super().__init__(**kwargs)
        self.profile_fails, self.cells = profile_fails, []

    def __call__(self, cell, out_dir, opts=None):
        self.cells.append(cell)
        result = super().__call__(cell, out_dir, opts)
        if opts is None or opts.profiler != "torch":
            return result
        slowed = float(opts.env.get("FAKE_SLOW", 0)) > 0
        if slowed and self.profile_fails == "error":
            return {**result, "status": "error", "reason": "rank 1 failed: RuntimeError: profiler crashed"}
        if slowed and self.profile_fails == "raise":
            raise RuntimeError("the profiled launch could not start")
        if slowed and self.profile_fails == "empty":
            return {**result, "profiler": {"mode": "torch", "error": "no trace was written"}}
        return {**result, "profile": stored("mobilenet-cpu-conv-spin" if slowed else "mobilenet-cpu-a")}

    @property
    def profiled(self):
        return [i for i, opts in enumerate(self.opts) if opts.profiler == "torch"]


def launches(monkeypatch, **kwargs):
    fake = ProfilingLaunches(**kwargs)
    monkeypatch.setattr("perfsuite.ab.session.run_cell", fake)
    return fake


def run(tmp_path, slow=None, lines=None, **settings):
    side_b = ab.Side("B", sys.executable, {"FAKE_SLOW": slow} if slow else {})
    settings.setdefault("mode", "launches")
    log = lines.append if lines is not None else (lambda line: None)
    code = ab.ABSession([tiny_image_cell(world_size=1)], ab.Side("A", sys.executable), side_b, tmp_path,
                        log=log, **settings).run()
    return code, saved(tmp_path)["cells"][0]


def test_a_regressed_cell_is_attributed_from_one_profiled_launch_a_side_after_the_judged_ones(tmp_path, monkeypatch):
    fake = launches(monkeypatch, launch_sigma=0.02)
    code, record = run(tmp_path, slow="0.1", attribute="changed")
    assert record["verdict"] == "regressed" and code == ab.EXIT_REGRESSED
    judged = len(record["launches"])
    assert fake.profiled == [judged, judged + 1] and len(fake.calls) == judged + 2  # last, A then B
    assert all(opts.profiler is None for opts in fake.opts[:judged])  # no judged launch under the profiler
    assert [out_dir for _, out_dir, _, _ in fake.calls[judged:]] == [
        tmp_path / "launches" / "a" / "profiled", tmp_path / "launches" / "b" / "profiled"]
    # the cell's warm-up, then the profiled steps; no counting window, no evaluation
    assert fake.cells[-2:] == [profile_only(tiny_image_cell(world_size=1), {})[0]] * 2
    assert fake.opts[-1].options["count_steps"] == "0"
    found = record["attribution"]
    assert found["top"][0]["name"] == CONV and found["top"][0]["delta_s"] > found["noise_s"] > 0
    a_values = [x["value"] for x in record["launches"] if x["side"] == "A"]
    assert found["change_s"] == pytest.approx((record["ratio"] - 1) * statistics.median(a_values))
    profiled = found["profiled"]
    assert profiled["how"] == "launch" and profiled["steps"] == 10
    assert 0 <= profiled["wall_s"] <= profiled["cell_wall_s"]
    assert saved(tmp_path)["attribution_wall_s"] == pytest.approx(profiled["wall_s"], abs=1e-3)
    assert saved(tmp_path)["settings"]["attribute"] == "changed"


@pytest.mark.parametrize(("when", "slow", "attributed"), [
    ("changed", None, False), ("always", None, True), ("never", "0.1", False), ("changed", "0.1", True)])
def test_a_same_cell_gets_no_attribution_unless_always_and_never_turns_it_off(tmp_path, monkeypatch, when, slow,
                                                                             attributed):
    fake = launches(monkeypatch, launch_sigma=0.02 if slow else 0.01)
    _, record = run(tmp_path, slow=slow, attribute=when)
    assert record["verdict"] == ("regressed" if slow else "same")
    assert ("attribution" in record) == attributed and len(fake.profiled) == 2 * attributed
    if attributed and not slow:  # the same profile on both sides: nothing above the noise
        assert record["attribution"]["top"] == []
        assert "attribution_wall_s" in saved(tmp_path)
    if not attributed:
        assert "attribution_wall_s" not in saved(tmp_path)


def test_a_session_made_in_code_attributes_nothing_unless_asked():
    """bisect and the selftests build sessions without --attribute: none of their launches is added."""
    session = ab.ABSession([], ab.Side("A", sys.executable), ab.Side("B", sys.executable), "/nonexistent")
    assert session.attribute == "never"
    with pytest.raises(ab.ABError, match="--attribute sometimes: use one of changed, always, never"):
        ab.ABSession([], ab.Side("A", sys.executable), ab.Side("B", sys.executable), "/x", attribute="sometimes")
    assert cli_ab.ATTRIBUTE_WHEN == attributing.ATTRIBUTE_WHEN


@pytest.mark.parametrize(("fails", "said"), [
    ("error", "side B's profiled launch ended error: rank 1 failed: RuntimeError: profiler crashed"),
    ("raise", "the profiled launch could not start"),
    ("empty", "side B's profiled launch left no profile summary (no trace was written); its folder: "),
])
def test_a_failing_profile_keeps_the_verdict_and_says_why(tmp_path, monkeypatch, fails, said):
    launches(monkeypatch, launch_sigma=0.02, profile_fails=fails)
    lines = []
    code, record = run(tmp_path, slow="0.1", lines=lines, attribute="changed")
    assert record["verdict"] == "regressed" and code == ab.EXIT_REGRESSED and record["ratio"] > 1
    assert record["attribution"]["error"].startswith(said)
    assert set(record["attribution"]) == {"error", "profiled"} and record["attribution"]["profiled"]["steps"] is None
    assert any(line.startswith("  attribution: not made, the verdict stands: " + said) for line in lines)
    assert not saved(tmp_path)["interrupted"]
    page = (tmp_path / "ab.html").read_text()
    assert "attribution: not made (" in page and not (tmp_path / "ab-attribution.png").exists()


def test_ab_json_keeps_the_attribution_as_the_diff_writes_it_and_it_reads_back(tmp_path, monkeypatch):
    launches(monkeypatch, launch_sigma=0.02)
    _, record = run(tmp_path, slow="0.1", attribute="changed")
    found = dict(record["attribution"])
    assert set(found.pop("profiled")) == {"how", "steps", "wall_s", "cell_wall_s", "dirs"}
    expected = attribute(stored("mobilenet-cpu-a"), stored("mobilenet-cpu-conv-spin"), change_s=found["change_s"])
    assert found == json.loads(json.dumps(expected.to_dict()))
    again = Attribution.from_dict(record["attribution"])  # ab.json's extra keys are left aside
    assert again.to_dict() == found
    assert f"| module | `{CONV}` |" in markdown_attribution(again)


def test_an_attribution_round_trips_through_its_dict():
    diff = attribute(stored("mobilenet-cpu-a"), stored("mobilenet-cpu-conv-spin"), change_s=0.004)
    again = Attribution.from_dict(json.loads(json.dumps(diff.to_dict())))
    assert again == diff and again.top == diff.top and again.explained == diff.explained
    assert again.steps == (10, 10) and isinstance(again.steps, tuple)
    nothing = attribute(stored("mobilenet-cpu-a"), stored("mobilenet-cpu-a"))
    assert Attribution.from_dict(nothing.to_dict()).to_dict() == nothing.to_dict()


def test_the_terminal_prints_the_top_three_rows_after_the_verdict_line_and_the_added_time(tmp_path, monkeypatch,
                                                                                         capsys):
    launches(monkeypatch, launch_sigma=0.02)
    monkeypatch.setattr("perfsuite.ab.session.check_interpreter", lambda side: None)
    code = cli.main(["ab", SMOKE_CELL, "--b-env", "FAKE_SLOW=0.1", "--max-launches", "4", "--out", str(tmp_path),
                     "--mode", "launches"])
    out = capsys.readouterr().out.splitlines()
    assert code == ab.EXIT_REGRESSED
    verdict = next(i for i, line in enumerate(out) if line.startswith(f"{SMOKE_CELL}  REGRESSED"))
    told = out[verdict + 1:]
    assert told[0].startswith("  attribution: each side profiled in a short launch under torch.profiler")
    assert told[1].startswith("    measured change +") and "noise" in told[1]
    top = saved(tmp_path)["cells"][0]["attribution"]["top"]
    rows = told[2:2 + min(3, len(top))]  # the stored spin explains the change alone: one row above the noise
    assert rows and all(re.match(r"^      +[+-]\d+\.\d\d ms +\d+ %  \w+ ", line) for line in rows), rows
    assert CONV in rows[0] and "module" in rows[0]
    after = told[2 + len(rows):]
    assert after[0].startswith("    explained: module ")
    assert re.match(r"^    profiling added \d+\.\d s \(\d+ % of this cell's \d+ s\)$", after[1]), after[1]
    assert any(re.match(r"^attribution: profiling added \d+\.\d s, \d+ % of the session's \d+ s$", line)
               for line in after[2:])


def test_ab_json_summary_carries_the_top_rows(tmp_path, monkeypatch, capsys):
    launches(monkeypatch, launch_sigma=0.02)
    monkeypatch.setattr("perfsuite.ab.session.check_interpreter", lambda side: None)
    cli.main(["ab", SMOKE_CELL, "--b-env", "FAKE_SLOW=0.1", "--out", str(tmp_path), "--json", "--mode", "launches"])
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    stored_top = saved(tmp_path)["cells"][0]["attribution"]["top"]
    assert cell["attribution"]["top"] == stored_top[:3] and cell["attribution"]["top"][0]["name"] == CONV
    assert cell["attribution"]["profiled"]["how"] == "launch"


def test_ab_html_has_the_attribution_table_and_its_chart(tmp_path, monkeypatch):
    launches(monkeypatch, launch_sigma=0.02)
    run(tmp_path, slow="0.1", attribute="changed")
    page = (tmp_path / "ab.html").read_text()
    table = page[page.index('<table class="attribution">'):]
    table = table[:table.index("</table>")]
    assert f"<td>module</td><td><code>{CONV}</code></td>" in table
    assert table.count("<tr>") == 1 + min(10, len(saved(tmp_path)["cells"][0]["attribution"]["top"]))
    assert "Where the step time went: measured change +" in page and "explained per level: module" in page
    assert 'src="ab-attribution.png"' in page
    assert (tmp_path / "ab-attribution.png").read_bytes()[:4] == b"\x89PNG"


def test_the_chart_draws_both_signs_largest_first():
    from perfsuite.report import ab as report

    row = {"level": "module", "status": "changed", "a_s": 0.01, "b_s": 0.02, "a_calls": 1, "b_calls": 1,
           "share": 1.0, "noise_s": 0.0}
    found = {"change_s": 0.01, "explained": 0.9, "a_step_s": 0.1, "b_step_s": 0.11, "noise_s": 0.001,
             "levels": {}, "top": [{**row, "name": "slower", "delta_s": 0.01},
                                   {**row, "name": "faster", "delta_s": -0.004, "status": "vanished"}]}
    data = {"cells": [{"id": "c", "verdict": "regressed", "attribution": found}]}
    assert report.attribution_figure_png(data)[:4] == b"\x89PNG"
    assert report.attribution_figure_png({"cells": [{"id": "c", "attribution": {"error": "x"}}]}) is None
    assert report._row_label(found["top"][1]) == "module: faster (vanished)"


def test_a_resident_cell_is_profiled_by_a_short_launch_a_side_after_its_pairs(tmp_path, monkeypatch):
    from perfsuite.ab.resident import PairRun

    order, rng = [], np.random.default_rng(3)
    fake = launches(monkeypatch)

    def fake_pair(cell, opts, dirs, *, quads, window_steps, first, **kwargs):
        order.append("pair")
        windows = [{"side": side, "value": 0.1 * (1.1 if side == "B" else 1.0) * math.exp(rng.normal(0, 0.004)),
                    "steps": [], "settling": quad == 0} for quad in range(quads + 1) for side in "ABBA"]
        ok = {"id": cell.id, "params": cell.params(), "env": CPU_ENV, "checks": [], "ranks": [], "status": "ok",
              "reason": None, "duration_s": 1.0, "metrics": {"step_time": {"value": 0.1, "unit": "s",
                                                                            "samples": [0.1] * 5}}}
        return PairRun({side: {**ok, "dir": str(dirs[side])} for side in "AB"}, windows, 0.5)

    monkeypatch.setattr("perfsuite.ab.session.run_pair", fake_pair)
    code, record = run(tmp_path, slow="0.1", mode="resident", attribute="changed")
    assert record["mode"] == "resident" and record["verdict"] == "regressed" and code == ab.EXIT_REGRESSED
    assert len(order) == len(record["pairs"]) and len(fake.calls) == 2 == len(fake.profiled)
    assert record["attribution"]["profiled"]["how"] == "launch" and record["attribution"]["top"][0]["name"] == CONV
    a_windows = [w["value"] for p in record["pairs"] for w in p["windows"] if w["side"] == "A" and not w["settling"]]
    assert record["attribution"]["change_s"] == pytest.approx((record["ratio"] - 1) * statistics.median(a_windows))
    assert math.isclose(record["ratio"], 1.1, rel_tol=0.01)


def test_resident_mode_with_a_profiler_is_still_refused(tmp_path, capsys):
    code = cli.main(["ab", SMOKE_CELL, "--mode", "resident", "--profiler", "torch", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "(--profiler torch)" in err and "leave --mode out" in err
    assert not (tmp_path / "ab.json").exists()


def test_an_attributed_sessions_ab_json_names_only_keys_of_its_records(tmp_path, monkeypatch):
    from perfsuite.schemas import records

    launches(monkeypatch, launch_sigma=0.02)
    run(tmp_path, slow="0.1", attribute="changed")
    data = saved(tmp_path)
    assert set(data) <= set(records.ABRecord.__annotations__), set(data) - set(records.ABRecord.__annotations__)
    (cell,) = data["cells"]
    assert "attribution" in cell
    assert set(cell) <= set(records.ABCellRecord.__annotations__), set(cell) - set(records.ABCellRecord.__annotations__)


def test_ab_json_keeps_how_the_ranks_started_for_the_repro_line(tmp_path, monkeypatch):
    from perfsuite.launch.launch import LaunchOptions

    launches(monkeypatch, launch_sigma=0.02)
    run(tmp_path, launch=LaunchOptions(rank_start="exec"))
    assert saved(tmp_path)["settings"]["launch"]["rank_start"] == "exec"
