"""What a resident A/B session of a cell can resolve, forecast before its first launch.

The cell's step times recorded on this hardware (its baseline's samples,
launch by launch, in the order they ran) are cut into windows of the
session's ``window_steps`` and every run of four consecutive windows taken
as an ABBA quad of two identical sides: the scatter of their log-ratios is
what a quad of the session would scatter by, were a resident window like a
recorded one. From it, as ``compare_windows`` pools quads, the smallest
detectable change at the first look and at the cap, the quads a pair that
would resolve the tolerance at the first look (an interval that narrow is
`same` only where its ratio is 1 to the digit), and the quads a pair at
which unchanged code reads `same` by the session's last look 4 times in 5
(``--quads auto``; simulated sessions of that scatter).

A forecast, said as one: launch-to-launch effects are not in it (a session
measures them), and a resident window follows a parked side's, not its own
launch's last step. On one H200 (baselines/h200-140gb-x1) the recorded
steps put the pinned fp32 cell's quads at 0.06 %, the pageable fp32 cell's
at 3.2 % and the fp64 cell's at 5.4 %; resident sessions of the pinned cell
on an H100 and an H200 measured 0.04-0.2 %.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from perfsuite.ab.resident import SETTLING_QUADS
from perfsuite.ab.settings import MAX_QUADS, MIN_PAIRS
from perfsuite.ab.verdicts import pair_look_confidence, verdict_by_looks
from perfsuite.cells import Cell
from perfsuite.judge.lookup import find_here
from perfsuite.options import AUTO_QUADS, AUTO_QUADS_RANGE, DEFAULT_QUADS
from perfsuite.stats.windows import MIN_QUADS, ORDER, design_half_width, fewest_quads, window_value


def quad_scatter(launches: Sequence[Sequence[float]], window_steps: int) -> float | None:
    """The variance of the log-ratio of ABBA quads of consecutive windows of
    ``window_steps`` recorded steps (every start within each launch, after as
    many steps as a session's settling quads take); None where no launch has
    that many windows of steps."""
    span = len(ORDER) * window_steps
    d = []
    for steps in (launch[SETTLING_QUADS * span:] for launch in launches):
        for start in range(len(steps) - span + 1):
            a1, b1, b2, a2 = (math.log(window_value(steps[start + k * window_steps:start + (k + 1) * window_steps]))
                              for k in range(len(ORDER)))
            d.append((b1 + b2 - a1 - a2) / 2)
    return float(np.var(d, ddof=1)) if len(d) > 1 else None


# How often unchanged code should read `same` by a session's last look at the
# quads ``--quads auto`` plans: where it does not, the verdict is `unknown`.
SAME_POWER = 0.8
SIMULATED_SESSIONS = 200


def same_share(within: float, quads: int, tolerance: float, max_pairs: int, *,
               sessions: int = SIMULATED_SESSIONS, seed: int = 0) -> float:
    """The share of simulated unchanged sessions, their quads scattering
    independently by ``within`` (a variance), that read `same` by their last
    look: ``compare_windows`` after the pairs of ``look_pairs(max_pairs)``,
    the launch order alternating, stopping at the first decided look, as a
    session does. Simulated, since the random-effects step widens an
    interval wherever two pairs' means differ by chance."""
    rng = np.random.default_rng(seed)
    sd = math.sqrt(within)
    return sum(verdict_by_looks(lambda: list(rng.normal(0.0, sd, quads)), tolerance, max_pairs)[0] == "same"
               for _ in range(sessions)) / sessions


@functools.lru_cache(maxsize=64)  # a forecast asked again (its line, ab.json, --quads auto) is not simulated again
def fewest_quads_for_same(within: float, tolerance: float, max_pairs: int, *, power: float = SAME_POWER,
                          least: int = MIN_QUADS, most: int = MAX_QUADS) -> int | None:
    """The fewest quads a pair (``least`` to ``most``) at which unchanged
    code reads `same` by a session's last look with probability ``power``
    (``same_share``, the same simulated sessions for every count, found by
    bisection); None where ``most`` do not. An interval merely as narrow as
    the tolerance is `same` only where its ratio is 1 to the digit."""
    if same_share(within, least, tolerance, max_pairs) >= power:
        return least  # a quiet cell: no search
    if same_share(within, most, tolerance, max_pairs) < power:
        return None
    low, high = least + 1, most
    while low < high:
        mid = (low + high) // 2
        if same_share(within, mid, tolerance, max_pairs) >= power:
            high = mid
        else:
            low = mid + 1
    return low


def forecast(launches: Sequence[Sequence[float]], window_steps: int, quads: int | str, max_pairs: int,
             tolerance: float, source: str | None) -> dict[str, Any]:
    """The forecast of a session at these settings from the recorded
    ``launches`` (``source`` says whose), or why there is none (``reason``);
    ``quads``: the quads a pair it is run with (``--quads auto``: as the
    forecast asks, within AUTO_QUADS_RANGE; DEFAULT_QUADS without one)."""
    within = quad_scatter(launches, window_steps)
    if within is None:
        longest = max((len(s) for s in launches), default=0)
        return {"source": source, "quads": DEFAULT_QUADS if quads == AUTO_QUADS else quads,
                "reason": f"its recorded launches have {longest} steps at most; a forecast "
                f"needs {len(ORDER) * (SETTLING_QUADS + 1)} windows of {window_steps}"}

    confidence = pair_look_confidence(max_pairs)

    def detectable(pairs: int, at_quads: int) -> float:
        return math.expm1(design_half_width(within, 0.0, at_quads, pairs, confidence))

    enough = fewest_quads(within, 0.0, math.log1p(tolerance), confidence, pairs=MIN_PAIRS, most=MAX_QUADS)
    same = fewest_quads_for_same(within, tolerance, max_pairs)
    least, most = AUTO_QUADS_RANGE
    chosen = min(max(same or most, least), most) if quads == AUTO_QUADS else int(quads)
    return {"source": source, "quads": chosen, "quad_sd": round(math.sqrt(within), 6),
            "detectable_first_look": round(detectable(MIN_PAIRS, chosen), 6),
            "detectable_at_cap": round(detectable(max_pairs, chosen), 6), "quads_for_tolerance": enough,
            "quads_for_same": same}


def cell_forecast(cell: Cell, window_steps: int, quads: int | str, max_pairs: int,
                  tolerance: float) -> dict[str, Any]:
    """The forecast from the step times recorded for ``cell`` on this machine's hardware profile."""
    found = find_here(cell.params(), "step_time")
    if not found.samples:
        return {**forecast([], window_steps, quads, max_pairs, tolerance, None),
                "reason": found.reason or f"{found.baseline} keeps no step samples of it"}
    return forecast(found.launches or [found.samples], window_steps, quads, max_pairs, tolerance,
                    f"baselines {found.baseline} ({found.source})")


def forecast_line(said: dict[str, Any], tolerance: float) -> str:
    """The forecast in one line of the session's log."""
    if "quad_sd" not in said:
        return f"forecast: none ({said['reason']}); {said['quads']} quads a pair"
    needs, same = said["quads_for_tolerance"], said.get("quads_for_same")
    bound = f"±{tolerance * 100:g} %"
    return (f"{said['quads']} quads a pair; forecast from the steps recorded here ({said['source']}): a quad's "
            f"log-ratio ~{said['quad_sd'] * 100:.2f} %, smallest detectable change ~"
            f"{said['detectable_first_look'] * 100:.2f} % after {MIN_PAIRS} pairs, ~{said['detectable_at_cap'] * 100:.2f} "
            f"% at the cap; {bound} " + (f"needs ~{needs} quads a pair" if needs else
                                         f"is beyond {MAX_QUADS} quads a pair")
            + (f", unchanged code `same` by the last look {SAME_POWER * 5:.0f} times in 5 ~{same}"
               if same else ""))
