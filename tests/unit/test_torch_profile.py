"""torch.profiler wrapper and its conversion to the shared summary schema."""

import json
import os
import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from perfsuite.profiling.nsys_csv import summarize_path
from perfsuite.profiling.summary import H2D, ProfileSummary, merge_rank_summaries
from perfsuite.profiling.torch_profile import (
    PROFILE_DIR_ENV,
    PROFILER_ENV,
    StepProfiler,
    classify_event,
    h2d_bytes_from_chrome_trace,
    read_summary,
    summary_from_key_averages,
    write_summary,
)

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


@pytest.mark.parametrize("key, on_device, annotation, expected", [
    ("Memcpy HtoD (Pinned -> Device)", True, False, ("memcpy", H2D)),
    ("Memcpy DtoH (Device -> Pageable)", True, False, ("memcpy", "CUDA memcpy Device-to-Host")),
    ("Memset (Device)", True, False, ("memset", "CUDA memset")),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True, False,
     ("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")),
    ("forward", True, True, None),
    ("cudaLaunchKernel", False, False, ("cuda_api", "cudaLaunchKernel")),
    ("cuLaunchKernel", False, False, ("cuda_api", "cuLaunchKernel")),
    ("gloo:all_reduce", False, True, ("collective", "gloo:all_reduce")),
    ("c10d::allreduce_", False, False, ("collective", "c10d::allreduce_")),
    ("forward", False, True, ("nvtx", "forward")),
    ("ProfilerStep*", False, True, ("nvtx", "step")),
    ("aten::addmm", False, False, ("cpu_op", "aten::addmm")),
    ("cudnn_convolution", False, False, ("cpu_op", "cudnn_convolution")),
])
def test_classify_event(key, on_device, annotation, expected):
    assert classify_event(key, on_device, annotation) == expected


def _avg(key, device_type=CPU, count=1, cpu=0.0, self_cpu=0.0, device=0.0, annotation=False):
    return SimpleNamespace(key=key, device_type=device_type, count=count, cpu_time_total=cpu,
                           self_cpu_time_total=self_cpu, self_device_time_total=device,
                           device_time_total=device, is_user_annotation=annotation)


def test_cuda_key_averages_map_to_paper_metric_names():
    """Rows as torch.profiler reports them on a GPU (times in microseconds)."""
    averages = [
        _avg("cudaLaunchKernel", count=900, cpu=4_500.0, self_cpu=4_500.0),
        _avg("cudaStreamSynchronize", count=10, cpu=20_000.0, self_cpu=20_000.0),
        _avg("cudaMemcpyAsync", count=20, cpu=3_000.0, self_cpu=3_000.0),
        _avg("Memcpy HtoD (Pageable -> Device)", CUDA, count=10, device=1_000.0),
        _avg("Memcpy HtoD (Pinned -> Device)", CUDA, count=10, device=500.0),
        _avg("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", CUDA, count=4, device=800.0),
        _avg("void at::native::vectorized_elementwise_kernel<4, float>", CUDA, count=100, device=1_200.0),
        _avg("forward", CPU, count=2, cpu=9_000.0, self_cpu=100.0, annotation=True),
        _avg("forward", CUDA, count=2, device=7_000.0, annotation=True),
        _avg("aten::add", count=50, cpu=800.0, self_cpu=600.0),
    ]
    s = summary_from_key_averages(averages, rank=1, steps=2, window_s=0.05, h2d_bytes=3e6)
    assert s.rank == 1 and s.steps == 2 and s.source == "torch"
    h2d = s.find(H2D, "memcpy")  # pageable and pinned copies are one row, as in nsys
    assert h2d.total_s == pytest.approx(1.5e-3) and h2d.calls == 20 and h2d.bytes == 3e6
    assert s.h2d_bandwidth_gbps() == pytest.approx(2.0)
    metrics = s.paper_metrics()
    assert metrics["cudaLaunchKernel"]["total_s"] == pytest.approx(4.5e-3)
    assert metrics["ncclDevKernel_AllGather"]["total_s"] == pytest.approx(0.8e-3)
    assert not metrics["cudaEventDestroy"]["present"]
    assert s.find("forward", "nvtx").total_s == pytest.approx(9e-3)  # the CPU range, not its GPU copy
    assert s.find("aten::add").total_s == pytest.approx(6e-4)  # self time
    assert s.kernel_time_by_family() == pytest.approx({"compute": 1.2e-3, "nccl": 0.8e-3, "memcpy": 1.5e-3})


def test_h2d_bytes_from_chrome_trace(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "args": {"bytes": 1024}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "args": {"bytes": 976}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "args": {"bytes": 5}},
        {"ph": "X", "cat": "kernel", "name": "k", "args": {}},
    ]}))
    assert h2d_bytes_from_chrome_trace(trace) == 2000.0
    trace.write_text(json.dumps({"traceEvents": []}))
    assert h2d_bytes_from_chrome_trace(trace) is None


