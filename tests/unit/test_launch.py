"""Real cells through torch.distributed.run on CPU (gloo): skip, no hang, crash;
and the command built from what the side's torchrun accepts."""

import argparse
import json
import sys

import pytest
from cellkit import tiny_image_cell

from perfsuite import cells
from perfsuite.launch import diagnose, torchrun_options
from perfsuite.launch.launch import LaunchOptions, run_cell, torchrun_argv
from perfsuite.runner import Runner

tiny = tiny_image_cell


def test_cell_needing_more_gpus_is_skipped_with_reason(tmp_path):
    cell = cells.get("gate/image/ddp-ds/g4/fp16/px500/nopin/nchw")
    result = run_cell(cell, tmp_path)
    assert result["status"] == "skipped"
    assert result["reason"] == "needs 4 GPU(s), 0 present"
    assert not (tmp_path / "cells").exists()  # nothing was launched


@pytest.mark.slow
def test_round_robin_with_odd_batch_count_does_not_hang(tmp_path):
    # 1437 training digits / 17 per batch = 85 batches: odd, for 2 ranks.
    cell = tiny(strategy="ddp-rr", batch_size=17, max_steps=0)
    result = run_cell(cell, tmp_path)
    assert result["status"] == "ok", result.get("output_tail")
    assert [r["steps"] for r in result["ranks"]] == [42 - 2, 42 - 2]
    assert result["metrics"]["step_time"]["n"] == 40


@pytest.mark.slow
def test_crash_in_one_cell_keeps_earlier_results(tmp_path):
    good = tiny(world_size=1)
    bad = tiny(strategy="ddp", world_size=2)
    runner = Runner(tmp_path, LaunchOptions(), probe=False)
    first = runner.result(good)
    runner.launch.options = {"fault": "raise:1:3"}
    second = runner.result(bad)
    assert first["status"] == "ok"
    assert second["status"] == "error"
    assert "rank 1 failed: RuntimeError: injected fault: rank 1 raised at step 3" in second["reason"]
    assert "injected fault" in (tmp_path / "cells" / bad.id / "output.log").read_text()
    assert "injected fault" in second["ranks"][1]["tail"]  # that rank's own output
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [c["status"] for c in saved["cells"]] == ["ok", "error"]
    assert saved["cells"][0]["metrics"]["step_time"]["samples"] == first["metrics"]["step_time"]["samples"]


def test_session_gpu_set_bounds_what_a_cell_may_use(tmp_path):
    cell = cells.get("gate/image/ddp-ds/g1/fp32/px500/nopin/nchw")
    result = run_cell(cell, tmp_path, LaunchOptions(gpus=[]))
    assert result["status"] == "skipped" and result["reason"] == "needs 1 GPU(s), 0 present"


def test_ranks_that_skipped_themselves_make_a_skipped_cell_and_a_skip_beside_an_error_does_not():
    import _pytest.outcomes

    from perfsuite.launch import launch
    from perfsuite.rank.worker import skip_reason

    assert skip_reason(_pytest.outcomes.Skipped("needs NCCL")) == "needs NCCL"
    assert skip_reason(_pytest.outcomes.XFailed("known")) == "known"
    assert skip_reason(AssertionError("Skipped")) is None and skip_reason(KeyboardInterrupt()) is None
    cell = tiny_image_cell(world_size=2)
    ok = {"status": "ok", "finished": 1.0}
    skipped = {"status": "skipped", "reason": "needs NCCL", "finished": 1.0}
    assert launch._failure(cell, None, [ok, skipped], "", 0, False, 9)[:2] == (
        "skipped", "rank 1 skipped: needs NCCL")
    assert launch._failure(cell, None, [skipped, skipped], "", 0, False, 9)[:2] == (
        "skipped", "ranks 0, 1 skipped: needs NCCL")
    error = {"status": "error", "finished": 1.0, "error": {"type": "RuntimeError", "message": "boom"}}
    assert launch._failure(cell, None, [skipped, error], "", 1, False, 9)[:2] == (
        "error", "rank 1 failed: RuntimeError: boom")
    assert launch._failure(cell, None, [ok, ok], "", 0, False, 9)[:2] == ("ok", None)


def torchrun_parser(prefix_template: bool) -> argparse.ArgumentParser:
    """torchrun's parser in the parts a launch uses: torch 2.11's has no
    --log-line-prefix-template, later ones have it."""
    parser = argparse.ArgumentParser(prog="torchrun")
    for flag in ("--standalone", "--no-python", "--no_python"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("-m", "--module", action="store_true")
    for option in ("--nnodes", "--nproc-per-node", "--max-restarts", "--tee", "--rdzv-backend",
                   "--rdzv-endpoint", "--rdzv-id"):
        parser.add_argument(option)
    if prefix_template:
        parser.add_argument("--log-line-prefix-template")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


@pytest.mark.parametrize("prefix_template", [False, True], ids=["torch-2.11", "torch-2.14"])
def test_the_launch_command_has_only_options_the_interpreters_torchrun_accepts(
        tmp_path, monkeypatch, prefix_template):
    import torch.distributed.run

    monkeypatch.setattr(torch.distributed.run, "get_args_parser", lambda: torchrun_parser(prefix_template))
    monkeypatch.setattr(torchrun_options, "_answers", {})
    argv = torchrun_argv(tiny(), tmp_path, LaunchOptions())
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    parsed = torchrun_parser(prefix_template).parse_args(argv[3:])
    # torch 2.11 took an option it lacked for the script to run: python failed with "unknown option"
    assert parsed.module and parsed.training_script == "perfsuite.rank.worker"
    assert parsed.training_script_args[:2] == ["--cell-file", str(tmp_path / "cell.json")]
    assert parsed.tee == "3" and parsed.nproc_per_node == "2"
    assert (f"--log-line-prefix-template={diagnose.RANK_PREFIX}" in argv) is prefix_template
