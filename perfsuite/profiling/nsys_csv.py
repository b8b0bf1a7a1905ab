"""Nsight Systems CSVs: parse what `nsys stats --format csv` writes and
summarise a rank's (or a directory of ranks') reports into a ProfileSummary.

The CSV parser is the part that runs everywhere (CI has no nsys): it accepts
the 2023 and 2024+ spellings of memory operations, thousands separators,
notes printed before a header, several reports in one file (the stdout of
`nsys stats`), quoted names with commas and empty reports. Finding nsys and
running `nsys stats` is ``perfsuite.profiling.nsys``.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .nsys import (
    NSYS_REPORTS,
    REPORT_EXTENSIONS,
    NsysCsvError,
    NsysImportError,
    NsysNotFoundError,
    qdstrm_only_message,
    resolve_nsys,
    run_nsys_stats,
)
from .summary import ProfileRow, ProfileSummary, api_base_name, canonical_memop, merge_rank_summaries
from .trace_summary import summary_from_chrome_trace

_PER_SECOND = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0}  # divide: exact for whole ns
_SIZE_UNITS = {"B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3}
_TIME_COL = re.compile(r"^Total Time \((ns|us|ms|s)\)$")
_SIZE_COL = re.compile(r"^Total \((B|KB|MB|GB|KiB|MiB|GiB)\)$")
_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d*)?([eE][+-]?\d+)?$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_FIX_HINT = ("re-export it with `nsys stats --report <name> --format csv --output <prefix> <report.nsys-rep>` "
             "or remove the file from the directory")


# -- CSV parsing -----------------------------------------------------------

@dataclass
class NsysTable:
    """One report section of an nsys stats CSV."""

    kind: str  # one of NSYS_REPORTS
    path: str
    header: list[str]
    rows: list[dict[str, str]] = field(default_factory=list)
    line_numbers: list[int] = field(default_factory=list)


def _report_kind(header: Sequence[str]) -> str | None:
    cols = set(header)
    has_time = any(_TIME_COL.match(c) for c in cols)
    if "Range" in cols and has_time:
        return "nvtx_sum"
    if "Operation" in cols and has_time:
        return "cuda_gpu_mem_time_sum"
    if "Operation" in cols and any(_SIZE_COL.match(c) for c in cols):
        return "cuda_gpu_mem_size_sum"
    if "Name" in cols and has_time and "Num Calls" in cols:
        return "cuda_api_sum"
    if "Name" in cols and has_time and "Instances" in cols:
        return "cuda_gpu_kern_sum"
    return None


def _parse_number(text: str) -> float:
    text = text.strip()
    if not _NUMBER.match(text):
        raise ValueError(text)
    return float(text.replace(",", ""))


def _is_number(text: str) -> bool:
    try:
        _parse_number(text)
    except ValueError:
        return False
    return True


def _clean(fields: list[str]) -> list[str]:
    return [f.strip().lstrip("\ufeff") for f in fields]


def read_nsys_csv(path: str | os.PathLike) -> list[NsysTable]:
    """Every report section in one CSV file (usually one; several when the
    file is the stdout of `nsys stats`). An empty or skipped report gives []."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NsysCsvError(f"{path}: cannot read ({exc})") from exc
    tables: list[NsysTable] = []
    current: NsysTable | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            current = None
            continue
        raw = next(csv.reader([line]))
        fields = _clean(raw)
        kind = _report_kind(fields)
        if kind is not None:
            current = NsysTable(kind, str(path), fields)
            tables.append(current)
            continue
        numeric_start = _is_number(fields[0]) and len(fields) >= 3
        if current is None:
            if numeric_start:
                raise NsysCsvError(f"{path}: line {lineno}: data row before any nsys stats header "
                                   f"(the header row is missing or renamed); {_FIX_HINT}")
            continue  # a note printed before the header
        if len(fields) != len(current.header) and not numeric_start:
            current = None  # a note after the table (e.g. "Processing [...]")
            continue
        current.rows.append(_row_dict(raw, current.header, path, lineno))
        current.line_numbers.append(lineno)
    if not tables and text.strip() and "SKIPPED" not in text and "does not contain" not in text:
        raise NsysCsvError(
            f"{path}: no nsys stats header row found (expected e.g. 'Time (%),Total Time (ns),"
            f"Num Calls,...,Name'); {_FIX_HINT}")
    return tables


