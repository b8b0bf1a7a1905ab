"""Baselines: numbers to judge a run against, one folder per hardware profile.

Folder files and columns: ``baselines/README.md``. This module finds the baselines root, loads
and validates its folders (profile.json, the metric, ratio and finding tables, samples, work
counters; profile summaries: ``perfsuite.judge.baseline_profiles``) and tells which hardware
model a profile belongs to; ``perfsuite.judge.lookup`` finds the rows and counters that apply
to a cell and what they expect of it.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perfsuite import hardware
from perfsuite.judge.baseline_profiles import PROFILES_FILE, parse_profiles
from perfsuite.judge.spreads import Spreads, parse_spreads
from perfsuite.stats import launches as launchstats

FORMAT = "perfsuite.baselines/1"
PROFILE_FILE, METRICS_FILE, RATIOS_FILE, FINDINGS_FILE, SAMPLES_FILE, COUNTERS_FILE = (
    "profile.json", "metrics.csv", "ratios.csv", "findings.csv", "samples.json", "counters.json")
COUNTERS_FORMAT = "perfsuite.counters/1"
KINDS = ("paper", "recorded")  # transcribed from a publication, or measured by this suite

# Cell parameters a row may be keyed on: the fields of perfsuite.cells.Cell
# that change what is measured, plus "model" for the LLM tables.
KEY_COLUMNS = ("workload", "device", "strategy", "model", "dataset", "world_size", "precision",
               "pin_memory", "image_size", "memory_format", "batch_size", "epochs", "max_steps",
               "loader_workers", "lr", "lr_warmup_steps", "lr_decay", "max_seq_len", "profile")
PROVENANCE_COLUMNS = ("source", "kind", "recorded_at", "commit", "fingerprint", "versions",
                      "assumptions", "notes", "cell")
METRIC_COLUMNS = ("id", *KEY_COLUMNS, "metric", "value", "unit", "better", "tolerance",
                  "samples_key", *PROVENANCE_COLUMNS)
RATIO_COLUMNS = ("id", *KEY_COLUMNS, "metric", "reference", "value", "low", "high", "better",
                 "tolerance", "stated", "trend", *PROVENANCE_COLUMNS)
REQUIRED = {METRICS_FILE: ("id", "metric", "value", "unit", "better", "tolerance", "source"),
            RATIOS_FILE: ("id", "metric", "reference", "tolerance", "source"),
            FINDINGS_FILE: ("id", "metric", "reference", "tolerance", "source")}

# The metric names a row may carry, one list per kind of table. A row naming
# anything else would match no check and quietly leave it without a
# baseline, so rows are validated against these (_row_problems). They are the
# names something reads from baselines or writes into them:
# - metrics.csv: perfsuite/judge/checks.py judges step_time (time_per_token for
#   LLM cells, else their tokens/s throughput), peak_mem_allocated, peak_rss
#   and accuracy, and derives a recorded folder's ratios from its
#   throughput and step_time rows (_candidates); perfsuite/report/paper.py
#   draws the papers' rows (total_time, step_time, accuracy);
#   perfsuite/judge/recording.py records the metrics of its RECORDED_TOLERANCE
#   (tests/unit/test_baselines.py keeps that list within this one);
#   baselines/README.md lists them for people.
# - ratios.csv, findings.csv: the cross-cell checks' metrics (checks.CROSS_CELL).
METRIC_NAMES = frozenset({"step_time", "time_per_token", "throughput", "total_time", "epoch_time",
                          "accuracy", "peak_mem_allocated", "peak_mem_reserved", "peak_rss",
                          "h2d_bytes"})
RATIO_METRICS = frozenset({"speedup", "step_time_ratio"})
PORTABLE_METRICS = frozenset({"accuracy"})  # all but these and ratios are absolute
ZERO_ALLOWED = frozenset({"accuracy", "h2d_bytes"})  # others' values are above 0: times, rates, sizes
HIGHER_IS_BETTER = frozenset({"throughput", "accuracy", "speedup"})
# What a launch contributes to a launch-level verdict; a profile's noise decides (profile.json).
LAUNCH_STATISTICS = tuple(launchstats.LAUNCH_STATISTICS)
COUNTER_VERSION_KEYS = ("torch", "torchvision", "torchtune", "torchao")
GPU_COUNTER_VERSION_KEYS = ("cuda", "cudnn", "nccl")
ENV_VERSION_KEYS = ("torch", "torchvision", "torchtune", "torchao", "cuda", "cudnn", "nccl",
                    "driver", "python")


class BaselineError(ValueError):
    """A baseline file or request that cannot be used as it stands."""


ROOT_ENV = "PERFSUITE_BASELINES"
# The project's baselines/: beside the package in a checkout (and an editable
# install); inside it, as perfsuite/_baselines, in a wheel (pyproject.toml maps
# the top-level baselines/ there).
PROJECT_BASELINES = next((p for p in (Path(__file__).resolve().parents[1] / "_baselines",
                                      Path(__file__).resolve().parents[2] / "baselines")
                          if p.is_dir()), Path(__file__).resolve().parents[2] / "baselines")


def default_root() -> Path:
    """``$PERFSUITE_BASELINES``, else the project's baselines (PROJECT_BASELINES)."""
    env = os.environ.get(ROOT_ENV)
    return Path(env) if env else PROJECT_BASELINES


