"""How a launch's ranks start: forked from a zygote that imported torch and
the workload, or each a fresh interpreter (perfsuite.launch.starting)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from cellkit import tiny_image_cell as tiny

from perfsuite import cells
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
    # and what a built-in workload's ranks import as they run (an LLM recipe's datasets: scipy.io)
    llm = cells.get("smoke/llm/lora/alpaca/c1/fp32/nopin")
    assert starting.preload_modules(llm)[:len(starting.PRELOAD) + 1] == [*starting.PRELOAD, "perfsuite.workloads.llm"]
    assert "scipy.io" in starting.preload_modules(llm)
    assert starting.preload_modules(tiny(workload="mypkg.bench:run")) == starting.PRELOAD
    assert sys.executable  # the zygote runs under the launch's interpreter


def _forked_rank_after_cuda_was_asked(tmp_path, device: str) -> tuple[int, str, dict]:
    """What torchrun does with --start-method=fork after its agent asked CUDA
    (torch.accelerator.is_available(), which poisons later forks with or
    without a GPU): a child forked from a poisoned process runs
    perfsuite/rank/forked.py. Its exit code, output and rank record."""
    import json
    import subprocess

    cell = tiny(world_size=1, device=device)
    (tmp_path / "cell.json").write_text(json.dumps(cell.params()))
    script = f"""
import os, runpy, sys, torch
torch.cuda.is_available()  # the agent's question
pid = os.fork()
if pid == 0:
    sys.argv = [{str(agent.FORKED_RANK)!r}, "--cell-file", {str(tmp_path / "cell.json")!r}, "--out", {str(tmp_path)!r}]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:
        os._exit(done.code or 0)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("forked pid", pid, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29561"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    record = json.loads((tmp_path / "rank0.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, record


@pytest.mark.slow
def test_a_cuda_rank_forked_after_cuda_was_asked_runs_the_worker_in_a_fresh_interpreter(tmp_path):
    """Seen on an H200 with torch 2.11: every forked rank failed with "Cannot
    re-initialize CUDA in forked subprocess". A CUDA rank that finds itself
    poisoned runs the worker in a fresh interpreter of its own and says so
    (here without a GPU the fresh worker fails, writing its record: it ran)."""
    code, output, record = _forked_rank_after_cuda_was_asked(tmp_path, "cuda")
    assert "had initialised CUDA before it forked this rank; running it in a fresh interpreter" in output
    forked_pid = int(output.split("forked pid ")[1].split()[0])
    assert record["pid"] != forked_pid  # the record is the fresh interpreter's
    assert code == 1 and record["status"] == "error"


@pytest.mark.slow
def test_a_cpu_rank_forked_after_cuda_was_asked_trains_where_it_was_forked(tmp_path):
    code, output, record = _forked_rank_after_cuda_was_asked(tmp_path, "cpu")
    assert "fresh interpreter" not in output
    forked_pid = int(output.split("forked pid ")[1].split()[0])
    assert code == 0 and record["status"] == "ok" and record["pid"] == forked_pid


def test_the_agent_checks_cuda_through_nvml_and_the_rank_gets_the_users_environment_back():
    """PYTORCH_NVML_BASED_CUDA_CHECK=1 for the agent whose ranks fork (torch's
    own way to ask without poisoning forks), never where the user set it
    themselves, nor for an agent whose ranks exec (a fresh rank keeps the
    user's environment as it is)."""
    seen = []

    class Pool:
        def launch(self, argv, log_fd, env, python, preload, cuda):
            seen.append(env)
            return SimpleNamespace(pid=1, zygote=SimpleNamespace(startup={}))

    fork, fresh = starting.ForkStarter(sys.executable, Pool()), starting.ExecStarter(sys.executable, Pool())
    argv = [sys.executable, "-m", "torch.distributed.run"]
    assert fork.start(argv, 1, {"A": "1"}, tiny()).pid == 1
    assert seen[-1][starting.NVML_CHECK] == "1" and seen[-1][starting.NVML_CHECK_SET] == "1"
    fork.start(argv, 1, {starting.NVML_CHECK: "0"}, tiny())
    assert seen[-1][starting.NVML_CHECK] == "0" and starting.NVML_CHECK_SET not in seen[-1]
    fresh.start(argv, 1, {"A": "1"}, tiny())
    assert seen[-1] == {"A": "1"}


@pytest.mark.slow
def test_a_forked_rank_imports_nothing_to_hand_in_its_record(tmp_path):
    """What the worker does with a workload's finished record (check it against
    the results schema, write it) needs nothing its zygote did not import:
    an import there is launch time after training, in every rank (scipy's
    through perfsuite.stats.samples took ~1 s of each rank on the 2-core VM)."""
    script = f"""
import importlib, json, sys
from pathlib import Path
for name in {starting.preload_modules(tiny())!r}:
    importlib.import_module(name)
before = set(sys.modules)
from perfsuite.rank import worker
measured = {{"metrics": {{"step_time": {{"value": 0.1, "unit": "s", "samples": [0.1, 0.12]}}}},
             "steps": 2, "counters": {{"per_step": {{}}}}, "info": {{}}}}
worker.check_measured(measured, "image", {{"rank", "status"}})
worker.atomic_write_json(Path(sys.argv[1]) / "rank0.json", measured)
# the standard library's own modules aside (a codec): milliseconds
print(json.dumps(sorted(m for m in set(sys.modules) - before
                        if m.partition(".")[0] not in sys.stdlib_module_names)))
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []
