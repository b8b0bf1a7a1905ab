"""How a launch starts its processes: read this file first.

    launcher (pytest, perfsuite run, perfsuite ab's threads; never forks itself)
      |-- execs --> zygote (perfsuite/launch/zygote.py; one per interpreter, directory and
      |               |      environment: imports torch, torchrun and the workload once)
      |               '-- forks --> torchrun's agent (torchrun's own main, on the launch's argv)
      |                               |-- fork: forks --> ranks (perfsuite/rank/forked.py)
      |                               '-- exec: execs --> ranks (python -m perfsuite.rank.worker)
      '-- execs --> torchrun's agent, a fresh interpreter, where there is no zygote
                      (srun, not Linux, $PERFSUITE_FORK_AGENT=0, the zygote failed)
                      '-- execs (fork: forks) --> ranks

One interface, ``Starter``: ``start(argv, log_fd, env, cell)`` returns the
agent (a Popen-like process: pid, poll, wait, returncode) in a session of its
own that dies with the launcher. Two of them: ``ForkStarter`` (ranks forked
from the zygote's imports: seconds less a launch) and ``ExecStarter`` (each
rank a fresh interpreter, as torchrun starts them). ``choose`` picks one from
the launch's options, in one place; the zygotes are held by one pool
(perfsuite.launch.agent.POOL), which a starter is handed.

What runs once and what per rank (docs/explanation/launching.md): a forked
rank inherits what the zygote ran at start-up and import (a sitecustomize,
a .pth hook, module-level code) and runs none of it again; code there that
reads RANK or LOCAL_RANK saw none. ``--rank-start exec``
(``$PERFSUITE_RANK_START=exec``) gives every rank a fresh interpreter. A
result's ``info.rank_start`` says which ran, ``info.rank_start_means`` what
that means, ``info.rank_start_note`` why not fork where fork was asked, and
``info.ran_once`` the start-up modules the zygote ran for every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Protocol

from perfsuite import specs
from perfsuite.cells import Cell
from perfsuite.launch import agent, multinode
from perfsuite.launch.agent import NVML_CHECK, NVML_CHECK_SET, ZygoteError, ZygotePool  # noqa: F401
from perfsuite.options import RANK_STARTS
from perfsuite.system.lifetime import die_with_me

# What every rank imports, whatever its workload: torch, the optimiser's
# torch._dynamo, torchrun's agent, the worker, and the results schema with the
# jsonschema it checks a record with once the workload returns (imported there,
# they were launch time after training in every rank).
PRELOAD = ["torch", "torch._dynamo", "torch.distributed.run", "perfsuite.rank.worker", "perfsuite.schemas.results",
           "jsonschema"]
AGENT_PRELOAD = ["torch", "torch.distributed.run"]  # what an agent whose ranks exec needs
# What a built-in workload's ranks import while they run, beyond its module:
# the LLM recipes' datasets.load_dataset imports scipy.io (0.2-0.3 s a rank on
# the 2-core VM, every launch), the QAT recipes torchao's QAT (~0.35 s).
WORKLOAD_PRELOAD = {"llm": ["scipy.io", "torchao.prototype.qat", "perfsuite.profiling"]}
MEANS = {
    "fork": "each rank forked from a zygote that imported torch and the workload once: start-up code "
            "(sitecustomize, .pth, module level) ran there, before any rank, without RANK; "
            "--rank-start exec gives fresh interpreters",
    "exec": "each rank a fresh interpreter: start-up code (sitecustomize, .pth, module level) ran in every "
            "rank, with its RANK",
}


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


class Process(Protocol):
    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Starter(Protocol):
    name: str  # "fork" | "exec": the result's info.rank_start
    python: str  # the launch's interpreter
    ran_once: dict[str, str]  # start-up modules run once for every rank (sitecustomize), once started

    def warm(self, cell: Cell, env: dict[str, str]) -> None:
        """Start what ``start`` will need (a zygote) in the background."""

    def start(self, argv: list[str], log_fd: int, env: dict[str, str], cell: Cell) -> Process:
        """torchrun's agent on ``argv``, writing to ``log_fd``, in ``env``."""


