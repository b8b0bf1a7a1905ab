"""Run one cell on its ranks through torch.distributed.run, and collect them.

No launcher of our own: each cell is one ``python -m torch.distributed.run``
command line (under ``srun`` on SLURM), its processes started as
perfsuite.launch.starting says (read that first). On one node ``--standalone``
gives every cell a fresh c10d rendezvous on a free local port. The whole
process tree lives in its own session so a timeout or an interruption can end
all of it, and dies with the launcher, also one killed by SIGKILL
(perfsuite.system.lifetime, perfsuite.rank.worker.watch_launcher).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite import extras, profiling
from perfsuite.cells import Cell
from perfsuite.launch import agent, diagnose, multinode, starting, torchrun_options
from perfsuite.profiling import fallback
from perfsuite.results import aggregate, skipped_result
from perfsuite.schemas.records import CellResult
from perfsuite.system.atomic import atomic_write_json

OUTPUT_TAIL_CHARS = 8000  # a forked launch's agent adds ~2 kB of its own report after the ranks' lines
PROGRESS_EVERY_S = 30.0
STACK_DUMP_GRACE_S = 2.0
TERMINATE_GRACE_S = 10.0
LEFTOVER_GRACE_S = 3.0  # a process the launch left behind (a user's helper): SIGTERM, then SIGKILL
TRACK_EVERY_S = 1.0  # how often a running launch's processes are noted


@dataclass
class LaunchOptions:
    data_dir: Path | None = None
    options: dict[str, str] = field(default_factory=dict)  # user paths for workloads
    timeout_s: float | None = None  # overrides the cell's own timeout
    # None: profile cells get nsys where it works, torch.profiler otherwise;
    # "nsys" | "torch": every cell is profiled that way; "off": none is.
    profiler: str | None = None
    on_progress: Callable[[Cell, str], None] | None = None  # called every PROGRESS_EVERY_S
    gpus: list[int] | None = None  # this session's GPUs (CUDA_VISIBLE_DEVICES)
    nodes: multinode.Nodes = field(default_factory=lambda: multinode.Nodes())
    python: str = sys.executable  # the interpreter whose torch, torchrun and perfsuite run the cell
    env: dict[str, str] = field(default_factory=dict)  # extra variables for this launch only
    # How the processes start (perfsuite.launch.starting). rank_start "fork":
    # ranks forked from a zygote that imported torch and the workload; "exec":
    # each a fresh interpreter; None: $PERFSUITE_RANK_START, else fork. Both
    # sides of an A/B start alike. fork_agent: torchrun's agent forked from the
    # zygote (never from this launcher), else a fresh interpreter; default: not
    # $PERFSUITE_FORK_AGENT=0, read once, as the options are built.
    rank_start: str | None = None
    fork_agent: bool = field(default_factory=lambda: os.environ.get(agent.FORK_AGENT_ENV, "1") != "0")


def gpus_present() -> int:
    """The GPUs torch sees in this process (CUDA_VISIBLE_DEVICES applied)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cell_dir(out_dir: Path, cell: Cell) -> Path:
    return Path(out_dir) / "cells" / cell.id


def profiler_mode(cell: Cell, opts: LaunchOptions) -> tuple[str, str]:
    """("nsys" | "torch" | "off", why nsys was not used). nsys is the one
    resolve_nsys finds ($PERFSUITE_NSYS_BIN, PATH, NVIDIA's install folders);
    one whose install lacks its QdstrmImporter (or left only .qdstrm earlier
    in this session) gives torch.profiler from the start, the note saying
    why; $PERFSUITE_NSYS_BIN set to nothing executable raises
    NsysConfigError naming it."""
    requested = opts.profiler
    if requested is None:
        requested = "auto" if cell.profile else "off"
    return profiling.choose_profiler(requested, cuda_available=cell.device == "cuda")


def torchrun_argv(cell: Cell, directory: Path, opts: LaunchOptions, profiler: str = "off",
                  plan: multinode.Plan | None = None, rank_start: str = "exec") -> list[str]:
    """The command, as a list: no shell, nothing built from a string.

    Only options that ``opts.python``'s torchrun accepts: without its
    ``--log-line-prefix-template`` (torch 2.11) the ranks' lines keep its
    default prefix, which perfsuite.launch.diagnose reads as well.
    ``rank_start`` "fork": torchrun forks each rank and runs
    perfsuite/rank/forked.py in it."""
    args = ["--cell-file", str(directory / "cell.json"), "--out", str(directory)]
    if opts.data_dir is not None:
        args += ["--data-dir", str(opts.data_dir)]
    for key, value in sorted(opts.options.items()):
        args += ["--option", f"{key}={value}"]
    worker = ["-m", "perfsuite.rank.worker", *args]
    plan = plan or multinode.plan(cell, multinode.Nodes())
    argv = [opts.python, "-m", "torch.distributed.run", *plan.rendezvous_args(),
            f"--nproc-per-node={plan.procs_per_node}", "--max-restarts=0", "--tee=3"]
    if torchrun_options.accepted(opts.python, opts.env).accepts(torchrun_options.LINE_PREFIX_TEMPLATE):
        argv.append(f"{torchrun_options.LINE_PREFIX_TEMPLATE}={diagnose.RANK_PREFIX}")
    if rank_start == "fork" and profiler != "nsys":
        return argv + ["--start-method=fork", "--run-path", str(agent.FORKED_RANK), *args]
    if profiler == "nsys":  # each rank under its own `nsys profile`, one report per rank
        # The binary profiler_mode chose ($PERFSUITE_NSYS_BIN or PATH), by its
        # absolute path; nsys writes into directory/profile, which run_cell makes.
        target = str(directory / "profile" / profiling.RANK_OUTPUT_PATTERN)
        return argv + ["--no-python", *profiling.nsys_profile_argv([opts.python, *worker], target,
                                                                   nsys=profiling.resolve_nsys())]
    return argv + worker


def launch_marks(token: str) -> dict[str, str]:
    """What every process a launch execs carries in its environment."""
    return {"PERFSUITE_RUN_TOKEN": token, "PERFSUITE_LAUNCHER_PID": str(os.getpid())}


def _alive(process: Any) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _children(pid: int, marks: dict[str, str] | None = None,
              seen: dict[int, Any] | None = None) -> dict[int, Any]:
    """The live processes (psutil's, which tell a reused pid) of the launch whose
    agent is ``pid``: its descendants, those ``seen`` before (re-parented since),
    and with ``marks`` any whose environment carries them (one that called
    setsid) outside the launcher's other children's trees (a zygote, another
    launch), where a forked process shows its forebear's environment."""
    import psutil

    def tree(root: int) -> dict[int, Any]:
        try:
            return {p.pid: p for p in psutil.Process(root).children(recursive=True)}
        except psutil.Error:
            return {}

    found = {**{p.pid: p for p in (seen or {}).values() if _alive(p)}, **tree(pid)}
    if marks:
        others: set[int] = set()
        for child in psutil.Process().children():
            if child.pid != pid:
                others |= {child.pid, *tree(child.pid)}
        others -= {pid, *found}  # this launch's agent may be a zygote's child
        for process in psutil.process_iter():
            if process.pid in found or process.pid in others:
                continue
            try:
                environ = process.environ()
            except psutil.Error:
                continue
            if all(environ.get(k) == v for k, v in marks.items()):
                found[process.pid] = process
    for own in (os.getpid(), pid):  # the agent is ended through its session and waited for
        found.pop(own, None)
    return {k: p for k, p in found.items() if _alive(p)}


def _signal_all(processes: list[Any], sig: int, wait_s: float) -> list[Any]:
    """Send ``sig`` to each; those still alive after up to ``wait_s``."""
    import psutil

    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.Error:
            pass
    deadline = time.monotonic() + wait_s
    while True:
        processes = [p for p in processes if _alive(p)]
        if not processes or time.monotonic() >= deadline:
            return processes
        time.sleep(0.05)


