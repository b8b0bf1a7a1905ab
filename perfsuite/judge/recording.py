"""Recording a run as the baseline of its hardware profile.

Baselines (perfsuite.judge.baselines) only load and look up; this module writes:
a run's ok cells become metrics.csv rows and samples.json entries, merged
with the folder's earlier rows, and profile.json keeps the between-launch
spread a run with repeated launches showed; a profiled cell's summary goes
to profiles.json (perfsuite.judge.baseline_profiles).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perfsuite import options
from perfsuite.judge.baseline_profiles import (
    PROFILES_FILE,
    ROWS_KEPT,
    STEP_METRICS,
    merged_profiles,
    parse_profiles,
    profile_entries,
    profiles_text,
)
from perfsuite.judge.baselines import (
    COUNTERS_FILE,
    COUNTERS_FORMAT,
    ENV_VERSION_KEYS,
    FORMAT,
    HIGHER_IS_BETTER,
    KEY_COLUMNS,
    LAUNCH_STATISTICS,
    METRIC_COLUMNS,
    METRICS_FILE,
    PROFILE_FILE,
    SAMPLES_FILE,
    BaselineError,
    check_samples,
    counter_versions,
    default_root,
    load_profile,
    norm,
    parse_counters,
    parse_number,
    read_json,
    read_table,
    run_cells,
    run_profile,
)
from perfsuite.judge.lookup import samples_of
from perfsuite.judge.spreads import ANY_KIND, Spreads, launch_kind, spreads_json
from perfsuite.stats import launches as launchstats
from perfsuite.system.atomic import atomic_write_text
from perfsuite.system.locking import FolderLock, LockBusy

RECORD_LOCK_WAIT_S = 600.0  # another record of the folder is writing: wait, then merge
PROFILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # one folder name, inside the root, not hidden

# The metrics record_run keeps, each with the tolerance a new row gets.
RECORDED_TOLERANCE = {"step_time": 0.05, "time_per_token": 0.05, "throughput": 0.05, "epoch_time": 0.05,
                      "total_time": 0.10, "accuracy": 0.02, "peak_mem_allocated": 0.05,
                      "peak_mem_reserved": 0.05, "peak_rss": 0.10, "h2d_bytes": 0.01}


def fingerprint(env: Mapping[str, Any]) -> str:
    """Short hash of the hardware and software facts of an env."""
    keys = ("gpu_name", "gpu_count", "gpu_memory_bytes", "interconnect", "cpu_model",
            "cpu_isa", "cpu_cores", *ENV_VERSION_KEYS)
    text = json.dumps({k: env.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def utc_stamp() -> str:
    """Now, as recorded rows and counter entries spell it."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows_from_run(results: Mapping[str, Any] | list,
                  date: str | None = None) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    """metrics.csv rows and samples.json entries for every ok cell of a run."""
    date = date or utc_stamp()
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
    sides = [pd.DataFrame({"id": t.get("id", []), name: [parse_number(v) for v in t.get("value", [])]})
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
    launch_spreads: Spreads = field(default_factory=dict)  # what this run's repeated launches showed
    counted_cells: int = 0  # cells whose work counters were recorded
    profiled_cells: int = 0  # cells whose profile summary was recorded
    chosen: str = ""  # the launch statistic the folder now judges by, and why, where recording chose it
    unspread: tuple[str, ...] = ()  # launch kinds of the folder's timed cells without a spread there

    def describe(self) -> str:
        shown = {"added": "{r.id}: {r.new}", "removed": "{r.id}: {r.old}",
                 "changed": "{r.id}: {r.old} -> {r.new} (x{r.ratio:.3f})"}
        lines = [f"{r.change:8} " + shown[r.change].format(r=r)
                 for r in self.diff.itertuples() if r.change != "same"]
        same = int((self.diff["change"] == "same").sum())
        spread = [f"between-launch spread of {kind} launch {k}s: {v.log_sd:.1%} (s.d. of logs, "
                  f"{v.dof} d.o.f.)" for kind, entries in self.launch_spreads.items() for k, v in entries.items()]
        counted = [f"work counters of {self.counted_cells} cell(s) in {COUNTERS_FILE}"] * bool(
            self.counted_cells)
        profiled = [f"profile summaries of {self.profiled_cells} cell(s) in {PROFILES_FILE} (the "
                    f"{ROWS_KEPT} largest rows of each kind)"] * bool(self.profiled_cells)
        chosen = [f"launch statistic {self.chosen}"] * bool(self.chosen)
        unspread = [f"no between-launch spread of {', '.join(self.unspread)} launches: one launch of such a cell "
                    "against one is unknown until a run with --perf-repeats 4 or --perf-record-new records "
                    "it"] * bool(self.unspread)
        return "\n".join([f"{self.folder}:"] + lines + [f"{same} row(s) unchanged"] + spread + chosen
                         + unspread + counted + profiled)


def steadier(spreads: Spreads) -> tuple[str, str] | None:
    """The launch statistic whose launches scatter less, and why, judged on the
    launch kind best measured; None until both are known over
    options.STEADIER_DOF d.o.f. (on one H200 the pageable cells' launch floors
    scattered 1.2 %, their medians 3.8 %; on one H100's pinned cell medians
    0.08 %, floors 0.12 %)."""
    known = [(min(e["median"].dof, e["floor"].dof), kind, e) for kind, e in spreads.items()
             if "median" in e and "floor" in e]
    if not known or max(known)[0] < options.STEADIER_DOF:
        return None
    dof, kind, entries = max(known)
    median, floor = entries["median"], entries["floor"]
    name = "floor" if floor.log_sd < median.log_sd else "median"
    return name, (f"{name}: the steadier over {dof} d.o.f. (floors {floor.log_sd * 100:.1f} %, medians "
                  f"{median.log_sd * 100:.1f} %) of the folder's repeated {kind} launches; "
                  "`perfsuite baseline record --launch-statistic` sets one by hand")


def launch_spreads(results: Mapping[str, Any] | list,
                   kept: Sequence[tuple[str, Sequence[Sequence[float]]]] = ()) -> Spreads:
    """The between-launch spread of the run's repeated launches, per launch
    kind and statistic, pooled over its ok cells of that kind (a cell's
    launches are identical) and over ``kept``: (kind, launches) of the
    folder's other cells, so that a runner recording cell by cell
    (--record-new) pools every cell it recorded rather than keeping the last
    one's."""
    cells = [c for c in run_cells(results) if c.get("status") == "ok"]
    launches = [(launch_kind(c.get("params") or {}),
                 ((c.get("metrics") or {}).get("step_time") or {}).get("launches") or []) for c in cells]
    if not any(len(group) > 1 for _, group in launches):
        return {}  # a run without repeated launches leaves the folder's spread as it was
    launches += list(kept)
    out: Spreads = {}
    for kind in sorted({k for k, group in launches if len(group) > 1}):
        for statistic in LAUNCH_STATISTICS:
            spread = launchstats.launch_spread([launchstats.launch_values(group, statistic)
                                                for k, group in launches if k == kind and len(group) > 1])
            if spread.dof >= 1:
                out.setdefault(kind, {})[statistic] = spread
    return out


def counter_entries(results: Mapping[str, Any] | list, date: str) -> list[dict[str, Any]]:
    """counters.json entries for every ok cell that counted its work."""
    run_env = (results.get("env") or {}) if isinstance(results, Mapping) else {}
    out = []
    for cell in run_cells(results):
        counted = cell.get("counters") or {}
        if cell.get("status") != "ok" or not counted.get("per_step"):
            continue
        params = cell.get("params", {})
        env = cell.get("env") or run_env
        out.append({"cell": cell["id"],
                    "params": {k: norm(v) for k, v in params.items() if k in KEY_COLUMNS},
                    "versions": counter_versions(env, str(params.get("device", "cpu")), params.get("workload")),
                    "per_step": counted["per_step"], "unstable": counted.get("unstable", []),
                    "window_steps": counted.get("window_steps"), "ranks": counted.get("ranks"),
                    "source": f"recorded run {date}", "recorded_at": date,
                    "commit": env.get("commit") or ""})
    return out


def _merged_counters(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    """counters.json text: new entries replace those of the same cell and
    stack; a tolerance set by hand on a replaced entry is kept."""
    def key(e):
        return e["cell"], json.dumps(e["versions"], sort_keys=True)
    tuned = {key(e): e["tolerance"] for e in old if e.get("tolerance")}
    fresh = {key(e): {**e, **({"tolerance": tuned[key(e)]} if key(e) in tuned else {})} for e in new}
    kept = [e for e in old if key(e) not in fresh]
    entries = sorted([*kept, *fresh.values()], key=key)
    body = ",\n".join(json.dumps(e, sort_keys=True) for e in entries)  # an entry a line: diffable
    return f'{{"format": "{COUNTERS_FORMAT}", "entries": [\n{body}\n]}}\n'


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
    ids = [c.get("id") for c in run_cells(results)]
    twice = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
    if twice is not None:  # its rows would repeat, and the folder would be refused from then on
        raise BaselineError(f"the run holds cell {twice} twice; record from a results.json that holds "
                            "each cell once")
    measured_on = run_profile(results)
    given, profile_id = profile_id is not None, profile_id if profile_id is not None else measured_on
    if not profile_id and not given:
        raise BaselineError("the results carry no env naming their hardware profile; "
                            "give the profile id")
    if not PROFILE_ID.fullmatch(profile_id):  # a folder outside the root, or one load_all skips
        raise BaselineError(f"profile id {profile_id!r}{'' if given else ' (from the run env)'} names no "
                            "folder of the baselines root; give an id of letters, digits, '.', '_', '+' and "
                            "'-' that starts with a letter or digit, as perfsuite prints them")
    if measured_on and measured_on != profile_id and not force:
        raise BaselineError(f"these results were measured on {measured_on}, not {profile_id}; "
                            "record them under their own profile, or force it")
    folder = (Path(root) if root is not None else default_root()) / profile_id
    if not write:
        return _plan(results, profile_id, folder, force, False, date, launch_statistic)
    # Read, merge and write under the root's lock (the folder may not exist
    # yet): a second record at the same time waits, then merges with what the
    # first wrote.
    try:
        with FolderLock(folder.parent, "baseline record", wait_s=RECORD_LOCK_WAIT_S):
            return _plan(results, profile_id, folder, force, True, date, launch_statistic)
    except LockBusy as err:
        raise BaselineError(str(err)) from None
    except OSError as err:
        raise BaselineError(f"{folder}: cannot write the baseline ({err.strerror or err}); "
                            "record into a folder you can write (--baselines DIR)") from None


def _plan(results: Mapping[str, Any] | list, profile_id: str, folder: Path, force: bool,
          write: bool, date: str | None, launch_statistic: str | None) -> RecordPlan:
    old = load_profile(folder) if (folder / PROFILE_FILE).exists() else None
    if old and not force and (old.kind == "paper" or not old.matches(profile_id)):
        raise BaselineError(f"{folder} holds {old.kind} baselines of "
                            f"{old.hardware}; refusing to overwrite it with "
                            f"{profile_id} results unless forced")
    date = date or utc_stamp()
    new_rows, samples = rows_from_run(results, date)
    counted = counter_entries(results, date)
    if new_rows.empty and not counted:
        raise BaselineError("the run has no ok cell with a recordable metric; nothing to record")
    old_rows = old.metrics if old else pd.DataFrame(columns=["id", "metric"])
    tuned = dict(zip(old_rows["id"], old_rows.get("tolerance", [])))
    new_rows["tolerance"] = [tuned.get(i) or t for i, t in new_rows[["id", "tolerance"]].values]
    merged = pd.concat([old_rows[~old_rows["id"].isin(new_rows["id"])], new_rows],
                       ignore_index=True).fillna("").sort_values("id").reset_index(drop=True)
    merged = merged[[c for c in METRIC_COLUMNS if c in merged.columns]]
    keys = set(merged.get("samples_key", []))
    samples = {**{k: v for k, v in (old.samples if old else {}).items() if k in keys}, **samples}
    retimed = set(new_rows.loc[new_rows["metric"].isin(STEP_METRICS), "cell"]) if not new_rows.empty else set()
    kinds = {row["cell"]: launch_kind(row) for row in merged.to_dict("records")}
    spreads = launch_spreads(results, [(kinds[cell], samples_of(samples.get(f"{cell}:step_time"))[1])
                                       for cell in set(merged["cell"]) - retimed])  # () for one launch
    folder_spreads = {**(old.launch_spread if old else {}), **spreads}  # kinds not seen again stay
    profiled = profile_entries(run_cells(results), retimed, date)
    profiles = merged_profiles(old.profiles if old else {}, profiled, retimed)
    meta = read_json(folder / PROFILE_FILE) if old else {"aliases": []}
    if launch_statistic:  # set by hand: kept until set again
        meta["launch_statistic"] = launch_statistic
        meta.pop("launch_statistic_chosen", None)
    elif ("launch_statistic" not in meta or "launch_statistic_chosen" in meta) and (
            chosen := steadier(folder_spreads)):
        meta["launch_statistic"], meta["launch_statistic_chosen"] = chosen
    timed = {kinds[cell] for cell in merged.loc[merged["metric"].isin(STEP_METRICS), "cell"]}
    plan = RecordPlan(folder, merged, samples, diff_tables(old_rows, merged), write, spreads,
                      len(counted), len(profiled), meta.get("launch_statistic_chosen", ""),
                      () if ANY_KIND in folder_spreads else tuple(sorted(timed - set(folder_spreads))))
    old_counters = read_json(folder / COUNTERS_FILE)["entries"] if old and old.counters else []
    counters_text = _merged_counters(old_counters, counted) if counted else None
    # Checked as the folder's next load will check them, before anything is
    # written: a value it refuses (a zero step time, a negative count) would
    # fail every later run.
    check_samples(samples, folder / SAMPLES_FILE)
    read_table(folder / METRICS_FILE, METRIC_COLUMNS, samples, df=merged)
    if counters_text:
        parse_counters(json.loads(counters_text), folder / COUNTERS_FILE)
    profiles_json = profiles_text(profiles) if profiles else None
    if profiles_json:
        parse_profiles(json.loads(profiles_json), folder / PROFILES_FILE, BaselineError)
    if write:  # samples first, so metrics.csv never names samples that are not there
        body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(samples.items()))
        atomic_write_text(folder / SAMPLES_FILE, "{\n" + body + "\n}\n")  # a line per row: diffable
        atomic_write_text(folder / METRICS_FILE, merged.to_csv(index=False, lineterminator="\n"))
        if counters_text:
            atomic_write_text(folder / COUNTERS_FILE, counters_text)
        if profiles_json:
            atomic_write_text(folder / PROFILES_FILE, profiles_json)
        elif (folder / PROFILES_FILE).exists():  # its last cells were recorded again without a profile
            (folder / PROFILES_FILE).unlink()
        if spreads:  # per kind, pooled over the cells whose repeated launches the folder keeps
            meta["launch_spread"] = spreads_json(folder_spreads)
        atomic_write_text(folder / PROFILE_FILE, json.dumps(
            {**meta, "format": FORMAT, "hardware": profile_id, "kind": "recorded"}, indent=2))
    return plan




# Launches a cell gets where its step time is recorded as a runner's new
# baseline (perfsuite.runner, --record-new): one recorded launch judges a
# later one only as `unknown` (drift between launches is unmeasured); four
# give the between-launch spread that lets one later launch be judged.
RECORD_LAUNCHES = 4


def lacks_time_baseline(result: Mapping[str, Any]) -> bool:
    """Its step-time verdict was skipped for want of a baseline on this hardware,
    or left `unknown` for want of a between-launch spread of its launch kind there."""
    return result.get("status") == "ok" and any(
        c.get("missing") in ("baseline", "spread") and c.get("metric") in ("step_time", "time_per_token")
        for c in result.get("checks", []))


def record_missing(result: dict[str, Any], root: Path | str, *, spread: bool = False) -> Path | None:
    """A runner's first baselines: record into ``root`` (the runner's own
    baselines root) what this judged cell had nothing to be judged against:
    its metrics where a check lacked a baseline on this hardware, or (``spread``)
    where its launch kind lacked a between-launch spread and the cell was
    launched again for one; its work counters where none were recorded on this
    software stack. Each such check says it was recorded (``recorded``: the
    folder), so that the run says what it recorded instead of passing as
    judged (a time check judged with the launches recorded for a spread says
    so in its message); where recording failed, it says why (the measured
    result stands either way). The folder, or None."""
    checks = [c for c in result.get("checks", []) if c.get("missing")]
    if spread:  # judged by now, with its own launches: the time checks are the ones said
        checks += [c for c in result.get("checks", []) if not c.get("missing")
                   and c.get("metric") in ("step_time", "time_per_token")]
    if result.get("status") != "ok" or not checks:
        return None
    missing = {c.get("missing") for c in checks}
    times = spread or "baseline" in missing
    cell = {**result, "metrics": result.get("metrics") if times else {},
            "counters": result.get("counters") if "counters" in missing else None,
            "profile": result.get("profile") if times else None}  # beside its samples
    try:
        plan = record_run({"env": result.get("env") or {}, "cells": [cell]}, root=root)
    except (BaselineError, OSError) as err:
        for check in checks:
            check["message"] = f"{check.get('message', '')}; not recorded: {err}"
        return None
    for check in checks:
        if not check.get("missing"):  # judged with its own launches: what they recorded is said
            check["message"] = (f"{check.get('message', '')}; its launches recorded into {plan.folder}: "
                                f"this runner's spread of {launch_kind(result.get('params') or {})} launches")
            continue
        check["recorded"] = str(plan.folder)
        check["message"] = (f"{check.get('message', '')}; recorded into {plan.folder} as this runner's "
                            "baseline: the next run judges it")
    return plan.folder
