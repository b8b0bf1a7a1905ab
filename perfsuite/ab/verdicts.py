"""An A/B session's words on its cells: the confidence each look is held to,
a cell's summary line, the session's exit code (a regression accepted on
purpose, perfsuite.judge.accepted, passes it), and which side failed a
resident launch pair."""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from perfsuite.ab.settings import MAX_PAIRS, MAX_QUADS, MIN_PAIRS, look_pairs
from perfsuite.ab.stopping import is_full, side_failed
from perfsuite.judge import accepted as accepted_mod
from perfsuite.judge.checks import FAILING
from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import DEFAULT_CONFIDENCE
from perfsuite.stats.windows import WITHIN, compare_windows, design_half_width, fewest_quads, within_pair_variance

ORDER = "ABBA"  # one round; every round the same, so each side leads half the rounds
DECIDED = ("same", "regressed", "improved")
EXIT_OK, EXIT_REGRESSED, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def look_confidence(max_launches: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The confidence each round's verdict is held to, so that the whole
    session holds ``confidence``: the verdict is looked at after every round
    from MIN_LAUNCHES a side on, and each look is another chance of a false
    call (Bonferroni over the planned looks). On the 2-core VM, judging every
    look at 95 % called identical sides regressed in the first trial tried."""
    looks = (max_launches - launchstats.MIN_LAUNCHES) // 2 + 1
    return 1.0 - (1.0 - confidence) / looks


def pair_look_confidence(max_pairs: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """As ``look_confidence``: Bonferroni over the looks of ``look_pairs``."""
    return 1.0 - (1.0 - confidence) / len(look_pairs(max_pairs))


def verdict_by_looks(next_pair: Callable[[], Sequence[float]], tolerance: float, max_pairs: int, *,
                     within: str = WITHIN) -> tuple[str, int]:
    """A resident session's verdict as it looks: launch pairs' quad log-ratios
    from ``next_pair`` one pair at a time, judged by ``compare_windows`` after
    the pairs of ``look_pairs(max_pairs)`` (the launch order alternating),
    stopping at the first decided look; the verdict and the pairs it took.
    What simulated sessions run (the forecast, perfsuite.selftest.regimes)."""
    confidence, looks = pair_look_confidence(max_pairs), look_pairs(max_pairs)
    pairs: list[Sequence[float]] = []
    verdict = "unknown"
    for pair in range(1, max_pairs + 1):
        pairs.append(next_pair())
        if pair in looks:
            verdict = compare_windows(pairs, tolerance, confidence, min_pairs=MIN_PAIRS,
                                      firsts=[ORDER[i % 2] for i in range(pair)], within=within).verdict
            if verdict in DECIDED:
                break
    return verdict, len(pairs)


def resident_settings(window_steps: int, quads: int, max_pairs: int) -> dict[str, Any]:
    """What a session records of its resident windows: what a replay of its looks needs."""
    return {"window_steps": window_steps, "quads_per_pair": quads, "min_pairs": MIN_PAIRS,
            "max_pairs": max_pairs, "looks": look_pairs(max_pairs), "look_confidence": pair_look_confidence(max_pairs),
            "within": WITHIN}


def recorded_looks(resident: dict[str, Any]) -> tuple[list[int], float]:
    """The looks and their confidence a stored session's resident settings
    name; a record from before ``look_pairs`` (no "looks") looked after every
    pair from MIN_PAIRS on. Bonferroni over them where no confidence is kept."""
    looks = list(resident["looks"]) if "looks" in resident else list(range(MIN_PAIRS, int(resident["max_pairs"]) + 1))
    return looks, float(resident.get("look_confidence") or 1.0 - (1.0 - DEFAULT_CONFIDENCE) / len(looks))


def recorded_within(resident: dict[str, Any]) -> str:
    """How a stored session's pairs got their standard errors
    (``compare_windows``'s ``within``): a record from before ``within`` was
    kept judged each pair by its own quads."""
    return str(resident.get("within") or "per-pair")


def undecided_rounds_reason(launches: list[list[list[float]]], statistic: str, max_launches: int,
                            tolerance: float) -> str:
    """Why launch rounds are undecided at their cap (``launches``: each side's
    launches' step times), and what would decide them."""
    spread = launchstats.launch_spread([launchstats.launch_values(side, statistic) for side in launches])
    return (f"undecided at the cap of {max_launches} launches a side: the interval is neither "
            f"wholly within ±{tolerance:.0%} nor a change beyond it; identical launches' "
            f"{statistic}s scattered {spread.log_sd:.1%} here, so more launches "
            f"(--max-launches {2 * max_launches}) or a quieter machine would decide it")


def undecided_reason(record: dict[str, Any], quads_by_pair: list[list[float]], tolerance: float,
                     quads: int, max_pairs: int) -> str:
    """Why a resident session is undecided at its cap, and what would decide it."""
    return (f"undecided after {max_pairs} launch pairs: {record.get('reason') or ''}; " + what_would_decide(
        quads_by_pair, record.get("ratio"), record.get("tau2") or 0.0, tolerance, quads, max_pairs))


def what_would_decide(quads_by_pair: list[list[float]], ratio: float | None, tau2: float, tolerance: float,
                      quads: int, max_pairs: int) -> str:
    """What would decide a resident session left undecided at its cap, from its
    own ratio and scatter: the quads a pair (decided at the first look) or the
    launch pairs (at these quads) whose interval would clear the nearer
    decision's bound (``same`` needs it within ±tolerance around this ratio,
    ``regressed``/``improved`` clear of 1), as ``compare_windows`` would pool them.
    About: the ratio moves, and pairs may disagree more or less than these did."""
    within = within_pair_variance(quads_by_pair)
    if within is None or not ratio or ratio <= 0:
        return f"--max-pairs {2 * max_pairs} or --quads {2 * quads} would narrow it"
    m, edge = abs(math.log(ratio)), math.log1p(tolerance)
    target = edge - m if m < edge else m  # the interval's half-width that would decide
    scatter = (f"a quad's log-ratio scattered {math.sqrt(within) * 100:.2f} % within its pair"
               + (f", the pairs {math.sqrt(tau2) * 100:.2f} % between them" if tau2 > 0 else ""))
    more_quads = fewest_quads(within, tau2, target, pair_look_confidence(max_pairs), pairs=MIN_PAIRS,
                              least=quads + 1, most=MAX_QUADS)
    more_pairs = next((p for p in range(max_pairs + 1, MAX_PAIRS + 1) if p in look_pairs(p) and design_half_width(
        within, tau2, quads, p, pair_look_confidence(p)) <= target), None)
    ways = ([f"about --quads {more_quads} (decided after {MIN_PAIRS} pairs)"] * bool(more_quads)
            + [f"about --max-pairs {more_pairs} at {quads} quads"] * bool(more_pairs))
    bound = f"±{tolerance * 100:g} %"
    if not ways:  # near the bound nothing decides; elsewhere the launches' own scatter is too wide
        near = target < edge / 4
        return (f"at ratio {ratio:.4g}{f' (near the {bound} bound)' if near else ''}, where {scatter}, no "
                f"session of up to {MAX_QUADS} quads or {MAX_PAIRS} pairs would decide {bound}"
                + ("" if near else ": a quieter machine would"))
    return f"at ratio {ratio:.4g}, where {scatter}, {' or '.join(ways)} would decide {bound}"


def finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def interval(entry: dict[str, Any]) -> str:
    confidence = entry.get("confidence") or DEFAULT_CONFIDENCE
    high = entry.get("ci_high")
    return (f"ratio {entry['ratio']:.4g} ({confidence * 100:.0f} % CI {entry['ci_low']:.4g}-"
            f"{'inf' if high is None else f'{high:.4g}'})")


def _detectable(record: dict[str, Any]) -> str:
    detectable = record.get("detectable")
    return "" if detectable is None else f"; smallest detectable change {detectable * 100:.2f} %"


def _accepted(record: dict[str, Any]) -> str:
    said = record.get("accepted")
    return f"; {said['line']}" if said else ""


def summary_line(record: dict[str, Any]) -> str:
    """The last word on a cell: verdict, interval, launches a side, and the
    smallest change its scatter resolved."""
    verdict = record["verdict"]
    if verdict not in (*DECIDED, "unknown") or record.get("ratio") is None:
        return f"{record['id']}  {verdict.upper()}  {record.get('reason') or ''}".rstrip()
    if record.get("mode") == "resident":
        return (f"{record['id']}  {verdict.upper()}  {interval(record)}, "
                f"{record.get('quads', 0)} ABBA quads over {len(record.get('pairs') or [])} launch pairs"
                + _detectable(record) + _accepted(record))
    return (f"{record['id']}  {verdict.upper()}  {interval(record)}, "
            f"{record['n_b']} vs {record['n_a']} launches" + _detectable(record) + _accepted(record))


def accept(record: dict[str, Any], entries: list[Any], commit_a: str | None = None) -> None:
    """A regressed cell (or failed check) that an entry of the accept file
    covers keeps ``accepted``: the entry, and whether the change measured is
    within it. An entry whose commit side A already holds accepts nothing."""
    if record.get("verdict") == "regressed" and record.get("ratio") is not None:
        entry = accepted_mod.applying(entries, record["id"], "step_time", commit_a)
        if entry is not None:
            record["accepted"] = accepted_mod.judged(entry, record["ratio"], record.get("ci_low"),
                                                     record.get("ci_high"))
    for check in record.get("checks") or []:
        if check.get("verdict") in FAILING and check.get("ratio") is not None:
            entry = accepted_mod.applying(entries, record["id"], check.get("metric") or check["name"], commit_a)
            if entry is not None:
                check["accepted"] = accepted_mod.judged(entry, check["ratio"], check.get("ci_low"),
                                                        check.get("ci_high"))


class Accepting:
    """The accept file's entries, applied to each cell as its verdict is said."""

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    def judge(self, record: dict[str, Any], commit_a: str | None = None) -> dict[str, Any]:
        accept(record, self.entries, commit_a)
        return record


def load_accepted() -> Accepting:
    """perfsuite-accept.toml (or PERFSUITE_ACCEPT_FILE's file): AcceptError, an
    OSError naming the file and entry, where it is malformed."""
    return Accepting(accepted_mod.load())


def within_accepted(item: dict[str, Any]) -> bool:
    return bool((item.get("accepted") or {}).get("within"))


def exit_code(records: list[dict[str, Any]]) -> int:
    """1 on a regression (but one accepted on purpose) or a failed launch, else
    3 while a cell is undecided, else 0."""
    if any((r["verdict"] == "regressed" and not within_accepted(r)) or r["verdict"] == "error"
           or any(c["verdict"] in FAILING and not within_accepted(c) for c in r["checks"]) for r in records):
        return EXIT_REGRESSED
    return EXIT_UNDECIDED if any(r["verdict"] == "unknown" for r in records) else EXIT_OK


def pair_failure(run: Any) -> tuple[str | None, str | None]:
    """The side that failed a launch pair and why, naming its first error;
    (None, None) where the pair ran whole. The side the coordinator saw fail
    (not ready, a window past its timeout, gone) is the one: the other's
    launch, ended with the pair, fails too for want of windows."""
    bad = [name for name in ORDER[:2] if (run.results.get(name) or {"status": "error"})["status"] != "ok"]
    failed = run.failed or (bad[0] if bad else None)
    if failed is None:
        return None, run.error
    result = run.results.get(failed) or {"status": "error", "reason": run.error}
    if result["status"] == "ok" and run.ready_s is not None:  # it ended well after a window past its timeout
        return failed, run.error
    if result["status"] == "ok":  # up and finished, yet it never said it was ready
        return failed, (f"side {failed}'s launch finished without serving a window (its ranks never said they "
                        "were ready: its perfsuite may predate resident A/B); --mode launches compares it "
                        "in launch rounds")
    return failed, side_failed(failed, result, run.error)


def check_room(result: dict[str, Any] | None) -> None:
    """A launch that failed for a full disk stops the session as a write there does."""
    if result is not None and result["status"] != "ok" and is_full(str(result.get("reason"))):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), result.get("dir"))
