"""Hardware and software fingerprint recorded with every number.

Read with the field's tools: torch for CUDA/NCCL versions and the devices
this process sees, NVML (nvidia-ml-py) for the driver and, per device found
by its PCI address, memory, PCIe link and NVLink state, and between devices
their peer-to-peer and NVLink status; /proc/cpuinfo for the CPU. Everything
degrades to ``None`` rather than failing: a fingerprint is evidence, not a
precondition. ``why_no_gpu`` says why torch sees no GPU.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import warnings
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


def _import_nvml() -> tuple[Any, str | None]:
    """(the initialised pynvml module, None) or (None, why NVML is not there).

    The caller shuts NVML down (``pynvml.nvmlShutdown()``) when it got a module."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - no driver: the normal case on CPU machines
        return None, f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Theoretical PCIe bandwidth per lane and direction, GB/s (10^9 bytes/s), by
# generation: the transfer rate after line coding (8b/10b up to Gen2,
# 128b/130b from Gen3), before packet overheads.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}


def pcie_gbps(gen: Any, width: Any) -> float | None:
    """One direction of a PCIe link of ``gen`` and ``width`` lanes, GB/s; None if unknown."""
    if not isinstance(gen, int) or not isinstance(width, int) or width < 1:
        return None
    per_lane = PCIE_GBPS_PER_LANE.get(gen)
    return None if per_lane is None else per_lane * width


def pci_bus_id(domain: int, bus: int, device: int) -> str:
    """A device's PCI address as NVML spells it: 00000000:18:00.0."""
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def cuda_devices() -> list[dict[str, Any]]:
    """The devices torch sees, in torch's order: CUDA_VISIBLE_DEVICES applied.

    Name and memory as torch reports them, and each device's PCI address
    (``pci_domain_id``, ``pci_bus_id``, ``pci_device_id`` of its device
    properties, there in torch 2.14; an older torch may lack them) by which
    NVML finds the same device.
    """
    import torch

    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        try:
            address = pci_bus_id(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        except (AttributeError, TypeError, ValueError):  # an older torch: not found in NVML
            address = None
        out.append({"index": index, "name": props.name,
                    "memory_bytes": int(props.total_memory), "pci_bus_id": address})
    return out


def _nvml_call(function: Any, *args: Any) -> Any:
    """``function(*args)``, or None where NVML cannot answer (not supported, no permission)."""
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - one fact missing never loses the others
        return None


def _nvml_device(pynvml: Any, handle: Any) -> dict[str, Any]:
    """What NVML tells about one device: name, memory, PCIe link, active NVLinks.

    ``pcie_gen``/``pcie_width``: the link the device and this system can
    train to (NVML's "max" link: the lower of the GPU's and the slot's, so an
    H100 in a Gen4 server says 4); ``*_current``: the link right now, which
    an idle GPU lowers to save power (nvidia-smi: "may be reduced when the
    GPU is not in use"), so it is recorded, not expected.
    """
    name = _nvml_call(pynvml.nvmlDeviceGetName, handle)
    memory = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, handle)
    facts: dict[str, Any] = {
        "name": _text(name) if name is not None else None,
        "memory_bytes": int(memory.total) if memory is not None else None,
        "pcie_gen": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_width": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "pcie_gen_current": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_width_current": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
    }
    if facts["pcie_gen"] is None:  # an NVML without the "max" query: the current link
        facts["pcie_gen"] = facts["pcie_gen_current"]
    if facts["pcie_width"] is None:
        facts["pcie_width"] = facts["pcie_width_current"]
    links = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                links += 1
        except Exception:  # noqa: BLE001 - no NVLink on this GPU, or no more links
            break
    facts["nvlinks"] = links
    return {k: v for k, v in facts.items() if v is not None}


def _pair_status(pynvml: Any, handles: list[Any], index: Any) -> list[bool] | None:
    """For every pair of the devices, whether NVML's P2P status for capability
    ``index`` is OK; None where NVML cannot tell or there is no pair."""
    if len(handles) < 2 or any(h is None for h in handles):
        return None
    index = index[0] if isinstance(index, tuple) else index  # some nvidia-ml-py spell it (0,)
    ok = getattr(pynvml, "NVML_P2P_STATUS_OK", 0)
    status = [_nvml_call(pynvml.nvmlDeviceGetP2PStatus, a, b, index)
              for i, a in enumerate(handles) for b in handles[i + 1:]]
    return None if any(s is None for s in status) else [s == ok for s in status]