def _end_process_tree(proc: subprocess.Popen, dump_stacks: bool, marks: dict[str, str] | None = None,
                      seen: dict[int, Any] | None = None) -> None:
    """Ask the ranks for their stacks, end the agent's session, then every other
    process of the launch (``_children``: a rank's helper, a grandchild, one in
    a session of its own, one deaf to SIGTERM); after every launch."""
    seen = {} if seen is None else seen
    seen.update(_children(proc.pid, seen=seen))  # before the agent ends: its tree is re-parented then
    if proc.poll() is None:
        if dump_stacks:
            _signal_all(list(seen.values()), signal.SIGUSR1, 0)
            time.sleep(STACK_DUMP_GRACE_S)
        for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
    for _ in range(3):  # a leftover may start another as it ends
        left = list(_children(proc.pid, marks, seen).values())
        if not left:
            return
        _signal_all(_signal_all(left, signal.SIGTERM, LEFTOVER_GRACE_S), signal.SIGKILL, 5.0)


def _attach_profile(result: dict[str, Any], mode: str, note: str, profile_dir: Path,
                    cell: Cell | None = None, opts: LaunchOptions | None = None) -> None:
    """nsys reports become a summary here; torch summaries came with the ranks.
    A launch whose nsys left only .qdstrm captures gets the torch.profiler
    summary of a second, profile-only launch (profiling.fallback), its own
    timings standing."""
    result["profiler"] = {"mode": mode, "note": note}
    if mode == "nsys" and result["status"] == "ok":
        try:
            result["profile"] = profiling.summarize_path(profile_dir).to_dict()
        except profiling.NsysImportError as err:
            # Later cells of this session go to torch.profiler from the start.
            profiling.remember_import_failure(str(err))
            result["profiler"]["error"] = str(err)
            if cell is not None and opts is not None:
                fallback.profile_with_torch(result, cell, opts, profile_dir, run_cell)
        except (profiling.NsysError, OSError) as err:  # the timings stand without the profile
            result["profiler"]["error"] = str(err)
    if result.get("profile"):  # readable later with `perfsuite profile DIR`
        atomic_write_json(profile_dir / "summary.json", result["profile"])


def _wait(proc: subprocess.Popen, timeout: float, cell: Cell, directory: Path,
          on_progress: Callable[[Cell, str], None] | None, seen: dict[int, Any] | None = None) -> int:
    """proc.wait(timeout), noting the launch's processes in ``seen`` (one whose
    parent ends is no one's descendant after) and telling on_progress where the ranks are."""
    watch = diagnose.ProgressWatch(directory) if on_progress is not None else None
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + PROGRESS_EVERY_S
    while True:
        try:
            return proc.wait(timeout=max(min(deadline - time.monotonic(), TRACK_EVERY_S), 0.01))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        if seen is not None:
            found = _children(proc.pid, seen=seen)
            seen.clear()
            seen.update(found)
        if watch is not None and time.monotonic() >= next_report:
            next_report += PROGRESS_EVERY_S
            line = watch.line()
            if line:
                on_progress(cell, line)


def _records(directory: Path, processes: int, token: str, wait_s: float) -> list[dict | None]:
    """This run's rank records; waits a little for ranks on other nodes."""
    deadline = time.time() + wait_s
    while True:
        records = []
        for rank in range(processes):
            path = directory / f"rank{rank}.json"
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                record = None
            records.append(record if record and record.get("run_token") == token else None)
        if all(records) or time.time() >= deadline:
            return records
        time.sleep(0.5)


