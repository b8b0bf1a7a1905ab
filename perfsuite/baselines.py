"""Baselines: numbers to judge a run against, one folder per hardware profile.

Folder files and columns: ``baselines/README.md``. Rows are keyed by cell
parameters, not cell ids, so a cell of any tier finds the rows whose
parameters it shares (a blank key matches anything). Absolute metrics
(seconds, images/s, bytes) compare only within one hardware profile, ratios
within one GPU (or CPU) model, accuracy anywhere; otherwise the Expectation
is not available and says why, never a pass.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perfsuite import stats
from perfsuite.fsutil import atomic_write_text

FORMAT = "perfsuite.baselines/1"
PROFILE_FILE, METRICS_FILE, RATIOS_FILE, FINDINGS_FILE, SAMPLES_FILE = (
    "profile.json", "metrics.csv", "ratios.csv", "findings.csv", "samples.json")
KINDS = ("paper", "recorded")  # transcribed from a publication, or measured by this suite

# Cell parameters a row may be keyed on: the fields of perfsuite.cells.Cell
# that change what is measured, plus "model" for the LLM tables.
KEY_COLUMNS = ("workload", "device", "strategy", "model", "dataset", "world_size", "precision",
               "pin_memory", "image_size", "memory_format", "batch_size", "epochs", "max_steps",
               "loader_workers", "lr", "lr_warmup_steps", "max_seq_len", "profile")
PROVENANCE_COLUMNS = ("source", "kind", "recorded_at", "commit", "fingerprint", "versions",
                      "assumptions", "notes", "cell")
METRIC_COLUMNS = ("id", *KEY_COLUMNS, "metric", "value", "unit", "better", "tolerance",
                  "samples_key", *PROVENANCE_COLUMNS)
RATIO_COLUMNS = ("id", *KEY_COLUMNS, "metric", "reference", "value", "low", "high", "better",
                 "tolerance", "stated", "trend", *PROVENANCE_COLUMNS)
REQUIRED = {METRICS_FILE: ("id", "metric", "value", "unit", "better", "tolerance", "source"),
            RATIOS_FILE: ("id", "metric", "reference", "tolerance", "source"),
            FINDINGS_FILE: ("id", "metric", "reference", "tolerance", "source")}

PORTABLE_METRICS = frozenset({"accuracy"})  # all but these and ratios are absolute
RATIO_METRICS = frozenset({"speedup", "step_time_ratio"})
HIGHER_IS_BETTER = frozenset({"throughput", "accuracy", "speedup"})
# The metrics record_run keeps, each with the tolerance a new row gets.
RECORDED_TOLERANCE = {"step_time": 0.05, "throughput": 0.05, "epoch_time": 0.05,
                      "total_time": 0.10, "accuracy": 0.02, "peak_mem_allocated": 0.05,
                      "peak_mem_reserved": 0.05, "peak_rss": 0.10, "h2d_bytes": 0.01}
# What a launch contributes to a launch-level verdict; a profile's noise decides (profile.json).
LAUNCH_STATISTICS = tuple(stats.LAUNCH_STATISTICS)
ENV_VERSION_KEYS = ("torch", "torchvision", "torchtune", "torchao", "cuda", "cudnn", "nccl",
                    "driver", "python")


class BaselineError(ValueError):
    """A baseline file or request that cannot be used as it stands."""


def default_root() -> Path:
    """``$PERFSUITE_BASELINES`` or the repository's ``baselines/``."""
    env = os.environ.get("PERFSUITE_BASELINES")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "baselines"


def norm(value: Any) -> str:
    """A parameter value as rows spell it: true/false, 64, 0.001, ddp-ds ('_' = '-')."""
    if value is None or isinstance(value, bool):
        return {None: "", True: "true", False: "false"}[value]
    text = str(value).strip().lower().replace("_", "-")
    try:
        number = float(text)
    except ValueError:
        return text
    return text if not math.isfinite(number) else (
        str(int(number)) if number == int(number) else repr(number))


