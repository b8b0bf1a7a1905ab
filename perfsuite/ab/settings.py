"""What an A/B session is refused before anything is set up or launched
(an ``ABError``: exit 2): settings it could not keep, resident windows a
cell or its launch cannot have, windows too long to be windows."""

from __future__ import annotations

from perfsuite.ab.resident import resident_refusal
from perfsuite.ab.sides import ABError
from perfsuite.cells import Cell
from perfsuite.launch.launch import LaunchOptions
from perfsuite.options import AB_MODES as MODES
from perfsuite.options import AUTO_QUADS, AUTO_QUADS_RANGE
from perfsuite.stats import launches as launchstats
from perfsuite.stats.windows import ORDER_MODEL_PAIRS

MIN_PAIRS = 2  # launch pairs a resident verdict weighs: one cannot see effects of its own launches
# A window is a few seconds, so that both sides' windows share the machine's
# drift, and each must end within the launch's timeout; a pair's windows
# and pairs beyond these would run for days, and would be taken for a hang.
MAX_WINDOW_STEPS, MAX_QUADS, MAX_PAIRS = 1000, 1000, 100


def look_pairs(max_pairs: int) -> list[int]:
    """The launch pairs after which a resident session looks at its verdict:
    from MIN_PAIRS on, where the two launch orders weigh alike (an even
    count) or the order is a term of the model (ORDER_MODEL_PAIRS on). Three
    pairs (A, B, A first) pooled plainly weigh the A-first pairs twice: on
    the 2-core VM the side launched first ran ~3 % slower, and both false
    calls of 40 A/A sessions came at that look (tests/data/cpu-2026-11-28)."""
    return [n for n in range(MIN_PAIRS, max_pairs + 1) if n % 2 == 0 or n >= ORDER_MODEL_PAIRS]


def check_settings(tolerance: float, statistic: str, max_launches: int) -> None:
    """Refuse settings a session could not keep (before anything is set up)."""
    if max_launches < launchstats.MIN_LAUNCHES or max_launches % 2:
        raise ABError(f"--max-launches {max_launches}: give an even number of at least "
                      f"{launchstats.MIN_LAUNCHES} (a round of ABBA is 2 launches a side, and a "
                      f"verdict weighs {launchstats.MIN_LAUNCHES} a side)")
    if not 0 < tolerance < 1:
        raise ABError(f"--tolerance {tolerance}: give a fraction such as 0.05")
    if statistic not in launchstats.LAUNCH_STATISTICS:
        raise ABError(f"--launch-statistic {statistic}: use one of {sorted(launchstats.LAUNCH_STATISTICS)}")


def check_resident_settings(mode: str, window_steps: int, quads: int | str, max_pairs: int) -> None:
    if mode not in MODES:
        raise ABError(f"--mode {mode}: use one of {', '.join(MODES)}")
    if quads == AUTO_QUADS:  # each cell's, within AUTO_QUADS_RANGE (perfsuite.ab.forecast)
        quads = AUTO_QUADS_RANGE[0]
    if not isinstance(quads, int):
        raise ABError(f"--quads {quads}: give a number of quads, or {AUTO_QUADS}")
    if window_steps < 1 or quads < 4 or max_pairs < MIN_PAIRS:
        raise ABError(f"--window-steps {window_steps}, --quads {quads}, --max-pairs {max_pairs}: give at "
                      f"least 1 step a window, 4 quads a pair and {MIN_PAIRS} pairs")
    if look_pairs(max_pairs)[-1] != max_pairs:  # a last pair after which no session looks
        raise ABError(f"--max-pairs {max_pairs}: a look after {max_pairs} pairs weighs the side launched first "
                      f"in the odd pair twice, and so no session looks there; give {max_pairs - 1}, or "
                      f"{ORDER_MODEL_PAIRS} or more (from {ORDER_MODEL_PAIRS} the launch order is modelled)")
    if window_steps > MAX_WINDOW_STEPS:
        raise ABError(f"--window-steps {window_steps}: a window is meant to last seconds, so that both sides' "
                      "windows share the machine's drift, and must end within the launch's timeout "
                      f"(--timeout, else the cell's); give at most {MAX_WINDOW_STEPS} steps")
    for flag, value, most in (("--quads", quads, MAX_QUADS), ("--max-pairs", max_pairs, MAX_PAIRS)):
        if value > most:
            raise ABError(f"{flag} {value}: a session of that many would run for days; give at most {most}")


def check_resident_cells(mode: str, cells: list[Cell], launch: LaunchOptions | None) -> None:
    """``--mode resident`` for a cell or a launch that cannot have resident
    windows (another workload, several nodes, a profiler), refused before any launch."""
    if mode != "resident":
        return
    for cell in cells:
        refusal = resident_refusal(cell, launch)
        if refusal:
            given = launch or LaunchOptions()
            flag = (f" (--profiler {given.profiler})" if given.profiler not in (None, "off") and "profil" in refusal
                    else " (--nnodes, --slurm)" if "nodes" in refusal else "")
            raise ABError(f"--mode resident: {cell.id}: {refusal.split(';')[0]}{flag}; leave --mode out "
                          "(auto) to compare such a cell in launch rounds")
