"""The preflight probe: its cell, and what its figures say about the node.

A session runs the probe (``perfsuite.workloads.preflight``) once before its
measured cells. ``assess`` compares the probe's figures with the datasheet
peaks of the node's GPU (``perfsuite.rank.peaks``): a node that multiplies, copies
or all-reduces at less than a set fraction of its datasheet figures is not
trusted, and regression verdicts measured on it should not be believed.

The host link is the node's, not the GPU's: an H100 PCIe in a Gen4 server
copies at Gen4 speed. Host-to-device copies and all-reduces without NVLink
are compared with the PCIe link NVML reports for the session's GPUs (its
generation and width, in the fingerprint: ``pcie_gen``, ``pcie_width``),
and an all-reduce without NVLink or peer-to-peer access is expected at half
of it (staged through host memory). NVLink figures come from the datasheet,
and only where NVLink is up.

Where there is nothing to compare with (a CPU, a GPU the table does not
hold, a topology whose bandwidth the datasheet does not give, a PCIe link
NVML did not report) the figures are kept and the comparison is reported
as not made: never as passed.
"""

from __future__ import annotations

import math
from typing import Any

from perfsuite.cells import Cell
from perfsuite.hardware import pcie_gbps
from perfsuite.rank import peaks

WORKLOAD = "probe"
STRATEGY = "preflight"
SOURCE = ("preflight probe: matmul FLOP/s, host-to-device and all-reduce bandwidth "
          "against datasheet peaks (perfsuite/data/peaks.toml)")
FIGURES = {  # metric -> unit, in the order they are reported
    "matmul_tflops_bf16": "TFLOP/s",
    "matmul_tflops_fp32": "TFLOP/s",
    "h2d_gbps_pinned": "GB/s",
    "h2d_gbps_pageable": "GB/s",
    "allreduce_busbw_gbps": "GB/s",
}
OK, LOW, INVALID, NOT_COMPARED = "ok", "low", "invalid", "not compared"


def probe_cell(device: str, world_size: int, *, tier: str | None = None) -> Cell:
    """The probe on ``world_size`` ranks of ``device`` ("cpu" | "cuda").

    warmup_steps are untimed repetitions; max_steps 0 lets the workload pick
    its repetitions (5 on CPU, 10 on CUDA).
    """
    cuda = device == "cuda"
    return Cell(tier=tier or ("gate" if cuda else "smoke"), workload=WORKLOAD,
                strategy=STRATEGY, device=device, world_size=world_size,
                precision="bf16" if cuda else "fp32", pin_memory=cuda, dataset="synthetic",
                batch_size=1, warmup_steps=3 if cuda else 2, max_steps=0,
                timeout_s=300 if cuda else 120, sources=(SOURCE,))


def nvlink_topology(facts: list[dict[str, Any] | None] | None) -> str | None:
    """How NVLink joins the probe's ranks, from each rank's NVML facts.

    "switch": every GPU's links go to NVSwitches; "direct": GPU-to-GPU links
    join every pair of ranks; "none": no active NVLink (PCIe only);
    "partial": anything else; None: some rank could not tell.
    """
    if not facts or any(f is None for f in facts):
        return None
    if all(f["active_links"] == 0 for f in facts):
        return "none"
    if all(f["active_links"] > 0 and f["remote"] == ["switch"] for f in facts):
        return "switch"
    buses = [f["pci_bus_id"] for f in facts]
    if all(f["active_links"] > 0 and f["remote"] == ["gpu"]
           and all(b in f["peers"] for b in buses if b != f["pci_bus_id"]) for f in facts):
        return "direct"
    return "partial"


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def host_link(env: dict[str, Any]) -> tuple[float | None, str]:
    """(GB/s one direction, what it is) of the GPUs' PCIe link as NVML reports it
    in the fingerprint: the generation and width the GPUs and this system train
    to, the narrowest of the session's GPUs; (None, why not) without them."""
    gen, width = env.get("pcie_gen"), env.get("pcie_width")
    gbps = pcie_gbps(gen, width)
    if gbps is None:
        return None, "PCIe link not reported by NVML (no pcie_gen/pcie_width in the fingerprint)"
    return gbps, f"PCIe Gen{gen} x{width} {gbps:.4g} GB/s one direction (NVML)"


def _allreduce_reference(row: peaks.GpuPeaks, info: dict[str, Any], env: dict[str, Any],
                         world: int) -> tuple[float | None, str, str]:
    """(expected GB/s, threshold key, what it is) or (None, "", why not)."""
    if world < 2:
        return None, "", "one rank: no all-reduce across ranks"
    topology = nvlink_topology(info.get("nvlink"))
    if topology == "switch" and row.nvlink_gbps:
        return row.nvlink_gbps, "allreduce_nvlink", \
            f"NVLink {row.nvlink_gbps:g} GB/s one direction, through NVSwitch"
    if topology == "direct" and world == 2 and row.nvlink_scope == "pair" and row.nvlink_gbps:
        return row.nvlink_gbps, "allreduce_nvlink", \
            f"NVLink {row.nvlink_gbps:g} GB/s one direction, 2-GPU bridge"
    if topology == "none" or (topology is None and env.get("interconnect") == "pcie"):
        link, what = host_link(env)
        if link is None:
            return None, "", f"no NVLink, and {what}"
        if env.get("gpu_p2p") is True:  # GPU to GPU through the PCIe switches
            return link, "allreduce_pcie", f"{what}, no NVLink, peer-to-peer"
        # No peer access (or NVML could not tell): NCCL stages every transfer
        # through host memory, out over one GPU's link and in over the next's.
        return link / 2, "allreduce_pcie", \
            (f"half of {what}: no NVLink, and peer-to-peer "
             f"{'off' if env.get('gpu_p2p') is False else 'not known'} (staged through host "
             "memory)")
    if topology is None:
        return None, "", "NVLink topology unknown (no NVML facts from every rank)"
    return None, "", (f"NVLink topology {topology!r} with {row.model} "
                      f"(datasheet scope {row.nvlink_scope!r}): per-pair bandwidth is not "
                      "on the datasheet")


