"""The hostile probe's cases: ab (resident sessions refused before any
launch where they could never run or finish, a side B that cannot run its
launches named with what it lacks)."""

from __future__ import annotations

from pathlib import Path

from tests.plugin.probekit import SMOKE_CELL, Case, nothing_under

LLM_CELL = "smoke/llm/lora/alpaca/c1/fp32/nopin"


def ab(*more: str) -> tuple[str, ...]:
    return ("ab", *more, "--out", "{t}/out")


def no_torchvision(t: Path) -> None:
    """A folder whose torchvision cannot be imported, for side B's PYTHONPATH."""
    (t / "shadow" / "torchvision").mkdir(parents=True)
    (t / "shadow" / "torchvision" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torchvision'\", name='torchvision')\n")


def older_perfsuite(t: Path) -> None:
    """A perfsuite from before resident windows (no perfsuite.rank.windows), for side B's PYTHONPATH."""
    (t / "old" / "perfsuite" / "rank").mkdir(parents=True)
    (t / "old" / "perfsuite" / "__init__.py").write_text('"""perfsuite, as it was."""\n')
    (t / "old" / "perfsuite" / "rank" / "__init__.py").write_text("")


NO_AB = nothing_under("out")

CASES: list[Case] = [
    Case("ab-resident-llm-cell", "cli", ab(LLM_CELL, "--mode", "resident"), 2,
         ("--mode resident", LLM_CELL, "the llm workload does not serve measured windows"), check=NO_AB),
    Case("ab-resident-an-llm-cell-among-image-cells", "cli", ab(SMOKE_CELL, LLM_CELL, "--mode", "resident"), 2,
         ("--mode resident", LLM_CELL, "leave --mode out"), check=NO_AB),
    Case("ab-resident-with-a-profiler", "cli", ab(SMOKE_CELL, "--mode", "resident", "--profiler", "torch"), 2,
         ("--mode resident", SMOKE_CELL, "--profiler torch"), check=NO_AB),
    Case("ab-window-steps-a-million", "cli", ab(SMOKE_CELL, "--mode", "resident", "--window-steps", "1000000"), 2,
         ("--window-steps 1000000", "at most 1000 steps"), check=NO_AB),
    Case("ab-window-steps-a-million-in-auto-mode", "cli", ab(SMOKE_CELL, "--window-steps", "1000000"), 2,
         ("--window-steps 1000000",), check=NO_AB),
    Case("ab-quads-a-hundred-thousand", "cli", ab(SMOKE_CELL, "--quads", "100000"), 2,
         ("--quads 100000", "at most 1000"), check=NO_AB),
    Case("ab-max-pairs-a-thousand", "cli", ab(SMOKE_CELL, "--mode", "resident", "--max-pairs", "1000"), 2,
         ("--max-pairs 1000", "at most 100"), check=NO_AB),
    Case("ab-resident-timeout-zero", "sub", ab(SMOKE_CELL, "--mode", "resident", "--timeout", "0"), 2,
         ("--timeout", "'0'", "positive number of seconds"), check=NO_AB),
    Case("ab-side-b-without-torchvision", "cli", ab(SMOKE_CELL, "--b-env", "PYTHONPATH={t}/shadow"), 2,
         ("side B", "perfsuite.workloads.image", "No module named 'torchvision'"), no_torchvision, check=NO_AB),
    Case("ab-side-b-an-older-perfsuite", "cli", ab(SMOKE_CELL, "--mode", "resident", "--b-env",
                                                   "PYTHONPATH={t}/old"), 2,
         ("side B", "{t}/old/perfsuite", "cannot serve resident windows", "--mode launches"), older_perfsuite,
         check=NO_AB),
    Case("ab-side-b-interpreter-missing", "cli", ab(SMOKE_CELL, "--b-python", "{t}/venv/bin/python"), 2,
         ("side B", "no Python interpreter at {t}/venv/bin/python"), check=NO_AB),
]
