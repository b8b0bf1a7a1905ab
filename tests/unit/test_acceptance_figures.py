"""A GPU acceptance run read back (perfsuite/selftest/acceptance.py): an
acceptance folder put together from stored H100 data (the gate's results, an
A/B session of each condition) and the self-tests' own files (made by their
code on stood-in launches), archived as .ci/gpu-acceptance archives it; the
figures name each part's outcome, and a file changed after the run is refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from perfsuite.selftest import acceptance
from perfsuite.selftest import attribution as attribution_selftest
from perfsuite.selftest import error_rates as rates
from tests.unit.test_ab import fake_launches
from tests.unit.test_selftest_attribution import gpu_result

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "h100-2026-11-26"
GPU_CELL = "gate/image/ddp-ds/g1/fp32/px500/pin/nchw"
SMOKE = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"


def session(name: str, seconds: float) -> dict:
    cell = json.loads((H100 / name).read_text())["cells"][0]
    return {**{k: cell.get(k) for k in ("verdict", "ratio", "ci_low", "ci_high", "reason")},
            "detectable": 0.0123, "seconds": seconds}


def summed(folder: Path) -> list[str]:
    """Write folder/SHA256SUMS over its other files, as the script's hand_back; their names."""
    names = sorted(f"./{p.relative_to(folder)}" for p in folder.rglob("*")
                   if p.is_file() and p.name != "SHA256SUMS")
    subprocess.run(["sha256sum", *names], cwd=folder, check=True, stdout=(folder / "SHA256SUMS").open("w"))
    return names


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """An acceptance run's folder, as the script leaves it."""
    work = tmp_path / "work"
    (work / "gate").mkdir(parents=True)
    shutil.copy(H100 / "gate-px500-g1.results.json", work / "gate" / "results.json")
    (work / "ab-fp32-px500-pin").mkdir()
    (work / "ab-fp32-px500-pin" / "ab-detection.json").write_text(json.dumps({
        "cell": GPU_CELL, "trials": [{"trial": 0, "conditions": {
            "unchanged": {**session("ab-unchanged-1.json", 51), "quad_sd": 0.0009, "forecast_quad_sd": 0.0006},
            "slow 2%": {**session("ab-slow2.json", 47),
                        "serial": {"same_side": 0.41, "across_sides": 0.03, "adjacent": 126}}}}]}))
    monkeypatch.setattr(attribution_selftest, "run_cell",
                        lambda cell, out, options: gpu_result(cell, options.options.get("fault"), 0.0005))
    attribution_selftest.measure_attribution(1, None, GPU_CELL, work / "attribution", log=lambda line: None,
                                             steps=20)
    fake_launches(monkeypatch)
    rates.measure_error_rates([SMOKE], 2, 0.10, work / "rates", mode="launches", tolerance=0.05,
                              log=lambda line: None)
    (work / "summary.txt").write_text(
        "# perfsuite GPU acceptance, 2026-12-01T10:00:00Z, budget 540 s\n"
        "NVIDIA H200, 143771 MiB, 580.159.04, 00000000:00:06.0\n"
        "python 3.12.3 torch 2.11.0+cu130 cuda 13.0 gpus 1\n"
        "part rc wall_s\ndoctor 0 21\ngate 0 233\nab 0 291\nattribution 0 160\nrates not-run 0 (budget spent)\n")
    names = summed(work)  # as hand_back: every file's sum, then the archive
    with tarfile.open(tmp_path / "acceptance.tgz", "w:gz") as tar:
        for name in [*names, "./SHA256SUMS"]:
            tar.add(work / name, arcname=name)
    return work


