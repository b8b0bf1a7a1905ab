"""What a resident A/B session can resolve, forecast from the step times
recorded on its hardware (perfsuite.ab.forecast), and `--quads auto`: each
cell as many quads a pair as its forecast says resolve the tolerance."""

import json
import math
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import perfsuite.hardware
from perfsuite import cells
from perfsuite.ab import session as ab
from perfsuite.ab.forecast import cell_forecast, forecast, forecast_line
from perfsuite.ab.resident import PairRun
from perfsuite.cli import main as cli
from perfsuite.judge import baselines as bl
from perfsuite.judge.lookup import samples_of
from perfsuite.stats.windows import compare_windows
from tests.unit.cellkit import tiny_image_cell

H200 = bl.PROJECT_BASELINES / "h200-140gb-x1"
JUDGED = Path(__file__).resolve().parents[1] / "data" / "h200-2026-11-28" / "call3-gate-judged" / "gate2.tgz"
CELL = "gate/image/ddp-ds/g1/{}/px500/{}/nchw"
# what the H200's recorded steps forecast, as 5-step windows: a quad's s.d., the quads that
# resolve ±2 % and those at which unchanged code reads `same` by the last look 4 times in 5 (--quads auto)
H200_FORECASTS = [(CELL.format("fp32", "pin"), 0.0006, 4, 4), (CELL.format("fp32", "nopin"), 0.0316, 9, 12),
                  (CELL.format("fp64", "nopin"), 0.0539, 21, 37)]


def h200_steps(cell_id: str) -> list[list[float]]:
    pooled, launches = samples_of(bl.load_profile(H200).samples[f"{cell_id}:step_time"])
    return list(launches) or [list(pooled)]


@pytest.mark.parametrize("cell_id,quad_sd,quads,same", H200_FORECASTS)
def test_the_h200s_recorded_steps_forecast_what_each_cell_resolves(cell_id, quad_sd, quads, same):
    said = forecast(h200_steps(cell_id), 5, "auto", 4, 0.02, "h200")
    assert said["quad_sd"] == pytest.approx(quad_sd, rel=0.05)
    assert said["quads_for_tolerance"] == quads and said["quads"] == said["quads_for_same"] == same
    assert said["detectable_first_look"] <= 0.02
    if quads > 4:  # one fewer would not resolve it
        assert forecast(h200_steps(cell_id), 5, quads - 1, 4, 0.02, "h200")["detectable_first_look"] > 0.02
    fixed = forecast(h200_steps(cell_id), 5, 16, 4, 0.02, "h200")  # the pull-request job's 16 quads
    assert fixed["quads"] == 16 and fixed["quads_for_tolerance"] == quads and fixed["quads_for_same"] == same
    line = forecast_line(fixed, 0.02)
    assert f"±2 % needs ~{quads} quads a pair, unchanged code `same` by the last look 4 times in 5 ~{same}" in line


@pytest.mark.parametrize("cell_id", [c for c, *_ in H200_FORECASTS])
def test_at_the_quads_auto_gives_unchanged_code_reads_same_by_the_last_look_four_times_in_five(cell_id):
    """What a pull request wants of an unchanged cell is `same`. An interval
    of half-width ±2 % is `same` only where its ratio is 1 to the digit, so
    the quads that merely resolve ±2 % (the pageable fp32 cell's 9, the fp64
    cell's 21) left simulated unchanged sessions of that scatter `same` by
    their last look well under 4 times in 5; `--quads auto` asks for the
    quads that make it so (sessions simulated here apart from the forecast's)."""
    said = forecast(h200_steps(cell_id), 5, "auto", 4, 0.02, "h200")
    confidence, looks = ab.pair_look_confidence(4), ab.look_pairs(4)

    def same_share(quads: int) -> float:
        rng = np.random.default_rng(8)
        same = 0
        for _ in range(400):
            pairs = []
            for pair in range(1, 5):
                pairs.append(list(rng.normal(0.0, said["quad_sd"], quads)))
                verdict = (compare_windows(pairs, 0.02, confidence, firsts=["A", "B", "A", "B"][:pair]).verdict
                           if pair in looks else "unknown")
                if verdict != "unknown":
                    break
            same += verdict == "same"
        return same / 400

    assert same_share(said["quads"]) >= 0.75, said
    if said["quads_for_tolerance"] < said["quads"]:
        assert same_share(said["quads_for_tolerance"]) < 0.75


def test_a_forecast_agrees_with_the_verdict_over_quads_of_that_scatter():
    """Quads scattering as forecast, pooled as a session pools them: the
    forecast's detectable change is the interval's half-width."""
    said = forecast(h200_steps(H200_FORECASTS[2][0]), 5, 21, 4, 0.02, "h200")
    d = [z for z in (-1.5, -1, -0.5, 0, 0.5, 1, 1.5)] * 3
    pair = [x * said["quad_sd"] / float(np.std(d, ddof=1)) for x in d]  # 21 quads of exactly that s.d., mean 0
    cmp = compare_windows([pair, pair], 0.02, ab.pair_look_confidence(4))
    assert cmp.detectable == pytest.approx(said["detectable_first_look"], rel=1e-3) and cmp.verdict == "same"


