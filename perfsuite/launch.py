"""Run one cell on its ranks through torch.distributed.run, and collect them.

No launcher of our own: each cell is one ``python -m torch.distributed.run``
invocation. ``--standalone`` gives every cell a fresh c10d rendezvous on a
free local port, so cells (and two suite runs on one machine) never share a
port. The whole process tree lives in its own session so a timeout can end
all of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.cells import Cell
from perfsuite.fsutil import atomic_write_json
from perfsuite.results import aggregate, skipped_result

OUTPUT_TAIL_CHARS = 4000
STACK_DUMP_GRACE_S = 2.0
TERMINATE_GRACE_S = 10.0


@dataclass
class LaunchOptions:
    data_dir: Path | None = None
    options: dict[str, str] = field(default_factory=dict)  # user paths for workloads
    timeout_s: float | None = None  # overrides the cell's own timeout
    # None: profile cells get nsys where it works, torch.profiler otherwise;
    # "nsys" | "torch": every cell is profiled that way; "off": none is.
    profiler: str | None = None
    python: str = sys.executable


def gpus_present() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cell_dir(out_dir: Path, cell: Cell) -> Path:
    return Path(out_dir) / "cells" / cell.id


def profiler_mode(cell: Cell, opts: LaunchOptions) -> tuple[str, str]:
    """("nsys" | "torch" | "off", why nsys was not used)."""
    from perfsuite.profiling import choose_profiler

    requested = opts.profiler
    if requested is None:
        requested = "auto" if cell.profile else "off"
    return choose_profiler(requested, cuda_available=cell.device == "cuda")


def torchrun_argv(cell: Cell, directory: Path, opts: LaunchOptions,
                  profiler: str = "off") -> list[str]:
    """The command, as a list: no shell, nothing built from a string."""
    worker = ["-m", "perfsuite.worker", "--cell-file", str(directory / "cell.json"),
              "--out", str(directory)]
    if opts.data_dir is not None:
        worker += ["--data-dir", str(opts.data_dir)]
    for key, value in sorted(opts.options.items()):
        worker += ["--option", f"{key}={value}"]
    argv = [opts.python, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={cell.processes}", "--max-restarts=0"]
    if profiler == "nsys":  # each rank under its own `nsys profile`, one report per rank
        from perfsuite.profiling import RANK_OUTPUT_PATTERN, nsys_profile_argv

        target = str(directory / "profile" / RANK_OUTPUT_PATTERN)
        return argv + ["--no-python", *nsys_profile_argv([opts.python, *worker], target)]
    return argv + worker


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - the process may be gone already
        return []


def _end_process_tree(proc: subprocess.Popen, dump_stacks: bool) -> None:
    """Ask the ranks for their stacks, then end the whole session."""
    if dump_stacks:
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(STACK_DUMP_GRACE_S)
    for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-OUTPUT_TAIL_CHARS:]


def _attach_profile(result: dict[str, Any], mode: str, note: str, profile_dir: Path) -> None:
    """nsys reports become a summary here; torch summaries came with the ranks."""
    result["profiler"] = {"mode": mode, "note": note}
    if mode == "nsys" and result["status"] == "ok":
        from perfsuite.profiling import NsysError, summarize_path

        try:
            result["profile"] = summarize_path(profile_dir).to_dict()
        except (NsysError, OSError) as err:  # the timings stand without the profile
            result["profiler"]["error"] = str(err)
    if result.get("profile"):  # readable later with `perfsuite profile DIR`
        atomic_write_json(profile_dir / "summary.json", result["profile"])


def run_cell(cell: Cell, out_dir: Path, opts: LaunchOptions | None = None) -> dict[str, Any]:
    """Run ``cell`` and return its result (a dict in the results schema)."""
    opts = opts or LaunchOptions()
    present = gpus_present() if cell.device == "cuda" else 0
    if cell.gpus_needed > present:
        return skipped_result(cell, f"needs {cell.gpus_needed} GPU(s), {present} present")

    directory = cell_dir(out_dir, cell)
    if directory.exists():  # stale rank records must never be read as this run's
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    atomic_write_json(directory / "cell.json", cell.params())
    profiler, profiler_note = profiler_mode(cell, opts)
    argv = torchrun_argv(cell, directory, opts, profiler)
    timeout = opts.timeout_s or cell.timeout_s
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PERFSUITE_PROFILER": profiler,
           "PERFSUITE_PROFILE_DIR": str(directory / "profile")}
    log_path = directory / "output.log"
    started = time.time()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end_process_tree(proc, dump_stacks=True)
            returncode = proc.returncode
        except BaseException:  # Ctrl-C: leave no rank behind, then let it propagate
            _end_process_tree(proc, dump_stacks=False)
            raise
    records = []
    for rank in range(cell.processes):
        path = directory / f"rank{rank}.json"
        records.append(json.loads(path.read_text()) if path.exists() else None)
    result = aggregate(cell, records, returncode=returncode, timed_out=timed_out,
                       timeout_s=timeout, output_tail=_tail(log_path),
                       duration_s=time.time() - started)
    result["argv"] = argv
    result["dir"] = str(directory)
    if profiler != "off":
        _attach_profile(result, profiler, profiler_note, directory / "profile")
    atomic_write_json(directory / "result.json", result)
    return result
