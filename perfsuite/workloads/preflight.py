"""Preflight probe: what a node's devices and links deliver right now.

Runs once per session before the measured cells, so a node with throttled
clocks, a PCIe link trained narrow or NCCL fallen back to sockets is caught
before its numbers are read as a regression. Each rank measures, warm-up
excluded, medians over repetitions:

- matmul FLOP/s on its device: CUDA bf16 and fp32 (TF32 off) 8192 x 8192,
  timed with CUDA events; CPU fp32 1024 x 1024, as many repetitions as fill
  about a second. All ranks multiply at once, as they train at once.
- host-to-device copies (CUDA only): 256 MiB from pinned and from pageable
  memory, one rank at a time, so each GPU's own link is measured.
- all-reduce bus bandwidth over the ranks (NCCL on CUDA, gloo on CPU) at
  several sizes (nccl-tests' definition, via profiling.summary).

Every rank returns the same figures, gathered over the process group: the
slowest rank's matmul and copy, each all-reduce's slowest-rank time.
perfsuite.launch.preflight compares them with the datasheet peaks.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from perfsuite.hardware import cpu_model
from perfsuite.profiling.summary import nccl_bus_bandwidth
from perfsuite.rank.meter import metric

MiB = 2**20
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 1024
CPU_MATMUL_BUDGET_S = 0.8  # ~1 s of multiplying per rank on CPU, warm-up included
CPU_MATMUL_MAX_REPS = 50
GPU_WARMUP_S = 0.5  # clocks ramp and cuBLAS picks its kernels in the first matmuls
MATMULS_PER_SAMPLE = {"bf16": 10, "fp32": 3}  # >= ~10 ms per CUDA-event sample on H100
H2D_BYTES = 256 * MiB
GPU_ALLREDUCE_MIB = (1, 4, 16, 64, 256)
CPU_ALLREDUCE_MIB = (1, 4, 16)
GPU_ALLREDUCE_PER_SAMPLE = 10  # small messages take microseconds: time them in batches
DEFAULT_REPS = {"cuda": 10, "cpu": 5}


def _gather(value: Any, world_size: int) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if world_size == 1:
        return [value]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def _agree_max(count: int, device: torch.device) -> int:
    """The largest of the ranks' counts, so all ranks repeat alike."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    t = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _barrier(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _operands(n: int, dtype: torch.dtype, device: torch.device):
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
    return a, b, torch.empty(n, n, dtype=dtype, device=device)


def matmul_tflops_cuda(device: torch.device, precision: str, warmup: int,
                       reps: int) -> list[float]:
    """TFLOP/s of each timed sample of ``MATMULS_PER_SAMPLE`` matmuls."""
    n, per = GPU_MATMUL_N, MATMULS_PER_SAMPLE[precision]
    a, b, c = _operands(n, torch.bfloat16 if precision == "bf16" else torch.float32, device)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # fp32 on CUDA cores: TF32 off
    try:
        began, done = time.perf_counter(), 0
        while done < warmup or time.perf_counter() - began < GPU_WARMUP_S:
            for _ in range(per):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize(device)
            done += 1
        events = []
        for _ in range(reps):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(per):
                torch.matmul(a, b, out=c)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
    finally:
        torch.set_float32_matmul_precision(before)
    flop = 2.0 * n**3 * per
    return [flop / (s.elapsed_time(e) / 1e3) / 1e12 for s, e in events]


def matmul_tflops_cpu(device: torch.device, warmup: int, reps: int) -> list[float]:
    """TFLOP/s of single fp32 matmuls, repeated to fill about a second."""
    n = CPU_MATMUL_N
    a, b, c = _operands(n, torch.float32, device)
    for _ in range(max(warmup, 1)):
        torch.matmul(a, b, out=c)
    began = time.perf_counter()
    torch.matmul(a, b, out=c)
    one = max(time.perf_counter() - began, 1e-6)
    count = min(max(int(CPU_MATMUL_BUDGET_S / one), reps), CPU_MATMUL_MAX_REPS)
    count = _agree_max(count, device)
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        torch.matmul(a, b, out=c)
        samples.append(2.0 * n**3 / (time.perf_counter() - began) / 1e12)
    return samples


