"""How a launch's ranks start: forked from a zygote that imported torch and
the workload, or each a fresh interpreter (perfsuite.launch.starting)."""

import os
import sys

import pytest
from cellkit import tiny_image_cell as tiny

from perfsuite.launch import agent, multinode, starting
from perfsuite.launch.launch import LaunchOptions, run_cell, torchrun_argv


@pytest.mark.slow
def test_forked_and_fresh_ranks_train_alike_and_the_result_says_which_ran(tmp_path):
    cell = tiny()
    run_cell(cell, tmp_path / "first", LaunchOptions(rank_start="fork"))  # starts the zygote
    forked = run_cell(cell, tmp_path / "fork", LaunchOptions(rank_start="fork"))
    fresh = run_cell(cell, tmp_path / "exec", LaunchOptions(rank_start="exec"))
    for result, start in ((forked, "fork"), (fresh, "exec")):
        assert result["status"] == "ok", result.get("output_tail")
        assert result["info"]["rank_start"] == start and "rank_start_note" not in result["info"]
        # OMP_NUM_THREADS as the launch set it, though the zygote loaded torch under another value
        assert result["info"]["torch_threads"] == max(1, ((os.cpu_count() or 1) - 1) // 2)
    assert "--start-method=fork" in forked["argv"] and "perfsuite.rank.worker" in fresh["argv"]
    assert [r["steps"] for r in forked["ranks"]] == [r["steps"] for r in fresh["ranks"]]
    # the same computation: seeded, one thread a rank, exact work counters
    assert forked["metrics"]["loss"]["samples"] == fresh["metrics"]["loss"]["samples"]
    assert forked["counters"]["per_step"] == fresh["counters"]["per_step"]
    # imported once, before the fork; a fresh rank imports torch and torchvision again
    assert forked["timeline"]["workload_import"] < 0.5 < fresh["timeline"]["workload_import"]
    assert forked["timeline"]["start_and_imports"] < fresh["timeline"]["start_and_imports"]


def test_ranks_start_fresh_where_they_cannot_fork_and_the_switch_says_so(monkeypatch):
    plan = multinode.plan(tiny(), multinode.Nodes())
    monkeypatch.delenv("PERFSUITE_RANK_START", raising=False)
    assert starting.rank_start(None, "off", plan) == ("fork", None)
    assert starting.rank_start("exec", "off", plan) == ("exec", None)
    assert starting.rank_start(None, "nsys", plan)[0] == "exec"
    two_nodes = multinode.plan(tiny(), multinode.Nodes(nnodes=2, rdzv_endpoint="h:1", rdzv_id="j"))
    assert starting.rank_start(None, "off", two_nodes)[0] == "exec"
    monkeypatch.setenv("PERFSUITE_RANK_START", "exec")
    assert starting.rank_start(None, "off", plan) == ("exec", None)
    assert starting.rank_start("fork", "off", plan) == ("fork", None)
    with pytest.raises(ValueError, match="rank start"):
        starting.rank_start("spawn", "off", plan)


def test_the_fork_command_is_torchruns_own(tmp_path):
    import torch.distributed.run

    argv = torchrun_argv(tiny(), tmp_path, LaunchOptions(options={"a": "b"}), rank_start="fork")
    parsed = torch.distributed.run.get_args_parser().parse_args(argv[3:])
    assert parsed.start_method == "fork" and parsed.run_path
    assert parsed.training_script == str(agent.FORKED_RANK) and agent.FORKED_RANK.is_file()
    assert parsed.training_script_args == ["--cell-file", str(tmp_path / "cell.json"), "--out", str(tmp_path),
                                           "--option", "a=b"]


def test_a_zygote_imports_the_built_in_workload_but_never_the_users_own():
    assert starting.preload_modules(tiny()) == [*starting.PRELOAD, "perfsuite.workloads.image"]
    assert starting.preload_modules(tiny(workload="mypkg.bench:run")) == starting.PRELOAD
    assert sys.executable  # the zygote runs under the launch's interpreter
