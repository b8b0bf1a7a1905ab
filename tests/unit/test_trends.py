"""The history's trends page (perfsuite.report.trends, `perfsuite history
report`): a synthetic store with a 10 % step at a known commit and a change
of hardware, written to trends.html and read back (and rendered in headless
Chromium where one is installed)."""

from __future__ import annotations

import base64
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from perfsuite.cli import main as cli
from perfsuite.hardware import profile_id
from perfsuite.history.store import History
from perfsuite.report import html as report_html
from perfsuite.report import trends, trends_page
from tests.unit.test_history import ENV, write_run

CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
HOSTILE = "smoke/image/<b>bold</b>&amp/$\\bad{$/c1"  # a user's cell id: must reach the page escaped
FAST_ENV = {**ENV, "cpu_cores": 4}
STEP_AT, SWITCH_AT, COMMITS = 12, 24, 32  # the step's first bad commit; the first on the new machine


def sha(i: int) -> str:
    return f"c{i:03d}".ljust(40, "f")


def build_store(root: Path, url: str) -> None:
    """Commits 0-23 on a 2-core machine (step_time 0.1 s, 0.11 s from commit 12,
    one more all-reduce per step with it), then 24-31 on a 4-core one (0.05 s)."""
    rng = np.random.default_rng(11)
    with History(url) as store:
        for i in range(COMMITS):
            env = ENV if i < SWITCH_AT else FAST_ENV
            step = 0.05 if i >= SWITCH_AT else 0.11 if i >= STEP_AT else 0.1
            run = write_run(root / "runs", f"r{i}", started=1000.0 * (i + 1),
                            step=step * math.exp(rng.normal(0, 0.004)), cells=(CELL, HOSTILE), env=env,
                            allreduce=3 if STEP_AT <= i < SWITCH_AT else 2, repeats=4 if i % 4 == 0 else None)
            store.add_run(run, commit=sha(i), branch="main")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("trends")
    url = str(root / "history.sqlite")
    build_store(root, url)
    return url


@pytest.fixture(scope="module")
def page(store, tmp_path_factory) -> tuple[Path, str]:
    out = trends_page.write_trends(store, tmp_path_factory.mktemp("page") / "trends.html")
    return out, out.read_text(encoding="utf-8")