def _failure(cell: Cell, directory: Path, records: list[dict | None], log_text: str,
             returncode: int | None, timed_out: bool, timeout: float,
             nnodes: int = 1) -> tuple[str, str | None, dict]:
    """(status, reason, per-rank facts) of a finished launch."""
    if timed_out:
        progress = diagnose.read_progress(directory)
        stacks = diagnose.read_stacks(directory)
        report = diagnose.hang_report(cell.processes, progress, stacks)
        facts = {r: {"progress": progress.get(r), "stack": stacks.get(r)}
                 for r in range(cell.processes)}
        return "timeout", f"no result within {timeout:.0f} s: {report}", facts
    failed = returncode != 0 or any(r is None or r.get("status") not in ("ok", "skipped") for r in records)
    if not failed:
        skipped = [(i, r.get("reason")) for i, r in enumerate(records) if r.get("status") == "skipped"]
        if skipped:  # a workload (a user's test) that skipped itself, in one rank or all
            ranks = ", ".join(str(i) for i, _ in skipped)
            return "skipped", f"rank{'s' if len(skipped) > 1 else ''} {ranks} skipped: {skipped[0][1]}", {}
        return "ok", None, {}
    reason, facts = diagnose.crash_report(log_text, records, nnodes=nnodes)
    return "error", reason, facts


def timeline(started: float, ended: float, record: dict | None,
             result: dict[str, Any]) -> dict[str, float] | None:
    """Where a launch's wall time went (seconds), from rank 0's record: the
    torchrun agent and the rank's imports, the workload's import, its set-up
    (data, model, process group: until its first training step began, where
    the record says when), training, the counting window, the rest of the
    workload (evaluation, teardown; a recipe's first step, which its step log
    leaves out of training), and the exit of the rank and the agent. The
    first three are what a launch costs before it trains."""
    if not record or not record.get("finished"):
        return None
    imported = record.get("workload_imported") or record["started"]
    info = result.get("info") or {}
    training = (((result.get("metrics") or {}).get("total_time") or {}).get("value")
                or info.get("train_s") or 0.0)  # recipes: between their first and last step log
    counting = info.get("count_window_s") or 0.0
    workload = record["finished"] - imported
    began = record.get("training_started")
    setup = min(max(began - imported, 0.0), workload) if began else 0.0
    return {"wall": ended - started, "start_and_imports": record["started"] - started,
            "workload_import": imported - record["started"], "workload_setup": setup,
            "training": training, "counting": counting,
            "workload_other": workload - setup - training - counting,
            "exit": ended - record["finished"]}


def launcher_env() -> dict[str, str]:
    """This process, for its ranks: those on this host end once it is gone,
    also when it was killed with SIGKILL (see perfsuite.rank.worker.watch_launcher).
    Its start time tells it from a later process given the same pid."""
    import psutil

    return {"PERFSUITE_LAUNCHER_PID": str(os.getpid()),
            "PERFSUITE_LAUNCHER_START": repr(psutil.Process().create_time()),
            "PERFSUITE_LAUNCHER_HOST": socket.gethostname()}