def h2d_gbps(device: torch.device, rank: int, world_size: int, warmup: int,
             reps: int) -> dict[str, list[float]]:
    """GB/s of 256 MiB copies to the device, from pinned and pageable memory.

    Ranks take turns: GPUs that share a PCIe switch would otherwise measure
    their share of it, not their own link.
    """
    dst = torch.empty(H2D_BYTES, dtype=torch.uint8, device=device)
    # Written once, so first-touch page faults are not timed as the link.
    sources = {"pinned": torch.ones(H2D_BYTES, dtype=torch.uint8).pin_memory(),
               "pageable": torch.ones(H2D_BYTES, dtype=torch.uint8)}
    out: dict[str, list[float]] = {}
    for turn in range(world_size):
        if turn == rank:
            for kind, src in sources.items():
                for _ in range(max(warmup, 1)):
                    dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(device)
                events = []
                for _ in range(reps):
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    dst.copy_(src, non_blocking=True)
                    end.record()
                    events.append((start, end))
                torch.cuda.synchronize(device)
                out[kind] = [H2D_BYTES / (s.elapsed_time(e) / 1e3) / 1e9 for s, e in events]
        _barrier(device)
    return out


def allreduce_bandwidth(device: torch.device, sizes_mib: tuple[int, ...], world_size: int,
                        warmup: int, reps: int) -> dict[int, dict[str, list[float]]]:
    """Per message size (bytes): bus and algorithm bandwidth of each sample, GB/s.

    A sample's time is the slowest rank's: an all-reduce is done when every
    rank has its result.
    """
    cuda = device.type == "cuda"
    per = GPU_ALLREDUCE_PER_SAMPLE if cuda else 1
    out: dict[int, dict[str, list[float]]] = {}
    for mib in sizes_mib:
        nbytes = mib * MiB
        x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros stay finite
        for _ in range(max(warmup, 1)):
            dist.all_reduce(x)
        _barrier(device)
        seconds: list[float] = []
        events = []
        for _ in range(reps):
            if cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(per):
                    dist.all_reduce(x)
                end.record()
                events.append((start, end))
            else:
                began = time.perf_counter()
                dist.all_reduce(x)
                seconds.append(time.perf_counter() - began)
        if cuda:
            torch.cuda.synchronize(device)
            seconds = [s.elapsed_time(e) / 1e3 / per for s, e in events]
        slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        bw = [nccl_bus_bandwidth("all_reduce", nbytes, s, world_size)
              for s in slowest.tolist()]
        out[nbytes] = {"busbw": [b.busbw_gbps for b in bw], "algbw": [b.algbw_gbps for b in bw]}
        _barrier(device)
    return out