def _p2p(pynvml: Any, handles: list[Any]) -> bool | None:
    """Whether every pair of the devices can read each other's memory directly
    (over NVLink or PCIe); None where NVML cannot tell or there is no pair."""
    pairs = _pair_status(pynvml, handles, getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", 0))
    return None if pairs is None else all(pairs)


def _nvlink_pairs(pynvml: Any, handles: list[Any]) -> list[bool] | None:
    """For every pair of the devices, whether NVML reports NVLink between them."""
    index = getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    return None if index is None else _pair_status(pynvml, handles, index)


def _nvml_facts(devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The driver, and what NVML tells about each device torch sees.

    NVML counts every GPU of the machine whatever CUDA_VISIBLE_DEVICES says,
    and its index 0 need not be torch's device 0: each of ``devices``
    (``cuda_devices()``) is looked up by its PCI address. A device without
    one (an older torch) gets no NVML facts rather than another GPU's.
    """
    pynvml, _ = _import_nvml()
    if pynvml is None:
        return {}
    try:
        facts: dict[str, Any] = {}
        driver = _nvml_call(pynvml.nvmlSystemGetDriverVersion)
        if driver is not None:
            facts["driver"] = _text(driver)
        cuda = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        if isinstance(cuda, int) and cuda > 0:
            facts["driver_cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        gpus, handles = [], []
        for device in devices or []:
            handle = None
            if device.get("pci_bus_id"):
                handle = _nvml_call(pynvml.nvmlDeviceGetHandleByPciBusId, device["pci_bus_id"])
            handles.append(handle)
            gpus.append({**device, **(_nvml_device(pynvml, handle) if handle is not None
                                      else {})})
        if gpus:
            facts["gpus"] = gpus
            facts["gpu_p2p"] = _p2p(pynvml, handles)
            facts["nvlink_pairs"] = _nvlink_pairs(pynvml, handles)
        return facts
    except Exception:  # noqa: BLE001 - facts are evidence, never a precondition
        return {}
    finally:
        _nvml_call(pynvml.nvmlShutdown)


def _interconnect(gpus: list[dict[str, Any]], nvlink_pairs: list[bool] | None) -> str | None:
    """What links the GPUs to each other: "nvlink" where NVML reports NVLink
    between every pair, "pcie" between none, "mixed" between some; without
    NVML's answer per pair, every GPU's active NVLinks decide. One GPU has no
    link to another: None. A GPU's own NVLinks are no link between these GPUs
    (an H100 SXM5 alone has them idle; in a larger node they reach GPUs not
    in this set)."""
    if len(gpus) < 2:
        return None
    links = nvlink_pairs
    if links is None:
        links = [g["nvlinks"] for g in gpus if "nvlinks" in g]
        if len(links) != len(gpus):
            return None
    return "nvlink" if all(links) else "pcie" if not any(links) else "mixed"


def _gpu_summary(gpus: list[dict[str, Any]],
                 nvlink_pairs: list[bool] | None = None) -> dict[str, Any]:
    """The fingerprint's one-line facts of the devices torch sees."""
    names = sorted({g.get("name") or "gpu" for g in gpus})
    memory = [g["memory_bytes"] for g in gpus if g.get("memory_bytes")]
    out: dict[str, Any] = {
        "gpu_count": len(gpus),
        # GPUs of different models are one profile of their own, never one of them
        "gpu_name": names[0] if len(names) == 1 else " + ".join(names),
        "gpu_memory_bytes": min(memory) if memory else None,
    }
    link = _interconnect(gpus, nvlink_pairs)
    if link is not None:
        out["interconnect"] = link
    for key in ("pcie_gen", "pcie_width", "pcie_gen_current", "pcie_width_current"):
        values = [g[key] for g in gpus if isinstance(g.get(key), int)]
        # the slowest link bounds a collective and the probe's slowest rank
        out[key] = min(values) if len(values) == len(gpus) else None
    return out


def _cuda_version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in str(text).split(".")[:2])
    except ValueError:
        return None


def why_no_gpu() -> str | None:
    """None when torch sees a usable GPU; otherwise why it sees none, with
    the facts that explain it: the CUDA this torch was built for (none for a
    CPU-only build), the driver and the CUDA it supports (NVML), and
    CUDA_VISIBLE_DEVICES. The one place that decides whether GPU cells can
    run here (pytest plugin, ``perfsuite run``, the pre-flight probe)."""
    import torch

    with warnings.catch_warnings(record=True) as caught:  # torch says why, once, as a warning
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    if available and count > 0:
        return None
    facts = ["torch.cuda.is_available() is false" if not available
             else "torch.cuda.device_count() is 0"]
    built = torch.version.cuda
    if built is None:
        facts.append(f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA wheel")
    else:
        facts.append(f"this torch ({torch.__version__}) is built for CUDA {built}")
    pynvml, not_loaded = _import_nvml()
    if pynvml is None:
        facts.append(f"NVML does not load ({not_loaded}): no NVIDIA driver is visible here "
                     "(none installed, or a container started without GPUs: docker run "
                     "--gpus all)")
    else:
        try:
            driver = _nvml_call(pynvml.nvmlSystemGetDriverVersion)
            cuda = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
            gpus = _nvml_call(pynvml.nvmlDeviceGetCount)
        finally:
            _nvml_call(pynvml.nvmlShutdown)
        supported = (f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0
                     else None)
        text = f"NVIDIA driver {_text(driver) if driver is not None else '(version unknown)'}"
        text += f" supports CUDA up to {supported}" if supported else ", its CUDA version unknown"
        if gpus is not None:
            text += f", NVML sees {gpus} GPU(s)"
        facts.append(text)
        have, need = _cuda_version(supported), _cuda_version(built)
        if have and need and have < need:
            facts.append(f"the driver is older than the CUDA {built} this torch needs: update "
                         f"the driver, or install a torch wheel built for CUDA {supported} "
                         "or older")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip() in ("", "-1"):
            facts.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
        else:
            facts.append(f"CUDA_VISIBLE_DEVICES={visible!r} (an index or UUID that is not "
                         "here hides it and every GPU after it)")
    said = sorted({str(w.message).strip() for w in caught if "CUDA" in str(w.message)})
    if said:
        facts.append("torch says: " + " ".join(said))
    return "; ".join(facts)


def git_commit() -> str | None:
    """The commit of perfsuite's own checkout (None where it is no git checkout)."""
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
        "commit": git_commit(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "driver": None,
        "gpu_name": None,
        "gpu_count": 0,
        "gpu_memory_bytes": None,
        "interconnect": None,
        "driver_cuda": None,
        "pcie_gen": None,
        "pcie_width": None,
        "gpu_p2p": None,
    }
    if torch.cuda.is_available():
        # The devices this process sees (the launcher's CUDA_VISIBLE_DEVICES
        # applied), each described by NVML where NVML finds it.
        devices = cuda_devices()
        nvml = _nvml_facts(devices)
        gpus = nvml.pop("gpus", devices)
        pairs = nvml.pop("nvlink_pairs", None)
        env.update(nvml)
        env["gpus"] = gpus
        env.update(_gpu_summary(gpus, pairs))
        env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    return env


def _slug(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|nvidia|corporation|processor|\bcpu\b|@.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def profile_id(env: dict[str, Any]) -> str:
    """Name of the hardware profile whose absolute numbers are comparable.

    GPU machines: model, memory, count and, for several GPUs, the link
    between them ("nvlink", "pcie", "mixed"; "unknown-link" where NVML could
    not tell). One GPU has no link to name, whatever an env written before
    says ("pcie"): h100-80gb-hbm3-80gb-x1. CPU machines: model, the
    instruction set torch's kernels use, and core count. Software versions
    are deliberately not part of it: a new torch on the same machine is
    exactly what a baseline should judge.
    """
    if env.get("gpu_count"):
        memory_gb = round((env.get("gpu_memory_bytes") or 0) / 2**30)
        gpus = f"{_slug(env.get('gpu_name') or 'gpu')}-{memory_gb}gb-x{env['gpu_count']}"
        return gpus if env["gpu_count"] == 1 else f"{gpus}-{env.get('interconnect') or 'unknown-link'}"
    isa = f"-{_slug(env['cpu_isa'])}" if env.get("cpu_isa") else ""
    return f"cpu-{_slug(env.get('cpu_model') or 'unknown')}{isa}-{env.get('cpu_cores')}c"


def gpu_cells_without_gpu(gpu_cells: list[str], skip_option: str) -> str | None:
    """Why GPU cells must not run here (None: they may, or there are none).
    A GPU tier that skipped every cell would pass having measured nothing."""
    why = why_no_gpu() if gpu_cells else None
    if why is None:
        return None
    more = ", ..." if len(gpu_cells) > 1 else ""
    return (f"{len(gpu_cells)} GPU cell(s) selected ({gpu_cells[0]}{more}), and torch sees no "
            f"GPU: {why}. Nothing was launched; pass {skip_option} to skip the GPU cells instead")
