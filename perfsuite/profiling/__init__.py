"""Profiling: Nsight Systems (wrap + `nsys stats` CSV parsing) and the
torch.profiler fallback, both producing one ProfileSummary schema.

torch is imported only by `perfsuite.profiling.torch_profile`, so reading
nsys CSVs and torch.profiler traces (trace_summary), finding nsys
(nsys_installs) and comparing summaries work without it.
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
    locate_nsys,
    nsys_available,
    nsys_profile_argv,
    nsys_stats_argv,
    rank_report_path,
    remember_import_failure,
    resolve_nsys,
    run_nsys_stats,
)
from .nsys_csv import read_nsys_csv, summarize_csvs, summarize_path
from .nsys_installs import NsysInstall, installed
from .summary import (
    CATEGORIES,
    H2D,
    PAPER_METRICS,
    SCHEMA,
    BusBandwidth,
    ProfileRow,
    ProfileSummary,
    format_summary,
    merge_rank_summaries,
    nccl_bus_bandwidth,
)
from .trace_summary import summary_from_chrome_trace, summary_from_trace_events

__all__ = [
    "CATEGORIES", "H2D", "NSYS_REPORTS", "PAPER_METRICS", "RANK_OUTPUT_PATTERN", "SCHEMA",
    "BusBandwidth", "NsysConfigError", "NsysCsvError", "NsysError", "NsysImportError", "NsysInstall",
    "NsysNotFoundError", "ProfileRow", "ProfileSummary", "choose_profiler",
    "format_summary", "installed", "locate_nsys", "merge_rank_summaries", "nccl_bus_bandwidth", "nsys_available",
    "nsys_profile_argv", "nsys_stats_argv", "rank_report_path", "read_nsys_csv", "remember_import_failure",
    "resolve_nsys", "run_nsys_stats", "summarize_csvs", "summarize_path", "summary_from_chrome_trace",
    "summary_from_trace_events",
]