def test_the_figures_name_each_parts_outcome_from_the_archive_as_from_the_folder(run_folder, capsys):
    assert acceptance.main([str(run_folder.parent / "acceptance.tgz")]) == 0
    text = capsys.readouterr().out
    assert acceptance.main([str(run_folder)]) == 0
    assert capsys.readouterr().out == text
    lines = text.splitlines()
    assert lines[0].startswith("perfsuite GPU acceptance (") and "files checked against SHA256SUMS" in lines[0]
    assert "  NVIDIA H200, 143771 MiB, 580.159.04, 00000000:00:06.0" in lines
    assert ("parts: doctor rc 0 (21 s), gate rc 0 (233 s), ab rc 0 (291 s), attribution rc 0 (160 s), "
            "rates rc not-run (0 s)") in lines
    assert "gate: 3 of 3 cells run (3 ok), 0 not run (need more GPUs than present); step time: 3 same" in lines
    (ab,) = [line for line in lines if line.startswith("ab ")]
    assert ab.startswith(f"ab {GPU_CELL}: unchanged -> same ") and "; slow 2% -> regressed 1.044 (1.029-1.059)" in ab
    assert "detects 1.23 %" in ab and ", 47 s" in ab
    # which regimes the windows met: a process's own (same side only) or the machine's (both)
    assert "windows' lag-1 r 0.41 same side / 0.03 across, 47 s" in ab
    assert "detects 1.23 %, quads 0.09 % (forecast 0.06 %), 51 s" in ab  # measured beside forecast
    assert any(line.startswith("  gpu-sleep: top row names the changed place 1/1") for line in lines)
    assert any(line.startswith(f"{SMOKE}: 2 A/A sessions") for line in lines)


def test_the_json_holds_what_the_lines_say(run_folder, capsys):
    assert acceptance.main([str(run_folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gate"]["step_time"] == {"same": 3} and data["gate"]["not_run"] == []
    assert data["parts"]["rates"] == {"rc": "not-run", "wall_s": 0}
    assert data["attribution"]["figures"]["precision"]["hits"] == 1
    assert data["rates"]["cells"][SMOKE]["sessions"] == 2


def test_a_file_changed_after_the_run_is_refused_naming_it(run_folder, capsys):
    results = run_folder / "gate" / "results.json"
    measured = hashlib.sha256(results.read_bytes()).hexdigest()
    results.write_text(results.read_text().replace('"same"', '"regressed"', 1))
    assert acceptance.main([str(run_folder)]) == 2
    err = capsys.readouterr().err
    assert f"{results}: not the file measured (SHA256SUMS says {measured[:12]})" in err
    results.unlink()
    assert acceptance.main([str(run_folder)]) == 2
    assert f"{results}: missing" in capsys.readouterr().err


def test_a_folder_that_is_no_acceptance_run_is_said_so(tmp_path, capsys):
    assert acceptance.main([str(tmp_path)]) == 2
    assert "no SHA256SUMS (is it a .ci/gpu-acceptance folder?)" in capsys.readouterr().err
    (tmp_path / "x.txt").write_text("x")
    assert acceptance.main([str(tmp_path / "x.txt")]) == 2
    assert "neither a folder nor a tar archive" in capsys.readouterr().err


def test_a_gate_run_kept_aside_by_a_later_call_is_read_before_the_latest(run_folder, capsys):
    latest = run_folder / "gate" / "results.json"
    shutil.copytree(run_folder / "gate", run_folder / "gate.1")  # a finished run, kept aside
    cut = json.loads(latest.read_text())
    cut["run"]["status"] = "interrupted"
    cut["cells"] = cut["cells"][:1]
    latest.write_text(json.dumps(cut))
    summed(run_folder)
    assert acceptance.main([str(run_folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    earlier = lines.index("gate.1: 3 of 3 cells run (3 ok), 0 not run (need more GPUs than present); "
                          "step time: 3 same")
    latest_at = lines.index("gate: 1 of 1 cells run (1 ok), 0 not run (need more GPUs than present); "
                            "step time: 1 same")
    assert earlier < latest_at
    assert lines[latest_at + 1].startswith("  the run is interrupted: the cells after these were not reached")


def test_an_llm_cell_that_compared_nothing_says_what_it_lacked(run_folder, capsys):
    # the llm part runs one launch without recording: on a GPU without LLM baselines its step
    # time is not compared, and the figures say so (the H100's first day, before its folder)
    day = json.loads((DATA / "h100-2026-11-25" / "gate-llm-g1.results.json").read_text())
    dpo = next(c for c in day["cells"] if c["id"] == "gate/llm/dpo/stack_exchange_paired/g1/bf16/nopin")
    (run_folder / "llm").mkdir()
    (run_folder / "llm" / "results.json").write_text(json.dumps({**day, "cells": [dpo]}))
    summed(run_folder)
    assert acceptance.main([str(run_folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"llm {dpo['id']}: ok")
    assert lines[at + 1].startswith("  not compared: step_time: no comparable baseline")
