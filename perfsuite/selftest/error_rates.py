"""Published error rates of ``perfsuite ab`` on this runner (``perfsuite
selftest error-rates``).

Per cell, n A/A sessions (side B the same code as side A: any call is a
false one) and n with side B slowed by an injected fraction, alternating,
each one session of ``detection.run_ab_session``. Kept per cell: false calls
out of n, A/A sessions called ``same``, injected ones called ``regressed``,
the smallest change an A/A session resolved (its interval's half-width at
the session's confidence: median and range) and minutes a verdict (the
median session's wall time, A/A and injected alike). error-rates.json
(schema: perfsuite.report.error_rates) is rewritten after every session
with every session in it, so ``resume`` goes on from a stopped run.

``from_detection`` derives the same figures from a detection benchmark's
record (``verdict-detection --ab``), whose unchanged sessions are A/A ones.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.ab.verdicts import look_pairs
from perfsuite.options import DEFAULT_MAX_PAIRS
from perfsuite.report.error_rates import SCHEMA
from perfsuite.selftest.detection import AB_TOLERANCE, DEFAULT_CELL, ab_fault, run_ab_session, session_line
from perfsuite.stats.windows import WITHIN, detectable_change
from perfsuite.system.atomic import atomic_write_json

GPU_CELL = "gate/image/ddp-ds/g1/fp32/px500/pin/nchw"  # the pull-request A/B's, measured on an H100 and an H200
DEFAULT_FRACTION = 0.05
DEFAULT_SESSIONS = {"cpu": 40, "cuda": 10}  # a cell's, where not given: what is asked of each kind of runner
DEFAULT_OUT = Path(".perfsuite") / "error-rates"
FILE = "error-rates.json"
KINDS = ("aa", "injected")
FALSE_CALLS = ("regressed", "improved")
VERDICTS = ("same", "regressed", "improved", "unknown")  # what a session that ran to its end says
HOST_KEYS = ("cpu", "gpu", "gpus", "cores", "torch")  # a resumed run's sessions must come from the same machine


def default_cells() -> list[str]:
    """One smoke cell on a machine without a GPU, one gate cell on one with."""
    import torch

    return [GPU_CELL if torch.cuda.is_available() else DEFAULT_CELL]


def fault_kind_for(cell: cells.Cell, kind: str = "auto") -> str:
    """``auto``: device time (gpu-sleep) on a CUDA cell, host time (slow) otherwise."""
    if kind == "auto":
        return "gpu-sleep" if cell.device == "cuda" else "slow"
    return kind


def host_facts(env: Mapping[str, Any], date: str | None = None) -> dict[str, Any]:
    """The machine and stack the rates hold for (from a fingerprint, ``hardware.fingerprint``)."""
    return {"cpu": env.get("cpu_model"), "cpu_isa": env.get("cpu_isa"), "cores": env.get("cpu_cores"),
            "gpu": env.get("gpu_name"), "gpus": env.get("gpu_count") or 0, "torch": env.get("torch"),
            "python": env.get("python"), "platform": env.get("platform"), "perfsuite": env.get("perfsuite"),
            "commit": env.get("commit"), "date": date}


def session_detectable(session: Mapping[str, Any]) -> float | None:
    """A session's smallest detectable change: as it says, else from its interval
    (records made before sessions said it; the same rule, ``detectable_change``)."""
    if session.get("detectable") is not None:
        return float(session["detectable"])
    return detectable_change(session.get("ci_low"), session.get("ci_high"))


def false_call_bound(false_calls: int, sessions: int, confidence: float = 0.95) -> float:
    """The most the false-call rate can be, one-sided at ``confidence``, after
    ``false_calls`` in ``sessions`` A/A sessions (Clopper-Pearson; with none,
    ``1 - (1 - confidence) ** (1 / sessions)``)."""
    from scipy.stats import beta

    if false_calls >= sessions:
        return 1.0
    return float(beta.ppf(confidence, false_calls + 1, sessions - false_calls))


def cell_figures(sessions: list[Mapping[str, Any]], fraction: float) -> dict[str, Any]:
    """One cell's figures from its sessions (each with ``kind``: aa or injected)."""
    aa = [s for s in sessions if s["kind"] == "aa"]
    injected = [s for s in sessions if s["kind"] == "injected"]
    detectable = sorted(d for d in map(session_detectable, aa) if d is not None)
    walls = [s["seconds"] for s in sessions if s.get("seconds") is not None]
    return {"sessions": len(aa),
            "false_calls": sum(s["verdict"] in FALSE_CALLS for s in aa),
            "same": sum(s["verdict"] == "same" for s in aa),
            "injected": {"fraction": fraction, "sessions": len(injected),
                         "regressed": sum(s["verdict"] == "regressed" for s in injected)},
            "detectable": round(statistics.median(detectable), 6) if detectable else None,
            "detectable_spread": [round(detectable[0], 6), round(detectable[-1], 6)] if detectable else None,
            "minutes_per_verdict": round(statistics.median(walls) / 60, 2) if walls else None}


