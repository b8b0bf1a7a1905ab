"""Every figure of a run's report, drawn: the image figures (perfsuite.report.figures),
the LLM ones (figures_llm) and the profile's (figures_profile)."""

from __future__ import annotations

import traceback
from collections.abc import Callable

from matplotlib.figure import Figure

from perfsuite.report import figures, figures_llm, figures_profile
from perfsuite.report.figures import Cells
from perfsuite.report.paper import PaperReference, with_default
from perfsuite.report.plotting import ReportFigure, png_bytes


def all_figures() -> list[tuple[str, str, Callable[..., Figure | None], str]]:
    return list(figures.FIGURES) + list(figures_llm.FIGURES) + list(figures_profile.FIGURES)


def render_figures(cells: Cells, paper: PaperReference | None = None) -> list[ReportFigure]:
    """Every figure the run has data for, as PNG bytes; a figure that fails to
    draw is reported with its error instead of costing the run its report."""
    paper = with_default(paper)
    out = []
    for name, title, function, caption in all_figures():
        try:
            fig = function(cells, paper)
            if fig is not None:
                out.append(ReportFigure(name, title, caption, png_bytes(fig)))
        except Exception as err:  # noqa: BLE001 - shown in the report
            out.append(ReportFigure(name, title, caption, error=f"{type(err).__name__}: {err}\n"
                                    + traceback.format_exc(limit=3)))
    return out
