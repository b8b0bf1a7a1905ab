"""One self-contained HTML page per run: environment, cells, checks, figures,
profiles; figures embedded as base64 PNG so the file travels alone (a CI
artifact, an e-mail), links to each cell's files beside it (relative, so the
run folder can move).

The page is built from Jinja2 templates (``templates/*.html.j2``) with
autoescaping on: every text from results.json is escaped by the template,
nothing here concatenates HTML. ``perfsuite.report.page_data`` turns
results.json into plain values for the templates (numbers, strings, lists);
formatting lives in the filters registered below (``report.formatting``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from perfsuite.report import cellview as cv
from perfsuite.report.error_rates import table_context
from perfsuite.report.formatting import fmt, fmt_bytes, quantity, sort_key
from perfsuite.report.gallery import render_figures
from perfsuite.report.page_data import report_context
from perfsuite.report.plotting import ReportFigure
from perfsuite.report.tables import write_checks_csv, write_results_csv
from perfsuite.report.trends_page import trends_link  # the history's trends page, where there is one
from perfsuite.schemas.results import load
from perfsuite.system.atomic import atomic_write_text

TEMPLATES = Path(__file__).with_name("templates")
CSS = (TEMPLATES / "report.css").read_text(encoding="utf-8")  # report/ab.py's page uses it too


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, quantity=quantity, bytes=fmt_bytes, sortkey=sort_key,
                       pct=lambda v, digits=3: fmt(None if cv.number(v) is None
                                                   else 100 * cv.number(v), digits))
    return env


def render_html(results: Mapping[str, Any], figures: list[ReportFigure] | None = None,
                base: Path | str | None = None, error_rates: Mapping[str, Any] | None = None) -> str:
    """The page as a string; figures are drawn here unless given. ``base``, the
    run folder the page is written to, makes the links point at files that exist;
    ``error_rates`` (a loaded error-rates.json) adds the runner's error rates."""
    if figures is None:
        figures = render_figures(list(results.get("cells") or []))
    context = report_context(results, figures, Path(base) if base is not None else None)
    return _environment().get_template("report.html.j2").render(css=CSS, trends=trends_link(base),
                                                                error_rates=table_context(error_rates), **context)


def write_html_report(results: Mapping[str, Any], out_path: Path | str,
                      figures: list[ReportFigure] | None = None,
                      error_rates: Mapping[str, Any] | None = None) -> Path:
    """Write the run's report page (written whole, then renamed into place)."""
    out_path = Path(out_path)
    atomic_write_text(out_path, render_html(results, figures, base=out_path.parent, error_rates=error_rates))
    return out_path


def write_reports(results_dir: Path | str, *, figure_dir: str | None = "figures",
                  error_rates: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """results.csv, checks.csv and report.html (plus each figure as a PNG under
    ``figure_dir``, unless None) next to a run's results.json."""
    results_dir = Path(results_dir)
    if results_dir.name == "results.json":
        results_dir = results_dir.parent
    results = load(results_dir)
    written = {"results_csv": write_results_csv(results, results_dir / "results.csv"),
               "checks_csv": write_checks_csv(results, results_dir / "checks.csv")}
    figures = render_figures(list(results.get("cells") or []))
    if figure_dir:
        folder = results_dir / figure_dir
        folder.mkdir(parents=True, exist_ok=True)
        for fig in figures:
            if fig.png is not None:
                (folder / f"{fig.name}.png").write_bytes(fig.png)
    written["report_html"] = write_html_report(results, results_dir / "report.html", figures, error_rates)
    return written