def document(host: dict[str, Any], settings: dict[str, Any], sessions: list[dict[str, Any]],
                planned: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """error-rates.json: the figures per cell, and every session they come from."""
    by_cell = {cell: [s for s in sessions if s["cell"] == cell] for cell in settings["cells"]}
    confidence = {cell: statistics.median(c) for cell, done in by_cell.items()
                  if (c := [s["confidence"] for s in done if s.get("confidence") is not None])}
    return {"schema": SCHEMA, "host": host,
            "cells": {cell: cell_figures(done, settings["fraction"]) for cell, done in by_cell.items() if done},
            "settings": settings, "confidence": confidence, "planned": planned or {}, "per_session": sessions}


# ------------------------------------------------------------ measured here
def _earlier_sessions(path: Path, settings: dict[str, Any], host: dict[str, Any],
                      resume: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The sessions a stopped run left in ``path`` and the host they were
    measured on, if it is to go on; ([], ``host``) where there is none."""
    if not path.exists():
        return [], host
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        sessions, saved_settings, saved_host = saved["per_session"], saved["settings"], saved["host"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not an error-rates file this version can go on from ({err}); "
                         "choose another --out") from err
    if not resume:
        raise ValueError(f"{path} already holds {len(sessions)} session(s); pass --resume to go on "
                         "with them or choose another --out")
    differ = {k: (saved_settings.get(k), v) for k, v in settings.items() if saved_settings.get(k) != v}
    if differ:
        raise ValueError(f"{path} was measured with other settings "
                         f"({'; '.join(f'{k}: {a} there, {b} now' for k, (a, b) in differ.items())}); "
                         "resume with the same settings or choose another --out")
    moved = {k: (saved_host.get(k), host.get(k)) for k in HOST_KEYS if saved_host.get(k) != host.get(k)}
    if moved:
        raise ValueError(f"{path} was measured on another machine "
                         f"({'; '.join(f'{k}: {a} there, {b} here' for k, (a, b) in moved.items())}); "
                         "its rates are that machine's: choose another --out")
    if saved_host.get("commit") != host.get("commit"):  # another decision rule, perhaps: not one rate
        there, here = (str(h.get("commit") or "unknown")[:7] for h in (saved_host, host))
        raise ValueError(f"{path} was measured by perfsuite at commit {there} there, {here} here: one rate is "
                         "one version's sessions; choose another --out (or check out that commit to go on)")
    return sessions, saved_host


def _ended(judged: dict[str, Any], cell: str, folder: Path, path: Path) -> None:
    """A session that did not come to a verdict (a launch failed, the cell
    was skipped) stops the run: it is no error rate of the verdict."""
    if judged["verdict"] not in VERDICTS:
        raise RuntimeError(f"an A/B session of {cell} ended {judged['verdict']}: see {folder / 'ab.html'}; "
                           f"the sessions before it are kept in {path}, and --resume goes on from them")


def measure_error_rates(cell_ids: list[str] | None = None, sessions: int | None = None,
                        fraction: float = DEFAULT_FRACTION, out_dir: Path | None = None, *,
                        injected: int | None = None, resume: bool = False, tolerance: float = AB_TOLERANCE, steps: int = 40,
                        max_launches: int = 12, mode: str = "auto", resident: dict[str, int] | None = None,
                        fault_kind: str = "auto",
                        log: Callable[[str], None] = lambda line: print(line, flush=True)) -> dict[str, Any]:
    """A/A and injected sessions per cell, alternating, until ``sessions`` A/A
    and ``injected`` (default: as many) injected ones are done (counting those
    a stopped run left in ``out_dir`` when ``resume``)."""
    from perfsuite.hardware import fingerprint  # torch: the command's alone

    if not 0 < fraction < 1:
        raise ValueError(f"--fraction {fraction}: give a fraction between 0 and 1 (0.05 = 5 %)")
    if sessions is not None and sessions < 1:
        raise ValueError(f"--sessions {sessions}: give 1 or more")
    if injected is not None and injected < 0:
        raise ValueError(f"--injected {injected}: give 0 or more")
    chosen = [cells.get(c).replace(max_steps=steps) for c in (cell_ids or default_cells())]
    kinds = {c.id: fault_kind_for(c, fault_kind) for c in chosen}
    faults = {c.id: ab_fault(kinds[c.id], c, fraction) for c in chosen}  # refused before any launch
    planned = {}
    for c in chosen:
        n = sessions or DEFAULT_SESSIONS["cuda" if c.device == "cuda" else "cpu"]
        planned[c.id] = {"aa": n, "injected": n if injected is None else injected}
    settings = {"cells": [c.id for c in chosen], "fraction": fraction, "tolerance": tolerance, "steps": steps,
                "max_launches": max_launches, "mode": mode, "fault_kinds": kinds, "resident": dict(resident or {}),
                # where the sessions look: a run measured under another rule is not resumed
                "looks": look_pairs(int((resident or {}).get("max_pairs") or DEFAULT_MAX_PAIRS)),
                "within": WITHIN}  # and how a pair's error is weighed (compare_windows)
    work = Path(out_dir or DEFAULT_OUT)
    path = work / FILE
    host = host_facts(fingerprint(), time.strftime("%Y-%m-%d", time.gmtime()))
    done, host = _earlier_sessions(path, settings, host, resume)
    work.mkdir(parents=True, exist_ok=True)
    if done:
        log(f"going on from {len(done)} session(s) in {path}")
    finished = {(s["cell"], s["kind"], s["index"]) for s in done}
    for cell in chosen:
        wanted = planned[cell.id]
        for index in range(max(wanted.values())):
            for kind in KINDS if index % 2 == 0 else KINDS[::-1]:  # neither always first
                if index >= wanted[kind] or (cell.id, kind, index) in finished:
                    continue
                folder = work / cell.id.replace("/", "-") / f"{kind}{index}"
                shutil.rmtree(folder, ignore_errors=True)  # a stopped session's launches
                judged = run_ab_session(cell, folder, faults[cell.id] if kind == "injected" else None,
                                        tolerance=tolerance, max_launches=max_launches, mode=mode,
                                        resident=resident)
                _ended(judged, cell.id, folder, path)
                done.append({"cell": cell.id, "kind": kind, "index": index, **judged})
                log(f"{cell.id} {'A/A' if kind == 'aa' else f'{fraction:.0%} slower'} session "
                    f"{index + 1}/{wanted[kind]} -> {session_line(judged)}")
                atomic_write_json(path, document(host, settings, done, planned))  # --resume goes on from here
    out = document(host, settings, done, planned)
    atomic_write_json(path, out)
    return {**out, "file": str(path)}


# ------------------------------------------------------- from a stored record
def condition_fraction(condition: str) -> float:
    """How much slower side B was: "unchanged" 0, "slow10" and "slow 10%" 0.10."""
    if condition == "unchanged":
        return 0.0
    try:
        return float(condition.removeprefix("slow").strip().rstrip("%")) / 100
    except ValueError:
        raise ValueError(f"condition {condition!r}: neither unchanged nor slowN") from None


def detection_sessions(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A detection benchmark's sessions, each with its condition's fraction:
    from a stored record (``sessions``, as tests/data/cpu-2026-11-26/) or the
    ab-detection.json that ``verdict-detection --ab`` writes (``trials``)."""
    if isinstance(record.get("sessions"), list):
        found = [(s.get("cell"), s.get("trial"), s["condition"], s) for s in record["sessions"]]
    elif isinstance(record.get("trials"), list):
        found = [(record.get("cell"), t.get("trial"), name, s) for t in record["trials"]
                 for name, s in t["conditions"].items()]
    else:
        raise ValueError("it holds neither sessions nor trials of `perfsuite selftest verdict-detection --ab`")
    out = []
    for cell, trial, condition, s in found:
        pairs = s.get("pairs")
        out.append({"cell": cell, "trial": trial, "fraction": condition_fraction(condition),
                    "verdict": s["verdict"], "ratio": s.get("ratio"), "ci_low": s.get("ci_low"),
                    "ci_high": s.get("ci_high"), "detectable": session_detectable(s),
                    "confidence": s.get("confidence"), "pairs": len(pairs) if isinstance(pairs, list) else pairs,
                    "seconds": s.get("wall_s", s.get("seconds"))})
    return out


def from_detection(record: Mapping[str, Any], fraction: float = DEFAULT_FRACTION,
                   source: str | None = None) -> dict[str, Any]:
    """error-rates.json's figures from a detection benchmark's record: its
    unchanged sessions are the A/A ones, those slowed by ``fraction`` the
    injected ones (other slowdowns are left out)."""
    where = source or "the record"
    try:
        sessions = detection_sessions(record)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where} is not a detection benchmark's record ({err})") from err
    fractions = sorted({s["fraction"] for s in sessions if s["fraction"]})
    if not any(math.isclose(f, fraction) for f in fractions):
        raise ValueError(f"{where} holds no session slowed by {fraction:.3g} (it holds "
                         f"{', '.join(f'{f:.3g}' for f in fractions) or 'none'}); pass --fraction with one of them")
    kept: list[dict[str, Any]] = []
    for s in sessions:
        kind = "aa" if not s["fraction"] else "injected" if math.isclose(s["fraction"], fraction) else None
        if kind:
            index = sum(k["cell"] == s["cell"] and k["kind"] == kind for k in kept)
            kept.append({"cell": s["cell"], "kind": kind, "index": index,
                         **{k: v for k, v in s.items() if k not in ("cell", "fraction")}})
    saved = record.get("settings") or {}
    settings = {"from_detection": source, "cells": list(dict.fromkeys(s["cell"] for s in kept)),
                "fraction": fraction, "tolerance": saved.get("tolerance", record.get("tolerance")),
                "resident": saved.get("resident") or {}}
    return document(host_facts(record.get("env") or {}, record.get("date")), settings, kept)


# ----------------------------------------------------------------- printed
def figure_lines(out: Mapping[str, Any]) -> list[str]:
    """The figures in words, a block a cell."""
    host = out.get("host") or {}
    said = (host.get("gpu") or host.get("cpu"), f"{host.get('cores')} cores" if host.get("cores") else None,
            f"torch {host.get('torch')}" if host.get("torch") else None, host.get("date"))
    machine = ", ".join(str(x) for x in said if x)
    tolerance = (out.get("settings") or {}).get("tolerance")
    lines = [f"perfsuite ab's error rates on {machine or 'this runner'}"
             + (f", judged at ±{tolerance:.0%}" if tolerance else "")]
    for cell_id, c in out.get("cells", {}).items():
        n, injected = c["sessions"], c["injected"]
        confidence = (out.get("confidence") or {}).get(cell_id)
        spread = c["detectable_spread"]
        planned = (out.get("planned") or {}).get(cell_id) or {}
        planned_aa = planned.get("aa") if isinstance(planned, dict) else planned  # an int in older files
        lines.append(f"{cell_id}: {n} A/A sessions"
                     + (f" of {planned_aa} planned" if planned_aa and planned_aa > n else ""))
        bound = f" (so the rate is below {false_call_bound(c['false_calls'], n):.1%} at 95% confidence)" if n else ""
        figures = [("false calls (A/A called regressed or improved)", f"{c['false_calls']}/{n}{bound}"),
                   ("A/A called same", f"{c['same']}/{n}"),
                   (f"{injected['fraction']:.0%} slower B called regressed",
                    f"{injected['regressed']}/{injected['sessions']}")]
        if c["detectable"] is not None:
            figures.append(("smallest detectable change" + (f" at {confidence:.1%} confidence" if confidence else ""),
                            f"{c['detectable']:.2%} (median; {spread[0]:.2%}-{spread[1]:.2%})"))
        if c["minutes_per_verdict"] is not None:
            figures.append(("minutes per verdict (median session)", f"{c['minutes_per_verdict']:.1f}"))
        width = max(len(label) for label, _ in figures) + 1
        lines += [f"  {label + ':':<{width}} {value}" for label, value in figures]
    return lines
