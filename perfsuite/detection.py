"""Detection power of the suite's step-time verdict, measured on a real cell.

One reference run of a CPU smoke cell is recorded as a baseline (in a
scratch baselines root). Then the same cell runs again and again, through the
same Runner the pytest plugin uses (judging, re-measuring on "unknown"),
unchanged or with an injected slowdown of every training step (the ``slow``
fault). Trials of the three conditions are interleaved so machine drift hits
them alike. The figures: how often unchanged code is called "regressed"
(false alarms) and how often a 10 % and a 5 % slowdown are.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.baselines import record_run
from perfsuite.launch import LaunchOptions
from perfsuite.results import load
from perfsuite.runner import Runner

DEFAULT_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
CONDITIONS = {"unchanged": 0.0, "slow 10%": 0.10, "slow 5%": 0.05}


def _verdict(result: dict[str, Any]) -> str:
    for check in result.get("checks", []):
        if check["name"] == "step_time":
            return check["verdict"]
    return f"no step_time check ({result['status']}: {result.get('reason')})"


def measure_detection(trials: int = 20, cell_id: str = DEFAULT_CELL, steps: int = 40,
                      work_dir: Path | None = None, log=print) -> dict[str, Any]:
    cell = cells.get(cell_id).replace(max_steps=steps)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-detection-"))
    root = work / "baselines"
    reference = Runner(work / "reference", LaunchOptions(), probe=False, baselines=root)
    first = reference.result(cell)
    if first["status"] != "ok":
        raise RuntimeError(f"reference run failed: {first['reason']}")
    record_run(load(work / "reference"), root=root)
    log(f"reference: {cell.id}, {first['metrics']['step_time']['n']} steps, median "
        f"{first['metrics']['step_time']['median'] * 1e3:.2f} ms")

    verdicts: dict[str, Counter] = {name: Counter() for name in CONDITIONS}
    started = time.time()
    for trial in range(trials):
        for name, slowdown in CONDITIONS.items():
            options = {"fault": f"slow:*:0:{slowdown}"} if slowdown else {}
            runner = Runner(work / f"trial{trial}-{name.replace(' ', '').replace('%', '')}",
                            LaunchOptions(options=options), probe=False, baselines=root)
            verdict = _verdict(runner.result(cell))
            verdicts[name][verdict] += 1
            log(f"trial {trial + 1}/{trials} {name:<9} -> {verdict}")
    return {
        "cell": cell.id, "steps": steps, "trials": trials,
        "verdicts": {name: dict(count) for name, count in verdicts.items()},
        "false_alarms": verdicts["unchanged"]["regressed"],
        "caught_10": verdicts["slow 10%"]["regressed"],
        "caught_5": verdicts["slow 5%"]["regressed"],
        "seconds": time.time() - started, "work_dir": str(work),
    }
