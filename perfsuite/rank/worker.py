"""One rank of a cell: the module torch.distributed.run starts.

    python -m torch.distributed.run ... -m perfsuite.rank.worker --cell-file F --out DIR

It runs the cell's workload and writes ``rank<N>.json`` (a rank record) into
the cell directory, also when the workload fails, so the launcher can report
which rank failed and why. The workload is whatever the cell's spec names,
found by one resolver (``perfsuite.specs``): a built-in name, a
``module:function``, an entry point of ``perfsuite.workloads``, or a pytest
test run here (``perfsuite.plugin.ranktest``).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.cells import Cell
from perfsuite.context import RankContext
from perfsuite.rank.peers import is_peer_failure
from perfsuite.schemas.records import RankRecord
from perfsuite.schemas.results import metrics_problem
from perfsuite.specs import resolve
from perfsuite.system.atomic import atomic_write_json
from perfsuite.system.lifetime import die_with_parent

RECORD_SCHEMA = "perfsuite.rank/1"
LAUNCHER_POLL_S = 0.5
# A rank whose collective failed because a peer went away exits this much
# later than it could: torchrun's agent (polling every 0.1 s) then finds the
# peer's failure first and reports it, with its signal, as the root cause;
# it reports only the first failure it finds. Forked ranks end fast enough to
# beat the peer's report without it.
PEER_FAILURE_GRACE_S = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="perfsuite.rank.worker")
    parser.add_argument("--cell-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    return parser.parse_args(argv)


def _oom_facts(err: BaseException, ctx: RankContext) -> dict:
    """For CUDA out-of-memory: say so, with the peak reached before it."""
    import torch

    if not isinstance(err, torch.OutOfMemoryError) or not ctx.device.startswith("cuda"):
        return {}
    return {"oom": True,
            "peak_mem_allocated": torch.cuda.max_memory_allocated(ctx.device),
            "peak_mem_reserved": torch.cuda.max_memory_reserved(ctx.device),
            "device_memory": torch.cuda.get_device_properties(ctx.device).total_memory}


def _launcher(pid: int, started: float):
    """psutil's Process of the launcher ``pid`` started at ``started`` (its
    create_time); None when it is gone: no such pid, a zombie (a launcher
    killed and not yet reaped), or a process started at another time (one
    given the launcher's pid since)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.Error:
        pass
    return None


def _watch(proc) -> None:
    import psutil

    while True:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(LAUNCHER_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def watch_launcher(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """End this rank with SIGKILL once its launcher is gone; the watching thread.

    The parent-death signal ends a rank with its torchrun agent, and the agent
    with the launcher; a rank under ``nsys profile`` has nsys for its parent,
    which lives on. The launcher's pid and start time come from the launch's
    environment (``perfsuite.launch.launch.launcher_env``): None (no watching) for a
    rank started by hand, and on a node other than the launcher's, where its
    pid names nothing. The thread sleeps between two looks at /proc (tens of
    microseconds, the GIL held for no longer): no busy loop next to the steps
    it would slow down. A rank stuck in native code that holds the GIL is not
    seen to; the parent-death signal still is.
    """
    env = os.environ if environ is None else environ
    try:
        pid, started = int(env["PERFSUITE_LAUNCHER_PID"]), float(env["PERFSUITE_LAUNCHER_START"])
    except (KeyError, ValueError):
        return None
    if env.get("PERFSUITE_LAUNCHER_HOST") != socket.gethostname():
        return None
    launcher = _launcher(pid, started)
    if launcher is None:
        os.kill(os.getpid(), signal.SIGKILL)
    # From here on psutil tells that very process by its pid and its start in
    # ticks since boot, which a change of the clock leaves alone.
    thread = threading.Thread(target=_watch, args=(launcher,), daemon=True,
                              name="perfsuite-launcher-watch")
    thread.start()
    return thread


class RankBreakpoint(RuntimeError):
    """``breakpoint()`` in a rank, where no debugger can read a command."""


def rank_breakpoint(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` in a rank: Python's own where $PYTHONBREAKPOINT
    chooses (a debugger listening on a socket, or 0 for none); else a
    sentence, where pdb would read end of file from the rank's standard input
    (/dev/null, forked or exec'd) and end in an empty BdbQuit."""
    if os.environ.get("PYTHONBREAKPOINT"):
        return sys.__breakpointhook__(*args, **kwargs)
    raise RankBreakpoint(
        f"breakpoint() in rank {os.environ.get('RANK', '?')}: a rank's standard input is /dev/null, so pdb "
        "cannot read a command there; set PYTHONBREAKPOINT to a debugger that listens on a socket (a remote "
        "pdb), or PYTHONBREAKPOINT=0 to pass over breakpoints, or take the breakpoint() out")


def skip_reason(err: BaseException) -> str | None:
    """The reason of a ``pytest.skip`` (or of ``pytest.xfail``) raised by the
    workload, else None; pytest itself need not be imported to tell."""
    kind = type(err)  # pytest's Skipped says its module is builtins; its base does not
    pytest_outcome = any(c.__module__ == "_pytest.outcomes" and c.__name__ == "OutcomeException"
                         for c in kind.__mro__)
    if pytest_outcome and kind.__name__ in ("Skipped", "XFailed"):
        return getattr(err, "msg", None) or str(err) or kind.__name__
    return None


def _end_process_group() -> None:
    """A workload that left its process group up (one's own may): every rank
    gets here, so they meet once more and end it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class WorkloadRecordError(TypeError):
    """A workload returned a record the results cannot take; the message names the field."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_measured(measured: dict, workload: str, taken: set[str]) -> None:
    """What a workload returned, checked where it is made: ``metrics`` name ->
    {value: number, unit: str, samples: [numbers]}, ``steps`` a count,
    ``counters``/``info``/``profile`` mappings, everything JSON; none of the
    record's own keys. Raises WorkloadRecordError naming the field."""
    def bad(field: str, why: str) -> WorkloadRecordError:
        return WorkloadRecordError(f"workload {workload!r} returned a record whose {field} {why} "
                                   "(perfsuite.steps.Steps.record() makes one; docs/how-to/own-workload.md)")

    for key in sorted(set(measured) & taken):
        raise bad(key, "is the worker's own field; leave it out")
    metrics = measured.get("metrics", {})
    if not isinstance(metrics, Mapping):
        raise bad("metrics", f"is a {type(metrics).__name__}, not a mapping of metric names")
    for name, entry in metrics.items():
        if not isinstance(entry, Mapping):
            raise bad(f"metrics.{name}", f"is {entry!r}, not {{'value': number, 'unit': str}}")
        value = entry.get("value")
        if not (_number(value) or (isinstance(value, float) and math.isnan(value))):
            raise bad(f"metrics.{name}.value", f"is {value!r}, not a number")
        samples = entry.get("samples", [])
        if not isinstance(samples, list) or not all(_number(s) for s in samples):
            raise bad(f"metrics.{name}.samples", "is not a list of finite numbers")
    refused = metrics_problem(dict(metrics))  # what results.json would then refuse
    if refused:
        where, _, why = refused.partition(": ")
        raise bad(where.replace("/", "."), why)
    steps = measured.get("steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise bad("steps", f"is {steps!r}, not a count of steps")
    for key in ("counters", "info", "profile"):
        if measured.get(key) is not None and not isinstance(measured[key], Mapping):
            raise bad(key, f"is a {type(measured[key]).__name__}, not a mapping")
    for key, value in measured.items():
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as err:
            raise bad(key, f"cannot be written as JSON ({err})") from None


def main(argv: list[str] | None = None) -> int:
    # First of all, before torch's seconds of imports: a rank ends with its
    # torchrun agent (or nsys), and with the launcher even where that is not
    # its parent. (Its parent now is the one that started it but for one gone
    # during these milliseconds since exec; the watchdog sees to that case.)
    die_with_parent(os.getppid())
    watch_launcher()
    sys.breakpointhook = rank_breakpoint
    # Imported here, not at the top: perfsuite.rank.meter imports torch (after the
    # two lines above), and perfsuite.hardware (~20 ms) is rank 0's alone.
    from perfsuite.rank.meter import Progress

    args = parse_args(argv)
    cell = Cell.from_params(json.loads(args.cell_file.read_text()))
    options = dict(opt.split("=", 1) for opt in args.option)
    ctx = RankContext.from_env(cell.device, args.out, args.data_dir, options)
    # A launcher that finds a cell stuck sends SIGUSR1 first: every thread's
    # Python stack goes to this rank's file, which becomes part of the result.
    stacks = open(args.out / f"stacks-rank{ctx.rank}.txt", "w")  # noqa: SIM115 - lives with the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    ctx.progress = Progress(args.out / f"progress-rank{ctx.rank}")
    ctx.report_progress(0, "start")
    record: RankRecord = {"schema": RECORD_SCHEMA, "cell": cell.id, "rank": ctx.rank,
                    "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                    "device": ctx.device, "pid": os.getpid(), "started": time.time(),
                    # which torchrun agent ran this rank, and for which launch
                    "agent_pid": os.getppid(), "host": socket.gethostname(),
                    "launcher": {"host": os.environ.get("PERFSUITE_LAUNCHER_HOST"),  # owner of the
                                 "pid": os.environ.get("PERFSUITE_LAUNCHER_PID")},  # result (multinode)
                    "run_token": os.environ.get("PERFSUITE_RUN_TOKEN")}
    status = 0
    try:
        if ctx.rank == 0:
            from perfsuite.hardware import fingerprint
            record["env"] = fingerprint()
        run = resolve(cell.workload, importlib.import_module)
        record["workload_imported"] = time.time()
        measured = run(cell, ctx)
        if not isinstance(measured, dict):
            raise TypeError(f"workload {cell.workload!r} returned {type(measured).__name__}, not "
                            "its record (a dict: metrics, steps, ...; perfsuite.steps.Steps.record())")
        check_measured(measured, cell.workload, {*record, "status", "reason", "error", "finished"})
        record.update(measured)
        # the workload's own set-up ends here: reported steps, else what it says
        record["training_started"] = (ctx.progress.training_started()
                                      or (measured.get("info") or {}).get("training_started"))
        _end_process_group()
        record["status"] = "ok"
    except BaseException as err:  # noqa: BLE001 - the record must say what happened
        skipped = skip_reason(err)
        if skipped is not None:  # the workload's own pytest.skip: not a failure
            record["status"], record["reason"] = "skipped", skipped
            record["finished"] = time.time()
            atomic_write_json(args.out / f"rank{ctx.rank}.json", record)
            return 0
        record["status"] = "error"
        record["error"] = {"type": type(err).__name__, "message": str(err),
                           "traceback": traceback.format_exc(), **_oom_facts(err, ctx)}
        status = 1
    record["finished"] = time.time()
    atomic_write_json(args.out / f"rank{ctx.rank}.json", record)
    if status:
        print(record["error"]["traceback"], file=sys.stderr, flush=True)
        if is_peer_failure(record["error"]["message"]):
            time.sleep(PEER_FAILURE_GRACE_S)
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The record is written and the process group destroyed: skip the
    # interpreter's finalisation (tearing down torch's modules), which is
    # pure launch overhead: ~1 s of every launch on the 2-core machine. So
    # no atexit handler runs, and threads and children the workload left are
    # not waited for; a forked rank ends alike (perfsuite/rank/forked.py).
    os._exit(code)
