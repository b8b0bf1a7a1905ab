"""nsys command lines, `nsys stats` CSV parsing and the shared summary schema."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from perfsuite.profiling import nsys, nsys_installs
from perfsuite.profiling.nsys import (
    NsysCsvError,
    NsysNotFoundError,
    choose_profiler,
    nsys_profile_argv,
    nsys_stats_argv,
    rank_report_path,
    stats_csv_paths,
)
from perfsuite.profiling.nsys_csv import canonical_memop, read_nsys_csv, summarize_path
from perfsuite.profiling.summary import (
    H2D,
    PAPER_METRICS,
    ProfileRow,
    ProfileSummary,
    api_base_name,
    format_summary,
    merge_rank_summaries,
    nccl_bus_bandwidth,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


# -- parsing the two nsys spellings ----------------------------------------

def test_2023_spelling_with_thousands_separators_and_preamble():
    s = summarize_path(FIXTURES / "v2023")
    assert s.source == "nsys" and s.rank is None
    api = s.find("cudaStreamSynchronize", "cuda_api")
    assert api.total_s == pytest.approx(1.23456789) and api.calls == 2048
    assert api.avg_s == pytest.approx(1.23456789 / 2048)
    assert s.find("cudaLaunchKernel").total_s == pytest.approx(0.822)
    assert s.category_total_s("cuda_api") == pytest.approx(2.73109789)
    # "[CUDA memcpy HtoD]" is read under the 2024+ name, with its bytes.
    h2d = s.find(H2D, "memcpy")
    assert h2d.total_s == pytest.approx(0.8) and h2d.calls == 4000
    assert h2d.bytes == pytest.approx(19_660.8e6)
    assert s.h2d_bandwidth_gbps() == pytest.approx(24.576)
    assert s.find("CUDA memcpy Device-to-Host").bytes == pytest.approx(40e6)
    assert s.find("CUDA memset", "memset").calls == 5000
    # ":forward" (default NVTX domain prefix) is read as "forward".
    assert s.find("forward", "nvtx").total_s == pytest.approx(4.0)
    assert s.find("backward", "nvtx").share == pytest.approx(0.5)
    assert s.kernel_time_by_family() == pytest.approx({"compute": 2.5, "nccl": 1.5, "memcpy": 1.0})
    # the older ncclKernel_AllGather_* name counts as ncclDevKernel_AllGather
    metrics = s.paper_metrics()
    assert list(metrics) == list(PAPER_METRICS)
    assert metrics["ncclDevKernel_AllGather"]["total_s"] == pytest.approx(1.0)
    assert metrics["ncclDevKernel_AllGather"]["share_of_category"] == pytest.approx(0.25)
    assert metrics["cudaEventDestroy"]["total_s"] == pytest.approx(0.10925)
    assert all(m["present"] for m in metrics.values())
    assert sum(m["percent_of_selected"] for m in metrics.values()) == pytest.approx(100.0)


def test_2024_spelling_per_rank_directory_is_merged():
    s = summarize_path(FIXTURES / "v2024")
    assert [part.rank for part in s.ranks] == [0, 1]
    assert s.meta["world_size"] == 2
    rank0 = s.ranks[0]
    assert rank0.find(H2D).total_s == pytest.approx(1.5)
    assert rank0.h2d_bytes == pytest.approx(38_400e6)
    assert rank0.h2d_bandwidth_gbps() == pytest.approx(25.6)
    assert rank0.category_total_s("cuda_api") == pytest.approx(10.0)
    assert rank0.paper_metric("ncclDevKernel_AllGather").total_s == pytest.approx(3.0)
    assert rank0.kernel_time_by_family() == pytest.approx({"compute": 7.8, "nccl": 4.2, "memcpy": 2.0})
    # quoted kernel names with commas survive whole
    assert any(r.name.startswith("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float")
               and r.name.endswith("const T1 *, T2 *)") for r in rank0.category_rows("kernel"))
    # sums over ranks, per-rank kept
    assert s.find("cudaStreamSynchronize").total_s == pytest.approx(10.0)
    assert s.find("cudaLaunchKernel").calls == 1_200_000
    assert s.h2d_time_s == pytest.approx(2.9) and s.h2d_bytes == pytest.approx(76_800e6)
    assert s.per_rank_metric("cudaEventSynchronize") == pytest.approx({0: 0.5, 1: 0.83})
    assert s.find("comm", "nvtx").total_s == pytest.approx(0.5)


def test_both_spellings_give_the_same_names():
    old = {r.name for r in summarize_path(FIXTURES / "v2023").rows if r.category in ("memcpy", "memset")}
    new = {r.name for r in summarize_path(FIXTURES / "v2024").rows if r.category in ("memcpy", "memset")}
    assert old == new == {H2D, "CUDA memcpy Device-to-Host", "CUDA memcpy Device-to-Device", "CUDA memset"}
    assert canonical_memop("[CUDA memcpy PtoP]") == "CUDA memcpy Peer-to-Peer"


def test_stdout_bundle_with_notes_and_skipped_report():
    tables = read_nsys_csv(FIXTURES / "bundle" / "stats_stdout.csv")
    assert [t.kind for t in tables] == ["cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum",
                                        "cuda_gpu_mem_size_sum"]
    s = summarize_path(FIXTURES / "bundle" / "stats_stdout.csv")
    assert s.find("cudaStreamSynchronize").total_s == pytest.approx(0.002)  # "_v3020" suffix dropped
    assert s.h2d_bytes == pytest.approx(20e6) and s.h2d_bandwidth_gbps() == pytest.approx(20.0)
    assert s.category_rows("nvtx") == []


def test_empty_reports_are_refused_naming_each_file():
    # A rank whose every report is empty, header only or skipped by nsys has
    # nothing to summarise: an all-zero profile would read as "no time spent".
    folder = FIXTURES / "empty"
    with pytest.raises(nsys.NsysError) as err:
        summarize_path(folder)
    text = str(err.value)
    assert f"{folder / 'rank0_cuda_api_sum.csv'} (nsys: SKIPPED: /scratch/run/rank0.sqlite does not contain " \
           "CUDA trace data.)" in text
    assert f"{folder / 'rank0_cuda_gpu_kern_sum.csv'} (header only)" in text
    assert f"{folder / 'rank0_nvtx_sum.csv'} (empty)" in text
    assert "no kernel/API rows in any of these nsys CSV exports" in text
    assert "`nsys stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum," \
           "nvtx_sum --format csv --output <prefix> <report.nsys-rep>`" in text
    assert "--trace=cuda" in text  # a report without CUDA data needs a new profile, not a re-export


HEADERS = {
    "cuda_api_sum": "Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n",
    "cuda_gpu_kern_sum": "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n",
}


@pytest.mark.parametrize("name, text, why, report", [
    ("rank0_cuda_gpu_kern_sum.csv", HEADERS["cuda_gpu_kern_sum"], "header only", "cuda_gpu_kern_sum"),
    ("rank0_cuda_api_sum.csv", "", "empty", "cuda_api_sum"),
    ("rank0_cuda_api_sum.csv", "\n\n", "empty", "cuda_api_sum"),
    ("export.csv", HEADERS["cuda_api_sum"] + "\n", "header only", "cuda_api_sum"),  # kind from the header
    ("export.csv", "", "empty", ",".join(nsys.NSYS_REPORTS)),
], ids=["header-only", "empty", "blank-lines", "unnamed-header-only", "unnamed-empty"])
def test_a_header_only_or_empty_csv_is_refused(tmp_path, name, text, why, report):
    path = tmp_path / name
    path.write_text(text)
    expected = (f"{path}: no kernel/API rows in the nsys CSV export ({why}); re-export with "
                f"`nsys stats --report {report} --format csv --output <prefix> <report.nsys-rep>`")
    with pytest.raises(nsys.NsysError) as err:
        summarize_path(path)
    assert str(err.value).startswith(expected), str(err.value)
    with pytest.raises(nsys.NsysError, match="no kernel/API rows"):
        summarize_path(tmp_path)  # the directory it is alone in


def test_cli_profile_of_an_empty_export_exits_2_naming_the_file(tmp_path, capsys):
    from perfsuite.cli import main as cli

    path = tmp_path / "rank0_cuda_gpu_kern_sum.csv"
    path.write_text(HEADERS["cuda_gpu_kern_sum"])
    assert cli.main(["profile", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"perfsuite profile: {path}: no kernel/API rows in the nsys CSV export "
                                   "(header only); re-export with `nsys stats --report cuda_gpu_kern_sum")
    assert "Traceback" not in captured.err
    assert cli.main(["profile", str(FIXTURES / "empty")]) == 2
    assert str(FIXTURES / "empty" / "rank0_nvtx_sum.csv") in capsys.readouterr().err


def test_some_empty_reports_of_a_rank_are_legitimate(tmp_path):
    # nsys writes a report header-only (or SKIPPED) when the run had none of
    # it: no NVTX ranges, no memcpy, or no kernels on a cell computing on the
    # CPU. The rest of the rank's reports still make its summary.
    for name in ("rank0_cuda_api_sum.csv", "rank0_cuda_gpu_mem_time_sum.csv",
                 "rank0_cuda_gpu_mem_size_sum.csv"):
        (tmp_path / name).write_text((FIXTURES / "v2024" / name).read_text())
    (tmp_path / "rank0_cuda_gpu_kern_sum.csv").write_text(HEADERS["cuda_gpu_kern_sum"])
    (tmp_path / "rank0_nvtx_sum.csv").write_text(
        "SKIPPED: /r/rank0.sqlite does not contain NV Tools Extension (NVTX) data.\n")
    s = summarize_path(tmp_path)
    assert s.rank == 0 and s.category_rows("kernel") == [] and s.category_rows("nvtx") == []
    assert s.find("cudaLaunchKernel").calls > 0 and s.h2d_bytes == pytest.approx(38_400e6)
    assert not s.paper_metrics()["ncclDevKernel_AllGather"]["present"]


def test_a_rank_with_only_empty_reports_is_named(tmp_path):
    for src in (FIXTURES / "v2024").glob("rank0_*.csv"):
        (tmp_path / src.name).write_text(src.read_text())
    for report, header in HEADERS.items():
        (tmp_path / f"rank1_{report}.csv").write_text(header)
    with pytest.raises(nsys.NsysError) as err:
        summarize_path(tmp_path)
    text = str(err.value)
    assert f"{tmp_path / 'rank1_cuda_api_sum.csv'} (header only)" in text
    assert "rank0" not in text


@pytest.mark.parametrize("name, message", [
    ("truncated_row.csv", r"truncated_row\.csv: line 3: 4 fields for 9 columns.*re-export"),
    ("not_a_number.csv", r"not_a_number\.csv: line 3: column 'Total Time \(ns\)' is 'n/a', not a number"),
    ("no_header.csv", r"no_header\.csv: no nsys stats header row found"),
])
def test_malformed_csv_names_file_row_and_fix(name, message):
    with pytest.raises(NsysCsvError, match=message):
        summarize_path(FIXTURES / "malformed" / name)


def test_data_before_header_and_unquoted_fields(tmp_path):
    headless = tmp_path / "x_cuda_api_sum.csv"
    headless.write_text("70.0,7000000,700,10000.0,9000.0,2000,40000,5000.0,cudaLaunchKernel\n")
    with pytest.raises(NsysCsvError, match=r"line 1: data row before any nsys stats header"):
        read_nsys_csv(headless)
    header = "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
    unquoted = tmp_path / "k.csv"
    unquoted.write_text(header + "100.0,5000,5,1000.0,1000.0,900,1100,10.0,void k<float, 4>(int, float)\n")
    assert summarize_path(unquoted).rows[0].name == "void k<float, 4>(int, float)"
    separators = tmp_path / "s.csv"
    separators.write_text(header + "100.0,5,000,5,1000.0,1000.0,900,1100,10.0,kern\n")
    with pytest.raises(NsysCsvError, match="unquoted thousands separators"):
        summarize_path(separators)


def test_other_time_units_and_sizes(tmp_path):
    path = tmp_path / "r_cuda_gpu_mem_size_sum.csv"
    path.write_text("Total (GB),Count,Avg (GB),Med (GB),Min (GB),Max (GB),StdDev (GB),Operation\n"
                    "2.5,4,0.625,0.625,0.625,0.625,0.0,[CUDA memcpy HtoD]\n")
    (tmp_path / "r_cuda_gpu_mem_time_sum.csv").write_text(
        "Time (%),Total Time (us),Count,Avg (us),Med (us),Min (us),Max (us),StdDev (us),Operation\n"
        "100.0,250000,4,62500,62500,62500,62500,0,[CUDA memcpy HtoD]\n")
    s = summarize_path(tmp_path)
    assert s.h2d_bytes == pytest.approx(2.5e9) and s.h2d_time_s == pytest.approx(0.25)
    assert s.h2d_fraction_of_limit(20.0) == pytest.approx(0.5)


# -- command lines and running nsys ------------------------------------------

def test_profile_argv_is_a_list_with_capture_range_and_rank_report():
    out = rank_report_path("/runs/cell", 3)
    argv = nsys_profile_argv(["python", "-m", "perfsuite.rank.worker", "--cell", "a b"], out)
    assert argv[:2] == ["nsys", "profile"]
    assert argv[argv.index("--output") + 1] == "/runs/cell/rank3"
    assert "--capture-range=cudaProfilerApi" in argv and "--capture-range-end=stop" in argv
    assert "--trace=cuda,nvtx,osrt,cublas,cudnn" in argv
    assert argv[-5:] == ["python", "-m", "perfsuite.rank.worker", "--cell", "a b"]
    pattern = nsys_profile_argv(["python", "w.py"], f"/runs/cell/{nsys.RANK_OUTPUT_PATTERN}",
                                capture_range=None)
    assert "/runs/cell/rank%q{RANK}" in pattern and not any("capture-range" in a for a in pattern)
    with pytest.raises(TypeError):
        nsys_profile_argv("python w.py", out)


def test_stats_argv_and_csv_names():
    argv = nsys_stats_argv("/r/rank0.nsys-rep", "/r/rank0")
    assert argv[:2] == ["nsys", "stats"]
    assert argv[argv.index("--report") + 1] == ",".join(nsys.NSYS_REPORTS)
    assert argv[argv.index("--format") + 1] == "csv" and argv[-1] == "/r/rank0.nsys-rep"
    assert "--force-export=true" in argv
    assert stats_csv_paths("/r/rank0")["cuda_api_sum"] == Path("/r/rank0_cuda_api_sum.csv")


FAKE_NSYS = """#!{python}
# Stands in for `nsys stats`: copies fixture CSVs to <prefix>_<report>.csv.
import shutil, sys
args = sys.argv[1:]
assert args[0] == "stats", args
prefix = args[args.index("--output") + 1]
for report in args[args.index("--report") + 1].split(","):
    if report != "nvtx_sum":  # nsys writes nothing for a skipped report
        shutil.copy("{fixtures}/rank0_" + report + ".csv", prefix + "_" + report + ".csv")