def _usable_root(root: Path | str | None) -> Path | None:
    """The baselines root to read; None where the suite was installed without its baselines/ and
    nothing else was asked for (every check: no comparable baseline). A root asked for (argument or
    $PERFSUITE_BASELINES) must be one: a misspelt path would quietly turn every check into a skip."""
    if root is None and not os.environ.get(ROOT_ENV):
        return PROJECT_BASELINES if PROJECT_BASELINES.is_dir() else None
    given = "" if root is not None else f" (from ${ROOT_ENV})"
    root = Path(root) if root is not None else default_root()
    how = (f"the default is the project's {PROJECT_BASELINES}; pass another root with --perf-baselines "
           f"DIR (pytest), --baselines DIR (perfsuite run) or ${ROOT_ENV}=DIR, or leave them unset")
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise BaselineError(f"{root}: baselines root {what}{given}; {how}")
    if (root / PROFILE_FILE).is_file():
        raise BaselineError(f"{root}: one baseline folder (it holds {PROFILE_FILE}), not a baselines "
                            f"root{given}; pass the folder above it, {root.parent}")
    return root


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


# GPU models whose NVML/torch name carries no board form factor on the SXM
# board: "NVIDIA H100 80GB HBM3" is the H100 SXM5, "NVIDIA H200" the H200 SXM;
# their PCIe and NVL boards say so ("NVIDIA H100 PCIe", "NVIDIA H100 NVL").
_SXM_WHEN_UNNAMED = ("h100", "h200")


def gpu_model(name: str) -> str:
    """The GPU model a device name or profile-id model part belongs to, for
    ratios: the chip and its board form factor; memory size and type aside.

    The SXM variants of one chip are one model ("NVIDIA H100 80GB HBM3",
    "NVIDIA H100 SXM5 94GB", the papers' "H100 SXM 94 GB": h100-sxm): the
    same GPU on the same board and NVLink, with more or other memory. The
    PCIe card (114 SMs, 350 W, NVLink only through a bridge) and the NVL card
    (PCIe board, 350-400 W, 2-GPU NVLink bridge) are other boards with other
    clocks, power and links, so their scaling, precision and pinning ratios
    are not the SXM's: h100-pcie and h100-nvl are models of their own. The
    H200 (HBM3e at 4.8 TB/s against the H100's 3.35) is another model too.
    """
    tokens = [t for t in re.split(r"[^a-z0-9]+", name.lower().replace("nvidia", " ")) if t]
    kept = []
    for token in tokens:
        if re.fullmatch(r"\d+gb|hbm\d*e?|gddr\d*x?", token):
            continue  # memory size and type: the same model across memory sizes
        kept.append("sxm" if re.fullmatch(r"sxm\d*", token) else token)
    if len(kept) == 1 and kept[0] in _SXM_WHEN_UNNAMED:
        kept.append("sxm")
    return "-".join(kept) or name