class Tables(HTMLParser):
    """Each table's rows as lists of cell texts, by the table's class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table = self._row = self._cell = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(" ".join(" ".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(text: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(text)
    return parser.tables


def test_the_change_table_names_the_commit_of_the_step_and_not_the_hardware_change(page):
    _, text = page
    header, *rows = tables_of(text)["sortable changes"]
    assert header[:4] == ["cell", "metric · profile", "change", "last good"]
    assert {r[0] for r in rows} == {CELL, HOSTILE}  # one change per cell: the step, not the new machine
    for row in rows:
        assert profile_id(ENV) in row[1] and row[2] == "regressed"
        assert row[3].startswith(sha(STEP_AT - 1)[:12]) and row[4].startswith(sha(STEP_AT)[:12])
        assert re.match(r"×1\.(09|10|11)\d \[1\.\d{3}, 1\.\d{3}\] p = \d", row[5]), row[5]
        assert row[6] == "c10d allreduce per step 2 -> 3 (+16 B)"
    assert "regressed at head" in text


def test_each_hardware_profile_is_its_own_series(page, store):
    _, text = page
    _, *rows = tables_of(text)["sortable series"]
    by_profile = {(r[0], r[2]): r for r in rows}
    assert set(by_profile) == {(c, p) for c in (CELL, HOSTILE) for p in (profile_id(ENV), profile_id(FAST_ENV))}
    assert by_profile[(CELL, profile_id(ENV))][3] == str(SWITCH_AT)
    assert by_profile[(CELL, profile_id(FAST_ENV))][3:6] == [str(COMMITS - SWITCH_AT), sha(SWITCH_AT)[:12],
                                                             sha(COMMITS - 1)[:12]]
    assert by_profile[(CELL, profile_id(FAST_ENV))][7:] == ["0", "–"]  # no change, not regressed

    # the figure: one marker series per profile, the change at its commit, a break at the new machine
    with History(store, create=False) as history:
        series = [t for t in trends.read_trends(history, [CELL]) if t.cell == CELL]
    fig = trends.trend_figure(CELL, "step_time", series)
    ax = fig.axes[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert profile_id(ENV) in labels and profile_id(FAST_ENV) in labels
    assert "regressed: first bad commit" in labels and "another hardware profile from here" in labels
    verticals = {(round(line.get_xdata()[0], 1), line.get_linestyle()) for line in ax.get_lines()
                 if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]}
    assert (STEP_AT, "--") in verticals and (SWITCH_AT - 0.5, "-.") in verticals
    [top] = ax.child_axes  # the secondary axis above, naming the new machine
    assert [t.get_text() for t in top.get_xticklabels()] == [f"hardware → {profile_id(FAST_ENV)}"]
    ticks = dict(zip(ax.get_xticks(), (t.get_text() for t in ax.get_xticklabels())))
    assert ticks[STEP_AT] == sha(STEP_AT)[:8]
    assert ax.get_ylabel() == "step_time (ms)"


def test_the_error_bars_are_the_launches_spread_else_the_samples_iqr(store):
    with History(store, create=False) as history:
        [old] = [t for t in trends.read_trends(history, [CELL]) if t.profile == profile_id(ENV)]
    launched, single = old.spreads[0], old.spreads[1]  # commit 0 ran with --repeats 4, commit 1 once
    assert launched[2] == "launches" and launched[0] < old.points[0].value < launched[1]
    assert launched[1] / launched[0] == pytest.approx(1.03 / 0.98)
    assert single[2] == "iqr" and single[1] - single[0] == pytest.approx(0.004 * old.points[1].value, rel=0.01)


def test_the_figures_are_embedded_pngs_and_user_strings_are_escaped(page):
    path, text = page
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 2  # one per cell and metric
    for _, data in images:
        png = base64.b64decode(data)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "<b>bold</b>" not in text and "&amp/" not in text.replace("&amp;amp/", "")
    assert "smoke/image/&lt;b&gt;bold&lt;/b&gt;&amp;amp/$\\bad{$/c1" in text
    assert "could not be drawn" not in text  # `$...$` in a title is text, not mathtext
    assert any(alt.startswith("step_time of smoke/image/&lt;b&gt;") for alt, _ in images)
    assert path.name == "trends.html" and "<script>" in text  # the report's table sorting comes along


def test_cli_history_report(store, tmp_path, capsys):
    out = tmp_path / "t.html"
    assert cli.main(["history", "report", "--url", store, "--out", str(out), "--cell", "smoke/image/ddp*",
                     "--metric", "step_time", "--metric", "throughput"]) == 0
    assert capsys.readouterr().out.strip() == f"trends: {out} (1 cell(s), 4 series, 2 change point(s))"
    text = out.read_text(encoding="utf-8")
    assert len(re.findall(r'src="data:image/png;base64,', text)) == 2 and HOSTILE not in text
    assert cli.main(["history", "report", "--url", store, "--out", str(tmp_path / "x.html"),
                     "--cell", "smoke/nothing*"]) == 2
    assert "no step_time history of smoke/nothing*" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert cli.main(["history", "report", "--url", str(tmp_path / "missing.sqlite")]) == 2
    assert "no history at" in capsys.readouterr().err and not (tmp_path / "missing.sqlite").exists()


def test_a_runs_report_links_the_trends_page_of_the_default_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)  # the built-in default, as a user has it
    run = write_run(tmp_path, "run", started=1.0, cells=(CELL,))
    report = report_html.write_reports(run)["report_html"].read_text(encoding="utf-8")
    assert 'id="trends-link"' not in report  # no history here
    with History(None) as history:
        history.add_run(run, commit=sha(0))
    report = report_html.write_reports(run)["report_html"].read_text(encoding="utf-8")
    assert "writes its trends page, .perfsuite/trends.html" in report and 'href="../.perfsuite' not in report
    assert cli.main(["history", "report"]) == 0  # the default store, the page beside it
    assert capsys.readouterr().out.startswith(f"trends: {tmp_path / '.perfsuite' / 'trends.html'} (1 cell(s)")
    report = report_html.write_reports(run)["report_html"].read_text(encoding="utf-8")
    [href] = re.findall(r'<a href="([^"]+)">trends over commits</a>', report)
    assert href == "../.perfsuite/trends.html" and (run / href).resolve() == tmp_path / ".perfsuite" / "trends.html"


def test_trends_page_renders_in_chromium(page, tmp_path):
    from tests.unit.test_report_browser import DevTools, console_errors, open_and_check, require_browser

    binary = require_browser()
    path, _ = page
    devtools = DevTools(binary, tmp_path / "chromium-profile")
    try:
        session, found = open_and_check(devtools, path)
        devtools.send("Runtime.evaluate", {"expression": "1"}, session=session)  # late console messages
    finally:
        devtools.close()
    problems = console_errors(devtools, session)
    assert problems == [], f"console errors: {problems}"
    assert found["sections"] == ["summary", "changes", "series", "trends"]
    assert found["misaligned"] == [] and found["tables"] == 2
    assert len(found["images"]) == 2
    assert all(i["complete"] and i["width"] > 500 for i in found["images"]), found["images"]
    assert any(i["alt"].startswith("step_time of smoke/image/<b>bold</b>") for i in found["images"])


def test_the_page_draws_runs_only_unless_other_purposes_are_included(tmp_path, monkeypatch):
    url = str(tmp_path / "history.sqlite")
    with History(url) as store:
        for i in range(4):
            store.add_run(write_run(tmp_path / "runs", f"r{i}", started=1000.0 * (i + 1), cells=(CELL,)),
                          commit=sha(i))
        store.add_run(write_run(tmp_path / "runs", "tried", started=5000.0, step=0.5, cells=(CELL,),
                                options={"fault": "slow:0:3:4.0"}), commit=sha(4))
    with History(url) as store:
        [meant] = trends.read_trends(store)
        [tried] = trends.read_trends(store, include=("experiment",))
    assert [p.commit for p in meant.points] == [sha(i) for i in range(4)]
    assert [p.commit for p in tried.points] == [sha(i) for i in range(5)]
    calls = []
    real = trends_page.write_trends_page
    monkeypatch.setattr(trends_page, "write_trends_page", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    assert cli.main(["history", "report", "--url", url, "--out", str(tmp_path / "t.html"),
                     "--include", "experiment"]) == 0
    assert calls[0]["include"] == ("experiment",)
    _, [drawn] = real(url, tmp_path / "t.html", include=("experiment",))
    assert len(drawn.points) == 5