"""


def test_summarize_report_runs_nsys_stats(tmp_path):
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS.format(python=sys.executable, fixtures=FIXTURES / "v2024"))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    runs = tmp_path / "runs"
    runs.mkdir()
    for rank in (0, 1):
        (runs / f"rank{rank}.nsys-rep").write_bytes(b"")
    one = summarize_path(runs / "rank1.nsys-rep", nsys=str(fake))
    assert one.rank == 1 and one.find("cudaLaunchKernel").total_s == pytest.approx(3.0)
    assert one.category_rows("nvtx") == []
    (runs / "rank1_cuda_api_sum.csv").unlink()  # the directory path re-reads what is there
    both = summarize_path(runs, nsys=str(fake))
    assert [p.rank for p in both.ranks] == [0, 1]
    assert both.ranks[1].category_rows("cuda_api") == []


def test_a_report_nsys_stats_finds_nothing_in_is_named(tmp_path):
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nassert sys.argv[1] == 'stats'\n")  # writes no CSV
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    report = tmp_path / "rank0.nsys-rep"
    report.write_bytes(b"")
    with pytest.raises(nsys.NsysError, match=rf"^{report}: `nsys stats` wrote no CSV report "
                                             r"\(the report holds no CUDA or NVTX data\)"):
        summarize_path(report, nsys=str(fake))
    with pytest.raises(nsys.NsysError, match=rf"^{report}: `nsys stats` wrote no CSV report"):
        summarize_path(tmp_path, nsys=str(fake))


def test_missing_nsys_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    report = tmp_path / "rank0.nsys-rep"
    report.write_bytes(b"")
    assert not nsys.nsys_available()
    with pytest.raises(NsysNotFoundError, match=r"nsys \(Nsight Systems\) is not installed"):
        summarize_path(report)


def test_choose_profiler_falls_back_to_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    mode, why = choose_profiler("auto", cuda_available=True)
    assert mode == "torch" and "nsys not found" in why
    mode, why = choose_profiler("nsys", cuda_available=False)
    assert mode == "torch" and "no CUDA device" in why
    assert choose_profiler("off") == ("off", "")
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(fake))
    assert choose_profiler("auto", cuda_available=True) == ("nsys", "")
    with pytest.raises(ValueError):
        choose_profiler("perf")


# -- the summary schema ------------------------------------------------------

def test_summary_json_round_trip(tmp_path):
    s = summarize_path(FIXTURES / "v2024")
    text = json.dumps(s.to_dict(), allow_nan=False)
    back = ProfileSummary.from_dict(json.loads(text))
    assert back.to_dict() == s.to_dict()
    data = json.loads(text)
    assert data["schema"] == "perfsuite.profile/1"
    assert data["h2d"]["bandwidth_gbps"] == pytest.approx(76.8 / 2.9)
    assert {"name", "category", "total_s", "calls", "avg_s", "share"} <= set(data["rows"][0])
    saved = Path(tmp_path) / "rank0.json"
    saved.write_text(text)
    assert summarize_path(saved).to_dict() == s.to_dict()
    saved.write_text('{"schema": "other/1"}')
    with pytest.raises(NsysCsvError, match=r"rank0\.json: not a perfsuite profile summary"):
        summarize_path(tmp_path)
    with pytest.raises(ValueError, match="unknown profile row category"):
        ProfileRow("x", "gpu", 1.0, 1)


def test_text_view_shows_table1_and_bandwidth():
    text = format_summary(summarize_path(FIXTURES / "v2024"), top=3, h2d_limit_gbps=64)
    assert "all ranks" in text and "ncclDevKernel_AllGather" in text
    assert "76.800 GB in 2.900000 s = 26.48 GB/s (41% of 64 GB/s)" in text
    rows = text.split("top 3 rows:")[1].strip().splitlines()
    assert [row.split()[0] for row in rows] == ["nvtx", "kernel", "cuda_api"]


def test_api_suffixes_are_dropped():
    assert api_base_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_base_name("cudaMemcpyAsync_ptsz_v7000") == "cudaMemcpyAsync"
    assert api_base_name("cudaStreamSynchronize") == "cudaStreamSynchronize"


@pytest.mark.parametrize("op, factor", [("all_reduce", 2 * 3 / 4), ("allgather", 3 / 4),
                                        ("reduce_scatter", 3 / 4), ("broadcast", 1.0)])
def test_bus_bandwidth_follows_nccl_tests(op, factor):
    bw = nccl_bus_bandwidth(op, nbytes=8e9, seconds=0.5, world_size=4)
    assert bw.algbw_gbps == pytest.approx(16.0)
    assert bw.busbw_gbps == pytest.approx(16.0 * factor)


def test_bus_bandwidth_edge_cases():
    assert nccl_bus_bandwidth("all_reduce", 1e9, 1.0, 1).busbw_gbps == 0.0
    with pytest.raises(ValueError):
        nccl_bus_bandwidth("gather", 1e9, 1.0, 2)
    with pytest.raises(ValueError):
        nccl_bus_bandwidth("all_reduce", 1e9, 0.0, 2)


def _summary(rows, steps=None):
    return ProfileSummary("nsys", [ProfileRow(n, c, t, 1) for n, c, t in rows], steps=steps)


def test_merge_of_unranked_parts_numbers_them():
    a = _summary([("k", "kernel", 1.0)], steps=5)
    b = _summary([("k", "kernel", 3.0)], steps=5)
    merged = merge_rank_summaries([a, b])
    assert merged.find("k").total_s == 4.0 and merged.steps == 5
    assert [p.rank for p in merged.ranks] == [0, 1]
    with pytest.raises(ValueError):
        merge_rank_summaries([])


def test_fixture_files_exist_in_both_spellings():
    assert "[CUDA memcpy HtoD]" in (FIXTURES / "v2023" / "report1_cuda_gpu_mem_time_sum.csv").read_text()
    assert "[CUDA memcpy Host-to-Device]" in (FIXTURES / "v2024" / "rank0_cuda_gpu_mem_time_sum.csv").read_text()
    assert os.path.getsize(FIXTURES / "empty" / "rank0_nvtx_sum.csv") == 0


# -- which nsys runs, and what a profiled launch does with it ---------------

@pytest.fixture(autouse=True)
def _no_remembered_nsys_failures(monkeypatch):
    # choose_profiler remembers installs seen to leave .qdstrm only: per test
    monkeypatch.setattr(nsys, "_IMPORT_FAILED", {}, raising=False)


@pytest.fixture(autouse=True)
def _no_installed_nsys(tmp_path, monkeypatch):
    # the tests' nsys is on PATH or named; none found in this machine's /opt or /usr
    monkeypatch.setenv(nsys_installs.SEARCH_ROOT_ENV, str(tmp_path / "no-installs"))


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_one_resolver_for_nsys_and_a_bad_PERFSUITE_NSYS_BIN_is_named(tmp_path, monkeypatch):
    decoy = _executable(tmp_path / "path" / "nsys", "#!/bin/sh\nexit 97\n")
    chosen = _executable(tmp_path / "opt" / "nsys-2024", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(decoy.parent))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    assert nsys.resolve_nsys() == str(decoy)  # PATH when the variable is unset
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(chosen))
    assert nsys.resolve_nsys() == str(chosen) and nsys.find_nsys() == str(chosen)
    argv = nsys_profile_argv(["python", "w.py"], "/r/rank0", nsys=nsys.resolve_nsys())
    assert argv[0] == str(chosen)
    # set to nothing executable: an error naming it, not the nsys on PATH
    report = tmp_path / "rank0.nsys-rep"
    report.write_bytes(b"")
    for bad in (str(tmp_path / "missing" / "nsys"), str(tmp_path / "rank0.nsys-rep")):
        monkeypatch.setenv(nsys.NSYS_BIN_ENV, bad)
        named = rf"\$PERFSUITE_NSYS_BIN='{bad}' names no executable file"
        with pytest.raises(nsys.NsysConfigError, match=named):
            nsys.resolve_nsys()
        with pytest.raises(nsys.NsysConfigError, match=named):
            choose_profiler("auto", cuda_available=True)
        with pytest.raises(nsys.NsysConfigError, match=named):
            summarize_path(report)  # `nsys stats`
    assert choose_profiler("auto", cuda_available=False)[0] == "torch"  # no nsys needed there


def test_torchrun_argv_wraps_ranks_in_the_resolved_nsys(tmp_path, monkeypatch):
    from cellkit import tiny_image_cell

    from perfsuite.launch.launch import LaunchOptions, torchrun_argv

    chosen = _executable(tmp_path / "opt" / "nsys", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(chosen))
    argv = torchrun_argv(tiny_image_cell(device="cuda", world_size=1), tmp_path, LaunchOptions(), "nsys")
    wrapped = argv[argv.index("--no-python") + 1:]
    assert wrapped[:2] == [str(chosen), "profile"]
    assert wrapped[wrapped.index("--output") + 1] == str(tmp_path / "profile" / "rank%q{RANK}")


def test_only_qdstrm_captures_are_named_as_such(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.qdstrm").write_bytes(b"QDSTRM")
    for where in (tmp_path, tmp_path / "rank0.qdstrm"):
        with pytest.raises(nsys.NsysImportError) as err:
            summarize_path(where)
        assert str(err.value).startswith(
            ".qdstrm only: nsys could not import its capture — QdstrmImporter missing from this nsys "
            "install; install the full Nsight Systems package")
        assert str(tmp_path / "rank0.qdstrm") in str(err.value)
    # one rank imported, the other not: no summary passing for the whole cell
    (tmp_path / "rank0_cuda_api_sum.csv").write_text((FIXTURES / "v2024" / "rank0_cuda_api_sum.csv").read_text())
    with pytest.raises(nsys.NsysImportError, match=str(tmp_path / "rank1.qdstrm")):
        summarize_path(tmp_path)


def test_an_install_without_its_qdstrm_importer_is_profiled_with_torch(tmp_path, monkeypatch):
    install = tmp_path / "nsight-systems" / "2024.4.1"
    real = _executable(install / "bin" / "nsys", "#!/bin/sh\n")
    (install / "target-linux-x64").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nsys").symlink_to(real)  # /usr/local/bin/nsys -> the install
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    mode, why = choose_profiler("auto", cuda_available=True)
    assert mode == "torch" and why.startswith(".qdstrm only: nsys could not import its capture — "
                                              "QdstrmImporter missing from this nsys install")
    assert str(install) in why and why.endswith("using torch.profiler instead")
    _executable(install / "host-linux-x64" / "QdstrmImporter", "#!/bin/sh\n")
    assert choose_profiler("auto", cuda_available=True) == ("nsys", "")


# Stands in for nsys around one rank: `profile` checks its output folder is
# there (nsys does not create it), writes the rank's record in the worker's
# stead (no torch, no GPU: milliseconds) and the capture nsys would leave:
# a .nsys-rep, or only the .qdstrm where its QdstrmImporter is missing.
# `stats` copies fixture CSVs. Every call's argv goes to the log.
FAKE_NSYS_RANK = """#!{python}
import json, os, shutil, socket, sys, time
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
if args[0] == "stats":
    prefix = args[args.index("--output") + 1]
    for report in args[args.index("--report") + 1].split(","):
        shutil.copy({fixtures!r} + "/rank0_" + report + ".csv", prefix + "_" + report + ".csv")
    sys.exit(0)
