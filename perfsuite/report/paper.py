"""The papers' published numbers, as the report's figures need them.

Values come only from the baseline folders of kind "paper" (Tables 2, 3 and
5 of 2503.15252 as transcribed there); a figure whose paper gives only a chart
gets no paper series rather than numbers read off a plot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfsuite.judge import baselines

_NUMERIC = ("world_size", "image_size", "batch_size", "epochs", "value", "low", "high")


@dataclass
class PaperReference:
    """Rows of one paper baseline folder, with numbers as numbers."""

    hardware: str = ""  # profile id, e.g. h100-sxm-94gb-x4-nvlink
    description: str = ""
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    findings: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def empty(self) -> bool:
        return self.metrics.empty and self.ratios.empty and self.findings.empty

    @property
    def label(self) -> str:
        """Short hardware label for legends: "paper (4x H100 SXM 94GB, NVLink)"."""
        parts = self.hardware.split("-")
        if len(parts) >= 4 and parts[-2].startswith("x"):
            count, link = parts[-2][1:], parts[-1]
            model = " ".join(parts[:-2]).upper()
            return f"paper: {count}x {model}, {link}"
        return f"paper: {self.hardware}" if self.hardware else "paper"

    def speedups(self, reference: str, workload: str = "image", **match: str) -> pd.DataFrame:
        """Table speed-up rows vs ``reference`` ("precision=fp64", "world_size=1",
        "pin_memory=false"), filtered by exact column values."""
        return _select(self.ratios, metric="speedup", reference=reference, workload=workload,
                       **match)

    def values(self, metric: str, workload: str, **match: str) -> pd.DataFrame:
        return _select(self.metrics, metric=metric, workload=workload, **match)

    def findings_for(self, reference: str, workload: str = "image", **match: str) -> pd.DataFrame:
        return _select(self.findings, metric="speedup", reference=reference, workload=workload,
                       **match)


def _select(table: pd.DataFrame, **match: str) -> pd.DataFrame:
    if table.empty:
        return table
    keep = pd.Series(True, index=table.index)
    for column, wanted in match.items():
        if column not in table.columns:
            return table.iloc[0:0]
        keep &= table[column].astype(str).str.replace(" ", "") == str(wanted).replace(" ", "")
    return table[keep]


def _numeric(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    for column in _NUMERIC:
        if column in table.columns:
            table[column] = pd.to_numeric(table[column], errors="coerce")
    return table


def _read_tables_directly(folder: Path) -> dict[str, pd.DataFrame]:
    """Plain pandas reading, used when the baselines module cannot load a folder."""
    tables = {}
    for name in ("metrics", "ratios", "findings"):
        path = folder / f"{name}.csv"
        tables[name] = (pd.read_csv(path, dtype=str, keep_default_na=False)
                        if path.exists() else pd.DataFrame())
    return tables


def load_paper_reference(root: Path | str | None = None) -> PaperReference:
    """The first paper baseline folder under ``root`` (default: the repository's
    baselines); an empty reference when there is none, so figures still draw."""
    root = Path(root) if root is not None else baselines.default_root()
    if not root.is_dir():
        return PaperReference()
    for folder in sorted(p for p in root.iterdir() if (p / "profile.json").is_file()):
        try:
            meta = json.loads((folder / "profile.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("kind") != "paper":
            continue
        try:  # validated tables when the folder passes the baselines' checks
            bset = baselines.load_profile(folder)
            tables = {"metrics": bset.metrics, "ratios": bset.ratios, "findings": bset.findings}
        except Exception:  # noqa: BLE001 - a folder being edited must not cost the report
            try:
                tables = _read_tables_directly(folder)
            except (OSError, ValueError):
                continue
        return PaperReference(str(meta.get("hardware", "")), str(meta.get("description", "")),
                              **{k: _numeric(v) for k, v in tables.items()})
    return PaperReference()


def with_default(paper: PaperReference | None) -> PaperReference:
    """The given reference, or the repository's paper baselines."""
    return paper if paper is not None else load_paper_reference()
