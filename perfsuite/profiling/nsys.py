"""Nsight Systems: find the nsys binary, choose the profiler, wrap a rank in
`nsys profile` and run `nsys stats` on its report.

Reading the CSVs `nsys stats` writes into a ProfileSummary is
``perfsuite.profiling.nsys_csv``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .nsys_installs import NsysInstall, describe, installed, where_searched

NSYS_REPORTS = (
    "cuda_api_sum",
    "cuda_gpu_kern_sum",
    "cuda_gpu_mem_time_sum",
    "cuda_gpu_mem_size_sum",
    "nvtx_sum",
)
DEFAULT_TRACE = ("cuda", "nvtx", "osrt", "cublas", "cudnn")
NSYS_BIN_ENV = "PERFSUITE_NSYS_BIN"  # explicit path to the nsys binary
# nsys expands %q{VAR} from its own environment: under torchrun each rank's
# nsys sees its RANK, so one pattern gives one report per rank.
RANK_OUTPUT_PATTERN = "rank%q{RANK}"

REPORT_EXTENSIONS = (".nsys-rep", ".qdrep", ".sqlite")  # report files `nsys stats` reads


class NsysError(RuntimeError):
    """nsys failed or produced something we cannot read."""


class NsysNotFoundError(NsysError):
    """The nsys binary is not installed / not on PATH."""


class NsysConfigError(NsysNotFoundError):
    """$PERFSUITE_NSYS_BIN is set but names nothing executable."""


class NsysImportError(NsysError):
    """nsys left only .qdstrm captures: it could not import them into reports."""


class NsysCsvError(NsysError, ValueError):
    """A CSV that is not a readable `nsys stats` report."""


# -- finding nsys and deciding the profiler --------------------------------

def _not_installed() -> str:
    return (f"nsys (Nsight Systems) is not installed: none on PATH nor in {where_searched()}. Install it, "
            f"set ${NSYS_BIN_ENV}, or run `nsys stats --format csv` where it is and pass the directory of "
            "CSVs instead")


def qdstrm_only_message(install: str = "") -> str:
    """What a run that left only .qdstrm files (or would) is told."""
    where = f" ({install})" if install else ""
    return (f".qdstrm only: nsys could not import its capture — QdstrmImporter missing from this nsys "
            f"install{where}; install the full Nsight Systems package, or set ${NSYS_BIN_ENV} to the "
            "bin/nsys of one")


# Installs seen to lack the importer, by binary: found after a launch left only
# .qdstrm files (remember_import_failure), so later cells of the session are
# profiled with torch.profiler instead of running nsys for nothing.
_IMPORT_FAILED: dict[str, str] = {}


def _executable(candidate: str) -> str | None:
    if os.path.sep in candidate:
        path = os.path.abspath(candidate)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(candidate)
    return os.path.abspath(found) if found else None


def locate_nsys(nsys: str | None = None) -> NsysInstall:
    """The nsys every part of perfsuite runs (the rank wrap, `nsys stats`, the
    availability check, `perfsuite doctor`) and what its install has beside
    it: ``nsys`` if given, else $PERFSUITE_NSYS_BIN if set, else `nsys` on
    PATH, else the best of NVIDIA's install folders (nsys_installs.installed:
    one with its QdstrmImporter first, Nsight Systems' own, the newest).
    PATH's nsys gives way only to an install that imports captures where its
    own install is known to lack the importer.

    A set $PERFSUITE_NSYS_BIN that names nothing executable is an error naming
    it (NsysConfigError), never a quiet fall-back to another nsys;
    no nsys at all is NsysNotFoundError.
    """
    if nsys:
        found = _executable(nsys)
        if found is None:
            raise NsysNotFoundError(f"nsys binary {nsys!r}: no such executable file")
        return describe(found, "given")
    configured = os.environ.get(NSYS_BIN_ENV)
    if configured:
        found = _executable(configured)
        if found is None:
            raise NsysConfigError(
                f"${NSYS_BIN_ENV}={configured!r} names no executable file: point it at the nsys binary "
                "(e.g. /opt/nvidia/nsight-systems/<version>/bin/nsys) or unset it to use `nsys` from PATH")
        return describe(found, f"${NSYS_BIN_ENV}")
    on_path = _executable("nsys")
    if on_path is not None:
        first = describe(on_path, "PATH")
        if first.can_import is False:
            return next((i for i in installed() if i.can_import), first)
        return first
    found_installs = installed()
    if not found_installs:
        raise NsysNotFoundError(_not_installed())
    return found_installs[0]


def resolve_nsys(nsys: str | None = None) -> str:
    """locate_nsys's binary, as an absolute path."""
    return locate_nsys(nsys).binary


def find_nsys(nsys: str | None = None) -> str | None:
    """resolve_nsys, or None where no nsys is installed (a misconfigured
    $PERFSUITE_NSYS_BIN still raises NsysConfigError)."""
    try:
        return resolve_nsys(nsys)
    except NsysConfigError:
        raise
    except NsysNotFoundError:
        return None


def nsys_available(nsys: str | None = None) -> bool:
    return find_nsys(nsys) is not None


def missing_importer(binary: str) -> str | None:
    """Why this nsys install cannot turn its captures into reports, or None.

    A failure seen earlier in this session (remember_import_failure), else a
    look at the install (nsys_installs.describe): only a layout recognised as
    NVIDIA's own with no QdstrmImporter where nsys looks for it
    (``host-linux-*``: one in Nsight Compute's desktop folder does not count)
    counts as missing it; any other layout is given the benefit of the doubt,
    and a launch that leaves only .qdstrm files is caught afterwards
    (summarize_path).
    """
    if binary in _IMPORT_FAILED:
        return _IMPORT_FAILED[binary]
    found = describe(binary, "")
    if found.can_import is not False:
        return None
    return qdstrm_only_message(f"none in {found.importer_place}, where {binary} looks for it")


