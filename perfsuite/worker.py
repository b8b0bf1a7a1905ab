"""One rank of a cell: the module torch.distributed.run starts.

    python -m torch.distributed.run ... -m perfsuite.worker --cell-file F --out DIR

It runs the cell's workload and writes ``rank<N>.json`` (a rank record) into
the cell directory, also when the workload fails, so the launcher can report
which rank failed and why.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from perfsuite.cells import Cell
from perfsuite.context import RankContext
from perfsuite.fsutil import atomic_write_json
from perfsuite.meter import Progress

RECORD_SCHEMA = "perfsuite.rank/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="perfsuite.worker")
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


def main(argv: list[str] | None = None) -> int:
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
    record: dict = {"schema": RECORD_SCHEMA, "cell": cell.id, "rank": ctx.rank,
                    "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                    "device": ctx.device, "pid": os.getpid(), "started": time.time(),
                    # which torchrun agent ran this rank, and for which launch
                    "agent_pid": os.getppid(), "host": socket.gethostname(),
                    "run_token": os.environ.get("PERFSUITE_RUN_TOKEN")}
    status = 0
    try:
        if ctx.rank == 0:
            from perfsuite.hardware import fingerprint
            record["env"] = fingerprint()
        workload = importlib.import_module(f"perfsuite.workloads.{cell.workload}")
        record["workload_imported"] = time.time()
        record.update(workload.run(cell, ctx))
        record["status"] = "ok"
    except BaseException as err:  # noqa: BLE001 - the record must say what happened
        record["status"] = "error"
        record["error"] = {"type": type(err).__name__, "message": str(err),
                           "traceback": traceback.format_exc(), **_oom_facts(err, ctx)}
        status = 1
    record["finished"] = time.time()
    atomic_write_json(args.out / f"rank{ctx.rank}.json", record)
    if status:
        print(record["error"]["traceback"], file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The record is written and the process group destroyed: skip the
    # interpreter's finalisation (tearing down torch's modules), which is
    # pure launch overhead: ~1 s of every launch on the 2-core machine.
    os._exit(code)
