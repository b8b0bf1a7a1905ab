"""Why a step-time change happened: two profile summaries, diffed.

``attribute(a, b, change_s=...)`` matches the rows of side A and side B
level by level (modules, operators, kernels, collectives, copies; kernel
names normalised by perfsuite.profiling.names), per step and per rank, and
ranks each level's rows by their share of the measured step-time change.
Levels nest (a module's time holds its operators', which launch its
kernels), so shares are summed within a level only: each level says what
share of the change its listed rows explain. A row is listed only above the
diff's own noise: the spread of the profiled steps' times on each side
(``NOISE_Z`` standard errors of the difference of their means), and the
row's own spread per step; a row both sides hold whose calls per step
differ is listed whatever its time (``calls_changed``: counted, not timed,
so exact where a small change of time is not). Rows only one side has are "appeared" or
"vanished", unless the side without it kept only its largest rows
(``meta["capped"]``: per category, the largest row it left out): then it is
"capped", its change a lower bound. Pure Python; the record is JSON-ready
(``to_dict``); the terminal and markdown renderings are ``format_attribution`` and
``markdown_attribution``. How to read it: docs/explanation/attribution.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .names import match_key
from .summary import ProfileSummary

__all__ = ["LEVELS", "NOISE_Z", "Attribution", "AttributionRow", "LevelShare", "attribute",
           "attribute_results", "format_attribution", "markdown_attribution", "summary_of"]

SCHEMA = "perfsuite.attribution/1"
LEVELS = ("module", "operator", "kernel", "collective", "copy")
LEVEL_OF = {"module": "module", "cpu_op": "operator", "kernel": "kernel", "collective": "collective",
            "memcpy": "copy", "memset": "copy"}
NOISE_Z = 3.0  # standard errors: a row of an unchanged pair lands above it about once in 400
# Half a call a step (and rank): a steady training step calls each operator, kernel, collective and
# copy a whole number of times, the same on both sides unless the code changed; a change of calls is
# exact where a change of time is noisy (an extra clone of 158 parameters adds ~1 % of a CPU step).
CALLS_CHANGED = 0.5


@dataclass
class AttributionRow:
    """One matched row: seconds and calls per step (and rank) on each side."""

    level: str
    name: str
    a_s: float
    b_s: float
    a_calls: float
    b_calls: float
    status: str  # changed | appeared | vanished | capped (left out under one side's cap on rows)
    share: float | None  # of the measured step-time change; None where that is 0
    noise_s: float  # this row's own noise floor
    a_name: str | None = None  # A's name where it differs (a kernel matched across builds)
    # its calls per step (and rank) differ: counted, not timed, so listed even under the time noise
    calls_changed: bool = False

    @property
    def delta_s(self) -> float:
        return self.b_s - self.a_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "delta_s": self.delta_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttributionRow:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class LevelShare:
    level: str
    explained: float | None  # sum of the listed rows' shares
    rows: list[AttributionRow] = field(default_factory=list)
    unlisted: int = 0  # matched rows under the noise

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "explained": self.explained, "unlisted": self.unlisted,
                "rows": [row.to_dict() for row in self.rows]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LevelShare:
        return cls(data["level"], data.get("explained"), [AttributionRow.from_dict(r) for r in data.get("rows") or []],
                   int(data.get("unlisted") or 0))


@dataclass
class Attribution:
    """The diff of side A against side B (see the module doc)."""

    a_step_s: float
    b_step_s: float
    change_s: float
    noise_s: float  # the step-time noise of the profiled steps: no row under it is listed
    levels: dict[str, LevelShare]
    steps: tuple[int, int]
    ranks: tuple[int, int]

    @property
    def top(self) -> list[AttributionRow]:
        """Every level's listed rows by |change|, largest first; a module whose
        change is the first row's within their noise leads it (it holds that
        operator's or kernel's change, and says where in the model)."""
        rows = sorted((row for level in self.levels.values() for row in level.rows),
                      key=lambda r: (-abs(r.delta_s), LEVELS.index(r.level), r.name))
        lead = rows[0] if rows else None
        holder = next((r for r in rows[1:] if lead.level != "module" and r.level == "module"
                       and r.delta_s * lead.delta_s > 0
                       and abs(lead.delta_s) - abs(r.delta_s) <= max(lead.noise_s, r.noise_s)), None)
        return [holder, *(r for r in rows if r is not holder)] if holder else rows

    @property
    def explained(self) -> float | None:
        """The explained share of the top row's level (the level that answers)."""
        top = self.top
        return self.levels[top[0].level].explained if top else None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "a_step_s": self.a_step_s, "b_step_s": self.b_step_s,
                "change_s": self.change_s, "noise_s": self.noise_s, "explained": self.explained,
                "steps": list(self.steps), "ranks": list(self.ranks),
                "top": [row.to_dict() for row in self.top[:10]],
                "levels": {name: level.to_dict() for name, level in self.levels.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attribution:
        """The diff again from ``to_dict``'s record (e.g. a cell's in ab.json;
        other keys are left aside), so that it renders as before."""
        def number(key: str) -> float:
            return math.nan if data.get(key) is None else float(data[key])

        return cls(number("a_step_s"), number("b_step_s"), number("change_s"), number("noise_s"),
                   {name: LevelShare.from_dict(level) for name, level in data["levels"].items()},
                   tuple(data["steps"]), tuple(data["ranks"]))


def summary_of(data: ProfileSummary | Mapping[str, Any]) -> ProfileSummary:
    return data if isinstance(data, ProfileSummary) else ProfileSummary.from_dict(data)


def _parts(summary: ProfileSummary) -> list[ProfileSummary]:
    return summary.ranks or [summary]


def _step_times(summary: ProfileSummary) -> list[float]:
    """Per profiled step, the mean over ranks of its time (the ProfilerStep ranges)."""
    per_rank = [list(part.meta.get("step_times_s") or []) for part in _parts(summary)]
    per_rank = [times for times in per_rank if times]
    if not per_rank:
        return []
    n = min(len(times) for times in per_rank)
    return [statistics.fmean(times[i] for times in per_rank) for i in range(n)]


def _rows(summary: ProfileSummary) -> tuple[dict[tuple[str, str], list[Any]], int, int]:
    """(level, match key) -> [seconds, calls, variance, first name], per step and rank."""
    parts = _parts(summary)
    ranks = len(parts)
    steps = summary.steps or max((part.steps or 0) for part in parts) or 1
    scale = 1.0 / (steps * ranks)
    out: dict[tuple[str, str], list[Any]] = {}
    for row in summary.rows:
        level = LEVEL_OF.get(row.category)
        if level is None:
            continue
        key = (level, match_key(row.category, row.name))
        seen = out.setdefault(key, [0.0, 0.0, 0.0, row.name])
        seen[0] += row.total_s * scale
        seen[1] += row.calls * scale
        seen[2] += (row.step_sd_s or 0.0) ** 2 / ranks ** 2  # the sd of a per-rank mean
    return out, steps, ranks


def _floors(summary: ProfileSummary, steps: int, ranks: int) -> dict[str, float]:
    """Per level, the most a row that a capped summary left out can hold, per step and rank."""
    out: dict[str, float] = {}
    for category, total in (summary.meta.get("capped") or {}).items():
        if (level := LEVEL_OF.get(category)) is not None:
            out[level] = max(out.get(level, 0.0), float(total) / (steps * ranks))
    return out


def attribute(a: ProfileSummary | Mapping[str, Any], b: ProfileSummary | Mapping[str, Any], *,
              change_s: float | None = None, z: float = NOISE_Z) -> Attribution:
    """The diff of two profile summaries (a cell's merged one or one rank's).

    change_s: the measured step-time change (B - A, seconds), e.g. the
    verdict's; default: the change of the profiled steps' median times.
    """
    a, b = summary_of(a), summary_of(b)
    a_times, b_times = _step_times(a), _step_times(b)
    rows_a, steps_a, ranks_a = _rows(a)
    rows_b, steps_b, ranks_b = _rows(b)
    a_step = statistics.median(a_times) if a_times else math.nan
    b_step = statistics.median(b_times) if b_times else math.nan
    if change_s is None:
        change_s = b_step - a_step
    noise = z * math.sqrt(_sem2(a_times) + _sem2(b_times))
    levels = {level: LevelShare(level, None) for level in LEVELS}
    floors_a, floors_b = _floors(a, steps_a, ranks_a), _floors(b, steps_b, ranks_b)
    for key in sorted(set(rows_a) | set(rows_b)):
        level, _ = key
        sa, ca, va, name_a = rows_a.get(key, [0.0, 0.0, 0.0, None])
        sb, cb, vb, name_b = rows_b.get(key, [0.0, 0.0, 0.0, None])
        capped = level in (floors_a if name_a is None else floors_b if name_b is None else ())
        if capped:  # under the cap of the side without it: at most that side's floor there
            sa, sb = (min(sb, floors_a[level]), sb) if name_a is None else (sa, min(sa, floors_b[level]))
        own = z * math.sqrt(va / steps_a + vb / steps_b)
        status = ("capped" if capped else "appeared" if name_a is None else "vanished" if name_b is None
                  else "changed")
        row = AttributionRow(level, name_b or name_a, sa, sb, ca, cb, status,
                             (sb - sa) / change_s if change_s else None, own,
                             name_a if name_a not in (None, name_b) else None,
                             # both sides hold it: a row one side lacks may only be under its cut for small rows
                             calls_changed=status == "changed" and abs(cb - ca) >= CALLS_CHANGED)
        if (abs(row.delta_s) > max(noise, own) or (status != "changed" and abs(row.delta_s) > noise)
                or row.calls_changed):
            levels[level].rows.append(row)
        else:
            levels[level].unlisted += 1
    for level in levels.values():
        level.rows.sort(key=lambda r: (-abs(r.delta_s), r.name))
        if change_s and any(LEVEL_OF.get(c) == level.level for c in _categories(a, b)):
            level.explained = math.fsum(r.delta_s for r in level.rows) / change_s
    return Attribution(a_step, b_step, change_s, noise, levels, (steps_a, steps_b), (ranks_a, ranks_b))


def _sem2(times: Sequence[float]) -> float:
    """Squared standard error of the mean of ``times`` (0 for fewer than 2),
    the spread taken from the median absolute deviation: a profiled window's
    first steps (the profiler's own start) would inflate a variance."""
    if len(times) < 2:
        return 0.0
    middle = statistics.median(times)
    sd = 1.4826 * statistics.median(abs(t - middle) for t in times)
    return sd * sd / len(times)


def _categories(*summaries: ProfileSummary) -> set[str]:
    return {row.category for s in summaries for row in s.rows}


def attribute_results(a: Mapping[str, Any], b: Mapping[str, Any], *, z: float = NOISE_Z) -> Attribution | None:
    """The diff of two cell results (results.json's cells): their ``profile``
    summaries and their measured step times' change; None where a side has
    no profile summary."""
    if not a.get("profile") or not b.get("profile"):
        return None
    try:
        change = float(b["metrics"]["step_time"]["value"]) - float(a["metrics"]["step_time"]["value"])
    except (KeyError, TypeError, ValueError):
        change = None
    return attribute(a["profile"], b["profile"], change_s=change if change and math.isfinite(change) else None,
                     z=z)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2f} ms" if seconds else "0 ms"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _label(row: AttributionRow) -> str:
    tag = {"appeared": " (appeared)", "vanished": " (vanished)",
           "capped": " (at least: one side kept its top rows only)"}.get(row.status, "")
    if row.calls_changed:
        tag += f" (calls {row.a_calls:g} -> {row.b_calls:g} a step)"
    return f"{row.name}{tag}"