def remember_import_failure(reason: str, nsys: str | None = None) -> None:
    """After a launch left only .qdstrm files: later choose_profiler calls in
    this process pick torch.profiler instead of this nsys."""
    try:
        binary = resolve_nsys(nsys)
    except NsysNotFoundError:
        return
    _IMPORT_FAILED[binary] = reason


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def choose_profiler(requested: str = "auto", *, cuda_available: bool | None = None,
                    nsys: str | None = None) -> tuple[str, str]:
    """Which profiler to use: ("nsys" | "torch" | "off", why-not-nsys message).

    Nsight Systems needs a CUDA device, the nsys binary (resolve_nsys: a
    $PERFSUITE_NSYS_BIN naming nothing executable raises NsysConfigError) and
    its QdstrmImporter; otherwise the answer is torch.profiler with a message
    saying what was missing.
    """
    if requested not in ("auto", "nsys", "torch", "off"):
        raise ValueError(f"profiler must be auto, nsys, torch or off, not {requested!r}")
    if requested in ("torch", "off"):
        return requested, ""
    if cuda_available is None:
        cuda_available = _cuda_available()
    if not cuda_available:
        return "torch", "no CUDA device: Nsight Systems traces CUDA, using torch.profiler (CPU activity) instead"
    binary = find_nsys(nsys)
    if binary is None:
        return "torch", (f"nsys not found (${NSYS_BIN_ENV}, PATH, {where_searched()}): using torch.profiler "
                         "instead; install Nsight Systems to get the paper's nsys metrics")
    broken = missing_importer(binary)
    if broken:
        return "torch", f"{broken}: using torch.profiler instead"
    return "nsys", ""


# -- nsys profile / nsys stats command lines -------------------------------

def rank_report_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """Report base path for one rank (nsys appends .nsys-rep)."""
    return Path(out_dir) / f"rank{rank}"


def nsys_profile_argv(
    command: Sequence[str],
    output: str | os.PathLike,
    *,
    nsys: str = "nsys",
    trace: Sequence[str] = DEFAULT_TRACE,
    capture_range: str | None = "cudaProfilerApi",
    capture_range_end: str = "stop",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv that runs `command` (one rank) under `nsys profile`.

    output: report base path (see rank_report_path) or a pattern using
    RANK_OUTPUT_PATTERN. With capture_range="cudaProfilerApi" only the span
    between cudaProfilerStart/Stop is recorded (the measured steps).
    """
    if isinstance(command, (str, bytes)):
        raise TypeError("command must be a list of arguments, not a shell string")
    argv = [nsys, "profile", "--output", str(output), "--force-overwrite=true",
            "--trace=" + ",".join(trace), "--sample=none", "--cpuctxsw=none", "--stats=false"]
    if capture_range:
        argv += [f"--capture-range={capture_range}", f"--capture-range-end={capture_range_end}"]
    return argv + list(extra_args) + [str(part) for part in command]


def stats_csv_paths(prefix: str | os.PathLike, reports: Sequence[str] = NSYS_REPORTS) -> dict[str, Path]:
    """Where `nsys stats --format csv --output <prefix>` writes each report."""
    prefix = Path(prefix)
    return {name: prefix.with_name(f"{prefix.name}_{name}.csv") for name in reports}


def nsys_stats_argv(report: str | os.PathLike, prefix: str | os.PathLike, *, nsys: str = "nsys",
                    reports: Sequence[str] = NSYS_REPORTS) -> list[str]:
    argv = [nsys, "stats", "--report", ",".join(reports), "--format", "csv", "--output", str(prefix)]
    if str(report).endswith((".nsys-rep", ".qdrep")):
        argv.append("--force-export=true")  # never read a stale .sqlite next to it
    return argv + [str(report)]


def run_nsys_stats(report: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                   nsys: str | None = None, reports: Sequence[str] = NSYS_REPORTS,
                   timeout_s: float = 1800) -> dict[str, Path]:
    """Run `nsys stats` on a report; return {report name: CSV path} for the
    CSVs it wrote (nsys writes none for a report without data)."""
    try:
        binary = resolve_nsys(nsys)
    except NsysConfigError as err:
        raise NsysConfigError(f"cannot read {report}: {err}") from None
    except NsysNotFoundError as err:
        raise NsysNotFoundError(f"cannot read {report}: {err}") from None
    report = Path(report)
    stem = report.name
    for ext in REPORT_EXTENSIONS:
        stem = stem.removesuffix(ext)
    out_dir = Path(out_dir) if out_dir is not None else report.parent
    if not os.access(out_dir, os.W_OK):
        out_dir = Path(tempfile.mkdtemp(prefix="perfsuite-nsys-"))
    prefix = out_dir / stem
    paths = stats_csv_paths(prefix, reports)
    for stale in paths.values():
        stale.unlink(missing_ok=True)
    argv = nsys_stats_argv(report, prefix, nsys=binary, reports=reports)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise NsysError(f"`{' '.join(argv)}` took over {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout or "").strip()[-2000:]
        raise NsysError(f"`{' '.join(argv)}` exited with {done.returncode}:\n{tail}")
    return {name: path for name, path in paths.items() if path.is_file()}