def hardware_model(profile_id: str) -> str:
    """The model part of a profile id: GPU count and link, or CPU core count, removed."""
    match = (re.match(r"^(?P<model>.+)-x\d+-[a-z0-9-]+$", profile_id)
             or re.match(r"^(?P<model>cpu-.+)-\d+c$", profile_id))
    return match.group("model") if match else profile_id


def parse_reference(text: str) -> dict[str, str]:
    """``"precision=fp64; world_size=1"`` -> {"precision": "fp64", "world_size": "1"}."""
    out = {}
    for part in filter(None, (p.strip() for p in str(text).split(";"))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in KEY_COLUMNS:
            raise BaselineError(f"reference {text!r}: write key=value pairs separated by ';' "
                                f"with keys among {', '.join(KEY_COLUMNS)}")
        out[key] = norm(value)
    return out


@dataclass
class BaselineSet:  # one folder: its profile.json facts and its tables
    path: Path
    hardware: str
    kind: str
    aliases: tuple[str, ...]
    metrics: pd.DataFrame
    ratios: pd.DataFrame
    findings: pd.DataFrame
    samples: dict[str, list[float]] = field(default_factory=dict)
    launch_statistic: str = "median"  # what a launch contributes to a launch-level verdict

    def matches(self, profile_id: str | None) -> bool:
        return profile_id in (self.hardware, *self.aliases)

    def same_model(self, profile_id: str | None) -> bool:
        return profile_id is not None and hardware_model(profile_id) in {
            hardware_model(i) for i in (self.hardware, *self.aliases)}


def _read_json(file: Path) -> Any:
    try:  # a missing file here is a missing profile.json: samples.json is optional
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise BaselineError(f"{file}: missing; every baseline folder needs a profile.json "
                            "naming its hardware (see baselines/README.md)") from None
    except json.JSONDecodeError as err:
        raise BaselineError(f"{file}: not valid JSON ({err}); fix the file") from None


def _number(text: str) -> float | None:
    return float(text) if str(text).strip() else None  # blank: not given


def _row_problems(row: Mapping[str, str], ratio_file: bool, samples: Mapping) -> list[str]:
    problems = [f"'{c}' is empty; every row needs it"
                for c in ("id", "metric", "source", "tolerance") if not row[c]]
    for col, check in [(c, _number) for c in ("value", "low", "high", "tolerance")] + [
            ("reference", parse_reference)] * ratio_file:
        try:
            check(row.get(col, ""))
        except (ValueError, BaselineError) as err:  # BaselineError names the fix itself
            problems.append(str(err) if isinstance(err, BaselineError) else f"'{col}' is "
                            f"{row[col]!r}, not a number; write a plain decimal such as 0.05")
    return problems + [msg for bad, msg in (
        (row.get("better", "") not in ("lower", "higher", "")
         or not ratio_file and not (row["value"] and row["better"]),
         "a metric row needs 'value' and 'better' (lower or higher)"),
        (ratio_file and not (row.get("value") or row.get("low") or row.get("high")),
         "give 'value' or a 'low'/'high' range"),
        (row.get("pin_memory", "") not in ("", "true", "false"),
         "'pin_memory' must be true, false or blank"),
        (row.get("samples_key") and row["samples_key"] not in samples,
         f"samples_key {row.get('samples_key')!r} is not in {SAMPLES_FILE}; record again")) if bad]


def _read_table(file: Path, allowed: Iterable[str], samples: Mapping) -> pd.DataFrame:
    """A validated CSV; BaselineError names the file, line, column and fix."""
    if not file.exists():
        return pd.DataFrame(columns=["id", "metric"])
    try:
        df = pd.read_csv(file, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise BaselineError(f"{file}: not a readable CSV ({err}); fix the quoting or the "
                            "number of fields on the line named") from None
    unknown = [c for c in df.columns if c not in allowed]
    missing = [c for c in REQUIRED[file.name] if c not in df.columns]
    if unknown or missing:
        raise BaselineError(f"{file}: unknown column(s) {unknown}, missing column(s) {missing}; "
                            f"known columns: {', '.join(allowed)}")
    ids = list(df["id"])
    problems = [f"{file}, line {i + 2} (id {row['id']!r}): {p}"
                for i, row in enumerate(df.to_dict("records"))
                for p in _row_problems(row, file.name != METRICS_FILE, samples)
                + ["'id' repeats an earlier row; ids must be unique"] * (row["id"] in ids[:i])]
    if problems:
        more = [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
        raise BaselineError("invalid baseline data:\n  " + "\n  ".join(problems[:20] + more))
    return df


def load_profile(path: Path | str) -> BaselineSet:
    """One folder, validated."""
    data = _read_json(file := (path := Path(path)) / PROFILE_FILE)
    problems = [msg for bad, msg in (
        (data.get("format") != FORMAT, f"'format' must be {FORMAT!r}"),
        (not data.get("hardware") or not isinstance(data["hardware"], str),
         "'hardware' must name the hardware profile id"),
        (data.get("kind") not in KINDS, f"'kind' must be one of {KINDS}"),
        (data.get("launch_statistic", "median") not in LAUNCH_STATISTICS,
         f"'launch_statistic' must be one of {LAUNCH_STATISTICS}")) if bad]
    if problems:
        raise BaselineError(f"{file}: " + "; ".join(problems))
    samples = _read_json(path / SAMPLES_FILE) if (path / SAMPLES_FILE).exists() else {}
    return BaselineSet(path, data["hardware"], data["kind"], tuple(data.get("aliases", ())),
                       _read_table(path / METRICS_FILE, METRIC_COLUMNS, samples),
                       _read_table(path / RATIOS_FILE, RATIO_COLUMNS, samples),
                       _read_table(path / FINDINGS_FILE, RATIO_COLUMNS, samples), samples,
                       data.get("launch_statistic", "median"))


def load_all(root: Path | str | None = None) -> list[BaselineSet]:
    root = Path(root) if root is not None else default_root()
    return [load_profile(p) for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith((".", "_"))] if root.is_dir() else []


def row_matches(row: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Every non-blank key of the row equals the parameter (a missing parameter: no match)."""
    return all(not row.get(key) or (key in params and norm(params[key]) == norm(row[key]))
               for key in KEY_COLUMNS)


def lookup(table: pd.DataFrame, params: Mapping[str, Any], metric: str | None = None,
           reference: str | None = None) -> pd.DataFrame:
    """Rows of ``table`` that apply to a cell with ``params``."""
    if table.empty:
        return table
    ref = parse_reference(reference) if reference is not None else None
    return table[[row_matches(row, params) and metric in (None, row["metric"])
                  and (ref is None or parse_reference(row.get("reference", "")) == ref)
                  for row in table.to_dict("records")]]


@dataclass(frozen=True)
class Expectation:
    """What a baseline says about one metric of one cell (or why it says nothing)."""

    metric: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    tolerance: float = 0.0
    better: str = "lower"
    unit: str = ""
    samples: tuple[float, ...] = ()  # pooled over launches
    launches: tuple[tuple[float, ...], ...] = ()  # per launch, when recorded repeated
    launch_statistic: str = "median"  # the baseline profile's: each launch's median or floor
    reference: str = ""
    source: str = ""
    baseline: str = ""
    row_ids: tuple[str, ...] = ()
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.samples) or any(x is not None for x in (self.value, self.low, self.high))


def _samples_of(entry: Any) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """A samples.json entry: one launch's samples, or a list of launches'.
    Returns the pooled samples and the launches (none for a single launch)."""
    if not entry:
        return (), ()
    if isinstance(entry[0], list):
        launches = tuple(tuple(float(x) for x in launch) for launch in entry)
        return tuple(x for launch in launches for x in launch), launches
    return tuple(float(x) for x in entry), ()


def _from_rows(rows: pd.DataFrame, bset: BaselineSet, metric: str, reference: str) -> Expectation:
    """One expectation from matching rows; repeated measurements widen the tolerance."""
    records = rows.to_dict("records")
    if any(r.get("samples_key") for r in records):  # recorded: the newest row, with samples
        records = [max((r for r in records if r.get("samples_key")),
                       key=lambda r: r.get("recorded_at", ""))]
    values = [float(r["value"]) for r in records if r.get("value")]
    value = sum(values) / len(values) if values else None
    tol = max(float(r["tolerance"]) for r in records)
    if value and len(values) > 1:  # the paper's own repeats disagree: allow that much more
        tol += (max(values) - min(values)) / (2 * value)
    lows = [float(r["low"]) for r in records if r.get("low")]
    highs = [float(r["high"]) for r in records if r.get("high")]
    first = records[0]
    return Expectation(
        metric, value, max(lows) if lows else None, min(highs) if highs else None, tol,
        first.get("better") or ("higher" if metric in HIGHER_IS_BETTER else "lower"),
        first.get("unit", ""), *_samples_of(bset.samples.get(first.get("samples_key") or "")),
        bset.launch_statistic, reference, "; ".join(dict.fromkeys(r["source"] for r in records)),
        bset.path.name, tuple(r["id"] for r in records))


def _candidates(bset: BaselineSet, params: Mapping[str, Any], metric: str,
                reference: str) -> list[Expectation]:
    if metric not in RATIO_METRICS:
        rows = lookup(bset.metrics, params, metric)
        return [_from_rows(rows, bset, metric, "")] if not rows.empty else []
    out = [_from_rows(rows.loc[[i]], bset, metric, reference)
           for rows in (lookup(t, params, metric, reference) for t in (bset.ratios, bset.findings))
           for i in rows.index]
    if bset.kind == "recorded":  # the ratio of the two cells' recorded numbers
        base = "throughput" if metric == "speedup" else "step_time"
        pair = [lookup(bset.metrics, p, base) for p in (params, {**params, **parse_reference(
            reference)})]
        subject, twin = (_from_rows(r, bset, base, "") if not r.empty else None for r in pair)
        if subject and twin and subject.value and twin.value:
            out.append(Expectation(
                metric, subject.value / twin.value, tolerance=max(subject.tolerance,
                twin.tolerance), better="higher" if metric == "speedup" else "lower",
                reference=reference, source=f"derived from {subject.source}",
                baseline=bset.path.name, row_ids=subject.row_ids + twin.row_ids))
    return out


def find_expectations(params: Mapping[str, Any], metric: str, profile_id: str | None, *,
                      reference: str = "", sets: list[BaselineSet] | None = None,
                      root: Path | str | None = None) -> list[Expectation]:
    """Every comparable expectation, best first (exact profile before same model,
    recorded before paper, table values before findings); when there is none,
    a single unavailable Expectation whose ``reason`` says why."""
    sets = load_all(root) if sets is None else sets
    ratio = metric in RATIO_METRICS
    out = [e for s in sorted(sets, key=lambda s: (not s.matches(profile_id),
                                                  s.kind != "recorded", s.path.name))
           if metric in PORTABLE_METRICS or (s.same_model(profile_id) if ratio
                                             else s.matches(profile_id))
           for e in _candidates(s, params, metric, reference)]
    if out:
        return out
    elsewhere = [f"{s.path.name} ({s.hardware})" for s in sets
                 if _candidates(s, params, metric, reference)]
    why = (f"rows for these parameters exist only in {', '.join(elsewhere)}, and {metric} needs "
           f"the same hardware {'model' if ratio else 'profile'}" if elsewhere
           else "no baseline row matches these parameters")
    return [Expectation(metric, reference=reference, reason=f"no comparable baseline for "
                        f"{metric}{' vs ' + reference if reference else ''} on profile "
                        f"{profile_id}: {why}")]


def find_expectation(params: Mapping[str, Any], metric: str, profile_id: str | None,
                     **options: Any) -> Expectation:
    """The best comparable expectation, or one that says why there is none."""
    return find_expectations(params, metric, profile_id, **options)[0]


def run_cells(results: Mapping[str, Any] | list) -> list[dict]:  # results.json or its cells
    return list(results) if isinstance(results, list) else list(results.get("cells", []))


def run_profile(results: Mapping[str, Any] | list) -> str | None:
    """Hardware profile id of a run, from its env (None when it has none)."""
    from perfsuite.hardware import profile_id  # pure: needs no torch
    envs = ([results.get("env")] if isinstance(results, Mapping) else []) + [
        c.get("env") for c in run_cells(results)]
    ids = {profile_id(e) for e in envs if e}
    if len(ids) > 1:
        raise BaselineError(f"the run mixes hardware profiles {sorted(ids)}; record each "
                            "profile's cells from its own run")
    return ids.pop() if ids else None


def fingerprint(env: Mapping[str, Any]) -> str:
    """Short hash of the hardware and software facts of an env."""
    keys = ("gpu_name", "gpu_count", "gpu_memory_bytes", "interconnect", "cpu_model",
            "cpu_isa", "cpu_cores", *ENV_VERSION_KEYS)
    text = json.dumps({k: env.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def rows_from_run(results: Mapping[str, Any] | list,
                  date: str | None = None) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    """metrics.csv rows and samples.json entries for every ok cell of a run."""
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_env = (results.get("env") or {}) if isinstance(results, Mapping) else {}
    rows, samples = [], {}
    for cell in (c for c in run_cells(results) if c.get("status") == "ok"):
        env = cell.get("env") or run_env
        fixed = {**{k: norm(v) for k, v in cell.get("params", {}).items() if k in KEY_COLUMNS},
                 "source": f"recorded run {date}", "kind": "recorded", "recorded_at": date,
                 "commit": env.get("commit") or "", "fingerprint": fingerprint(env),
                 "versions": "; ".join(f"{k}={env[k]}" for k in ENV_VERSION_KEYS
                                       if env.get(k) is not None), "cell": cell["id"]}
        for metric, tol in RECORDED_TOLERANCE.items():
            if metric == "accuracy" and not cell.get("params", {}).get("min_accuracy"):
                continue  # trained too briefly for a target: chance level, nothing to keep
            data = cell.get("metrics", {}).get(metric) or {}
            if not isinstance(data.get("value"), (int, float)) or not math.isfinite(data["value"]):
                continue
            row_id = f"{cell['id']}:{metric}"
            if len(data.get("launches") or []) > 1:  # repeated launches stay apart
                samples[row_id] = [[float(x) for x in launch] for launch in data["launches"]]
            elif data.get("samples"):
                samples[row_id] = [float(x) for x in data["samples"]]
            rows.append({"id": row_id, "metric": metric, "value": repr(float(data["value"])),
                         "unit": data.get("unit", ""), "tolerance": str(tol),
                         "better": "higher" if metric in HIGHER_IS_BETTER else "lower",
                         "samples_key": row_id if row_id in samples else "", **fixed})
    columns = [c for c in METRIC_COLUMNS if any(c in r for r in rows)] or list(METRIC_COLUMNS)
    return pd.DataFrame(rows, columns=columns).fillna(""), samples


def diff_tables(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Row by row (by id): old and new value, new/old and what changed."""
    sides = [pd.DataFrame({"id": t.get("id", []), name: [_number(v) for v in t.get("value", [])]})
             for t, name in ((old, "old"), (new, "new"))]
    diff = sides[0].merge(sides[1], on="id", how="outer", indicator="change").sort_values("id")
    diff["change"] = diff["change"].map({"left_only": "removed", "right_only": "added",
                                         "both": "same"}).astype(str)
    diff.loc[(diff["change"] == "same") & (diff["old"] != diff["new"]), "change"] = "changed"
    diff["ratio"] = diff["new"] / diff["old"]
    return diff[["id", "old", "new", "ratio", "change"]].reset_index(drop=True)


@dataclass
class RecordPlan:
    """What record_run wrote (or would write): the folder's rows and their diff."""

    folder: Path
    metrics: pd.DataFrame
    samples: dict[str, list[float]]
    diff: pd.DataFrame
    written: bool = False

    def describe(self) -> str:
        shown = {"added": "{r.id}: {r.new}", "removed": "{r.id}: {r.old}",
                 "changed": "{r.id}: {r.old} -> {r.new} (x{r.ratio:.3f})"}
        lines = [f"{r.change:8} " + shown[r.change].format(r=r)
                 for r in self.diff.itertuples() if r.change != "same"]
        same = int((self.diff["change"] == "same").sum())
        return "\n".join([f"{self.folder}:"] + lines + [f"{same} row(s) unchanged"])


def record_run(results: Mapping[str, Any] | list, profile_id: str | None = None, *,
               root: Path | str | None = None, force: bool = False, write: bool = True,
               date: str | None = None, launch_statistic: str | None = None) -> RecordPlan:
    """Make or update the baseline folder of ``profile_id`` from a run's results.

    Re-measured rows are replaced (a tolerance tuned by hand is kept), others
    stay. Unless ``force``, refuses results measured on another profile, a
    folder of another profile and a paper's folder. ``write=False``: a dry run.
    ``launch_statistic`` sets the profile's (kept otherwise; "median" for a
    new folder).
    """
    if launch_statistic not in (None, *LAUNCH_STATISTICS):
        raise BaselineError(f"launch statistic {launch_statistic!r}: use one of {LAUNCH_STATISTICS}")
    measured_on = run_profile(results)
    profile_id = profile_id or measured_on
    if not profile_id:
        raise BaselineError("the results carry no env naming their hardware profile; "
                            "give the profile id")
    if measured_on and measured_on != profile_id and not force:
        raise BaselineError(f"these results were measured on {measured_on}, not {profile_id}; "
                            "record them under their own profile, or force it")
    folder = (Path(root) if root is not None else default_root()) / profile_id
    old = load_profile(folder) if (folder / PROFILE_FILE).exists() else None
    if old and not force and (old.kind == "paper" or not old.matches(profile_id)):
        raise BaselineError(f"{folder} holds {old.kind} baselines of "
                            f"{old.hardware}; refusing to overwrite it with "
                            f"{profile_id} results unless forced")
    new_rows, samples = rows_from_run(results, date)
    if new_rows.empty:
        raise BaselineError("the run has no ok cell with a recordable metric; nothing to record")
    old_rows = old.metrics if old else pd.DataFrame(columns=["id", "metric"])
    tuned = dict(zip(old_rows["id"], old_rows.get("tolerance", [])))
    new_rows["tolerance"] = [tuned.get(i) or t for i, t in new_rows[["id", "tolerance"]].values]
    merged = pd.concat([old_rows[~old_rows["id"].isin(new_rows["id"])], new_rows],
                       ignore_index=True).fillna("").sort_values("id").reset_index(drop=True)
    merged = merged[[c for c in METRIC_COLUMNS if c in merged.columns]]
    keys = set(merged.get("samples_key", []))
    samples = {**{k: v for k, v in (old.samples if old else {}).items() if k in keys}, **samples}
    plan = RecordPlan(folder, merged, samples, diff_tables(old_rows, merged), write)
    if write:  # samples first, so metrics.csv never names samples that are not there
        body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(samples.items()))
        atomic_write_text(folder / SAMPLES_FILE, "{\n" + body + "\n}\n")  # a line per row: diffable
        atomic_write_text(folder / METRICS_FILE, merged.to_csv(index=False, lineterminator="\n"))
        meta = _read_json(folder / PROFILE_FILE) if old else {"aliases": []}
        if launch_statistic:
            meta["launch_statistic"] = launch_statistic
        atomic_write_text(folder / PROFILE_FILE, json.dumps(
            {**meta, "format": FORMAT, "hardware": profile_id, "kind": "recorded"}, indent=2))
    return plan


def compare_runs(results_a: Mapping[str, Any], results_b: Mapping[str, Any],
                 **options: Any) -> list[dict]:
    """Per-cell verdicts of run B against run A; see perfsuite.checks.compare_runs."""
    from perfsuite import checks  # imported here: checks build on this module
    return checks.compare_runs(results_a, results_b, **options)
