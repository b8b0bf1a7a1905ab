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
import sys
import time
import traceback
from pathlib import Path

from perfsuite.cells import Cell
from perfsuite.context import RankContext
from perfsuite.fsutil import atomic_write_json

RECORD_SCHEMA = "perfsuite.rank/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="perfsuite.worker")
    parser.add_argument("--cell-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # A launcher that finds a rank stuck sends SIGUSR1 first: every thread's
    # Python stack goes to stderr, which the launcher keeps with the result.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = parse_args(argv)
    cell = Cell.from_params(json.loads(args.cell_file.read_text()))
    options = dict(opt.split("=", 1) for opt in args.option)
    ctx = RankContext.from_env(cell.device, args.out, args.data_dir, options)
    record: dict = {"schema": RECORD_SCHEMA, "cell": cell.id, "rank": ctx.rank,
                    "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                    "device": ctx.device, "pid": os.getpid(), "started": time.time()}
    status = 0
    try:
        if ctx.rank == 0:
            from perfsuite.hardware import fingerprint
            record["env"] = fingerprint()
        workload = importlib.import_module(f"perfsuite.workloads.{cell.workload}")
        record.update(workload.run(cell, ctx))
        record["status"] = "ok"
    except BaseException as err:  # noqa: BLE001 - the record must say what happened
        record["status"] = "error"
        record["error"] = {"type": type(err).__name__, "message": str(err),
                           "traceback": traceback.format_exc()}
        status = 1
    record["finished"] = time.time()
    atomic_write_json(args.out / f"rank{ctx.rank}.json", record)
    if status:
        print(record["error"]["traceback"], file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
