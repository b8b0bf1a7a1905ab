"""Profiling: Nsight Systems (wrap + `nsys stats` CSV parsing) and the
torch.profiler fallback, both producing one ProfileSummary schema.

torch is imported only by `perfsuite.profiling.torch_profile`, so reading
nsys CSVs and comparing summaries works without it.
"""

from .nsys import (
    NSYS_REPORTS,
    RANK_OUTPUT_PATTERN,
    NsysConfigError,
    NsysCsvError,
    NsysError,
    NsysImportError,
    NsysNotFoundError,
    choose_profiler,
    nsys_available,
    nsys_profile_argv,
    nsys_stats_argv,
    rank_report_path,
    remember_import_failure,
    resolve_nsys,
    run_nsys_stats,
)
from .nsys_csv import read_nsys_csv, summarize_csvs, summarize_path
from .summary import (
    CATEGORIES,
    H2D,
    PAPER_METRICS,
    SCHEMA,
    BusBandwidth,
    ProfileRow,
    ProfileSummary,
    RowDelta,
    attribute_change,
    format_summary,
    merge_rank_summaries,
    nccl_bus_bandwidth,
)

__all__ = [
    "CATEGORIES", "H2D", "NSYS_REPORTS", "PAPER_METRICS", "RANK_OUTPUT_PATTERN", "SCHEMA",
    "BusBandwidth", "NsysConfigError", "NsysCsvError", "NsysError", "NsysImportError", "NsysNotFoundError",
    "ProfileRow", "ProfileSummary", "RowDelta", "attribute_change", "choose_profiler", "format_summary",
    "merge_rank_summaries", "nccl_bus_bandwidth", "nsys_available", "nsys_profile_argv", "nsys_stats_argv",
    "rank_report_path", "read_nsys_csv", "remember_import_failure", "resolve_nsys", "run_nsys_stats",
    "summarize_csvs", "summarize_path",
]
