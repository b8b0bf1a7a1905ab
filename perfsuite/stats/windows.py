"""Statistics over interleaved windows: a verdict of B against A from windows
measured seconds apart, in launches kept up side by side.

A resident A/B session (perfsuite.ab.resident) measures windows of a few
steps in the order A B B A, A B B A, ...: each group of four is a *quad*.
Its log-ratio ``d = (log B1 + log B2 - log A1 - log A2) / 2`` (each window
its median step) cancels drift that is linear over the quad's few seconds,
and quads of one launch pair are close to independent. Effects tied to a
launch (its imports, memory layout, a bad NCCL ring) are the same for every
quad of that pair, so no number of quads from one pair can see them: the
session runs several launch pairs, and the pairs' means are combined with a
random-effects model (DerSimonian-Laird), whose between-pair variance
``tau2`` widens the interval as far as the pairs disagree, and whose t
quantile takes the degrees of freedom of what the variance was estimated
from (Welch-Satterthwaite): the quads' where the pairs agree, the pairs'
where a launch effect dominates. Both levels are reported: each pair's
ratio and interval, and the combined one.

Pure functions of numbers (numpy, scipy), judged with ``samples.classify``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats as _sps

from perfsuite.stats.samples import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE, classify

ORDER = "ABBA"
MIN_QUADS = 4  # a pair's own interval needs a few quads (3 d.o.f.)
# Pairs whose means differ beyond their own intervals at this level are
# called heterogeneous: a launch-level effect is there.
HETEROGENEITY_P = 0.01
# The launch order is modelled from two pairs each way: with three, the
# launch effect beside it rests on one degree of freedom, and simulated 99 %
# intervals missed 4.9 % of the time (four pairs: 3.4 %; test_windowstats.py).
ORDER_MODEL_PAIRS = 4
METHOD = "random-effects (DerSimonian-Laird) mean of ABBA quad log-ratios over launch pairs"
# Where a pair's standard error comes from: the quads' scatter within their
# pairs, pooled over the session's pairs (one cell, one machine, one window
# design: one scatter). Four quads a pair give their own variance 3 degrees
# of freedom, and on one H200's regime-switching pageable steps a pair's own
# was small by chance often enough that 7 % of simulated unchanged sessions
# were called a change (perfsuite.selftest.regimes; tests/unit/test_windowstats.py).
WITHIN = "pooled"


def quad_log_ratios(windows: Sequence[tuple[str, float]]) -> list[float]:
    """``d`` of every complete ABBA quad in ``windows`` ((side, seconds) in
    the order measured, from the first A); an incomplete last quad is left out."""
    out = []
    for i in range(0, len(windows) - len(ORDER) + 1, len(ORDER)):
        quad = windows[i:i + len(ORDER)]
        if "".join(side for side, _ in quad) != ORDER:
            raise ValueError(f"windows {i}-{i + 3} are {[s for s, _ in quad]}, not {list(ORDER)}")
        if not all(math.isfinite(v) and v > 0 for _, v in quad):
            raise ValueError(f"windows {i}-{i + 3}: a window's time is not a positive number: {quad}")
        a = math.log(quad[0][1]) + math.log(quad[3][1])
        b = math.log(quad[1][1]) + math.log(quad[2][1])
        out.append((b - a) / 2)
    return out


@dataclass(frozen=True)
class PairEstimate:
    """One launch pair: the mean of its quads' log-ratios, as a ratio and interval."""

    quads: int
    ratio: float
    ci_low: float
    ci_high: float
    log_mean: float
    log_se: float


def pair_estimate(d: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> PairEstimate:
    """A t interval over one pair's quads."""
    arr = np.asarray(d, dtype=float)
    n = arr.size
    if n < 2:
        mean = float(arr.mean()) if n else 0.0
        return PairEstimate(n, math.exp(mean), 0.0, math.inf, mean, math.inf)
    mean, se = float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(n))
    half = float(_sps.t.ppf(0.5 + confidence / 2, n - 1)) * se
    return PairEstimate(n, math.exp(mean), math.exp(mean - half), math.exp(mean + half), mean, se)


