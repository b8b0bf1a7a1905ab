"""The trends page names a repeated run's launch values one way: its header
and every figure's caption say floors when it takes floors, medians when
medians, and its default is the one every command has."""

import html
import re

import pytest

from perfsuite import options
from perfsuite.history.store import History
from perfsuite.report import trends_page
from tests.unit.test_history import write_run

CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
WORDS = {"floor": "launch floors (fastest steps)", "median": "launch medians"}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wording")
    url = str(root / "history.sqlite")
    with History(url) as history:
        for i in range(4):  # each run launched 4 times: the error bars are launch values
            run = write_run(root / "runs", f"r{i}", started=1000.0 * (i + 1), step=0.1, cells=(CELL,), repeats=4)
            history.add_run(run, commit=f"c{i:03d}".ljust(40, "f"), branch="main")
    return url


def said(page: str) -> tuple[str, list[str]]:
    header = re.search(r"A step time launched several times in a run is the median of its ([^.<]+)\.", page)
    captions = [html.unescape(c) for c in re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)]
    assert header and captions, page[:2000]
    return header.group(1), captions


@pytest.mark.parametrize("statistic", options.LAUNCH_STATISTICS)
def test_the_header_and_the_captions_name_the_same_launch_values(store, tmp_path, statistic):
    out = trends_page.write_trends(store, tmp_path / "trends.html", launch_statistic=statistic)
    header, captions = said(out.read_text(encoding="utf-8"))
    other = next(w for s, w in WORDS.items() if s != statistic)
    assert header == WORDS[statistic]
    for caption in captions:
        assert f"the median of its {WORDS[statistic]}" in caption and other not in caption
        assert f"the range of the commit's {WORDS[statistic]}" in caption  # the error bars


def test_the_page_takes_the_one_default(store, tmp_path):
    out = trends_page.write_trends(store, tmp_path / "trends.html")
    header, captions = said(out.read_text(encoding="utf-8"))
    assert header == WORDS[options.DEFAULT_LAUNCH_STATISTIC]
    assert all(WORDS[options.DEFAULT_LAUNCH_STATISTIC] in caption for caption in captions)
