"""Hardware and software fingerprint recorded with every number.

Read with the field's tools: torch for CUDA/NCCL versions, NVML (nvidia-ml-py)
for the driver, GPU memory and NVLink state, /proc/cpuinfo for the CPU.
Everything degrades to ``None`` rather than failing: a fingerprint is
evidence, not a precondition.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_isa() -> str | None:
    """The vector instructions torch's CPU kernels dispatch to ("avx2",
    "avx512", ...), "+bf16" where the CPU has bf16 dot products. Cloud VMs
    often name their CPU just "AMD EPYC": on such a VM the same cells ran
    5x apart in bf16 between an AVX2 host and an AVX-512 one."""
    try:
        import torch

        isa = torch.backends.cpu.get_cpu_capability().lower()
    except (ImportError, AttributeError, RuntimeError):
        return None
    try:
        flags = next((line.split(":", 1)[1].split() for line in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    return isa + ("+bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "")


def _nvml_facts() -> dict[str, Any]:
    """Driver, per-GPU memory and NVLink state through NVML, when present."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: the normal case on CPU machines
        return {}
    try:
        facts: dict[str, Any] = {"driver": pynvml.nvmlSystemGetDriverVersion()}
        count = pynvml.nvmlDeviceGetCount()
        facts["gpu_count"] = count
        if count:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            facts["gpu_name"] = pynvml.nvmlDeviceGetName(handle)
            facts["gpu_memory_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            facts["interconnect"] = "pcie"
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        facts["interconnect"] = "nvlink"
                        break
                except pynvml.NVMLError:
                    break
        return facts
    finally:
        pynvml.nvmlShutdown()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


@lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """The machine and software stack, as plain JSON-safe values."""
    import torch

    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "torchtune": _version("torchtune"),
        "torchao": _version("torchao"),
        "perfsuite": _version("perfsuite"),
        "commit": _git_commit(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "driver": None,
        "gpu_name": None,
        "gpu_count": 0,
        "gpu_memory_bytes": None,
        "interconnect": None,
    }
    if torch.cuda.is_available():
        env["gpu_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        env["gpu_name"] = props.name
        env["gpu_memory_bytes"] = int(props.total_memory)
        env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
        env.update({k: v for k, v in _nvml_facts().items() if v is not None})
    return env


def _slug(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|nvidia|corporation|processor|\bcpu\b|@.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def profile_id(env: dict[str, Any]) -> str:
    """Name of the hardware profile whose absolute numbers are comparable.

    GPU machines: model, memory, count and interconnect. CPU machines: model,
    the instruction set torch's kernels use, and core count. Software
    versions are deliberately not part of it: a new torch on the same
    machine is exactly what a baseline should judge.
    """
    if env.get("gpu_count"):
        memory_gb = round((env.get("gpu_memory_bytes") or 0) / 2**30)
        link = env.get("interconnect") or "unknown-link"
        return f"{_slug(env.get('gpu_name') or 'gpu')}-{memory_gb}gb-x{env['gpu_count']}-{link}"
    isa = f"-{_slug(env['cpu_isa'])}" if env.get("cpu_isa") else ""
    return f"cpu-{_slug(env.get('cpu_model') or 'unknown')}{isa}-{env.get('cpu_cores')}c"