def hardware_model(profile_id: str) -> str:
    """The model part of a profile id: GPU count and link (one GPU's id has
    none), or CPU core count, removed; for a GPU, its model as ``gpu_model``
    says (memory aside), so ratios compare across memory sizes and GPU counts
    of one GPU model."""
    cpu = re.match(r"^(?P<model>cpu-.+)-\d+c$", profile_id)
    if cpu:
        return cpu.group("model")
    if profile_id.startswith("cpu-"):
        return profile_id
    gpu = re.match(r"^(?P<model>.+)-x\d+(?:-[a-z][a-z0-9-]*)?$", profile_id)
    return gpu_model(gpu.group("model")) if gpu else profile_id


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


@dataclass(frozen=True)
class CounterBaseline:
    """A cell's recorded work counters per step, valid for one software stack."""

    cell: str
    params: dict[str, str]  # the cell's key parameters, normalised
    versions: dict[str, str]  # the stack they were counted on (COUNTER_VERSION_KEYS)
    per_step: dict[str, float]
    tolerance: dict[str, float] = field(default_factory=dict)  # per counter, where not exact
    unstable: tuple[str, ...] = ()
    source: str = ""
    recorded_at: str = ""


# Built-in workloads that run neither torchtune nor torchao (perfsuite's llm
# extra): their counts hold whether it is installed or not.
WITHOUT_LLM_STACK = ("image", "probe")


def counter_versions(env: Mapping[str, Any], device: str, workload: str | None = None) -> dict[str, str]:
    """The software a cell's counters depend on: torch and its libraries
    (and on CUDA the toolkit, cuDNN and NCCL), not the CPU or GPU model."""
    keys = COUNTER_VERSION_KEYS + (GPU_COUNTER_VERSION_KEYS if device == "cuda" else ())
    if workload in WITHOUT_LLM_STACK:
        keys = tuple(k for k in keys if k not in ("torchtune", "torchao"))
    return {k: str(env[k]) for k in keys if env.get(k) is not None}


def _counter_problem(entry: Mapping[str, Any]) -> str | None:
    """Why an entry cannot judge a cell (None: it can); float() alone takes "12", true, NaN."""
    bad = [(part, k, v) for part in ("per_step", "tolerance") for k, v in (entry.get(part) or {}).items()
           if not is_number(v) or v < 0]
    unstable = entry.get("unstable", [])
    return (f"{bad[0][0]} {bad[0][1]!r} is {bad[0][2]!r}; write a finite number of 0 or more" if bad else
            None if isinstance(unstable, list) and all(isinstance(u, str) for u in unstable) else
            f"unstable is {unstable!r}; write a list of counter names")


def parse_counters(data: Any, file: Path) -> tuple[CounterBaseline, ...]:
    """counters.json's entries, checked: ``file`` is named in every refusal."""
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != COUNTERS_FORMAT or not isinstance(
            entries, list):
        raise BaselineError(f"{file}: write {{\"format\": \"{COUNTERS_FORMAT}\", \"entries\": "
                            "[...]}} (see baselines/README.md), or record it again")
    out, first = [], {}  # first: each (cell, stack)'s entry; record replaces by it, so one judges
    for i, entry in enumerate(entries):
        where = f"{file}: entry {i + 1} ({entry.get('cell') if isinstance(entry, dict) else entry!r})"
        try:
            out.append(CounterBaseline(
                str(entry["cell"]), {k: norm(v) for k, v in entry["params"].items()},
                {k: str(v) for k, v in entry["versions"].items()},
                {k: float(v) for k, v in entry["per_step"].items()},
                {k: float(v) for k, v in entry.get("tolerance", {}).items()},
                tuple(entry.get("unstable", ())), str(entry.get("source", "")),
                str(entry.get("recorded_at", ""))))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BaselineError(f"{where}: {type(err).__name__} {err}; every entry needs cell, params, "
                                "versions and per_step with numbers") from None
        if problem := _counter_problem(entry):
            raise BaselineError(f"{where}: {problem}, or record the cell again")
        if first.setdefault(key := (out[-1].cell, json.dumps(out[-1].versions, sort_keys=True)), i) != i:
            raise BaselineError(f"{where}: the same cell and stack as entry {first[key] + 1} (twice); keep one")
    return tuple(out)


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
    launch_statistic: str = launchstats.DEFAULT_LAUNCH_STATISTIC  # what a launch gives a launch-level verdict
    # between-launch spread of launch values seen when recording, per launch kind and statistic
    launch_spread: Spreads = field(default_factory=dict)
    counters: tuple[CounterBaseline, ...] = ()  # work counters, portable across hardware
    profiles: dict[str, dict] = field(default_factory=dict)  # cell id -> {"summary": its profile, ...}

    def matches(self, profile_id: str | None) -> bool:
        return profile_id in (self.hardware, *self.aliases)

    def same_model(self, profile_id: str | None) -> bool:
        return profile_id is not None and hardware_model(profile_id) in {
            hardware_model(i) for i in (self.hardware, *self.aliases)}


