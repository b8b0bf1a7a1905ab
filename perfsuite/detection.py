"""Detection power of the suite's step-time verdict, measured on a real cell.

In every trial a reference run of a CPU smoke cell is recorded as a
baseline (in a scratch baselines root); then the same cell runs, through the
same Runner the pytest plugin uses (judging, re-measuring on "unknown"),
unchanged and with an injected slowdown of every training step (the ``slow``
fault) of 10 % and 5 %. The figures: how often unchanged code is called "regressed"
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


def _reference(cell, work: Path, name: str) -> Path:
    """Measure ``cell`` unchanged and record it as the baseline of a scratch root."""
    root = work / name / "baselines"
    run = Runner(work / name / "reference", LaunchOptions(), probe=False, baselines=root)
    result = run.result(cell)
    if result["status"] != "ok":
        raise RuntimeError(f"reference run failed: {result['reason']}")
    record_run(load(work / name / "reference"), root=root)
    return root


def measure_detection(trials: int = 20, cell_id: str = DEFAULT_CELL, steps: int = 40,
                      work_dir: Path | None = None, log=print) -> dict[str, Any]:
    """Each trial records its own reference, then runs the three conditions
    right after it: a baseline recorded shortly before, as a CI gate has it
    from the branch it compares with, not hours before on a drifting machine."""
    cell = cells.get(cell_id).replace(max_steps=steps)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-detection-"))
    verdicts: dict[str, Counter] = {name: Counter() for name in CONDITIONS}
    references = []
    started = time.time()
    for trial in range(trials):
        root = _reference(cell, work, f"trial{trial}")
        ref = load(work / f"trial{trial}" / "reference")["cells"][0]["metrics"]["step_time"]
        references.append(ref["median"])
        for name, slowdown in CONDITIONS.items():
            options = {"fault": f"slow:*:0:{slowdown}"} if slowdown else {}
            label = name.replace(" ", "").replace("%", "")
            runner = Runner(work / f"trial{trial}" / label, LaunchOptions(options=options),
                            probe=False, baselines=root)
            verdict = _verdict(runner.result(cell))
            verdicts[name][verdict] += 1
            log(f"trial {trial + 1}/{trials} (reference {ref['median'] * 1e3:.1f} ms) "
                f"{name:<9} -> {verdict}")
    return {
        "cell": cell.id, "steps": steps, "trials": trials,
        "reference_medians_ms": [round(m * 1e3, 2) for m in references],
        "verdicts": {name: dict(count) for name, count in verdicts.items()},
        "false_alarms": verdicts["unchanged"]["regressed"],
        "caught_10": verdicts["slow 10%"]["regressed"],
        "caught_5": verdicts["slow 5%"]["regressed"],
        "seconds": time.time() - started, "work_dir": str(work),
    }
