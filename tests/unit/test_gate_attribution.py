"""The gate against stored baselines says where the time went: ``baseline
record`` keeps a profiled cell's profile summary (profiles.json), and a
step-time check that regressed, of a run that profiled the cell, carries the
diff of the two (perfsuite.judge.baseline_profiles).

The summaries are the stored real ones of tests/fixtures/profiles/: a 2-rank
CPU MobileNetV2 cell, and the same with a spin in the first Conv2d's forward.
"""

import json
import random
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.hardware import profile_id
from perfsuite.judge import baselines as bl
from perfsuite.judge.baseline_profiles import HOW, PROFILES_FILE, ROWS_KEPT, compact
from perfsuite.judge.judging import explain, judge
from perfsuite.judge.recording import record_run
from perfsuite.profiling.attribution import attribute, format_attribution
from perfsuite.report.html import render_html
from perfsuite.report.markdown import summary_markdown
from perfsuite.report.terminal import summary_lines
from perfsuite.results import merge_repeats
from perfsuite.schemas.results import validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"
CELL = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")
ENV = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0}
CONV = "features.0.0 (Conv2d) forward"


def stored(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


A, SPIN = stored("mobilenet-cpu-a"), stored("mobilenet-cpu-conv-spin")


def measured(step_s, profile=None, seed=0):
    """One launch of the cell: 30 steps around ``step_s``, with ``profile`` where given."""
    rng = random.Random(seed)
    samples = [step_s * (1 + rng.gauss(0, 0.005)) for _ in range(30)]
    result = {"id": CELL.id, "status": "ok", "params": CELL.params(), "env": ENV,
              "metrics": {"step_time": {"value": sorted(samples)[15], "unit": "s", "samples": samples},
                          "throughput": {"value": 32 / step_s, "unit": "images/s"}},
              "info": {"images_per_step": 32}}
    return {**result, "profile": profile} if profile else result


def record(root, profile=A):
    """A baseline of six launches (their spread lets one later launch be judged)."""
    step = A["meta"]["step_time_s"]
    launches = [measured(step * level, seed=i) for i, level in enumerate((1.0, 1.01, 0.99, 1.005, 0.995, 1.0))]
    reference = merge_repeats(launches)
    if profile:
        reference["profile"] = profile
    return record_run({"schema": "perfsuite.results/1", "env": ENV, "cells": [reference]}, root=root,
                      date="2026-11-28T09:00:00Z")


def step_check(result, root):
    result["checks"] = judge(CELL, result, sets=bl.load_all(root))
    return next(c for c in result["checks"] if c["name"] == "step_time")


def slower(profile=SPIN):
    return measured(SPIN["meta"]["step_time_s"], profile, seed=7)


def test_a_recorded_baseline_keeps_the_profile_summary_small_beside_its_samples(tmp_path):
    plan = record(tmp_path)
    assert plan.profiled_cells == 1 and f"profile summaries of 1 cell(s) in {PROFILES_FILE}" in plan.describe()
    kept = bl.load_profile(plan.folder).profiles[CELL.id]["summary"]
    modules = [r for r in kept["rows"] if r["category"] == "module"]
    assert len(modules) == ROWS_KEPT < len([r for r in A["rows"] if r["category"] == "module"])
    assert kept["meta"]["capped"]["module"] <= min(r["total_s"] for r in modules)
    assert [len(part["meta"]["step_times_s"]) for part in kept["ranks"]] == [10, 10]
    assert (plan.folder / PROFILES_FILE).stat().st_size < 0.6 * len(json.dumps(A))


def test_a_slower_run_with_a_conv_spin_is_told_the_conv2d_module_first(tmp_path):
    record(tmp_path)
    check = step_check(result := slower(), tmp_path)
    assert check["verdict"] == "regressed"
    diff = check["attribution"]
    top = diff["top"][0]
    assert (top["level"], top["name"]) == ("module", CONV) and top["delta_s"] > diff["noise_s"] > 0
    assert diff["change_s"] == pytest.approx(check["observed"] - check["expected"])
    assert 0.6 <= diff["explained"] <= 1.1
    validate(json.loads(json.dumps({"schema": "perfsuite.results/1", "cells": [result]}, allow_nan=False)))
    assert CONV in explain(result)


def test_a_baseline_without_profiles_changes_nothing(tmp_path):
    record(tmp_path, profile=None)
    assert not (tmp_path / profile_id(ENV) / PROFILES_FILE).exists()
    profiled, plain = step_check(slower(), tmp_path), step_check(slower(profile=None), tmp_path)
    assert profiled["verdict"] == "regressed" and "attribution" not in profiled
    assert profiled == plain


def test_a_run_that_did_not_profile_the_cell_is_told_how_to_and_nothing_else(tmp_path):
    profiled, plain = tmp_path / "profiled", tmp_path / "plain"
    profiled.mkdir(), plain.mkdir()
    record(profiled), record(plain, profile=None)
    check, bare = step_check(slower(profile=None), profiled), step_check(slower(profile=None), plain)
    assert "attribution" not in check and "--profiler torch" in check["message"]
    assert "--perf-profiler torch" in HOW and check["message"] == f"{bare['message']}; {HOW}"
    assert {k: v for k, v in check.items() if k != "message"} == {k: v for k, v in bare.items() if k != "message"}


def test_a_step_time_check_that_did_not_regress_gets_no_diff(tmp_path):
    record(tmp_path)
    check = step_check(measured(A["meta"]["step_time_s"], A, seed=3), tmp_path)
    assert check["verdict"] == "same" and "attribution" not in check and "--profiler" not in check["message"]


@pytest.mark.parametrize(("text", "said"), [
    ("{not json", "not valid JSON"),
    ('{"format": "perfsuite.baseline-profiles/0", "profiles": {}}', "perfsuite.baseline-profiles/1"),
    ('{"format": "perfsuite.baseline-profiles/1", "profiles": {"c": {"summary": {"source": "torch"}}}}',
     "cell 'c': its summary has no rows"),
    ('{"format": "perfsuite.baseline-profiles/1", "profiles": {"c": {"summary": {"source": "torch", "rows": '
     '[{"name": "x", "category": "bogus", "total_s": 1}]}}}}', "unknown profile row category"),
    ('{"format": "perfsuite.baseline-profiles/1", "profiles": {"c": {"summary": {"source": "torch", "rows": '
     '[{"name": "x", "category": "module", "total_s": -1}]}}}}', "total_s is not a time"),
    ('{"format": "perfsuite.baseline-profiles/1", "profiles": {"c": {}}}', "KeyError"),
])
def test_a_malformed_profiles_file_is_refused_naming_it(tmp_path, text, said):
    folder = record(tmp_path).folder
    (folder / PROFILES_FILE).write_text(text)
    with pytest.raises(bl.BaselineError, match="profiles.json") as err:
        bl.load_all(tmp_path)
    assert str(folder / PROFILES_FILE) in str(err.value) and said in str(err.value)


def test_recording_a_run_without_profiles_writes_no_profiles_file_and_drops_a_stale_one(tmp_path):
    plan = record(tmp_path, profile=None)
    assert plan.profiled_cells == 0 and not (plan.folder / PROFILES_FILE).exists()
    assert "profile summaries" not in plan.describe()
    record(tmp_path)
    assert (plan.folder / PROFILES_FILE).exists()
    record(tmp_path, profile=None)  # new samples: the old profile would judge them
    assert not (plan.folder / PROFILES_FILE).exists() and bl.load_profile(plan.folder).profiles == {}


def regressed_run(root):
    """The conv-spin run, judged against a profiled baseline recorded in ``root``."""
    record(root)
    result = slower()
    step_check(result, root)
    return result


def test_the_terminal_shows_the_top_rows_under_the_failed_check(tmp_path):
    lines = summary_lines([regressed_run(tmp_path)])
    at = next(i for i, line in enumerate(lines) if "REGRESSED step_time" in line)
    assert "where the time went, against the baseline's profile" in lines[at + 1]
    assert "measured change +" in lines[at + 2] and "noise" in lines[at + 2]
    assert lines[at + 3].split()[1::2][:2] == ["ms", "%"] and lines[at + 3].split()[4:] == ["module", *CONV.split()]
    assert lines[at + 4].strip().startswith("explained: module")


def test_the_cell_page_shows_the_diff_as_a_table(tmp_path):
    page = render_html({"cells": [regressed_run(tmp_path)]}, figures=[])
    assert "Where the time went: step_time (regressed) against the baseline's profile" in page
    table = page[page.index('class="sortable gate-attribution"'):]
    assert f'<td class="id">{CONV}</td>' in table[:table.index("</table>")]
    assert "The work counters changed" not in page


def test_the_markdown_summary_shows_the_top_rows(tmp_path):
    markdown = summary_markdown({"cells": [regressed_run(tmp_path)]}, "run")
    assert f"| module | `{CONV}` |" in markdown


def test_changed_work_counters_come_first_and_the_diff_after_them(tmp_path):
    result = regressed_run(tmp_path)
    result["checks"].append({"name": "work_counters", "verdict": "fail", "metric": "counters",
                             "message": "work counters changed against recorded run: flops +12 %"})
    lines = summary_lines([result])
    counters = next(i for i, line in enumerate(lines) if "FAIL work_counters" in line)
    diff = next(i for i, line in enumerate(lines) if "against the baseline's profile" in line)
    assert lines.index(next(line for line in lines if "REGRESSED step_time" in line)) < counters < diff
    assert "the work counters changed" in lines[diff]
    assert "The work counters changed (work_counters above)" in render_html({"cells": [result]}, figures=[])


def test_a_row_the_baseline_left_out_under_its_cap_is_a_lower_bound_never_appeared():
    kept = compact(A)
    floor = kept["meta"]["capped"]["module"] / (10 * 2)  # per step and rank
    names = {r["name"] for r in kept["rows"]}
    left_out = {r["name"] for r in SPIN["rows"] if r["category"] == "module" and r["name"] not in names}
    diff = attribute(kept, SPIN, z=0.0)  # every row that moved at all is listed
    rows = [r for r in diff.levels["module"].rows if r.name in left_out]
    assert rows and {r.status for r in rows} == {"capped"}
    assert all(r.a_s == pytest.approx(floor) and r.b_s > floor for r in rows)
    assert "(at least" in format_attribution(diff, top=len(diff.top))
    bare = {**kept, "meta": {k: v for k, v in kept["meta"].items() if k != "capped"}}
    assert {r.status for r in attribute(bare, SPIN, z=0.0).levels["module"].rows if r.name in left_out} == {"appeared"}