assert args[0] == "profile", args
rank = os.environ["RANK"]
output = args[args.index("--output") + 1].replace("%q{{RANK}}", rank)
if not os.path.isdir(os.path.dirname(output)):
    sys.exit("Failed to create '" + output + ".qdstrm': No such file or directory")
begin = args.index("--output") + 2
while args[begin].startswith("--"):
    begin += 1
command = args[begin:]
out = command[command.index("--out") + 1]
samples = [0.101, 0.102, 0.103]
record = {{"rank": int(rank), "status": "ok", "steps": 3, "started": time.time(),
          "run_token": os.environ["PERFSUITE_RUN_TOKEN"], "agent_pid": os.getppid(),
          "launcher": {{"host": os.environ["PERFSUITE_LAUNCHER_HOST"],
                       "pid": os.environ["PERFSUITE_LAUNCHER_PID"]}},
          "metrics": {{"step_time": {{"value": 0.102, "unit": "s", "samples": samples}},
                      "throughput": {{"value": 156.9, "unit": "images/s"}}}}}}
record["finished"] = time.time()
with open(os.path.join(out, "rank" + rank + ".json"), "w") as fh:
    json.dump(record, fh)
if os.environ["FAKE_NSYS_LEAVES"] == "qdstrm":
    open(output + ".qdstrm", "wb").write(b"QDSTRM")
    print("Importer error status: Importation failed.", file=sys.stderr)
