"""What the machine answers ``perfsuite doctor``: torch's build and the GPUs
it sees, the driver through NVML, the torch versions perfsuite supports, a
filesystem's size, the nsys perfsuite would run and whether it writes a
report, and whether a 1-rank launch works. ``perfsuite.doctor.checks`` judges them;
the tests replace these functions to play a GPU machine on a CPU one.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomllib

from perfsuite import extras
from perfsuite.launch import launch, preflight
from perfsuite.profiling.nsys import NsysConfigError, NsysNotFoundError, locate_nsys
from perfsuite.profiling.nsys_installs import installed, where_searched

NSYS_TIMEOUT_S = 120.0
LAUNCH_TIMEOUT_S = 180.0
SUPPORTED = ("torch", "torchvision")  # their ranges in pyproject.toml are the supported ones


def torch_facts() -> dict[str, Any]:
    """torch's build and what it sees: version, CUDA build (None: CPU-only),
    GPU count and names, why it sees none, NCCL version."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - a broken install is an answer too
        return {"import_error": f"{type(err).__name__}: {err}"}
    facts: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda,
                             "hip": getattr(torch.version, "hip", None), "count": 0,
                             "names": [], "error": None, "nccl": None, "torchvision": None}
    try:  # its metadata, not an import: a broken torchvision is the image workload's error
        facts["torchvision"] = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        pass
    if facts["cuda"] is None:
        return facts
    try:
        facts["count"] = torch.cuda.device_count()
        if facts["count"]:
            facts["names"] = [torch.cuda.get_device_name(i) for i in range(facts["count"])]
        else:
            torch.cuda.init()  # raises with torch's own reason ("Found no NVIDIA driver ...")
    except Exception as err:  # noqa: BLE001
        facts["error"] = str(err).strip() or type(err).__name__
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_nccl_available():
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - no NCCL in this build
        pass
    return facts


def _checkout_pyproject() -> Path | None:
    """perfsuite's pyproject.toml where perfsuite runs from its checkout (an
    editable install's metadata is the pyproject of the day it was installed)."""
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return path if tomllib.loads(path.read_text())["project"]["name"] == "perfsuite" else None
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def supported_versions() -> dict[str, str]:
    """The torch and torchvision versions perfsuite supports, as specifiers
    ({"torch": ">=2.11", ...}): its requirements, from the checkout's
    pyproject.toml, else from the installed distribution's metadata."""
    from packaging.requirements import Requirement

    pyproject = _checkout_pyproject()
    if pyproject is not None:
        lines = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    else:
        try:
            lines = importlib.metadata.requires("perfsuite") or []
        except importlib.metadata.PackageNotFoundError:  # neither installed nor a checkout: no range known
            lines = []
    required = [Requirement(line) for line in lines]
    return {r.name: str(r.specifier) for r in required if r.name in SUPPORTED and not r.marker}


def extras_missing() -> dict[str, list[str]]:
    """Per extra of perfsuite (``perfsuite.extras``), its modules not installed here."""
    return {name: extras.missing(name) for name in extras.EXTRAS}


def tiny_launch(device: str) -> dict[str, Any]:
    """One launch of the preflight probe on 1 rank of ``device`` ("cpu" | "cuda")
    through perfsuite's own launch path (torchrun with the options this
    interpreter's accepts, the worker, a rank record), one repetition: its
    status and reason, wall time, the tail of its output (launch.OUTPUT_TAIL_CHARS)
    and the last lines each rank printed."""
    cell = dataclasses.replace(preflight.probe_cell(device, 1), warmup_steps=1, max_steps=1,
                               timeout_s=LAUNCH_TIMEOUT_S)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="perfsuite-doctor-launch-") as tmp:
        try:
            result = launch.run_cell(cell, Path(tmp), launch.LaunchOptions(profiler="off"))
        except Exception as err:  # noqa: BLE001 - a launch that cannot start is an answer too
            result = {"status": "error", "reason": f"{type(err).__name__}: {err}"}
    rank_tails = {r["rank"]: r["tail"] for r in result.get("ranks") or [] if r.get("tail")}
    return {"device": device, "status": result["status"], "reason": result.get("reason"),
            "wall_s": time.monotonic() - started, "tail": result.get("output_tail") or "",
            "rank_tails": rank_tails}


