"""One profile summary schema shared by Nsight Systems and torch.profiler.

A ProfileSummary is a flat table of rows (one per CUDA API call name, GPU
kernel, memory operation, NVTX range, CPU operator or collective), plus the
derived views the reports need: kernel time by family, host-to-device volume
and bandwidth, and the metrics of Table 1 of the MobileNetV2/Llama3 paper
under their canonical names. Pure Python: no torch, no nsys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "perfsuite.profile/1"

CATEGORIES = ("cuda_api", "kernel", "memcpy", "memset", "nvtx", "cpu_op", "collective", "module")

H2D = "CUDA memcpy Host-to-Device"

# Table 1 of the paper, in its order. ncclDevKernel_AllGather sums every
# all-gather kernel variant (RING_LL, RING_LL128, ...).
PAPER_METRICS = (
    H2D,
    "cudaLaunchKernel",
    "cudaStreamSynchronize",
    "ncclDevKernel_AllGather",
    "cudaEventSynchronize",
    "cudaEventDestroy",
    "cudaMemcpyAsync",
)

_ALLGATHER_KERNEL = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_AllGather")
_NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl", re.IGNORECASE)
# CUPTI-style API names carry a version suffix ("cudaLaunchKernel_v7000").
_API_SUFFIX = re.compile(r"(?:_ptsz|_ptds)?(?:_v\d+)?$")


def api_base_name(name: str) -> str:
    """The CUDA API name without version / per-thread-stream suffixes."""
    return _API_SUFFIX.sub("", name.strip())


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class ProfileRow:
    """One named thing the profiler timed, summed over the captured window."""

    name: str
    category: str
    total_s: float
    calls: int
    share: float = 0.0  # fraction of its category's total (nsys "Time (%)" / 100)
    bytes: float | None = None  # memory operations only
    # standard deviation of the row's time per step over the captured steps
    # (torch.profiler traces): the attribution diff's noise per row
    step_sd_s: float | None = None

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown profile row category {self.category!r}; expected one of {CATEGORIES}")

    @property
    def avg_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.category, self.name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "category": self.category,
            "total_s": self.total_s,
            "calls": self.calls,
            "avg_s": self.avg_s,
            "share": self.share,
        }
        if self.bytes is not None:
            out["bytes"] = self.bytes
        if self.step_sd_s is not None:
            out["step_sd_s"] = self.step_sd_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileRow:
        return cls(
            name=str(data["name"]),
            category=str(data["category"]),
            total_s=float(data["total_s"]),
            calls=int(data.get("calls", 0)),
            share=float(data.get("share", 0.0)),
            bytes=None if data.get("bytes") is None else float(data["bytes"]),
            step_sd_s=None if data.get("step_sd_s") is None else float(data["step_sd_s"]),
        )


@dataclass
class ProfileSummary:
    """Rows from one profiler run (one rank) or merged over ranks.

    source: "nsys" or "torch"; rank: None for a merged summary; steps: measured
    steps inside the capture window, when known (lets runs of different length
    be compared per step); window_s: wall time of the capture window.
    """

    source: str
    rows: list[ProfileRow] = field(default_factory=list)
    rank: int | None = None
    steps: int | None = None
    window_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    ranks: list[ProfileSummary] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rows = _combine(self.rows)

    # -- lookups -------------------------------------------------------
    def find(self, name: str, category: str | None = None) -> ProfileRow | None:
        for row in self.rows:
            if row.name == name and (category is None or row.category == category):
                return row
        return None

    def category_rows(self, category: str) -> list[ProfileRow]:
        return [row for row in self.rows if row.category == category]

    def category_total_s(self, category: str) -> float:
        return math.fsum(row.total_s for row in self.rows if row.category == category)

    def top(self, n: int = 10, category: str | None = None) -> list[ProfileRow]:
        rows = self.rows if category is None else self.category_rows(category)
        return sorted(rows, key=lambda r: (-r.total_s, r.name, r.category))[:n]

    # -- derived views ---------------------------------------------------
    def kernel_time_by_family(self) -> dict[str, float]:
        """GPU time split into compute kernels, NCCL kernels and memory ops."""
        families = {"compute": 0.0, "nccl": 0.0, "memcpy": 0.0}
        for row in self.rows:
            if row.category == "kernel":
                families["nccl" if _NCCL_KERNEL.match(row.name) else "compute"] += row.total_s
            elif row.category in ("memcpy", "memset"):
                families["memcpy"] += row.total_s
        return families

    @property
    def h2d_bytes(self) -> float | None:
        row = self.find(H2D, "memcpy")
        return None if row is None else row.bytes

    @property
    def h2d_time_s(self) -> float:
        row = self.find(H2D, "memcpy")
        return 0.0 if row is None else row.total_s

    def h2d_bandwidth_gbps(self) -> float | None:
        """Achieved host-to-device bandwidth over the copies' own GPU time."""
        nbytes, seconds = self.h2d_bytes, self.h2d_time_s
        if not nbytes or seconds <= 0:
            return None
        return nbytes / seconds / 1e9

    def h2d_fraction_of_limit(self, limit_gbps: float) -> float | None:
        """Achieved H2D bandwidth as a fraction of a hardware limit (e.g. PCIe/C2C)."""
        achieved = self.h2d_bandwidth_gbps()
        if achieved is None or limit_gbps <= 0:
            return None
        return achieved / limit_gbps

    def paper_metric(self, metric: str) -> ProfileRow | None:
        """One Table 1 metric as a row (summed over matching variants)."""
        if metric == H2D:
            matches = [r for r in self.rows if r.category == "memcpy" and r.name == H2D]
        elif metric == "ncclDevKernel_AllGather":
            matches = [r for r in self.rows if r.category == "kernel" and _ALLGATHER_KERNEL.match(r.name)]
        else:
            matches = [r for r in self.rows if r.category == "cuda_api" and api_base_name(r.name) == metric]
        if not matches:
            return None
        return ProfileRow(
            name=metric,
            category=matches[0].category,
            total_s=sum(r.total_s for r in matches),
            calls=sum(r.calls for r in matches),
            share=sum(r.share for r in matches),
            bytes=_sum_or_none(r.bytes for r in matches),
        )

    def paper_metrics(self, metrics: Sequence[str] = PAPER_METRICS) -> dict[str, dict[str, Any]]:
        """Table 1 metrics: total time, calls, share of their category, and
        percent among the chosen metrics (how the paper's Fig. 3/6 plot them)."""
        found = {m: self.paper_metric(m) for m in metrics}
        chosen_total = sum(r.total_s for r in found.values() if r is not None)
        out: dict[str, dict[str, Any]] = {}
        for metric, row in found.items():
            total = 0.0 if row is None else row.total_s
            out[metric] = {
                "present": row is not None,
                "total_s": total,
                "calls": 0 if row is None else row.calls,
                "share_of_category": 0.0 if row is None else row.share,
                "percent_of_selected": 100.0 * total / chosen_total if chosen_total > 0 else 0.0,
            }
        return out

    def per_rank_metric(self, metric: str) -> dict[int, float]:
        """Total seconds of one Table 1 metric on each rank of a merged summary."""
        out = {}
        for i, part in enumerate(self.ranks):
            row = part.paper_metric(metric)
            out[part.rank if part.rank is not None else i] = 0.0 if row is None else row.total_s
        return out

    # -- JSON ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (no NaN/inf). Derived views are included for readers;
        from_dict rebuilds them from rows."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "source": self.source,
            "rank": self.rank,
            "steps": self.steps,
            "window_s": _finite(self.window_s),
            "meta": self.meta,
            "rows": [row.to_dict() for row in self.top(len(self.rows))],
            "kernel_time_by_family": self.kernel_time_by_family(),
            "h2d": {
                "bytes": _finite(self.h2d_bytes),
                "time_s": self.h2d_time_s,
                "bandwidth_gbps": _finite(self.h2d_bandwidth_gbps()),
            },
            "paper_metrics": self.paper_metrics(),
        }
        if self.ranks:
            out["ranks"] = [part.to_dict() for part in self.ranks]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileSummary:
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"profile summary schema {schema!r} is not {SCHEMA!r}")
        return cls(
            source=str(data["source"]),
            rows=[ProfileRow.from_dict(r) for r in data.get("rows", [])],
            rank=data.get("rank"),
            steps=data.get("steps"),
            window_s=data.get("window_s"),
            meta=dict(data.get("meta") or {}),
            ranks=[cls.from_dict(r) for r in data.get("ranks", [])],
        )