def _expectations(row: peaks.GpuPeaks, info: dict[str, Any], env: dict[str, Any],
                  world: int) -> dict[str, tuple[float | None, str, str]]:
    def tflops(precision: str) -> float | None:
        flops = row.flops(precision)
        return None if flops is None else flops / 1e12

    bf16, fp32 = tflops("bf16"), tflops("fp32")
    link, link_what = host_link(env)
    return {
        "matmul_tflops_bf16": (bf16, "matmul", f"dense bf16 tensor peak {bf16:g} TFLOP/s"
                               if bf16 else "no bf16 figure on the datasheet"),
        "matmul_tflops_fp32": (fp32, "matmul", f"fp32 (non-tensor, TF32 off) peak {fp32:g} "
                               "TFLOP/s" if fp32 else "no fp32 figure on the datasheet"),
        "h2d_gbps_pinned": (link, "h2d_pinned", link_what),
        "h2d_gbps_pageable": (None, "", ("pageable copies are bounded by host memory copies "
                                         "into staging buffers, not by the link")),
        "allreduce_busbw_gbps": _allreduce_reference(row, info, env, world),
    }


def assess(probe_result: dict[str, Any], env: dict[str, Any], *,
           min_fraction: float | None = None) -> dict[str, Any]:
    """Whether the node's figures are near its datasheet's.

    ``probe_result``: the probe cell's result (status, metrics, info, params);
    ``env``: the node's fingerprint (perfsuite.hardware). ``min_fraction``
    replaces every threshold of peaks.toml when given. Returns
    ``{"trusted", "flags", "notes", "figures", "reference"}``: flags name the
    figure, measured, expected and fraction; figures hold every figure with
    its verdict (ok | low | invalid | not compared).
    """
    out: dict[str, Any] = {"trusted": True, "flags": [], "notes": [], "figures": {},
                           "reference": None}
    status = probe_result.get("status", "ok")
    if status != "ok":  # nothing measured is not a node found healthy
        out["trusted"] = False
        out["flags"].append(f"probe {status}: {probe_result.get('reason') or 'no reason given'}"
                            "; the node's figures were not measured")
        return out
    metrics = probe_result.get("metrics") or {}
    info = probe_result.get("info") or {}
    params = probe_result.get("params") or {}
    device = params.get("device") or info.get("device_type") or \
        ("cuda" if env.get("gpu_count") else "cpu")
    world = int(params.get("world_size") or info.get("world_size") or 1)

    figures = out["figures"]
    for name, unit in FIGURES.items():
        if name not in metrics:
            continue
        value = metrics[name].get("value")
        figures[name] = {"measured": value, "unit": metrics[name].get("unit", unit),
                         "expected": None, "min_fraction": None, "fraction": None,
                         "verdict": NOT_COMPARED, "against": None}
        if not _finite_positive(value):  # a broken measurement is never a pass
            figures[name]["verdict"] = INVALID
            out["flags"].append(f"{name}: measured {value!r}, not a positive finite number")

    names = [n for n in (info.get("device_names") or []) if n]
    if device != "cuda":
        what = names[0] if names else (env.get("cpu_model") or "this CPU")
        return _uncompared(out, f"no reference figures for {what}: probe ran, nothing to compare")
    if len(set(names)) > 1:
        return _uncompared(out, f"ranks run different GPUs {sorted(set(names))}: "
                                "no one reference, nothing compared")
    gpu_name = names[0] if names else env.get("gpu_name")
    row = peaks.lookup(gpu_name)
    if row is None:
        return _uncompared(out, f"no reference figures for {gpu_name or 'an unnamed GPU'}: "
                                "probe ran, nothing to compare")

    out["reference"] = row.describe()
    limits = peaks.thresholds()
    for name, (expected, key, against) in _expectations(row, info, env, world).items():
        figure = figures.get(name)
        if figure is None or figure["verdict"] == INVALID:
            continue
        figure["against"] = against
        if expected is None or key not in limits and min_fraction is None:
            out["notes"].append(f"{name}: not compared: {against}")
            continue
        threshold = min_fraction if min_fraction is not None else limits[key]
        fraction = figure["measured"] / expected
        figure.update(expected=expected, min_fraction=threshold, fraction=fraction,
                      verdict=OK if fraction >= threshold else LOW)
        if fraction < threshold:
            out["flags"].append(
                f"{name}: measured {figure['measured']:.4g} {figure['unit']}, expected >= "
                f"{threshold * expected:.4g} {figure['unit']} ({threshold:g} x {against} of "
                f"{row.model}); fraction {fraction:.2f}")
    out["trusted"] = not out["flags"]
    return out


def _uncompared(out: dict[str, Any], note: str) -> dict[str, Any]:
    out["notes"].append(note)
    out["trusted"] = not out["flags"]  # only an invalid figure can fail an uncompared probe
    return out
