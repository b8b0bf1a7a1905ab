"""The counting window on CUDA, simulated on the CPU: tensors that say they
live on "cuda", and torch.cuda / torch.profiler answering as on a GPU, with
the window's own synchronisations recorded as a real profiler records them."""

import types

import pytest
import torch
from torch.autograd import DeviceType
from torch.utils._pytree import tree_map

from perfsuite.rank import counting

CUDA = torch.device("cuda", 0)


class OnCuda(torch.Tensor):
    """A CPU tensor that every dispatch mode sees on device "cuda": each
    operator runs on the wrapped CPU tensors and its results are wrapped."""

    @staticmethod
    def __new__(cls, inner):
        out = torch.Tensor._make_wrapper_subclass(cls, inner.size(), dtype=inner.dtype, device=CUDA)
        out.inner = inner
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.inner if isinstance(x, OnCuda) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: OnCuda(x) if isinstance(x, torch.Tensor) else x, out)


def event(name, start=0.0, end=0.0, device=False, stream=7, activity=None, annotation=False):
    """One of torch.profiler's events (FunctionEvent's fields that are read); times in us."""
    return types.SimpleNamespace(
        name=name, key=name, count=1, time_range=types.SimpleNamespace(start=start, end=end),
        device_type=DeviceType.CUDA if device else DeviceType.CPU, device_resource_id=stream,
        activity_type=activity, is_user_annotation=annotation)


class FakeCuda:
    """torch.cuda and torch.profiler as on a GPU. A profile records the runtime
    calls made while it runs, the window's own included, and synchronises the
    device when it stops, as torch.profiler's does (a cudaDeviceSynchronize)."""

    def __init__(self, monkeypatch):
        self.recording: list | None = None
        self.sessions = 0
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.api("cudaDeviceSynchronize"))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 4096)
        monkeypatch.setattr("torch.profiler.profile", self.profile)

    def api(self, name):
        if self.recording is not None:
            self.recording.append(event(name))

    def gpu(self, name, start, end, stream=7, activity=None, runtime="cudaLaunchKernel"):
        """What the step launches: its runtime call and what the GPU ran."""
        self.api(runtime)
        if self.recording is not None:
            self.recording.append(event(name, start, end, device=True, stream=stream, activity=activity))

    def profile(self, activities=None, **kwargs):
        cuda = self

        class Profile:
            def __init__(self):
                self.recorded = []

            def start(self):
                cuda.sessions += 1
                cuda.recording = self.recorded

            def stop(self):
                torch.cuda.synchronize()  # torch.profiler's own, while it still records
                cuda.recording = None

            def __enter__(self):
                self.start()
                return self

            def __exit__(self, *exc):
                self.stop()
                return False

            def events(self):
                return list(self.recorded)

            def key_averages(self):
                counts = {}
                for e in self.recorded:
                    counts[e.key] = counts.get(e.key, 0) + 1
                return [types.SimpleNamespace(key=k, count=n) for k, n in counts.items()]

        return Profile()


@pytest.fixture
def cuda(monkeypatch):
    monkeypatch.setattr(counting, "_OWN_CALLS", {})  # measured again under this simulation
    return FakeCuda(monkeypatch)


def test_a_step_with_one_loss_item_counts_one_device_to_host_read(cuda):
    """The optimizer reads its CPU step counters (AdamW's bias corrections
    without capturable or fused): host scalars, no device read; the loss's
    ``.item()`` is one read from the device, 4 bytes."""
    weight, inputs = OnCuda(torch.randn(4, 3)), OnCuda(torch.randn(2, 4))
    weight.grad = OnCuda(torch.randn(4, 3))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)

    def step():
        loss = (inputs @ weight).pow(2).mean()
        optimizer.step()
        return loss.item()

    step()  # AdamW's state is made on the first step
    assert optimizer.state[weight]["step"].device.type == "cpu"
    per_step = counting.count_window(step, CUDA, steps=2)["per_step"]
    assert per_step["copies/d2h_calls"] == 1 and per_step["copies/d2h_bytes"] == 4
    assert per_step["ops/aten::_local_scalar_dense"] == 2  # the loss's and the step counter's


def test_reads_of_host_scalars_are_not_device_reads():
    counter = counting.WorkCounter()
    with counter:
        torch.tensor(3.0).item()
        OnCuda(torch.tensor([1.0, 2.0], dtype=torch.float64)).sum().item()
    assert counter.counts["ops/aten::_local_scalar_dense"] == 2
    assert counter.counts["copies/d2h_calls"] == 1 and counter.counts["copies/d2h_bytes"] == 8