def _train(prof, steps, model, opt):
    for _ in range(steps):
        with prof.phase("data"):
            x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        with prof.phase("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with prof.phase("backward"):
            loss.backward()
        with prof.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        prof.step()


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_real_cpu_training_run_is_summarised(tmp_path):
    model, opt = _tiny()
    trace = tmp_path / "rank0.trace.json"
    with StepProfiler("torch", wait=1, warmup=1, active=3, rank=0, trace_path=trace, cuda=False) as prof:
        _train(prof, 7, model, opt)  # steps after the window are not recorded
    s = prof.summary()
    assert s is not None and s.source == "torch" and s.steps == 3 and s.rank == 0
    assert 0 < s.window_s < 30
    for phase in ("data", "forward", "backward", "optimizer"):
        row = s.find(phase, "nvtx")
        assert row is not None and row.calls == 3 and row.total_s > 0, phase
    assert s.find("step", "nvtx").calls == 3
    assert s.find("aten::addmm", "cpu_op").calls == 6  # two linear layers x 3 steps
    assert s.find("forward").total_s <= s.find("step").total_s
    assert s.meta["device"] == "cpu" and s.meta["trace"] == str(trace)
    assert "traceEvents" in json.loads(trace.read_text())
    back = read_summary(write_summary(s, tmp_path / "summary.json"))
    assert back.to_dict() == s.to_dict()


def test_window_cut_short_and_modes_that_record_nothing(monkeypatch):
    model, opt = _tiny()
    with StepProfiler("torch", wait=0, warmup=1, active=5, cuda=False) as prof:
        _train(prof, 3, model, opt)
    assert prof.summary().steps == 2 and prof.summary().find("forward").calls == 2
    for mode in ("off", "nsys"):  # nsys mode on CPU: no cudaProfilerStart, no summary, no error
        with StepProfiler(mode, wait=1, warmup=0, active=1, cuda=False) as prof:
            _train(prof, 2, model, opt)
        assert prof.summary() is None and prof.captured_steps == 1
    with pytest.raises(ValueError):
        StepProfiler("perf")
    monkeypatch.setenv(PROFILER_ENV, "torch")
    monkeypatch.setenv(PROFILE_DIR_ENV, "/tmp/perfsuite-prof")
    from_env = StepProfiler.from_env(rank=3, active=2)
    assert from_env.mode == "torch" and str(from_env.trace_path).endswith("rank3.trace.json.gz")
    monkeypatch.delenv(PROFILER_ENV)
    assert StepProfiler.from_env(rank=0).mode == "off"


def _rows(summary):
    return {row.key: (row.calls, row.total_s) for row in summary.rows}


def test_the_summary_read_from_the_trace_is_key_averages_own(tmp_path):
    """Both from one real CPU capture: the same rows, calls and times."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from perfsuite.profiling.trace_summary import summary_from_chrome_trace

    model, _ = _tiny()
    opt = torch.optim.AdamW(model.parameters())
    prof = StepProfiler("torch", cuda=False)  # only for its phase labels
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3)) as torch_prof:
        for _ in range(5):
            _train(prof, 1, model, opt)
            torch_prof.step()
    torch_prof.export_chrome_trace(str(tmp_path / "t.json"))
    from_trace = summary_from_chrome_trace(tmp_path / "t.json")
    from_averages = summary_from_key_averages(torch_prof.key_averages())
    assert from_trace.find("aten::addmm", "cpu_op").calls == 6 and from_trace.find("step", "nvtx").calls == 3
    expected = _rows(from_averages)
    assert set(_rows(from_trace)) == set(expected)
    for key, (calls, seconds) in _rows(from_trace).items():
        assert calls == expected[key][0] and seconds == pytest.approx(expected[key][1], abs=1e-9), key


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_cuda_trace_in_kinetos_categories():
    """Event categories and fields as Kineto writes them on a GPU (times in µs)."""
    from perfsuite.profiling.trace_summary import summary_from_trace_events

    events = [
        _x("user_annotation", "ProfilerStep#4", 0.0, 1000.0),
        _x("user_annotation", "forward", 10.0, 500.0),
        _x("cpu_op", "aten::linear", 20.0, 100.0),
        _x("cpu_op", "aten::addmm", 30.0, 60.0),
        _x("cpu_op", "aten::addmm", 31.0, 50.0),  # an only child of its own name folds into it
        _x("cuda_runtime", "cudaLaunchKernel", 40.0, 8.0),
        _x("cpu_op", "aten::copy_", 200.0, 50.0),
        _x("cuda_runtime", "cudaMemcpyAsync", 210.0, 30.0),
        _x("cpu_op", "profiler::_record_function_exit", 300.0, 1.0),  # key_averages leaves it out
        _x("kernel", "ampere_sgemm_128x64_tn", 45.0, 70.0, tid=7),
        _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 215.0, 20.0, tid=7, bytes=4096),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 400.0, 5.0, tid=7, bytes=1024),
        _x("gpu_memset", "Memset (Device)", 420.0, 1.0, tid=7),
        _x("gpu_user_annotation", "forward", 45.0, 300.0, tid=7),  # the GPU copy of a CPU range
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "pid": 7, "tid": 1, "ts": 40.0, "id": 1},
        _x("Trace", "PyTorch Profiler (0)", 0.0, 2000.0, tid="PyTorch Profiler"),
    ]
    s = summary_from_trace_events(events, rank=0, steps=1)
    assert s.find("step", "nvtx").calls == 1 and s.find("forward", "nvtx").total_s == pytest.approx(500e-6)
    assert s.find("aten::linear", "cpu_op").total_s == pytest.approx(40e-6)  # 100 less its child's 60
    addmm = s.find("aten::addmm", "cpu_op")
    assert addmm.calls == 1 and addmm.total_s == pytest.approx(52e-6)  # 60 less the launch's 8
    assert s.find("cudaLaunchKernel", "cuda_api").total_s == pytest.approx(8e-6)
    assert s.find("aten::copy_", "cpu_op").total_s == pytest.approx(20e-6)
    assert s.find("profiler::_record_function_exit") is None
    assert s.find("ampere_sgemm_128x64_tn", "kernel").total_s == pytest.approx(70e-6)
    h2d = s.find(H2D, "memcpy")
    assert h2d.calls == 2 and h2d.total_s == pytest.approx(25e-6) and h2d.bytes == 5120
    assert s.find("CUDA memset", "memset").calls == 1
    assert s.category_rows("nvtx") and all(r.name != "forward" or r.calls == 1 for r in s.category_rows("nvtx"))


def test_the_export_reads_the_trace_not_key_averages_and_keeps_it_gzipped(tmp_path, monkeypatch):
    """key_averages() walks every event in Python (6 of the 7 s after a smoke LLM
    cell's last step): the export must not call it."""
    import gzip

    from torch.profiler import profile

    def refused(self, *args, **kwargs):
        raise AssertionError("key_averages() called")

    monkeypatch.setattr(profile, "key_averages", refused)
    model, opt = _tiny()
    trace = tmp_path / "rank0.trace.json.gz"
    with StepProfiler("torch", wait=1, warmup=1, active=2, rank=0, trace_path=trace, cuda=False) as prof:
        _train(prof, 5, model, opt)
    s = prof.summary()
    assert s.steps == 2 and s.find("aten::addmm", "cpu_op").calls == 4
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert s.meta["trace"] == str(trace) and s.meta["trace_bytes"] == trace.stat().st_size
    assert s.meta["trace_events"] > 0 and s.meta["export_s"] >= s.meta["summary_s"]
    assert [p.name for p in tmp_path.iterdir()] == [trace.name]  # no plain copy or partial file left
    read_back = summarize_path(trace)  # `perfsuite profile rank0.trace.json.gz`
    assert read_back.rank == 0 and _rows(read_back) == _rows(s)


def _ddp_rank(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        model, _ = _tiny()
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with StepProfiler("torch", wait=1, warmup=1, active=2, rank=rank, cuda=False) as prof:
            for _ in range(4):
                with prof.phase("forward"):
                    loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 32)), torch.randint(0, 4, (8,)))
                with prof.phase("backward"):
                    loss.backward()  # DDP all-reduces gradients here
                with prof.phase("comm"):
                    dist.all_reduce(torch.ones(4))
                with prof.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                prof.step()
        write_summary(prof.summary(), os.path.join(out_dir, f"rank{rank}.json"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_real_two_rank_gloo_run_has_collectives(tmp_path):
    mp.spawn(_ddp_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    parts = [read_summary(tmp_path / f"rank{r}.json") for r in (0, 1)]
    merged = merge_rank_summaries(parts)
    assert summarize_path(tmp_path).to_dict() == merged.to_dict()  # what `perfsuite profile DIR` reads
    assert [p.rank for p in merged.ranks] == [0, 1] and merged.steps == 2
    collectives = {r.name for r in merged.category_rows("collective")}
    assert "gloo:all_reduce" in collectives, collectives
    for part in parts:
        # per step: one DDP gradient bucket + one explicit all_reduce
        assert part.find("gloo:all_reduce", "collective").calls == 4
        assert part.find("comm", "nvtx").calls == 2
    assert merged.find("backward", "nvtx").calls == 4
    assert isinstance(ProfileSummary.from_dict(merged.to_dict()), ProfileSummary)