@dataclass(frozen=True)
class WindowComparison:
    """B against A over every pair: the combined verdict, and the pairs'."""

    verdict: str
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    tolerance: float
    quads: int
    pairs: list[PairEstimate] = field(default_factory=list)
    tau2: float = 0.0  # between-pair variance of the log-ratio
    heterogeneity_p: float | None = None
    dof: float | None = None  # of the t quantile (Welch-Satterthwaite)
    method: str = METHOD
    reason: str = ""
    order_effect: float | None = None  # A-first pairs' ratio over B-first pairs', where modelled
    # The smallest change this scatter resolves at ``confidence``: the interval's
    # half-width as a ratio (``detectable_change``); None where there is no interval.
    detectable: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def compare_windows(quads_by_pair: Sequence[Sequence[float]], tolerance: float = DEFAULT_TOLERANCE,
                    confidence: float = DEFAULT_CONFIDENCE, *, min_pairs: int = 2,
                    firsts: Sequence[str] | None = None, within: str = WITHIN) -> WindowComparison:
    """Judge B against A from the quad log-ratios of each launch pair.

    Each pair's mean has its standard error from the quads' scatter about
    their pair's mean, pooled over the pairs (``within="pooled"``; a record
    from before it judged each pair by its own quads alone: ``"per-pair"``),
    so a pair of few quads whose scatter is small by chance does not narrow
    the interval; the pairs are pooled with weights ``1 / (se^2 + tau2)``, ``tau2`` the
    DerSimonian-Laird between-pair variance, and the interval is a t
    interval with ``satterthwaite_dof`` degrees of freedom. Fewer
    than ``min_pairs`` pairs, or a pair with fewer than ``MIN_QUADS``
    quads, give "unknown": one launch a side cannot tell a change from an
    effect of that launch.

    ``firsts`` names the side whose launch came up first in each pair.
    ``perfsuite ab`` alternates it, so an effect of the order (on the 2-core
    VM the side that came up first ran ~1 % slower in nearly every session)
    cancels in the mean; from ``ORDER_MODEL_PAIRS`` pairs with both orders it
    is a term of the model (``pool_by_order``) rather than launch-to-launch
    variance.
    """
    pairs = [pair_estimate(d, confidence) for d in quads_by_pair]
    if firsts is not None and len(firsts) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs, {len(firsts)} launch orders")
    quads = sum(p.quads for p in pairs)
    kept = [i for i, p in enumerate(pairs) if p.quads >= MIN_QUADS and math.isfinite(p.log_se)]
    usable = [pairs[i] for i in kept]

    def unknown(reason: str, ratio: float = math.nan) -> WindowComparison:
        return WindowComparison("unknown", ratio, 0.0, math.inf, confidence, tolerance, quads, pairs,
                                reason=reason)

    if len(usable) < min_pairs:
        return unknown(f"{len(usable)} launch pair(s) with {MIN_QUADS}+ quads; a verdict weighs "
                       f"{min_pairs}: effects of one launch are not seen in its own windows")
    means = np.array([p.log_mean for p in usable])
    counts = [p.quads for p in usable]
    if within == "pooled":
        scatter = within_pair_variance([quads_by_pair[i] for i in kept]) or 0.0
        var = np.maximum(scatter / np.array(counts, dtype=float), 1e-18)
    elif within == "per-pair":
        var = np.maximum(np.array([p.log_se for p in usable]) ** 2, 1e-18)
    else:
        raise ValueError(f"within {within!r}: 'pooled' or 'per-pair'")
    orders = [firsts[i] for i in kept] if firsts is not None else []
    if len(usable) >= ORDER_MODEL_PAIRS and set(orders) == {"A", "B"}:
        pooled = pool_by_order(means, var, counts, [o == "A" for o in orders])
    else:
        pooled = pool(means, var, counts)
    half = float(_sps.t.ppf(0.5 + confidence / 2, pooled.dof)) * pooled.se
    low, high = math.exp(pooled.mean - half), math.exp(pooled.mean + half)
    verdict = classify(low, high, tolerance, estimate=math.exp(pooled.mean))
    reasons = []
    if pooled.order_p is not None and pooled.order_p < HETEROGENEITY_P:
        reasons.append(f"pairs with A launched first read {pooled.order_effect:.4g}x those with B launched "
                       f"first (p {pooled.order_p:.2g}): an effect of the launch order, which alternates, "
                       "taken out of the interval")
    if pooled.heterogeneity_p is not None and pooled.heterogeneity_p < HETEROGENEITY_P:
        reasons.append(f"the launch pairs disagree (ratios {', '.join(f'{p.ratio:.4g}' for p in usable)}; "
                       f"heterogeneity p {pooled.heterogeneity_p:.2g}): a launch-level effect, counted in "
                       "the interval")
    if verdict == "unknown":
        reasons.append("interval straddles 1 or a tolerance bound; more quads or launch pairs would narrow it")
    method = METHOD + (", the quads' scatter pooled over the pairs" if within == "pooled" else "") + (
        ", the launch order a fixed effect" if pooled.order_effect is not None else "")
    return WindowComparison(verdict, math.exp(pooled.mean), low, high, confidence, tolerance, quads, pairs,
                            pooled.tau2, pooled.heterogeneity_p, pooled.dof, method, "; ".join(reasons),
                            pooled.order_effect, detectable_change(low, high))