def format_attribution(diff: Attribution, top: int = 3, indent: str = "  ") -> str:
    """Terminal lines: the change, the top rows of every level, the explained shares."""
    rel = diff.change_s / diff.a_step_s if diff.a_step_s else math.nan
    lines = [f"{indent}measured change {_ms(diff.change_s)} ({100 * rel:+.1f} %); profiled steps "
             f"{diff.a_step_s * 1e3:.2f} -> {diff.b_step_s * 1e3:.2f} ms, noise {diff.noise_s * 1e3:.2f} ms a step"]
    rows = diff.top[:top]
    if not rows:
        lines.append(f"{indent}no row changed by more than the noise")
    for row in rows:
        lines.append(f"{indent}  {_ms(row.delta_s):>11} {_share(row.share):>6}  {row.level:<10} {_label(row)[:90]}")
    lines.append(f"{indent}explained: " + ", ".join(
        f"{name} {_share(level.explained)}" for name, level in diff.levels.items() if level.explained is not None))
    return "\n".join(lines)


def markdown_attribution(diff: Attribution, top: int = 10) -> str:
    """A markdown table of the largest rows of every level, and the explained shares."""
    lines = [f"Measured change {_ms(diff.change_s)}; profiled steps {diff.a_step_s * 1e3:.2f} ms → "
             f"{diff.b_step_s * 1e3:.2f} ms, noise {diff.noise_s * 1e3:.2f} ms a step.", ""]
    if not diff.top:  # a sentence, not a table with a header and no rows
        lines.append("No row changed by more than the noise: no module, operator, kernel, collective or copy "
                     "the profile names holds the change.")
    else:
        lines += ["| level | row | A ms/step | B ms/step | change | share | calls/step A → B |",
                  "|---|---|---:|---:|---:|---:|---|"]
    for row in diff.top[:top]:
        name = _label(row).replace("|", "\\|")
        lines.append(f"| {row.level} | `{name}` | {row.a_s * 1e3:.3f} | {row.b_s * 1e3:.3f} | {_ms(row.delta_s)} "
                     f"| {_share(row.share)} | {row.a_calls:g} → {row.b_calls:g} |")
    lines += ["", "Explained share of the change, per level: " + ", ".join(
        f"{name} {_share(level.explained)}" for name, level in diff.levels.items()
        if level.explained is not None) + "."]
    return "\n".join(lines)