def _row_dict(fields: list[str], header: list[str], path: Path, lineno: int) -> dict[str, str]:
    n = len(header)
    if len(fields) > n:
        # An unquoted name with commas: the name column is last, join it back.
        # If the spill-over starts with a number it was a thousands separator.
        spill = fields[n - 1:]
        if _is_number(spill[0]):
            raise NsysCsvError(f"{path}: line {lineno}: {len(fields)} fields for {n} columns; "
                               f"numbers with unquoted thousands separators? {_FIX_HINT}")
        fields = fields[: n - 1] + [",".join(spill)]
    fields = _clean(fields)
    if len(fields) < n:
        raise NsysCsvError(f"{path}: line {lineno}: {len(fields)} fields for {n} columns "
                           f"({','.join(header)}); the file is truncated or malformed; {_FIX_HINT}")
    return dict(zip(header, fields))


def _value(table: NsysTable, row: dict[str, str], index: int, column: str) -> float:
    try:
        return _parse_number(row[column])
    except ValueError:
        line = table.line_numbers[index]
        raise NsysCsvError(f"{table.path}: line {line}: column {column!r} is {row[column]!r}, "
                           f"not a number; {_FIX_HINT}") from None


def _time_column(header: Sequence[str]) -> tuple[str, float]:
    for col in header:
        m = _TIME_COL.match(col)
        if m:
            return col, _PER_SECOND[m.group(1)]
    raise AssertionError("header without a time column")  # _report_kind checked it


def _size_column(header: Sequence[str]) -> tuple[str, float]:
    for col in header:
        m = _SIZE_COL.match(col)
        if m:
            return col, _SIZE_UNITS[m.group(1)]
    raise AssertionError("header without a size column")


def summary_from_tables(tables: Iterable[NsysTable], *, rank: int | None = None,
                        meta: dict | None = None) -> ProfileSummary:
    """Turn parsed nsys report sections into one ProfileSummary."""
    rows: list[ProfileRow] = []
    memops: dict[str, dict] = {}  # memory ops: time and size reports joined by name
    files: list[str] = []
    for table in tables:
        if Path(table.path).name not in files:
            files.append(Path(table.path).name)
        if table.kind == "cuda_gpu_mem_size_sum":
            size_col, scale = _size_column(table.header)
            for i, row in enumerate(table.rows):
                op = memops.setdefault(canonical_memop(row["Operation"]), {})
                op["bytes"] = op.get("bytes", 0.0) + _value(table, row, i, size_col) * scale
                op.setdefault("size_calls", 0)
                op["size_calls"] += int(_value(table, row, i, "Count"))
            continue
        time_col, per_second = _time_column(table.header)
        for i, row in enumerate(table.rows):
            seconds = _value(table, row, i, time_col) / per_second
            if table.kind == "cuda_gpu_mem_time_sum":
                op = memops.setdefault(canonical_memop(row["Operation"]), {})
                op["total_s"] = op.get("total_s", 0.0) + seconds
                op["calls"] = op.get("calls", 0) + int(_value(table, row, i, "Count"))
            elif table.kind == "nvtx_sum":
                name = row["Range"].removeprefix(":")
                rows.append(ProfileRow(name, "nvtx", seconds, int(_value(table, row, i, "Instances"))))
            elif table.kind == "cuda_api_sum":
                rows.append(ProfileRow(api_base_name(row["Name"]), "cuda_api", seconds,
                                       int(_value(table, row, i, "Num Calls"))))
            else:
                rows.append(ProfileRow(row["Name"], "kernel", seconds, int(_value(table, row, i, "Instances"))))
    for name, op in memops.items():
        category = "memset" if "memset" in name.lower() else "memcpy"
        calls = op.get("calls", op.get("size_calls", 0))
        rows.append(ProfileRow(name, category, op.get("total_s", 0.0), calls, bytes=op.get("bytes")))
    return ProfileSummary("nsys", rows, rank=rank, meta={"files": files, **(meta or {})})