def _unique_keys(file: Path, items: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()  # json keeps the last of a key twice silently: which row was meant?
    if (twice := next((k for k, _ in items if k in seen or seen.add(k)), None)) is not None:
        raise BaselineError(f"{file}: key {twice!r} is there twice; keep one (or record it again)")
    return dict(items)


def read_json(file: Path) -> Any:
    try:  # a missing file here is a missing profile.json: samples.json is optional
        return json.loads(file.read_text(), object_pairs_hook=lambda items: _unique_keys(file, items))
    except FileNotFoundError:
        raise BaselineError(f"{file}: missing; every baseline folder needs a profile.json "
                            "naming its hardware (see baselines/README.md)") from None
    except json.JSONDecodeError as err:
        raise BaselineError(f"{file}: not valid JSON ({err}); fix the file") from None


def parse_number(text: str) -> float | None:
    return float(text) if str(text).strip() else None  # blank: not given


def is_number(value: Any) -> bool:  # finite; true is no number, though Python counts it
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _sample_problems(entry: Any) -> list[str]:
    launches = entry if isinstance(entry, list) and entry and isinstance(entry[0], list) else [entry]
    where = [f"launch {i + 1}, " * (launches is entry) for i in range(len(launches))]
    return [f"{w}{'no samples' if x == [] else f'{x!r}, not a list'}; write a list of seconds (one a launch)"
            for w, x in zip(where, launches) if not isinstance(x, list) or not x] or [
        f"{w}sample {j + 1} is {x!r}" for w, launch in zip(where, launches) for j, x in enumerate(launch)
        if not is_number(x) or x <= 0]


def check_samples(samples: Any, file: Path) -> dict[str, list]:
    """samples.json, checked: step times above 0 (a log or ratio of 0 judges nothing), a list a row or launch."""
    problems = ([f"{file}: row {key!r}: {p}" for key, entry in samples.items() for p in _sample_problems(entry)]
                if isinstance(samples, dict) else [f"{file}: write {{\"<row id>\": [seconds, ...], ...}}"])
    if problems:
        raise BaselineError("invalid baseline data (samples are seconds above zero: fix the row, or record the "
                            "cell again; see baselines/README.md):\n  " + "\n  ".join(_at_most_20(problems)))
    return samples


def _metric_problem(metric: str, ratio_file: bool) -> str | None:
    """Why a row's metric name is not one its table can hold (None: it is)."""
    known, other = (RATIO_METRICS, METRIC_NAMES) if ratio_file else (METRIC_NAMES, RATIO_METRICS)
    if not metric or metric in known:
        return None  # an empty one is named with the other empty columns
    tables = f"{RATIOS_FILE} and {FINDINGS_FILE}" if ratio_file else METRICS_FILE
    if metric in other:
        return (f"metric {metric!r} belongs in {f'{RATIOS_FILE} or {FINDINGS_FILE}' if not ratio_file else METRICS_FILE}"
                f"; rows of {tables} name one of {', '.join(sorted(known))}")
    close = difflib.get_close_matches(metric.strip().lower(), sorted(known), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown metric {metric!r}{guess}; known metrics for {tables}: {', '.join(sorted(known))}"


def _row_problems(row: Mapping[str, str], ratio_file: bool, samples: Mapping) -> list[str]:
    problems = [f"'{c}' is empty; every row needs it"
                for c in ("id", "metric", "source", "tolerance") if not row[c]]
    problems += [p for p in [_metric_problem(row["metric"], ratio_file)] if p]
    for col, check in [(c, parse_number) for c in ("value", "low", "high", "tolerance")] + [
            ("reference", parse_reference)] * ratio_file:
        try:
            number = check(row.get(col, ""))
        except (ValueError, BaselineError) as err:  # BaselineError names the fix itself
            problems.append(str(err) if isinstance(err, BaselineError) else f"'{col}' is "
                            f"{row[col]!r}, not a number; write a plain decimal such as 0.05")
            continue
        above = col == "value" and row["metric"] not in ZERO_ALLOWED  # a ratio to 0 judges nothing
        if isinstance(number, float) and not (math.isfinite(number) and (number > 0 or not above and number == 0)):
            problems.append(f"'{col}' is {row[col]!r}; write a finite number {'above 0' if above else 'of 0 or more'}")
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


def read_table(file: Path, allowed: Iterable[str], samples: Mapping, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """A validated CSV (or ``df``, rows recording would write there); BaselineError names file, line, column, fix."""
    if df is None and not file.exists():
        return pd.DataFrame(columns=["id", "metric"])
    try:
        df = pd.read_csv(file, dtype=str, keep_default_na=False) if df is None else df
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
        raise BaselineError("invalid baseline data:\n  " + "\n  ".join(_at_most_20(problems)))
    return df


def _at_most_20(problems: list[str]) -> list[str]:
    return problems[:20] + [f"... and {len(problems) - 20} more"] * (len(problems) > 20)


def load_profile(path: Path | str) -> BaselineSet:
    """One folder, validated."""
    data = read_json(file := (path := Path(path)) / PROFILE_FILE)
    problems = [msg for bad, msg in (
        (data.get("format") != FORMAT, f"'format' must be {FORMAT!r}"),
        (not data.get("hardware") or not isinstance(data["hardware"], str),
         "'hardware' must name the hardware profile id"),
        (data.get("kind") not in KINDS, f"'kind' must be one of {KINDS}"),
        (data.get("launch_statistic", launchstats.DEFAULT_LAUNCH_STATISTIC) not in LAUNCH_STATISTICS,
         f"'launch_statistic' must be one of {LAUNCH_STATISTICS}")) if bad]
    try:
        spread = parse_spreads(data.get("launch_spread"), LAUNCH_STATISTICS)
    except ValueError as err:
        problems.append(str(err))
    if problems:
        raise BaselineError(f"{file}: " + "; ".join(problems))
    samples = check_samples(read_json(f), f) if (f := path / SAMPLES_FILE).exists() else {}
    return BaselineSet(path, data["hardware"], data["kind"], tuple(data.get("aliases", ())),
                       read_table(path / METRICS_FILE, METRIC_COLUMNS, samples),
                       read_table(path / RATIOS_FILE, RATIO_COLUMNS, samples),
                       read_table(path / FINDINGS_FILE, RATIO_COLUMNS, samples), samples,
                       data.get("launch_statistic", launchstats.DEFAULT_LAUNCH_STATISTIC), spread,
                       parse_counters(read_json(f), f) if (f := path / COUNTERS_FILE).exists() else (),
                       parse_profiles(read_json(f), f, BaselineError) if (f := path / PROFILES_FILE).exists() else {})


def load_all(root: Path | str | None = None) -> list[BaselineSet]:
    """Every folder of a baselines root (default: ``default_root()``), validated. A root given (argument
    or $PERFSUITE_BASELINES) that is no directory of folders is a BaselineError; the project's own
    baselines/ may be absent (an installed suite): then there are none."""
    root = _usable_root(root)
    return [load_profile(p) for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith((".", "_"))] if root is not None else []


def run_cells(results: Mapping[str, Any] | list) -> list[dict]:  # results.json or its cells
    return list(results) if isinstance(results, list) else list(results.get("cells", []))


def run_profile(results: Mapping[str, Any] | list) -> str | None:
    """Hardware profile id of a run, from its env (None when it has none)."""
    envs = ([results.get("env")] if isinstance(results, Mapping) else []) + [
        c.get("env") for c in run_cells(results)]
    ids = {hardware.profile_id(e) for e in envs if e}
    if len(ids) > 1:
        raise BaselineError(f"the run mixes hardware profiles {sorted(ids)}; record each "
                            "profile's cells from its own run")
    return ids.pop() if ids else None