def nvml_facts() -> dict[str, Any]:
    """The driver's view through NVML (pynvml, from nvidia-ml-py): GPU count
    and names, driver version, the newest CUDA it runs; or why NVML failed."""
    try:
        import pynvml
    except ImportError as err:
        return {"error": f"pynvml is not installed ({err}); install nvidia-ml-py"}
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001
        return {"error": nvml_error(err)}
    try:
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
        count = pynvml.nvmlDeviceGetCount()
        facts: dict[str, Any] = {
            "error": None, "count": count, "driver": text(pynvml.nvmlSystemGetDriverVersion()),
            "names": [text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                      for i in range(count)]}
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        except Exception:  # noqa: BLE001 - older drivers: v1
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        facts["cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return facts
    except Exception as err:  # noqa: BLE001
        return {"error": nvml_error(err)}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def nvml_error(err: BaseException) -> str:
    name, text = type(err).__name__, str(err)
    if "LibraryNotFound" in name or "Library Not Found" in text:
        return (f"NVML fails to load ({text}): no NVIDIA driver here (its libnvidia-ml.so.1 is "
                "not installed, or not visible in this container)")
    if "DriverNotLoaded" in name or "Driver Not Loaded" in text:
        return f"NVML fails to load ({text}): the NVIDIA kernel driver is not loaded"
    if "NoPermission" in name:
        return f"NVML fails to load ({text}): no permission to the GPU device files (/dev/nvidia*)"
    return f"NVML fails to load ({name}: {text})"


def statvfs(path: str) -> tuple[int, int]:
    """(size, free to unprivileged users) of the filesystem holding ``path``, in bytes."""
    st = os.statvfs(path)
    return st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail


def nsys_binary() -> tuple[Any, str]:
    """The nsys that perfsuite would run (``profiling.nsys.locate_nsys``:
    $PERFSUITE_NSYS_BIN, else PATH, else NVIDIA's install folders) as an
    ``NsysInstall`` (its binary, where it was found, its QdstrmImporter), or
    None and why."""
    try:
        return locate_nsys(), ""
    except NsysConfigError as err:
        return None, str(err)
    except NsysNotFoundError:
        return None, f"none on PATH nor in {where_searched()}"


def nsys_others(chosen: Any) -> list[Any]:
    """The other installs in NVIDIA's folders, best first (``NsysInstall``)."""
    real = os.path.realpath(chosen.binary) if chosen is not None else None
    return [i for i in installed() if os.path.realpath(i.binary) != real]


# What the capture test says of an nsys that wrote a capture and no report.
QDSTRM_ONLY = "left only a .qdstrm capture: no QdstrmImporter turned it into a report"


def nsys_capture(binary: str, timeout: float | None = None) -> tuple[bool, str]:
    """A 1-second capture of a Python that sleeps: (report written, what
    happened; QDSTRM_ONLY where only the capture is left)."""
    timeout = NSYS_TIMEOUT_S if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="perfsuite-doctor-nsys-") as tmp:
        out = Path(tmp) / "doctor"
        argv = [binary, "profile", "-o", str(out), "--force-overwrite", "true",
                sys.executable, "-c", "import time; time.sleep(1)"]
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd=tmp, start_new_session=True)
        except OSError as err:
            return False, f"cannot start {binary}: {err}"
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # nsys and the python it started: their own session
            proc.communicate()
            return False, f"`nsys profile` of a 1-second Python did not end in {timeout:.0f} s"
        tail = " | ".join(output.decode(errors="replace").strip().splitlines()[-3:])
        reports = sorted(p.name for p in Path(tmp).iterdir()
                         if p.name.endswith((".nsys-rep", ".qdrep", ".sqlite")))
        if reports:
            return True, f"wrote {reports[0]} from a 1-second capture"
        if any(p.name.endswith(".qdstrm") for p in Path(tmp).iterdir()):
            return False, QDSTRM_ONLY
        return False, (f"exit {proc.returncode} and no report from a 1-second capture"
                       + (f" ({tail})" if tail else ""))

