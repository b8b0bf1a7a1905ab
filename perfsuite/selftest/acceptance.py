"""What a GPU acceptance run (``.ci/gpu-acceptance``) showed, read back from
its folder or its ``acceptance.tgz``: each part's exit code and wall time,
and per part the figures its issue asks for. The script prints it at its
end (``figures.txt``); a stored run is read again with

    python -m perfsuite.selftest.acceptance tests/data/<gpu>-<date>/acceptance.tgz [--json]

Every file the archive lists in its SHA256SUMS is checked first: a stored
run that is not what was measured is refused, naming the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from perfsuite.judge.judging import failures, unjudged

PARTS = ("doctor", "gate", "ab", "llm", "profile", "attribution", "rates")


class AcceptanceError(ValueError):
    """A folder or archive that is no acceptance run, or not the one measured."""


def verify(folder: Path) -> int:
    """Check every file SHA256SUMS lists; the count checked."""
    sums = folder / "SHA256SUMS"
    if not sums.is_file():
        raise AcceptanceError(f"{folder}: no SHA256SUMS (is it a .ci/gpu-acceptance folder?)")
    checked = 0
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        path = folder / name.lstrip("*")
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise AcceptanceError(f"{path}: {'missing' if not path.is_file() else 'not the file measured'} "
                                  f"(SHA256SUMS says {digest[:12]})")
        checked += 1
    return checked


@contextmanager
def opened(path: Path) -> Iterator[Path]:
    """The run's folder: ``path`` itself, or ``acceptance.tgz`` unpacked."""
    if path.is_dir():
        yield path
        return
    if not tarfile.is_tarfile(path):
        raise AcceptanceError(f"{path}: neither a folder nor a tar archive")
    with tempfile.TemporaryDirectory(prefix="perfsuite-acceptance-") as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parts(text: str) -> dict[str, dict[str, Any]]:
    """summary.txt's rows: part -> exit code (or "not-run") and wall seconds."""
    out: dict[str, dict[str, Any]] = {}
    rows = text.split("part rc wall_s\n", 1)[1].splitlines() if "part rc wall_s\n" in text else []
    for row in rows:
        words = row.split()
        if len(words) >= 3 and words[0] in PARTS:
            out[words[0]] = {"rc": int(words[1]) if words[1].lstrip("-").isdigit() else words[1],
                             "wall_s": int(words[2]) if words[2].isdigit() else None}
    return out


def gate(folder: Path) -> dict[str, Any] | None:
    """The gate's cells: run, not run (more GPUs than present), step time judged
    and how, what could not be compared, what was recorded, what failed."""
    run = _json(folder / "results.json")
    if not run:
        return None
    cells = [c for c in run.get("cells", []) if not c.get("partner")]
    ran = [c for c in cells if not c.get("needs_gpus")]
    step = [k for c in ran for k in c.get("checks", []) if k["name"] == "step_time"]
    return {"status": (run.get("run") or {}).get("status"),
            "cells": len(cells), "ran": len(ran), "ok": sum(c.get("status") == "ok" for c in ran),
            "not_run": sorted(c["id"] for c in cells if c.get("needs_gpus")),
            "step_time": dict(Counter(("recorded" if k.get("recorded") else k["verdict"]) for k in step)),
            "unjudged": {c["id"]: lines for c in ran if (lines := unjudged(c))},
            "failed": {c["id"]: [f"{k['name']}: {k.get('message')}" for k in failed] for c in ran
                       if (failed := failures(c))}}


def ab(folder: Path) -> dict[str, Any]:
    """Each A/B cell's sessions: per condition its verdict, ratio, interval, smallest detectable change."""
    out = {}
    for path in sorted(folder.glob("ab-*/ab-detection.json")):
        record = _json(path) or {}
        sessions = {}
        for trial in record.get("trials", []):
            for condition, judged in trial.get("conditions", {}).items():
                sessions.setdefault(condition, []).append(
                    {k: judged.get(k) for k in ("verdict", "ratio", "ci_low", "ci_high", "detectable", "seconds",
                                                "reason", "quad_sd", "forecast_quad_sd", "serial")})
        out[record.get("cell") or path.parent.name] = sessions
    return out


def results_of(folder: Path) -> list[dict[str, Any]]:
    run = _json(folder / "results.json") or {}
    return [{"id": c["id"], "status": c.get("status"), "reason": c.get("reason"),
             "profile": (c.get("profile") or {}).get("source"),
             "failed": [f"{k['name']}: {k.get('message')}" for k in failures(c)],
             "unjudged": unjudged(c)}
            for c in run.get("cells", [])]