def not_runnable(cell: Cell, opts: LaunchOptions) -> CellResult | None:
    """The skipped result of a cell this machine cannot launch (a node plan
    that does not fit, GPUs it lacks), else None."""
    try:
        plan = multinode.plan(cell, opts.nodes)
    except multinode.PlanError as err:
        return skipped_result(cell, str(err))
    present = gpus_present() if cell.device == "cuda" else 0
    if cell.device == "cuda" and opts.gpus is not None:
        missing = [g for g in opts.gpus if g >= present]
        if missing:
            return skipped_result(cell, f"GPU(s) {','.join(map(str, missing))} given with --gpus "
                                        f"are not present ({present} GPU(s) here)")
        present = len(opts.gpus)
    # The GPUs the cell drives, not its processes: DataParallel ("dp") is one
    # process driving world_size GPUs, and without them it crashes on an
    # invalid device id instead of being skipped.
    needed = -(-cell.gpus_needed // plan.nnodes)
    if cell.device == "cuda" and needed > present:
        return skipped_result(cell, f"needs {needed} GPU(s){' per node' if plan.nnodes > 1 else ''}"
                                    f", {present} present", needs_gpus=(needed, present))
    return None


def run_cell(cell: Cell, out_dir: Path, opts: LaunchOptions | None = None) -> CellResult:
    """Run ``cell`` and return its result (a dict in the results schema)."""
    opts = opts or LaunchOptions()
    skipped = not_runnable(cell, opts)
    if skipped is not None:
        return skipped
    plan = multinode.plan(cell, opts.nodes)

    directory = cell_dir(out_dir, cell)
    if plan.nnodes == 1 and directory.exists():
        shutil.rmtree(directory)  # other nodes may share a multi-node cell's directory
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / "cell.json", cell.params())
    unmet = extras.workload_problem(cell.workload)
    if unmet:  # not launched: every rank would only raise this sentence, under torchrun's traceback
        (directory / plan.log_name).write_text(unmet + "\n")
        result = {**aggregate(cell, [], status="error", reason=unmet, duration_s=0.0),
                  "output_tail": unmet + "\n", "dir": str(directory)}
        atomic_write_json(directory / "result.json", result)
        return result
    profiler, profiler_note = profiler_mode(cell, opts)
    if profiler != "off":  # `nsys profile --output profile/rank<N>` creates no folder
        (directory / "profile").mkdir(exist_ok=True)
    starter, start_note = starting.choose(opts, profiler, plan)
    starter.warm(cell, {**os.environ, **opts.env})  # its zygote's imports beside what follows
    argv = plan.wrap(torchrun_argv(cell, directory, opts, profiler, plan, starter.name))
    timeout = opts.timeout_s or cell.timeout_s
    token = plan.run_token
    env = {**os.environ, **opts.env, "PYTHONUNBUFFERED": "1", "PERFSUITE_PROFILER": profiler,
           "PERFSUITE_PROFILE_DIR": str(directory / "profile"), "PERFSUITE_RUN_TOKEN": token,
           **launcher_env()}
    if opts.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, opts.gpus))
    # The cores split between the node's ranks with one left for the agent and
    # the launcher, for 1 rank as for N, unless the user chose: on 2 cores a
    # 1-rank cell on 2 threads ran from 69 to 126 ms a step from run to run (its
    # OpenMP threads wait on each other whenever the agent runs), on 1 103-110 ms.
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, (cores - 1) // plan.procs_per_node)))
    log_path = directory / plan.log_name
    started = time.time()
    timed_out = False
    with open(log_path, "wb") as log:
        try:
            proc = starter.start(argv, log.fileno(), env, cell)
        except starting.ZygoteError as err:  # the ranks start as fresh interpreters
            starter, start_note = starting.fallback(starter, err)
            argv = plan.wrap(torchrun_argv(cell, directory, opts, profiler, plan, starter.name))
            proc = starter.start(argv, log.fileno(), env, cell)
        seen: dict[int, Any] = {}
        try:
            returncode = _wait(proc, timeout, cell, directory, opts.on_progress, seen)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end_process_tree(proc, dump_stacks=True, seen=seen)
            returncode = proc.returncode
        finally:  # passed, failed, timed out or interrupted: no process of the launch outlives it
            _end_process_tree(proc, dump_stacks=False, marks=launch_marks(token), seen=seen)
        if returncode and not timed_out:  # where torchrun's own output names no exit code
            os.write(log.fileno(), diagnose.agent_exit_line(returncode).encode())
    records = _records(directory, cell.processes, token,
                       wait_s=plan.record_wait_s if returncode == 0 else 0)
    if plan.partner_of(records, proc.pid):
        return skipped_result(cell, plan.partner_reason(records), partner=True)
    log_text = log_path.read_text(errors="replace")
    status, reason, facts = _failure(cell, directory, records, log_text, returncode,
                                     timed_out, timeout, nnodes=plan.nnodes)
    result = aggregate(cell, records, status=status, reason=reason,
                       duration_s=time.time() - started)
    for rank, extra in facts.items():
        if rank < len(result["ranks"]):
            result["ranks"][rank].update(extra)
    if status != "ok":
        result["output_tail"] = log_text[-OUTPUT_TAIL_CHARS:]
    result["argv"] = argv
    result["dir"] = str(directory)
    result["info"] = {**(result.get("info") or {}), **starting.info(starter, start_note)}
    result["timeline"] = timeline(started, time.time(), records[0] if records else None, result)
    if profiler != "off":
        _attach_profile(result, profiler, profiler_note, directory / "profile", cell, opts)
    atomic_write_json(directory / "result.json", result)
    return result