else:
    open(output + ".nsys-rep", "wb").write(b"NSYS")
"""


def _profiled_launch(tmp_path, monkeypatch, leaves: str):
    """One 1-GPU profile cell through torchrun, its rank under the fake nsys
    named by $PERFSUITE_NSYS_BIN, with a decoy `nsys` first on PATH."""
    from cellkit import tiny_image_cell

    from perfsuite.launch import launch

    log = tmp_path / "nsys-calls.jsonl"
    fake = _executable(tmp_path / "opt" / "bin" / "nsys", FAKE_NSYS_RANK.format(
        python=sys.executable, log=str(log), fixtures=str(FIXTURES / "v2024")))
    decoy = _executable(tmp_path / "decoy" / "nsys", "#!/bin/sh\necho decoy nsys >&2\nexit 97\n")
    monkeypatch.setenv("PATH", f"{decoy.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(fake))
    monkeypatch.setattr(launch, "gpus_present", lambda: 1)
    cell = tiny_image_cell(device="cuda", world_size=1, profile=True)
    result = launch.run_cell(cell, tmp_path / "out", launch.LaunchOptions(env={"FAKE_NSYS_LEAVES": leaves}))
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls, fake, launch.cell_dir(tmp_path / "out", cell) / "profile"


def test_a_profiled_launch_runs_PERFSUITE_NSYS_BIN_into_a_profile_folder_it_made(tmp_path, monkeypatch):
    result, calls, fake, profile_dir = _profiled_launch(tmp_path, monkeypatch, "nsys-rep")
    assert result["status"] == "ok", (result.get("reason"), result.get("output_tail"))
    assert [(call[0], call[1]) for call in calls] == [(str(fake), "profile"), (str(fake), "stats")]
    assert (profile_dir / "rank0.nsys-rep").is_file()
    assert result["profiler"] == {"mode": "nsys", "note": ""}
    assert result["profile"]["source"] == "nsys" and result["profile"]["rows"]
    assert (profile_dir / "summary.json").is_file()


@pytest.mark.slow
def test_a_launch_that_leaves_only_qdstrm_gets_a_torch_profile_from_a_second_launch(tmp_path, monkeypatch):
    """The GPU cell's second, profile-only launch runs here on the CPU (the
    same cell on device "cpu"), under the real torch.profiler."""
    from perfsuite.launch import launch
    from perfsuite.profiling.fallback import CAPTURES_DIR

    real_run_cell, second = launch.run_cell, []

    def run_cell(cell, out_dir, opts=None):
        if opts is not None and opts.profiler == "torch":
            second.append((cell, out_dir, opts))
            cell = cell.replace(device="cpu")
        return real_run_cell(cell, out_dir, opts)

    monkeypatch.setattr(launch, "run_cell", run_cell)
    result, calls, fake, profile_dir = _profiled_launch(tmp_path, monkeypatch, "qdstrm")
    assert result["status"] == "ok", (result.get("reason"), result.get("output_tail"))
    assert result["metrics"]["step_time"]["samples"] == [0.101, 0.102, 0.103]  # the timings stand
    assert [call[1] for call in calls] == ["profile"]  # nothing for `nsys stats` to read
    (cell, out_dir, opts), = second
    assert opts.options["count_steps"] == "0" and cell.epochs == 1 and cell.max_steps == 6
    assert out_dir == profile_dir / "torch-launch"
    profile = result["profile"]
    assert profile["source"] == "torch" and profile["steps"] > 0
    assert any(row["name"] == "forward" for row in profile["rows"])
    profiler = result["profiler"]
    assert profiler["mode"] == "torch" and profiler["timed_under"] == "nsys"
    assert profiler["error"].startswith(
        f".qdstrm only: nsys could not import its capture — QdstrmImporter missing from this nsys "
        f"install ({fake}); install the full Nsight Systems package")
    assert "second, profile-only launch under torch.profiler (6 steps" in profiler["note"]
    assert profiler["profile_launch"]["status"] == "ok"
    # the captures set aside, the trace where the report links it, the folder readable as a profile
    assert (profile_dir / CAPTURES_DIR / "rank0.qdstrm").is_file() and not list(profile_dir.glob("*.qdstrm"))
    trace = profile_dir / "rank0.trace.json.gz"
    assert trace.is_file() and profile["ranks"][0]["meta"]["trace"] == str(trace)
    assert summarize_path(profile_dir).to_dict() == profile
    # the rest of the session: torch.profiler instead of this nsys, saying why
    mode, why = choose_profiler("auto", cuda_available=True)
    assert mode == "torch" and why.startswith(".qdstrm only") and str(fake) in why


def _qdstrm_result(profile_dir):
    profile_dir.mkdir(parents=True)
    (profile_dir / "rank0.qdstrm").write_bytes(b"QDSTRM")
    return {"status": "ok", "profiler": {"mode": "nsys", "note": "", "error": ".qdstrm only: ..."}}


def test_a_profile_only_launch_that_fails_leaves_the_timings_and_says_so(tmp_path):
    from cellkit import tiny_image_cell

    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.profiling.fallback import profile_with_torch

    result = _qdstrm_result(tmp_path / "profile")
    launched = []

    def run_cell(cell, out_dir, opts):
        launched.append(cell)
        return {"status": "error", "reason": "rank 0 exited with 1", "dir": str(out_dir / "cells" / cell.id)}

    profile_with_torch(result, tiny_image_cell(profile=True), LaunchOptions(), tmp_path / "profile", run_cell)
    assert len(launched) == 1 and "profile" not in result
    assert result["profiler"]["mode"] == "nsys"
    assert result["profiler"]["error"] == (".qdstrm only: ...; the profile-only launch under torch.profiler "
                                           "failed (error: rank 0 exited with 1)")
    assert "this launch's timings stand without a profile" in result["profiler"]["note"]


def test_a_cell_across_nodes_is_not_launched_again(tmp_path):
    from cellkit import tiny_image_cell

    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.launch.multinode import Nodes
    from perfsuite.profiling.fallback import profile_with_torch

    result = _qdstrm_result(tmp_path / "profile")

    def run_cell(*args):
        raise AssertionError("launched")

    profile_with_torch(result, tiny_image_cell(profile=True), LaunchOptions(nodes=Nodes(nnodes=2)),
                       tmp_path / "profile", run_cell)
    assert "--profiler torch" in result["profiler"]["note"] and "profile" not in result
    assert (tmp_path / "profile" / "qdstrm" / "rank0.qdstrm").is_file()


def test_the_profile_only_launch_is_the_warm_up_and_the_window():
    from cellkit import tiny_image_cell

    from perfsuite.profiling.fallback import PROFILE_ONLY_STEPS, profile_only

    cell, options = profile_only(tiny_image_cell(max_steps=0, epochs=4, warmup_steps=5, min_accuracy=0.5),
                                 {"fault": "x"})
    assert (cell.epochs, cell.max_steps, cell.min_accuracy) == (1, 5 + PROFILE_ONLY_STEPS, 0.0)
    assert options == {"fault": "x", "count_steps": "0"}
    assert profile_only(tiny_image_cell(max_steps=6), {})[0].max_steps == 6