def summarize(folder: Path) -> dict[str, Any]:
    """Every part's figures from an acceptance run's folder (verified first)."""
    checked = verify(folder)
    text = (folder / "summary.txt").read_text() if (folder / "summary.txt").is_file() else ""
    header = text.split("part rc wall_s", 1)[0].strip().splitlines()
    attribution = _json(folder / "attribution" / "attribution-selftest.json")
    rates = _json(folder / "rates" / "error-rates.json")
    earlier = sorted((p for p in folder.glob("gate.*") if p.suffix[1:].isdigit()), key=lambda p: int(p.suffix[1:]))
    return {"files_checked": checked, "machine": header, "parts": parts(text), "gate": gate(folder / "gate"),
            "earlier_gates": {p.name: gate(p) for p in earlier},  # finished runs an earlier call kept aside
            "ab": ab(folder), "llm": results_of(folder / "llm"), "profile": results_of(folder / "profile"),
            "attribution": attribution and {k: attribution.get(k) for k in
                                            ("cell", "steps", "sessions", "figures", "profiling_wall_overhead")},
            "rates": rates and {k: rates.get(k) for k in ("host", "settings", "cells", "confidence", "planned")}}


def _session(s: dict[str, Any]) -> str:
    ratio = f"{s['ratio']:.4g}" if isinstance(s.get("ratio"), (int, float)) else "-"
    span = (f" ({s['ci_low']:.4g}-{s['ci_high']:.4g})" if isinstance(s.get("ci_low"), (int, float))
            and isinstance(s.get("ci_high"), (int, float)) else "")
    detect = f", detects {s['detectable'] * 100:.2f} %" if isinstance(s.get("detectable"), (int, float)) else ""
    wall = f", {s['seconds']:.0f} s" if isinstance(s.get("seconds"), (int, float)) else ""
    scatter = (f", quads {s['quad_sd'] * 100:.2f} %" if isinstance(s.get("quad_sd"), (int, float)) else "") + (
        f" (forecast {s['forecast_quad_sd'] * 100:.2f} %)" if isinstance(s.get("forecast_quad_sd"), (int, float)) else "")
    serial = s.get("serial") or {}
    lag = (f", windows' lag-1 r {serial['same_side']:.2f} same side / {serial['across_sides']:.2f} across"
           if isinstance(serial.get("same_side"), (int, float)) else "")
    return f"{s['verdict']} {ratio}{span}{detect}{scatter}{lag}{wall}"


def _gate_lines(name: str, g: dict[str, Any]) -> list[str]:
    out = [f"{name}: {g['ran']} of {g['cells']} cells run ({g['ok']} ok), {len(g['not_run'])} not run "
           f"(need more GPUs than present); step time: "
           + (", ".join(f"{v} {k}" for k, v in sorted(g["step_time"].items())) or "none judged")]
    if g.get("status") not in ("complete", None):  # results.json lists only the cells it reached
        out.append(f"  the run is {g['status']}: the cells after these were not reached "
                   "(the next call's gate goes on with --perf-resume)")
    out += [f"  not compared, {cell}: {'; '.join(why)}" for cell, why in g["unjudged"].items()]
    out += [f"  failed, {cell}: {'; '.join(why)}" for cell, why in g["failed"].items()]
    return out


def lines(summary: dict[str, Any]) -> list[str]:
    """The figures in words."""
    from perfsuite.selftest.attribution import figure_lines as attribution_lines
    from perfsuite.selftest.error_rates import figure_lines as rates_lines

    out = [f"perfsuite GPU acceptance ({summary['files_checked']} files checked against SHA256SUMS)",
           *(f"  {line}" for line in summary["machine"][1:])]
    out.append("parts: " + ", ".join(f"{name} rc {p['rc']} ({p['wall_s']} s)" for name, p in summary["parts"].items()))
    for name, g in [*summary.get("earlier_gates", {}).items(), ("gate", summary["gate"])]:
        if g is not None:
            out += _gate_lines(name, g)
    for cell, conditions in summary["ab"].items():
        out.append(f"ab {cell}: " + "; ".join(f"{condition} -> " + ", ".join(map(_session, sessions))
                                              for condition, sessions in conditions.items()))
    for part in ("llm", "profile"):
        for cell in summary[part]:
            extra = f", profile from {cell['profile']}" if cell["profile"] else ""
            why = f" ({cell['reason']})" if cell["reason"] else ""
            out.append(f"{part} {cell['id']}: {cell['status']}{why}{extra}"
                       + "".join(f"; failed {f}" for f in cell["failed"]))
            out += [f"  not compared: {line}" for line in cell.get("unjudged", [])]
    if summary["attribution"]:
        out.append(f"attribution ({summary['attribution']['cell']}, {summary['attribution']['steps']} steps a launch):")
        out += [f"  {line}" for line in attribution_lines(summary["attribution"])]
    if summary["rates"]:
        out += rates_lines(summary["rates"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfsuite.selftest.acceptance",
                                     description="What a GPU acceptance run showed, from its folder or archive")
    parser.add_argument("path", type=Path, help="the run's folder ($PERFSUITE_ACCEPTANCE_DIR) or acceptance.tgz")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    try:
        with opened(args.path) as folder:
            summary = summarize(folder)
    except (AcceptanceError, OSError, tarfile.TarError) as err:
        print(f"perfsuite acceptance: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1) if args.json else "\n".join(lines(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