def test_the_forecast_reads_the_cells_baseline_on_the_hardware_this_machine_is(monkeypatch):
    with tarfile.open(JUDGED) as tar:  # the H200's own answer to the fingerprint
        env = json.load(tar.extractfile("gate2/results.json"))["env"]
    monkeypatch.setattr(perfsuite.hardware, "fingerprint", lambda: env)
    cell_id, quad_sd, _, quads = H200_FORECASTS[2]
    said = cell_forecast(cells.get(cell_id), 5, "auto", 4, 0.02)
    assert said["source"].startswith("baselines h200-140gb-x1 (recorded run 2026-11-28")
    assert said["quads"] == quads and said["quad_sd"] == pytest.approx(quad_sd, rel=0.05)


def test_a_cell_recorded_with_too_few_steps_has_no_forecast_and_auto_keeps_the_default():
    said = forecast([[0.1] * 11, [0.1] * 12], 5, "auto", 4, 0.05, "cpu")
    assert said["quads"] == ab.DEFAULT_QUADS and "quad_sd" not in said
    assert "have 12 steps at most; a forecast needs 8 windows of 5" in said["reason"]
    assert forecast_line(said, 0.05).startswith("forecast: none (") and "16 quads a pair" in forecast_line(said, 0.05)


def test_quads_auto_gives_each_cell_the_quads_its_forecast_asks(tmp_path, monkeypatch):
    asked = []

    def fake_pair(cell, opts, dirs, *, quads, window_steps, first, **kwargs):
        asked.append(quads)
        windows = [{"side": side, "value": 0.1 * (1 + 0.001 * (i % 3)), "steps": [], "settling": q == 0}
                   for q in range(quads + 1) for i, side in enumerate("ABBA")]
        ok = {"id": cell.id, "params": cell.params(), "env": {"cpu_model": "x", "cpu_cores": 2, "gpu_count": 0},
              "checks": [], "ranks": [], "status": "ok", "reason": None, "duration_s": 1.0,
              "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1] * 5}}}
        return PairRun({side: {**ok, "dir": str(dirs[side])} for side in "AB"}, windows, 0.5)

    monkeypatch.setattr("perfsuite.ab.session.run_pair", fake_pair)
    monkeypatch.setattr("perfsuite.ab.session.cell_forecast", lambda cell, w, q, p, t: forecast(
        h200_steps(H200_FORECASTS[1][0]), w, q, p, t, "h200"))
    lines = []
    side_a, side_b = ab.Side("A", sys.executable, {}), ab.Side("B", sys.executable, {})
    ab.ABSession([tiny_image_cell(world_size=1)], side_a, side_b, tmp_path, mode="resident", quads="auto",
                 tolerance=0.02, log=lines.append).run()
    record = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert asked == [12, 12] and record["forecast"]["quads"] == 12 and record["verdict"] == "same"
    # the windows' serial diagnostic is kept with the verdict; side A's windows never vary here: none
    assert "serial" in record and record["serial"] is None
    assert any(line.strip().startswith("12 quads a pair; forecast from the steps recorded here") for line in lines)
    assert json.loads((tmp_path / "ab.json").read_text())["settings"]["resident"]["quads_per_pair"] == "auto"
    assert math.isfinite(record["detectable"])


def test_quads_must_be_a_number_or_auto(capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(["ab", "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", "--quads", "many"])
    assert ended.value.code == 2 and "'many': give a number of quads, or auto" in capsys.readouterr().err
    ab.check_resident_settings("resident", 5, "auto", 4)  # accepted: each cell's own, 4-64


def test_the_h100s_recorded_steps_with_their_epoch_boundaries_forecast_as_its_sessions_measured():
    """The H100 folder's samples hold each epoch's first step (0.33-0.60 s) and
    partial batch (68 ms): a window's median takes them in its stride, so the
    pinned cell forecasts the 0.04 % a quad its resident sessions showed
    (tests/data/h100-2026-11-26: pairs within ±0.04 % over 16 quads)."""
    folder = bl.load_profile(bl.PROJECT_BASELINES / "h100-80gb-hbm3-80gb-x1")
    said = {}
    for precision, pin in (("fp32", "pin"), ("fp16", "nopin"), ("fp32", "nopin"), ("fp64", "nopin")):
        pooled, launches = samples_of(folder.samples[f"{CELL.format(precision, pin)}:step_time"])
        said[precision, pin] = forecast(list(launches) or [list(pooled)], 5, "auto", 4, 0.02, "h100")
    assert said["fp32", "pin"]["quad_sd"] < 0.0006 and said["fp32", "pin"]["quads"] == 4
    others = [said[k] for k in said if k != ("fp32", "pin")]
    assert all(0.025 < s["quad_sd"] < 0.05 and 8 <= s["quads_for_tolerance"] <= 16 and 11 <= s["quads"] <= 26
               for s in others)
