"""Datasheet peaks of GPU models: dense FLOP/s per precision, memory and links.

The figures are data (``perfsuite/data/peaks.toml``), every row with the
datasheet it comes from. A device name (as ``torch.cuda.get_device_name`` or
NVML reports it) finds a row only through one of the row's own names; any
other name has no row and every lookup answers ``None``, so nothing is ever
compared with, or divided by, a guessed peak. Used by the preflight probe
and for MFU (``peak_flops(name, "bf16")``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import tomllib

PEAKS_FILE = Path(__file__).parent.parent / "data" / "peaks.toml"

# fp32 and fp64 are the non-tensor rates (a matmul with TF32 off runs at
# fp32's); tf32, bf16, fp16 and fp64_tensor are dense tensor-core rates.
PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16")
NVLINK_SCOPES = ("switch", "pair", "bridge")


class PeaksError(ValueError):
    """The peaks table cannot be used as written."""


def normalize_name(name: str) -> str:
    """Case, punctuation and vendor prefix aside: 'NVIDIA A100-SXM4-80GB' -> 'a100 sxm4 80gb'."""
    text = re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()
    return re.sub(r"^nvidia\s+", "", text)


@dataclass(frozen=True)
class GpuPeaks:
    key: str
    model: str
    names: tuple[str, ...]
    source: str
    tflops: Mapping[str, float] = field(default_factory=dict)  # dense; absent: not stated
    dense_from: str = ""
    memory: str = ""
    memory_gbps: float | None = None
    host_link: str = ""
    host_link_gbps_both_directions: float | None = None
    nvlink_gbps_both_directions: float | None = None
    nvlink_scope: str | None = None

    def flops(self, precision: str) -> float | None:
        """Dense peak in FLOP/s, None where the datasheet states none."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
        tflops = self.tflops.get(precision)
        return None if tflops is None else float(tflops) * 1e12

    # Datasheets give link bandwidth for both directions together; one copy
    # or one ring step moves data one way, so comparisons use half.
    @property
    def host_link_gbps(self) -> float | None:
        both = self.host_link_gbps_both_directions
        return None if both is None else both / 2

    @property
    def nvlink_gbps(self) -> float | None:
        both = self.nvlink_gbps_both_directions
        return None if both is None else both / 2

    def describe(self) -> str:
        return f"{self.model} [{self.key}] ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "model": self.model, "names": list(self.names),
                "source": self.source, "dense_from": self.dense_from,
                "tflops": dict(self.tflops), "memory": self.memory,
                "memory_gbps": self.memory_gbps, "host_link": self.host_link,
                "host_link_gbps": self.host_link_gbps,
                "nvlink_gbps": self.nvlink_gbps, "nvlink_scope": self.nvlink_scope}


@dataclass(frozen=True)
class PeaksTable:
    rows: tuple[GpuPeaks, ...]
    thresholds: Mapping[str, float]

    def lookup(self, gpu_name: str | None) -> GpuPeaks | None:
        if not gpu_name:
            return None
        wanted = normalize_name(gpu_name)
        for row in self.rows:
            if any(normalize_name(n) == wanted for n in row.names):
                return row
        return None


_ROW_FIELDS = {"key", "model", "names", "source", "tflops", "dense_from", "memory",
               "memory_gbps", "host_link", "host_link_gbps_both_directions",
               "nvlink_gbps_both_directions", "nvlink_scope"}


def _row(data: dict[str, Any], origin: str) -> GpuPeaks:
    where = f"{origin}: gpu {data.get('key', '?')!r}"
    missing = [k for k in ("key", "model", "names", "source", "tflops") if k not in data]
    unknown = sorted(set(data) - _ROW_FIELDS)
    if missing or unknown:
        raise PeaksError(f"{where}: missing {missing}, unknown {unknown}")
    if not data["source"].strip():
        raise PeaksError(f"{where}: every row needs its datasheet source")
    bad = sorted(set(data["tflops"]) - set(PRECISIONS))
    if bad:
        raise PeaksError(f"{where}: unknown precisions {bad}; known: {PRECISIONS}")
    if any(not isinstance(v, (int, float)) or v <= 0 for v in data["tflops"].values()):
        raise PeaksError(f"{where}: tflops must be positive numbers")
    scope = data.get("nvlink_scope")
    if scope is not None and scope not in NVLINK_SCOPES:
        raise PeaksError(f"{where}: nvlink_scope {scope!r} not in {NVLINK_SCOPES}")
    return GpuPeaks(**{**data, "names": tuple(data["names"]),
                       "tflops": {k: float(v) for k, v in data["tflops"].items()}})


def load_table(path: Path | str = PEAKS_FILE) -> PeaksTable:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise PeaksError(f"{path}: not valid TOML ({err})") from None
    rows = tuple(_row(row, str(path)) for row in data.get("gpu", []))
    names = [normalize_name(n) for row in rows for n in row.names]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # one name, two rows: a lookup would depend on file order
        raise PeaksError(f"{path}: names in more than one row: {twice}")
    thresholds = {k: float(v) for k, v in data.get("thresholds", {}).items()}
    if any(not 0 < v <= 1 for v in thresholds.values()):
        raise PeaksError(f"{path}: thresholds are fractions in (0, 1]")
    return PeaksTable(rows, thresholds)


@lru_cache(maxsize=1)
def table() -> PeaksTable:
    return load_table()


def lookup(gpu_name: str | None) -> GpuPeaks | None:
    """The row of a device name, or None for a name the table does not hold."""
    return table().lookup(gpu_name)


def peak_flops(gpu_name: str | None, precision: str) -> float | None:
    """Dense peak FLOP/s of ``precision`` on ``gpu_name``; None when unknown."""
    if precision not in PRECISIONS:  # a typo must fail even for an unknown GPU
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    row = lookup(gpu_name)
    return None if row is None else row.flops(precision)


def thresholds() -> dict[str, float]:
    """Smallest measured/expected fractions the preflight probe accepts, by figure."""
    return dict(table().thresholds)
