"""How a launch's ranks start: forked from a zygote that imported torch and
the workload once, or each a fresh interpreter.

A fresh rank spends its first seconds importing (on the 2-core VM torch
2.5 s, then torchvision and the optimiser's ``torch._dynamo`` 2.2 s; on an
H100 host 5.4 s and 6.6 s were seen), and every launch pays them again. On one
node without a wrapper, torchrun's own agent is forked from a zygote
(perfsuite.launch.zygote, one per interpreter, directory and environment) and
told to fork its ranks (``--start-method=fork --run-path
perfsuite/rank/forked.py``): torchrun's rendezvous, rank processes and tee
stay its own. ``rank_start="exec"`` (``--rank-start exec``,
``$PERFSUITE_RANK_START=exec``) starts every rank fresh; so does a launch
across nodes, under ``srun`` or under ``nsys``. A result's ``info.rank_start``
says which ran, and ``info.rank_start_note`` why not fork where fork was asked.
"""

from __future__ import annotations

import os
import subprocess
import sys

from perfsuite import specs
from perfsuite.cells import Cell
from perfsuite.launch import agent, multinode
from perfsuite.options import RANK_STARTS
from perfsuite.system.lifetime import die_with_me

# What every rank imports, whatever its workload: torch, the optimiser's
# torch._dynamo, torchrun's agent, the worker, and the results schema with the
# jsonschema it checks a record with once the workload returns (imported there,
# they were launch time after training in every rank).
PRELOAD = ["torch", "torch._dynamo", "torch.distributed.run", "perfsuite.rank.worker", "perfsuite.results",
           "jsonschema"]
# torchrun's agent asks torch.accelerator.is_available() as it reads its
# options (LaunchConfig, torch 2.9+), and on a GPU host that poisons every
# fork after it: a forked rank then cannot start CUDA. Set for the agent, the
# check reads NVML instead, which poisons nothing; perfsuite/rank/forked.py
# takes it out of the rank's environment again where perfsuite put it there.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
NVML_CHECK_SET = "PERFSUITE_NVML_CHECK_SET"


# What a built-in workload's ranks import while they run, beyond its module:
# the LLM recipes' datasets.load_dataset imports scipy.io (0.2-0.3 s a rank on
# the 2-core VM, every launch), the QAT recipes torchao's QAT (~0.35 s).
WORKLOAD_PRELOAD = {"llm": ["scipy.io", "torchao.prototype.qat", "perfsuite.profiling"]}


def preload_modules(cell: Cell) -> list[str]:
    """What a zygote imports for ``cell``'s ranks: PRELOAD, a built-in
    workload's module and what it imports as it runs. Never a workload of
    the user's own: it may change between launches (``perfsuite bisect``
    walks its commits), and a rank imports it after the fork as a fresh one
    would."""
    if cell.workload not in specs.BUILTIN:
        return list(PRELOAD)
    return [*PRELOAD, specs.BUILTIN[cell.workload].partition(":")[0], *WORKLOAD_PRELOAD.get(cell.workload, [])]


def rank_start(asked: str | None, profiler: str, plan: multinode.Plan) -> tuple[str, str | None]:
    """("fork" | "exec", why not fork where fork was asked). ``asked``: the
    launch's choice, else $PERFSUITE_RANK_START, else fork."""
    asked = asked or os.environ.get(agent.RANK_START_ENV) or "fork"
    if asked not in RANK_STARTS:
        raise ValueError(f"rank start {asked!r}: use 'fork' or 'exec'")
    if asked == "exec":
        return "exec", None
    if not sys.platform.startswith("linux"):
        return "exec", "ranks fork on Linux only"
    if plan.nnodes > 1 or plan.wrap(["python"]) != ["python"]:
        return "exec", "ranks fork on one node without a wrapper (srun) only"
    if profiler == "nsys":
        return "exec", "each rank runs under its own nsys profile"
    return "fork", None


def _with_nvml_check(env: dict[str, str]) -> dict[str, str]:
    return env if NVML_CHECK in env else {**env, NVML_CHECK: "1", NVML_CHECK_SET: "1"}


def warm_zygote(cell: Cell, start: str, python: str, env: dict[str, str]) -> None:
    """Where ``cell``'s ranks will fork, start their zygote now, in the
    background (agent.warm), while the launcher builds the launch: on the
    2-core VM its imports then ran beside the launcher's own. ``env``: the
    launch's, but for what each launch sets anew (agent.PER_LAUNCH_ENV,
    PERFSUITE_*), which zygotes do not tell apart."""
    if start == "fork" and agent.may_fork_agent():
        agent.warm(python, _with_nvml_check(env), preload_modules(cell), cuda=cell.device == "cuda")


def start_agent(argv: list[str], log_fd: int, env: dict[str, str], start: str, cell: Cell, opts):
    """The launch's torchrun agent (a Popen-like object): forked from a zygote
    where the ranks fork (raises agent.ZygoteError where there is none), else
    forked from this process where ``opts.fork_agent`` allows it, else a
    fresh interpreter ($PERFSUITE_FORK_AGENT=0: always; its ranks then fork
    from it where they fork, with torch imported but not the workload)."""
    if start == "fork":
        env = _with_nvml_check(env)
    if start == "fork" and agent.may_fork_agent():
        return agent.start_forked(argv, log_fd, env, opts.python, preload_modules(cell),
                                  cuda=cell.device == "cuda")
    if opts.fork_agent and agent.can_fork(argv):  # the agent without a fresh interpreter's imports
        return agent.ForkedAgent(argv, log_fd, env)
    return subprocess.Popen(argv, stdout=log_fd, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=die_with_me())