def _stats_command(reports: str) -> str:
    return f"`nsys stats --report {reports} --format csv --output <prefix> <report.nsys-rep>`"


_NO_CUDA_HINT = ("where nsys itself found no CUDA data in the report (its SKIPPED note), profile the run "
                 "again on a GPU: `nsys profile --trace=cuda,nvtx ...` (`perfsuite run --profiler nsys`, "
                 "pytest --perf-profiler nsys), with the measured steps inside the capture range")


def _why_empty(path: Path, tables: list[NsysTable]) -> str:
    """How a CSV without rows looks: header only, empty, or nsys's own note."""
    if tables:
        return "header only"
    text = path.read_text(encoding="utf-8", errors="replace")  # read_nsys_csv read it already
    note = next((line.strip() for line in text.splitlines() if "SKIPPED" in line or "does not contain" in line), "")
    return f"nsys: {note}" if note else "empty"


def _no_rows_error(files: list[tuple[Path, list[NsysTable]]]) -> NsysCsvError:
    """Every CSV of one summary is empty: name each file, how it looks, the fix."""
    if len(files) == 1:
        (path, tables), = files
        kinds = [t.kind for t in tables] or [r for r in NSYS_REPORTS if path.name.endswith(f"_{r}.csv")]
        reports = ",".join(dict.fromkeys(kinds)) or ",".join(NSYS_REPORTS)
        return NsysCsvError(f"{path}: no kernel/API rows in the nsys CSV export ({_why_empty(path, tables)}); "
                            f"re-export with {_stats_command(reports)}; {_NO_CUDA_HINT}")
    listed = ", ".join(f"{path} ({_why_empty(path, tables)})" for path, tables in files)
    return NsysCsvError(f"no kernel/API rows in any of these nsys CSV exports: {listed}; re-export the "
                        f"report with {_stats_command(','.join(NSYS_REPORTS))}; {_NO_CUDA_HINT}")


def summarize_csvs(paths: Iterable[str | os.PathLike], *, rank: int | None = None,
                   report: str | os.PathLike | None = None) -> ProfileSummary:
    """One summary from the CSVs of one rank (``report``: the .nsys-rep they
    were exported from, for messages).

    Some of a rank's CSVs may hold no rows: nsys writes a report header-only
    (or notes it SKIPPED) when the run had none of it: no NVTX ranges, no
    memory operations, or no kernels on a cell that computes on the CPU. The
    other reports still describe the run, so the summary is built from them.
    When none of them holds a row there is nothing to summarise: an all-zero
    summary would read as a run that spent no time, so that is an NsysCsvError
    naming every file.
    """
    files = [(Path(path), read_nsys_csv(path)) for path in sorted(paths, key=str)]
    if not files:
        if report is None:
            raise NsysCsvError("no nsys CSV files to summarise")
        raise NsysCsvError(f"{report}: `nsys stats` wrote no CSV report (the report holds no CUDA or NVTX "
                           f"data); check it with {_stats_command(','.join(NSYS_REPORTS))}; {_NO_CUDA_HINT}")
    tables = [table for _, found in files for table in found]
    if not any(table.rows for table in tables):
        raise _no_rows_error(files)
    return summary_from_tables(tables, rank=rank)


def _csv_prefix(path: Path) -> str:
    for name in NSYS_REPORTS:
        if path.name.endswith(f"_{name}.csv"):
            return path.name[: -len(f"_{name}.csv")]
    return path.stem


