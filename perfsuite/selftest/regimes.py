"""Resident A/B verdicts under step noise that switches between regimes, simulated.

A pageable GPU cell's steps do not scatter independently: one H200's
recorded launches of the pageable fp32 cell run for 5-20 steps near 200 ms,
then near 178 ms (lag-1 autocorrelation 0.4-0.8; baselines/h200-140gb-x1).
Whether a resident session's two sides share those regimes (a state of the
machine, which an ABBA quad cancels) or each process keeps its own (which no
quad cancels, and which makes consecutive quads alike) is not in a recorded
launch. This benchmark fits a two-level regime chain to a cell's recorded
steps and runs simulated sessions through the verdict's own looks
(``compare_windows`` after the pairs of ``look_pairs``) with the regimes
independent steps (``iid``), shared by the sides (``shared``) or kept by
each process (``per-process``), unchanged and with B slower, and prints how
often each is called what, beside the serial diagnostic a session's windows
give (``serial_correlation``), so that the windows of a real session say
which structure it met.

    python -m perfsuite.selftest.regimes [--baselines DIR] [--cell ID] [--sessions N] [--within per-pair]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite.ab.resident import SETTLING_QUADS
from perfsuite.ab.verdicts import verdict_by_looks
from perfsuite.judge.baselines import PROJECT_BASELINES, BaselineError, load_profile
from perfsuite.judge.lookup import samples_of
from perfsuite.stats.windows import ORDER, WITHIN, quad_log_ratios, serial_correlation, window_value

STRUCTURES = ("iid", "shared", "per-process")
DEFAULT_BASELINES = PROJECT_BASELINES / "h200-140gb-x1"
DEFAULT_CELL = "gate/image/ddp-ds/g1/fp32/px500/nopin/nchw"
JITTER = 0.001  # a step's own scatter (log) about its level, at least this


@dataclass(frozen=True)
class Regimes:
    """A symmetric two-state chain of step times: ``low`` or ``high`` seconds,
    kept from one step to the next with probability ``stay``, each step
    scattered by ``jitter`` (s.d. of its log)."""

    low: float
    high: float
    stay: float
    jitter: float

    def steps(self, rng: np.random.Generator, n: int, state: int | None = None) -> tuple[list[float], int]:
        """``n`` steps from ``state`` (drawn where None), and the state after them."""
        state = int(rng.integers(2)) if state is None else state
        out = []
        for _ in range(n):
            if rng.random() > self.stay:
                state = 1 - state
            out.append((self.high if state else self.low) * math.exp(rng.normal(0.0, self.jitter)))
        return out, state


def fit(launches: Sequence[Sequence[float]]) -> Regimes:
    """The chain that the recorded steps' logs, split in two levels (two
    means, each step to the nearer), suggest: its levels those means, its
    jitter the scatter about them, and its ``stay`` the share of consecutive
    recorded steps at the same level."""
    logs = [np.log(np.asarray(s, dtype=float)) for s in launches if len(s) > 2]
    if not logs:
        raise ValueError("no recorded launch of three steps or more to fit regimes to")
    pooled = np.concatenate(logs)
    centres = np.percentile(pooled, [25, 75])
    for _ in range(50):  # two means on a line
        high = np.abs(pooled - centres[1]) < np.abs(pooled - centres[0])
        if high.all() or not high.any():
            break
        centres = np.array([pooled[~high].mean(), pooled[high].mean()])
    levels = [np.abs(x - centres[1]) < np.abs(x - centres[0]) for x in logs]
    jitter = float(np.sqrt(np.mean((pooled - np.where(np.concatenate(levels), centres[1], centres[0])) ** 2)))
    kept = sum(int(np.sum(x[1:] == x[:-1])) for x in levels) / sum(len(x) - 1 for x in levels)
    return Regimes(float(np.exp(centres[0])), float(np.exp(centres[1])), min(max(kept, 0.5), 0.99),
                   max(jitter, JITTER))


def pair_windows(rng: np.random.Generator, regimes: Regimes, structure: str, quads: int, window_steps: int,
                 slowdown: float) -> list[tuple[str, float]]:
    """One launch pair's judged windows (its settling quads measured and left out), B ``slowdown`` slower."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure {structure!r}: one of {', '.join(STRUCTURES)}")
    state = {"A": None, "B": None, "shared": None}
    out = []
    for _ in range(SETTLING_QUADS + quads):
        for side in ORDER:
            key = "shared" if structure == "shared" else side
            if structure == "iid":
                steps = [regimes.steps(rng, 1)[0][0] for _ in range(window_steps)]
            else:
                steps, state[key] = regimes.steps(rng, window_steps, state[key])
            out.append((side, window_value([t * (1 + slowdown) if side == "B" else t for t in steps])))
    return out[len(ORDER) * SETTLING_QUADS:]