def nvlink_facts(device: torch.device) -> dict[str, Any] | None:
    """This GPU's active NVLinks and what they reach (NVML); None where unknown.

    The datasheet's NVLink figure is reachable between two GPUs only through
    an NVSwitch or a bridge joining just that pair; this says which it is.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: the comparison is skipped, not guessed
        return None
    try:
        props = torch.cuda.get_device_properties(device)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        kinds = {pynvml.NVML_NVLINK_DEVICE_TYPE_GPU: "gpu",
                 pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch"}
        links, remote, peers = 0, set(), set()
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except pynvml.NVMLError:  # no NVLink on this GPU, or no more links
                break
            links += 1
            kind = kinds.get(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), "other")
            remote.add(kind)
            if kind == "gpu":
                peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                peers.add(pci_key(peer.decode() if isinstance(peer, bytes) else peer))
        return {"pci_bus_id": pci_key(bus_id), "active_links": links,
                "remote": sorted(remote), "peers": sorted(peers)}
    except Exception:  # noqa: BLE001 - facts are evidence, never a precondition
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def pci_key(bus_id: str) -> str:
    """One spelling of a PCI address: NVML and torch differ in case and widths."""
    domain, bus, rest = bus_id.strip().lower().split(":")
    device, function = rest.split(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16)}"


def _device_name(device: torch.device) -> str | None:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def run(cell: Any, ctx: Any) -> dict[str, Any]:
    device = torch.device(ctx.device)
    cuda = device.type == "cuda"
    ctx.init_process_group(timeout_s=cell.timeout_s)
    world, rank = ctx.world_size, ctx.rank
    warmup = max(cell.warmup_steps, 1)
    reps = cell.max_steps or DEFAULT_REPS[device.type]
    metrics: dict[str, Any] = {}
    per_rank: dict[str, list[float]] = {}
    info: dict[str, Any] = {"device_type": device.type, "world_size": world,
                            "warmup": warmup, "reps": reps,
                            "device_names": _gather(_device_name(device), world)}

    def slowest(name: str, unit: str, samples: list[float]) -> None:
        """The metric is the slowest rank's median; every rank's is in info."""
        medians = _gather((statistics.median(samples), samples), world)
        per_rank[name] = [m for m, _ in medians]
        worst = min(range(world), key=lambda r: medians[r][0])
        metrics[name] = metric(medians[worst][0], unit, medians[worst][1])

    _barrier(device)  # all ranks multiply together
    if cuda:
        for precision in ("bf16", "fp32"):
            ctx.report_progress(0, f"matmul-{precision}")
            slowest(f"matmul_tflops_{precision}", "TFLOP/s",
                    matmul_tflops_cuda(device, precision, warmup, reps))
        info["matmul"] = {"n": GPU_MATMUL_N, "precisions": ["bf16", "fp32"], "tf32": False,
                          "per_sample": MATMULS_PER_SAMPLE}
        ctx.report_progress(0, "h2d")
        copies = h2d_gbps(device, rank, world, warmup, reps)
        for kind in ("pinned", "pageable"):
            slowest(f"h2d_gbps_{kind}", "GB/s", copies[kind])
        info["h2d"] = {"bytes": H2D_BYTES, "one_rank_at_a_time": True}
        info["nvlink"] = _gather(nvlink_facts(device), world)
    else:
        ctx.report_progress(0, "matmul-fp32")
        slowest("matmul_tflops_fp32", "TFLOP/s", matmul_tflops_cpu(device, warmup, reps))
        info["matmul"] = {"n": CPU_MATMUL_N, "precisions": ["fp32"], "per_sample": 1,
                          "threads": torch.get_num_threads()}

    if world > 1:
        ctx.report_progress(0, "allreduce")
        sizes = GPU_ALLREDUCE_MIB if cuda else CPU_ALLREDUCE_MIB
        bands = allreduce_bandwidth(device, sizes, world, warmup, reps)
        largest = max(bands)
        metrics["allreduce_busbw_gbps"] = metric(statistics.median(bands[largest]["busbw"]),
                                                 "GB/s", bands[largest]["busbw"])
        info["allreduce"] = {
            "backend": dist.get_backend(), "sizes_bytes": sorted(bands), "largest_bytes": largest,
            "per_sample": GPU_ALLREDUCE_PER_SAMPLE if cuda else 1,
            "busbw_gbps": {str(n): statistics.median(b["busbw"]) for n, b in bands.items()},
            "algbw_gbps": {str(n): statistics.median(b["algbw"]) for n, b in bands.items()}}
    else:
        info["allreduce"] = {"skipped": "one rank: nothing to reduce across"}
    info["per_rank"] = per_rank

    if dist.is_initialized():
        _barrier(device)
        dist.destroy_process_group()
    return {"metrics": metrics, "steps": reps, "info": info}