def _rank_of(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _summarize_groups(groups: dict[str, list[Path]], builder) -> ProfileSummary:
    parts = []
    for i, (prefix, members) in enumerate(sorted(groups.items())):
        rank = _rank_of(prefix)
        parts.append(builder(members, i if rank is None and len(groups) > 1 else rank))
    return parts[0] if len(parts) == 1 else merge_rank_summaries(parts)


def summarize_path(path: str | os.PathLike, *, nsys: str | None = None) -> ProfileSummary:
    """A ProfileSummary from an nsys report (.nsys-rep / .sqlite; runs
    `nsys stats`), a single CSV, a saved summary .json (torch.profiler runs),
    a torch.profiler chrome trace (.trace.json, .trace.json.gz), or a
    directory of reports, CSVs or summaries, one per rank (rank0_cuda_api_sum.csv,
    rank0.nsys-rep, rank0.json): ranks are merged."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such profile report, CSV or directory")
    if path.is_file():
        if path.suffix == ".qdstrm":
            raise _qdstrm_only([path])
        if path.suffix == ".csv":
            return summarize_csvs([path], rank=_rank_of(path.name))
        if path.name.endswith((".trace.json", ".trace.json.gz")):
            return summary_from_chrome_trace(path, rank=_rank_of(path.name))
        if path.name.endswith(REPORT_EXTENSIONS):
            return summarize_csvs(run_nsys_stats(path, nsys=nsys).values(), rank=_rank_of(path.name),
                                  report=path)
        if path.suffix == ".json":
            return _read_summary_json(path)
        raise NsysCsvError(f"{path}: expected a .nsys-rep, .sqlite, .csv, summary .json or .trace.json(.gz) file, "
                           "or a directory")
    # Exported CSVs win over the report they came from (a cache); reports
    # without CSVs are run through `nsys stats`.
    groups: dict[str, list[Path]] = {}
    for csv_path in sorted(path.glob("*.csv")):
        groups.setdefault(_csv_prefix(csv_path), []).append(csv_path)
    for candidate in sorted(path.iterdir()):
        stem = next((candidate.name[: -len(ext)] for ext in REPORT_EXTENSIONS if candidate.name.endswith(ext)), None)
        if stem is not None and stem not in groups:
            groups[stem] = [candidate]  # .nsys-rep sorts before .sqlite and wins
    # A capture nsys could not import stays a .qdstrm: a rank with nothing
    # else has no report to read, and a summary of the other ranks alone
    # would pass for the whole cell's.
    stranded = [q for q in sorted(path.glob("*.qdstrm")) if q.name[: -len(".qdstrm")] not in groups]
    if stranded:
        raise _qdstrm_only(stranded)
    if not groups:  # torch.profiler runs leave per-rank summary JSON instead
        saved = [p for p in sorted(path.glob("*.json")) if not p.name.endswith(".trace.json")]
        if saved:
            parts = [_read_summary_json(p) for p in saved]
            return parts[0] if len(parts) == 1 else merge_rank_summaries(parts)
        raise NsysCsvError(f"{path}: directory has no nsys CSVs (*.csv), reports (*.nsys-rep, *.sqlite) "
                           "or profile summaries (*.json)")
    return _summarize_groups(groups, lambda members, rank: _summarize_members(members, rank, nsys))


def _qdstrm_only(captures: list[Path]) -> NsysImportError:
    try:
        binary = resolve_nsys()
    except NsysNotFoundError:
        binary = ""
    listed = ", ".join(str(c) for c in captures)
    return NsysImportError(f"{qdstrm_only_message(binary)}; no report beside {listed}")


def _summarize_members(members: list[Path], rank: int | None, nsys: str | None) -> ProfileSummary:
    if members[0].suffix == ".csv":
        return summarize_csvs(members, rank=rank)
    return summarize_csvs(run_nsys_stats(members[0], nsys=nsys).values(), rank=rank, report=members[0])


def _read_summary_json(path: Path) -> ProfileSummary:
    try:
        return ProfileSummary.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise NsysCsvError(f"{path}: not a perfsuite profile summary ({exc})") from exc