def session(rng: np.random.Generator, regimes: Regimes, structure: str, *, quads: int, max_pairs: int,
            window_steps: int, tolerance: float, slowdown: float, within: str = WITHIN) -> dict[str, Any]:
    """One simulated session, looked at as ``perfsuite ab`` looks: its verdict, pairs and serial diagnostic."""
    pairs: list[list[tuple[str, float]]] = []

    def next_pair() -> list[float]:
        pairs.append(pair_windows(rng, regimes, structure, quads, window_steps, slowdown))
        return quad_log_ratios(pairs[-1])

    verdict, taken = verdict_by_looks(next_pair, tolerance, max_pairs, within=within)
    return {"verdict": verdict, "pairs": taken, "serial": serial_correlation(pairs)}


def rates(regimes: Regimes, structure: str, sessions: int, seed: int = 0, **settings: Any) -> dict[str, Any]:
    """``sessions`` simulated sessions: their verdicts counted, and the serial diagnostic's medians."""
    rng = np.random.default_rng(seed)
    ran = [session(rng, regimes, structure, **settings) for _ in range(sessions)]
    serial = [s["serial"] for s in ran if s["serial"]]
    return {"verdicts": dict(Counter(s["verdict"] for s in ran)),
            "same_side": float(np.median([s["same_side"] for s in serial])) if serial else None,
            "across_sides": float(np.median([s["across_sides"] for s in serial])) if serial else None}


def recorded_launches(baselines: Path, cell: str) -> list[list[float]]:
    """A cell's recorded step times, launch by launch, from a baseline folder's samples.json."""
    try:
        folder = load_profile(baselines)
    except BaselineError as err:
        raise SystemExit(f"{err}; give --baselines a recorded baseline folder (one of baselines/) whose "
                         "samples.json keeps the cell's steps") from None
    pooled, launches = samples_of(folder.samples.get(f"{cell}:step_time"))
    if not pooled:
        raise SystemExit(f"{baselines / 'samples.json'} keeps no step times of {cell}")
    return [list(launch) for launch in launches] or [list(pooled)]


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of sessions, 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfsuite.selftest.regimes", description=__doc__.split("\n")[0])
    parser.add_argument("--baselines", type=Path, default=DEFAULT_BASELINES)
    parser.add_argument("--cell", default=DEFAULT_CELL)
    parser.add_argument("--sessions", type=_at_least_one, default=200)
    parser.add_argument("--quads", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--slowdown", type=float, default=0.02)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--within", choices=("pooled", "per-pair"), default=WITHIN,
                        help="a pair's standard error from the quads' scatter pooled over the pairs, or its own "
                        "(as sessions before the pooling were judged)")
    args = parser.parse_args(argv)
    regimes = fit(recorded_launches(args.baselines, args.cell))
    print(f"{args.cell} in {args.baselines.name}: regimes {regimes.low * 1e3:.1f} / {regimes.high * 1e3:.1f} ms, "
          f"kept {regimes.stay:.3f} a step, jitter {regimes.jitter * 100:.2f} %; {args.sessions} sessions each, "
          f"5-step windows, 2-4 pairs, ±{args.tolerance * 100:g} %, pairs' errors {args.within}")
    for quads in args.quads:
        for structure in STRUCTURES:
            settings = {"quads": quads, "max_pairs": 4, "window_steps": 5, "tolerance": args.tolerance,
                        "within": args.within}
            aa = rates(regimes, structure, args.sessions, seed=1, slowdown=0.0, **settings)
            slow = rates(regimes, structure, args.sessions, seed=2, slowdown=args.slowdown, **settings)
            wrong = sum(n for v, n in aa["verdicts"].items() if v in ("regressed", "improved"))
            print(f"{quads:>3} quads  {structure:<12} unchanged: {wrong}/{args.sessions} called a change, "
                  f"{aa['verdicts'].get('same', 0)} same;  {args.slowdown * 100:g} % slower: "
                  f"{slow['verdicts'].get('regressed', 0)} regressed;  windows' lag-1 r same side "
                  f"{aa['same_side']:.2f}, across sides {aa['across_sides']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