def test_the_window_counts_the_steps_runtime_calls_not_its_own(cuda):
    """The window synchronises before and after the step and torch.profiler
    synchronises when it stops: none of that is the step's. What the step
    itself calls, a synchronize included, is counted exactly."""
    def step():
        cuda.gpu("sgemm", 0.0, 10.0)
        cuda.gpu("Memcpy HtoD (Pageable -> Device)", 10.0, 12.0, runtime="cudaMemcpyAsync")
        cuda.api("cudaStreamSynchronize")
        torch.cuda.synchronize()

    per_step = counting.count_window(step, CUDA, steps=2)["per_step"]
    assert per_step["cuda/kernel_launches"] == 1 and per_step["cuda/memcpy_calls"] == 1
    assert per_step["cuda/syncs/cudaStreamSynchronize"] == 1
    assert per_step["cuda/syncs/cudaDeviceSynchronize"] == 1  # the step's, not the window's
    assert per_step["memory/peak_allocated"] == 4096
    empty = counting.count_window(lambda: None, CUDA, steps=1)["per_step"]
    assert all(v == 0 for k, v in empty.items() if k.startswith("cuda/")), empty


def test_memcpy_calls_are_split_by_direction_from_the_gpu_side_copies():
    events = [event("cudaMemcpyAsync")] * 5 + [
        event("Memcpy HtoD (Pageable -> Device)", 0, 1, device=True, activity="gpu_memcpy"),
        event("Memcpy HtoD (Pinned -> Device)", 1, 2, device=True, activity="gpu_memcpy"),
        event("Memcpy DtoH (Device -> Pageable)", 2, 3, device=True),
        event("Memcpy DtoD (Device -> Device)", 3, 4, device=True),
        event("Memcpy PtoP (Device -> Device)", 4, 5, device=True)]
    counts, _ = counting.cuda_facts(events)
    assert counts["cuda/memcpy_calls"] == 5
    assert (counts["cuda/memcpy_h2d_calls"], counts["cuda/memcpy_d2h_calls"],
            counts["cuda/memcpy_d2d_calls"]) == (2, 1, 2)


def test_device_time_is_the_union_of_what_the_gpu_ran():
    """Two streams overlap: their common time counts once. A record_function
    range's copy on the GPU timeline is no GPU work."""
    events = [
        event("sgemm", 0, 100, device=True, stream=7, activity="kernel"),
        event("nccl:all_reduce", 50, 150, device=True, stream=20, activity="kernel"),
        event("Memcpy HtoD (Pageable -> Device)", 200, 210, device=True, activity="gpu_memcpy"),
        event("Memcpy DtoH (Device -> Pageable)", 205, 220, device=True, stream=9),
        event("Memcpy DtoD (Device -> Device)", 300, 304, device=True),
        event("Memset (Device)", 400, 401, device=True, activity="gpu_memset"),
        event("forward", 0, 1000, device=True, activity="gpu_user_annotation", annotation=True),
        event("cudaLaunchKernel", 0, 1000)]
    _, seconds = counting.cuda_facts(events)
    assert seconds == pytest.approx({"per_step_s": (150 + 20 + 4 + 1) * 1e-6, "kernels_s": 150e-6,
                                     "memcpy_h2d_s": 10e-6, "memcpy_d2h_s": 15e-6,
                                     "memcpy_d2d_s": 4e-6, "memset_s": 1e-6})


def test_the_window_reports_device_time_per_step_and_none_on_the_cpu(cuda):
    spans = iter([(0.0, 30.0), (0.0, 50.0)])

    def step():
        start, end = next(spans)
        cuda.gpu("conv", start, end, stream=7)
        cuda.gpu("nccl:all_reduce", start + 10, end + 10, stream=20)  # overlaps the conv

    window = counting.count_window(step, CUDA, steps=2)
    assert window["device_time"]["per_step_s"] == pytest.approx((40 + 60) / 2 * 1e-6)
    assert window["device_time"]["memcpy_h2d_s"] == 0
    assert "ops/aten::add" not in window["per_step"]
    assert not any(k.startswith("device_time") for k in window["per_step"])
    assert window["unstable"] == []  # times move between steps; they are not counts
    assert counting.count_window(lambda: torch.ones(1) + 1, torch.device("cpu"))["device_time"] is None


def test_a_loop_that_is_not_ours_gets_the_same_cuda_facts(cuda):
    """torchtune's loop on CUDA: one profile spans the window; its runtime calls
    less the window's own, and its GPU time, are divided over its steps."""
    weight = torch.randn(3, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    launched = iter(range(100))

    def step():
        at = 100.0 * next(launched)
        cuda.gpu("kernel", at, at + 20)
        (weight * 2).sum().backward()
        optimizer.step()

    with counting.OptimizerStepWindow(start=2, steps=2, device=CUDA) as window:
        for _ in range(6):
            step()
    counted = window.result()
    assert counted["per_step"]["cuda/kernel_launches"] == 1
    assert counted["per_step"]["cuda/syncs/cudaDeviceSynchronize"] == 0
    assert counted["device_time"]["per_step_s"] == pytest.approx(20e-6)


def test_torch_profilers_own_events_carry_what_is_read():
    """The fields read above, on the events of a real (CPU) profile: its
    operators and a record_function range are no runtime calls, no GPU work."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            torch.ones(4) @ torch.ones(4)
    events = list(prof.events())
    assert any(e.name == "forward" and e.is_user_annotation for e in events)
    assert all(e.time_range.end >= e.time_range.start for e in events)
    counts, seconds = counting.cuda_facts(events)
    assert set(counts.values()) == {0} and set(seconds.values()) == {0.0}