def within_pair_variance(quads_by_pair: Sequence[Sequence[float]]) -> float | None:
    """The quads' log-ratio variance within their launch pairs, pooled over the
    pairs (each centred on its own mean); None without two quads in a pair."""
    parts = [(len(d) - 1, float(np.var(d, ddof=1))) for d in quads_by_pair if len(d) > 1]
    dof = sum(n for n, _ in parts)
    return sum(n * v for n, v in parts) / dof if dof else None


def design_half_width(within: float, tau2: float, quads: int, pairs: int, confidence: float) -> float:
    """The half-width (of the log-ratio) of the interval ``compare_windows``
    would give over ``pairs`` launch pairs of ``quads`` quads, at this scatter:
    ``within`` a quad's variance within its pair, ``tau2`` between pairs."""
    se2 = within / quads
    dof = satterthwaite_dof([se2] * pairs, [quads] * pairs, tau2)
    return float(_sps.t.ppf(0.5 + confidence / 2, dof)) * math.sqrt((se2 + tau2) / pairs)


def fewest_quads(within: float, tau2: float, target: float, confidence: float, *, pairs: int = 2,
                 least: int = MIN_QUADS, most: int = 1000) -> int | None:
    """The fewest quads a pair (``least`` to ``most``) at which ``pairs`` launch
    pairs give a half-width of at most ``target`` at this scatter; None where
    none does (``tau2``, a launch-level effect, keeps an interval wide
    however many quads: the half-width need not shrink with them)."""
    return next((q for q in range(least, most + 1)
                 if design_half_width(within, tau2, q, pairs, confidence) <= target), None)


def detectable_change(ci_low: float | None, ci_high: float | None) -> float | None:
    """The smallest change an interval of a ratio resolves: its half-width as
    a ratio, ``sqrt(high / low) - 1`` (for the pooled interval above,
    ``exp(t * se) - 1``, whatever the ratio). A change smaller than it
    leaves the interval around 1, so it cannot be called regressed or
    improved; and ``same`` within ±tolerance needs it below the tolerance.
    None where the interval is open or missing."""
    if ci_low is None or ci_high is None or not (0 < ci_low <= ci_high < math.inf):
        return None
    return math.sqrt(ci_high / ci_low) - 1.0


@dataclass(frozen=True)
class Pooled:
    """The pairs' pooled log-ratio and what its interval needs."""

    mean: float
    se: float
    tau2: float
    heterogeneity_p: float | None
    dof: float
    order_effect: float | None = None  # A-first pairs' ratio over B-first pairs'
    order_p: float | None = None


def _tau2(q_stat: float, dof: int, c: float) -> float:
    """DerSimonian-Laird's moment estimate of the between-pair variance."""
    return max(0.0, (q_stat - dof) / c) if dof > 0 and c > 0 else 0.0


def pool(means: np.ndarray, var: np.ndarray, quads: Sequence[int]) -> Pooled:
    """The random-effects mean of the pairs' means."""
    w = 1.0 / var
    fixed = float(np.sum(w * means) / np.sum(w))
    q_stat = float(np.sum(w * (means - fixed) ** 2))
    dof_q = len(means) - 1
    het_p = float(_sps.chi2.sf(q_stat, dof_q)) if dof_q > 0 else None
    tau2 = _tau2(q_stat, dof_q, float(np.sum(w) - np.sum(w ** 2) / np.sum(w)))
    w_re = 1.0 / (var + tau2)
    mean = float(np.sum(w_re * means) / np.sum(w_re))
    return Pooled(mean, math.sqrt(1.0 / float(np.sum(w_re))), tau2, het_p, satterthwaite_dof(var, quads, tau2))


def pool_by_order(means: np.ndarray, var: np.ndarray, quads: Sequence[int], a_first: Sequence[bool]) -> Pooled:
    """The mean over the two launch orders: each order's pairs pooled with
    weights ``1 / (se^2 + tau2)``, the result their average, so that an
    effect of the order cancels as the alternation meant it to. ``tau2`` is
    estimated from the pairs' scatter within their order (pairs less two
    degrees of freedom): what the order does not explain is a launch effect."""
    group = np.asarray(a_first, dtype=bool)
    sides = (group, ~group)

    def order_means(w: np.ndarray) -> tuple[np.ndarray, list[float], list[float]]:
        totals = [float(np.sum(w[g])) for g in sides]
        m = [float(np.sum(w[g] * means[g])) / t for g, t in zip(sides, totals)]
        return np.where(group, m[0], m[1]), m, totals

    w = 1.0 / var
    fitted, _, totals = order_means(w)
    q_stat = float(np.sum(w * (means - fitted) ** 2))
    dof_q = len(means) - 2
    het_p = float(_sps.chi2.sf(q_stat, dof_q)) if dof_q > 0 else None
    c = float(np.sum(w)) - sum(float(np.sum(w[g] ** 2)) / t for g, t in zip(sides, totals))
    tau2 = _tau2(q_stat, dof_q, c)
    w_re = 1.0 / (var + tau2)
    _, m, totals = order_means(w_re)
    coef = w_re / (2.0 * np.where(group, totals[0], totals[1]))  # each pair's share of the mean
    se = math.sqrt(float(np.sum(coef ** 2 * (var + tau2))))
    se_diff = math.sqrt(1.0 / totals[0] + 1.0 / totals[1])
    order_p = float(2 * _sps.norm.sf(abs(m[0] - m[1]) / se_diff))
    dof = _satterthwaite(coef ** 2, var, quads, tau2, dof_q)
    return Pooled((m[0] + m[1]) / 2, se, tau2, het_p, dof, math.exp(m[0] - m[1]), order_p)