def _sum_or_none(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _combine(rows: Iterable[ProfileRow]) -> list[ProfileRow]:
    """Sum rows with the same (category, name) and recompute category shares,
    so every producer gets the same shares whatever its rounding."""
    merged: dict[tuple[str, str], ProfileRow] = {}
    for row in rows:
        seen = merged.get(row.key)
        if seen is None:
            merged[row.key] = ProfileRow(row.name, row.category, float(row.total_s), int(row.calls), 0.0, row.bytes,
                                         row.step_sd_s)
        else:
            seen.total_s += row.total_s
            seen.calls += row.calls
            seen.bytes = _sum_or_none([seen.bytes, row.bytes])
            if seen.step_sd_s is not None and row.step_sd_s is not None:  # independent parts add in variance
                seen.step_sd_s = math.hypot(seen.step_sd_s, row.step_sd_s)
    by_category: dict[str, list[float]] = {}
    for row in merged.values():
        by_category.setdefault(row.category, []).append(row.total_s)
    totals = {category: math.fsum(times) for category, times in by_category.items()}  # order-free
    for row in merged.values():
        total = totals[row.category]
        row.share = row.total_s / total if total > 0 else 0.0
    return list(merged.values())


def merge_rank_summaries(summaries: Sequence[ProfileSummary]) -> ProfileSummary:
    """Sum per-rank summaries into one (times add up across ranks, as in the
    paper's Fig. 6 where totals may exceed the wall window); the parts stay in
    `ranks` for per-rank views."""
    if not summaries:
        raise ValueError("merge_rank_summaries needs at least one summary")
    sources = {s.source for s in summaries}
    steps = {s.steps for s in summaries}
    windows = [s.window_s for s in summaries if s.window_s is not None]
    parts = []
    for i, part in enumerate(summaries):
        parts.append(part if part.rank is not None else ProfileSummary(
            part.source, list(part.rows), i, part.steps, part.window_s, dict(part.meta)))
    return ProfileSummary(
        source=sources.pop() if len(sources) == 1 else "mixed",
        rows=[row for part in summaries for row in part.rows],
        rank=None,
        steps=steps.pop() if len(steps) == 1 else None,
        window_s=max(windows) if windows else None,
        meta={"world_size": len(summaries)},
        ranks=sorted(parts, key=lambda p: p.rank),
    )


# -- NCCL bus bandwidth (nccl-tests definitions) --------------------------

_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


@dataclass(frozen=True)
class BusBandwidth:
    algbw_gbps: float
    busbw_gbps: float


def nccl_bus_bandwidth(op: str, nbytes: float, seconds: float, world_size: int) -> BusBandwidth:
    """algbw = bytes / time; busbw = algbw x factor(n), per nccl-tests.

    nbytes is the collective's size as nccl-tests counts it: the whole buffer
    for all-reduce, and the full gathered (output) size for all-gather and
    the full input size for reduce-scatter.
    """
    key = op.lower().replace("-", "_").replace("allreduce", "all_reduce").replace(
        "allgather", "all_gather").replace("reducescatter", "reduce_scatter").replace("alltoall", "all_to_all")
    if key not in _BUS_FACTORS:
        raise ValueError(f"unknown collective {op!r}; expected one of {sorted(_BUS_FACTORS)}")
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    algbw = nbytes / seconds / 1e9
    return BusBandwidth(algbw, algbw * _BUS_FACTORS[key](world_size))


def format_summary(summary: ProfileSummary, *, top: int = 15, h2d_limit_gbps: float | None = None) -> str:
    """Plain-text view for a terminal: Table 1 metrics, GPU time by family,
    H2D bandwidth, then the largest rows."""
    who = "all ranks" if summary.ranks else f"rank {summary.rank}" if summary.rank is not None else "one run"
    steps = f", {summary.steps} steps" if summary.steps else ""
    lines = [f"profile ({summary.source}, {who}{steps})", "", "Table 1 metrics:"]
    for name, m in summary.paper_metrics().items():
        shown = f"{m['total_s']:12.6f} s {m['calls']:>9} calls {100 * m['share_of_category']:6.1f}%" \
            if m["present"] else "           -"
        lines.append(f"  {name:<28}{shown}")
    families = ", ".join(f"{k} {v:.6f} s" for k, v in summary.kernel_time_by_family().items())
    lines += ["", f"GPU time: {families}"]
    bandwidth = summary.h2d_bandwidth_gbps()
    if bandwidth is not None:
        of_limit = summary.h2d_fraction_of_limit(h2d_limit_gbps) if h2d_limit_gbps else None
        limit = f" ({100 * of_limit:.0f}% of {h2d_limit_gbps:g} GB/s)" if of_limit is not None else ""
        lines.append(f"H2D: {summary.h2d_bytes / 1e9:.3f} GB in {summary.h2d_time_s:.6f} s = "
                     f"{bandwidth:.2f} GB/s{limit}")
    lines += ["", f"top {top} rows:"]
    for row in summary.top(top):
        lines.append(f"  {row.category:<10} {row.total_s:12.6f} s {row.calls:>9} {100 * row.share:6.1f}%  "
                     f"{row.name[:90]}")
    return "\n".join(lines)


# nsys names a copy's direction two ways, by release
_MEMOP_WORDS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device",
                "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer"}


def canonical_memop(operation: str) -> str:
    """'[CUDA memcpy HtoD]' and '[CUDA memcpy Host-to-Device]' -> 'CUDA memcpy Host-to-Device'."""
    name = operation.strip().strip("[]").strip()
    for short, long in _MEMOP_WORDS.items():
        name = re.sub(rf"\b{short}\b", long, name)
    return " ".join(name.split())