def fresh_agent(argv: list[str], log_fd: int, env: dict[str, str]) -> subprocess.Popen:
    """torchrun's agent as a fresh interpreter (or srun), in a session of its
    own (a timeout or Ctrl-C ends its tree), dying with the launcher. Its
    standard input, and so every rank's, is /dev/null, as a zygote's agent's
    is: never the launcher's terminal."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=die_with_me())


class ExecStarter:
    """Every rank a fresh interpreter, as torchrun starts them. The agent is
    forked from the pool's zygote (torchrun imported once: ~2 s less a
    launch on the 2-core VM) where there is one and the command line is this
    interpreter's plain torchrun, else a fresh interpreter."""

    name = "exec"

    def __init__(self, python: str, pool: ZygotePool | None = None) -> None:
        self.python, self.pool, self.ran_once = python, pool, {}

    def warm(self, cell: Cell, env: dict[str, str]) -> None:
        if self.pool is not None:
            self.pool.warm(self.python, env, AGENT_PRELOAD, cuda=False)

    def start(self, argv: list[str], log_fd: int, env: dict[str, str], cell: Cell) -> Process:
        if self.pool is not None and argv[:3] == [self.python, *agent.TORCHRUN]:
            try:  # its ranks exec: a zygote that touched CUDA serves as well
                return self.pool.launch(argv, log_fd, env, self.python, AGENT_PRELOAD, cuda=False)
            except ZygoteError:
                pass  # the pool remembers why; the agent starts as torchrun's would
        return fresh_agent(argv, log_fd, env)


class ForkStarter:
    """Ranks forked by torchrun's agent (``--start-method=fork --run-path
    perfsuite/rank/forked.py``), itself forked from the pool's zygote, which
    imported torch and the cell's built-in workload once. Raises ZygoteError
    where there is no zygote (the launch then falls back: ``fallback``).
    Without a pool ($PERFSUITE_FORK_AGENT=0) the agent is a fresh
    interpreter and the ranks fork from it, torch imported but not the workload."""

    name = "fork"

    def __init__(self, python: str, pool: ZygotePool | None = None) -> None:
        self.python, self.pool, self.ran_once = python, pool, {}

    def warm(self, cell: Cell, env: dict[str, str]) -> None:
        if self.pool is not None:
            self.pool.warm(self.python, env, preload_modules(cell), cuda=cell.device == "cuda")

    def start(self, argv: list[str], log_fd: int, env: dict[str, str], cell: Cell) -> Process:
        env = agent.with_nvml_check(env)
        if self.pool is None:
            return fresh_agent(argv, log_fd, env)
        proc = self.pool.launch(argv, log_fd, env, self.python, preload_modules(cell), cuda=cell.device == "cuda")
        self.ran_once = dict(proc.zygote.startup)
        return proc


def choose(opts: Any, profiler: str, plan: multinode.Plan,
           pool: ZygotePool | None = None) -> tuple[Starter, str | None]:
    """The launch's starter, and why its ranks do not fork where fork was
    asked: the one place a launch's processes are decided. ``opts``: its
    LaunchOptions (rank_start, fork_agent, python); ``pool``: the zygotes
    (default: this launcher's, agent.POOL), none where its agent is not to be
    forked (``opts.fork_agent`` false) or off Linux."""
    start, note = rank_start(opts.rank_start, profiler, plan)
    forks = opts.fork_agent and sys.platform.startswith("linux")
    pool = (pool or agent.POOL) if forks else None
    return (ForkStarter if start == "fork" else ExecStarter)(opts.python, pool), note


def fallback(starter: Starter, err: ZygoteError) -> tuple[Starter, str]:
    """After a ForkStarter found no zygote: fresh interpreters, the agent's too."""
    return ExecStarter(starter.python), str(err)


def info(starter: Starter, note: str | None) -> dict[str, Any]:
    """What a launch's result says of its start: which ran (``rank_start``),
    what that means for code run at start-up and import (``rank_start_means``),
    why not fork where fork was asked (``rank_start_note``), and the start-up
    modules its zygote ran once for every rank (``ran_once``, a sitecustomize
    by its file)."""
    return {"rank_start": starter.name, "rank_start_means": MEANS[starter.name],
            **({"rank_start_note": note} if note else {}), **({"ran_once": starter.ran_once} if starter.ran_once else {})}


def start_here(pool: ZygotePool | None = None) -> str:
    """Which rank start a plain one-node launch of this interpreter gets here
    (``perfsuite doctor``'s), and what it means: exec where asked
    ($PERFSUITE_RANK_START), off Linux, or where its zygote failed (after the
    launch: ``pool``'s, by default this launcher's)."""
    start, note = os.environ.get(agent.RANK_START_ENV) or "fork", None
    if start == "fork" and not sys.platform.startswith("linux"):
        start, note = "exec", "ranks fork on Linux only"
    failed = (pool or agent.POOL).failed.get(ZygotePool.key(sys.executable, dict(os.environ)))
    if start == "fork" and failed:
        start, note = "exec", failed
    return f"ranks start by {start}: {MEANS.get(start, start)}{f' ({note})' if note else ''}"