def satterthwaite_dof(se2: Sequence[float], quads: Sequence[int], tau2: float) -> float:
    """Degrees of freedom of the pooled mean's variance ``1 / sum(w)``,
    ``w = 1 / (se2 + tau2)``: a sum of the pairs' own variances (each from
    its quads less one) and ``tau2`` (from the pairs less one), weighted by
    ``(w / sum(w))^2``. The quads' count less one a pair where ``tau2`` is 0;
    near the pairs' less one where it dominates. With few pairs and a
    launch effect, the quads' count made a 99 % interval miss ~7 % of the
    time in simulation (tests/unit/test_windowstats.py)."""
    se2_arr = np.asarray(se2, dtype=float)
    w = 1.0 / (se2_arr + tau2)
    return _satterthwaite((w / w.sum()) ** 2, se2_arr, quads, tau2, len(se2_arr) - 1)


def _satterthwaite(coef2: np.ndarray, se2: np.ndarray, quads: Sequence[int], tau2: float,
                   tau_dof: int) -> float:
    """Welch-Satterthwaite for ``sum(coef2 * (se2 + tau2))``: each ``se2``
    from its pair's quads less one, ``tau2`` from ``tau_dof``."""
    n = np.asarray(quads, dtype=float)
    variance = float(np.sum(coef2 * (se2 + tau2)))
    parts = float(np.sum((coef2 * se2) ** 2 / np.maximum(n - 1, 1)))
    if tau_dof > 0:
        parts += (tau2 * float(coef2.sum())) ** 2 / tau_dof
    most = max(float(np.sum(n - 1)), 1.0)
    return most if parts <= 0 else min(max(variance ** 2 / parts, 1.0), most)


def serial_correlation(pairs: Sequence[Sequence[tuple[str, float]]]) -> dict[str, float | int] | None:
    """Whether a side's windows carry their noise into its next ones, and
    whether the other side shares it: the lag-1 correlation of the windows'
    log-values (each side's centred within its pair) between windows adjacent
    in time of the same side (B1 B2, and A2 to the next quad's A1) and of
    different sides (A1 B1, B2 A2), pooled over ``pairs`` ((side, seconds)
    in the order measured). A quad cancels noise both sides share (a machine
    state: high, alike); noise a process keeps for a few windows (high on the
    same side only) makes consecutive quads alike, and their scatter then
    understates a pair's uncertainty (docs/explanation/ab.md). None without
    two windows of each side in a pair."""
    sums = {"same": [0.0, 0], "across": [0.0, 0]}
    for windows in pairs:
        logs = [(side, math.log(v)) for side, v in windows]
        stats = {}
        for side in ORDER[:2]:
            values = np.array([x for s, x in logs if s == side])
            if values.size < 2 or not np.any(values != values[0]):
                break
            stats[side] = (float(values.mean()), float(values.std()))
        else:
            z = [(s, (x - stats[s][0]) / stats[s][1]) for s, x in logs]
            for (s1, z1), (s2, z2) in zip(z, z[1:]):
                kind = sums["same" if s1 == s2 else "across"]
                kind[0] += z1 * z2
                kind[1] += 1
    if not sums["same"][1] or not sums["across"][1]:
        return None
    return {"same_side": round(sums["same"][0] / sums["same"][1], 4),
            "across_sides": round(sums["across"][0] / sums["across"][1], 4),
            "adjacent": sums["same"][1] + sums["across"][1]}


def window_value(step_times: Sequence[float]) -> float:
    """One window's value: the median of its steps (one slow step, such as the
    first after parking, does not move it; an epoch's first and partial
    steps are not among them: perfsuite.rank.windows)."""
    arr = np.asarray([t for t in step_times if math.isfinite(t) and t > 0], dtype=float)
    if arr.size == 0:
        raise ValueError(f"a window without a positive step time: {list(step_times)}")
    return float(np.median(arr))
