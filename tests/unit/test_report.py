"""Reports from a hand-built results.json: CSV tables, figures and the HTML page."""

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from perfsuite.profiling.summary import ProfileRow, ProfileSummary
from perfsuite.report import figures, figures_llm, figures_profile, formatting, gallery, html, page_checks, page_data, tables
from perfsuite.report.paper import PaperReference, load_paper_reference
from perfsuite.report.terminal import junit_properties, summary_lines

CPU_ENV = {"hostname": "ci", "cpu_model": "Test CPU", "cpu_cores": 2, "torch": "2.14.0",
           "gpu_name": None, "gpu_count": 0, "commit": "abc123"}
GPU_ENV = {**CPU_ENV, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 4,
           "gpu_memory_bytes": 80 * 2**30, "interconnect": "nvlink"}


def step(median, n=12):
    samples = [median * (1 + 0.01 * ((i % 5) - 2)) for i in range(n)]
    return {"value": median, "unit": "s", "samples": samples, "n": n, "median": median,
            "iqr": median * 0.02, "p10": median * 0.98, "p90": median * 1.02}


def cell(*, strategy="ddp-ds", world_size=1, precision="fp32", pin=False, px=32,
         workload="image", dataset="digits", device="cpu", status="ok", step_s=0.1,
         per_step=16, checks=(), **extra):
    ranks = ("g" if device == "cuda" else "c") + str(world_size)
    pin_word = "pin" if pin else "nopin"
    parts = ([strategy, ranks, precision, f"px{px}", pin_word, "nchw"] if workload == "image"
             else [strategy, dataset, ranks, precision, pin_word])
    params = {"tier": "smoke", "workload": workload, "strategy": strategy, "device": device,
              "world_size": world_size, "precision": precision, "pin_memory": pin,
              "dataset": dataset, "batch_size": per_step, "image_size": px if workload == "image"
              else 0, "memory_format": "nchw", "sources": ["2503.15252 Table 2, smoke"]}
    out = {"id": "/".join(["smoke", workload, *parts]), "params": params, "status": status,
           "reason": None, "env": GPU_ENV if device == "cuda" else CPU_ENV, "metrics": {},
           "checks": list(checks), "ranks": [], "duration_s": 3.0}
    if status == "ok":
        images = per_step * (world_size if strategy != "ddp" else 1)
        out["metrics"] = {"step_time": step(step_s), "throughput": {
            "value": images / step_s, "unit": "images/s" if workload == "image" else "tokens/s"},
            "accuracy": {"value": 0.93, "unit": "fraction"},
            "peak_rss": {"value": 2**30, "unit": "bytes"}}
    out.update(extra)
    return out


def profile_pair():
    rows = [ProfileRow("cudaLaunchKernel", "cuda_api", 0.40, 900),
            ProfileRow("cudaStreamSynchronize_v3020", "cuda_api", 0.20, 30),
            ProfileRow("CUDA memcpy Host-to-Device", "memcpy", 0.10, 24, bytes=3e8),
            ProfileRow("ncclDevKernel_AllGather_RING_LL", "kernel", 0.05, 12),
            ProfileRow("forward", "nvtx", 0.6, 10)]
    base = ProfileSummary("nsys", rows, steps=10, window_s=2.0)
    slower = [ProfileRow(r.name, r.category, r.total_s * (2 if r.category == "memcpy" else 1),
                         r.calls, bytes=r.bytes) for r in rows]
    return base, ProfileSummary("nsys", slower, steps=10, window_s=2.2)


def run(cells, env=CPU_ENV):
    return {"schema": "perfsuite.results/1", "env": env, "cells": cells,
            "run": {"started": 1763800000.0, "finished": 1763800100.0, "argv": ["pytest"]}}


@pytest.fixture(scope="module")
def results():
    _, current = profile_pair()
    regressed = {"name": "step_time", "verdict": "regressed", "observed": 0.2, "expected": 0.1,
                 "ratio": 2.0, "ci_low": 1.8, "ci_high": 2.2, "confidence": 0.95,
                 "tolerance": 0.05, "metric": "step_time", "unit": "s",
                 "baseline": "2503.15252 Table 2", "message": "slower <b>than</b> baseline"}
    speedup = {"name": "precision_speedup", "verdict": "pass", "observed": 1.9, "ci_low": 1.7,
               "ci_high": 2.1, "confidence": 0.95, "expected": None, "message": "ok"}
    cells = [cell(world_size=1, precision="fp32", step_s=0.10),
             cell(world_size=2, precision="fp32", step_s=0.12),
             cell(world_size=1, precision="fp64", step_s=0.20),
             cell(world_size=2, precision="fp64", step_s=0.24),
             cell(world_size=2, precision="bf16", step_s=0.13, checks=[speedup]),
             cell(world_size=2, pin=True, step_s=0.11, checks=[regressed],
                  profile=current.to_dict()),
             cell(strategy="ddp", world_size=1, step_s=0.1),
             cell(strategy="ddp", world_size=2, step_s=0.15),
             cell(world_size=4, status="skipped",
                  reason="needs 4 ranks; <only 2 cores> & no GPU"),
             cell(strategy="ddp-rr", world_size=2, status="error", reason="rank 1 failed",
                  output_tail="Traceback ...\nRuntimeError: <boom>")]
    return run(cells)


@pytest.fixture(scope="module")
def paper():
    return load_paper_reference()


def test_results_csv_has_a_row_per_cell_and_metric(results, tmp_path):
    path = tables.write_results_csv(results, tmp_path / "results.csv")
    frame = pd.read_csv(path)
    assert list(frame.columns[:4]) == ["id", "tier", "workload", "strategy"]
    ok = [c for c in results["cells"] if c["status"] == "ok"]
    assert len(frame) == 4 * len(ok) + 2  # 4 metrics per ok cell, one row per other cell
    fp64 = frame[(frame["id"] == ok[2]["id"]) & (frame["metric"] == "step_time")].iloc[0]
    assert fp64["value"] == pytest.approx(0.2) and fp64["n"] == 12
    assert fp64["precision"] == "fp64" and fp64["world_size"] == 1
    assert fp64["iqr"] == pytest.approx(0.004) and fp64["unit"] == "s"
    skipped = frame[frame["status"] == "skipped"].iloc[0]
    assert pd.isna(skipped["metric"]) and "only 2 cores" in skipped["reason"]


def test_checks_csv_has_a_row_per_check(results, tmp_path):
    frame = pd.read_csv(tables.write_checks_csv(results, tmp_path / "checks.csv"))
    assert len(frame) == 2
    row = frame[frame["verdict"] == "regressed"].iloc[0]
    assert row["name"] == "step_time" and row["ratio"] == 2.0
    assert (row["ci_low"], row["ci_high"]) == (1.8, 2.2) and row["id"].endswith("/pin/nchw")


def test_empty_run_writes_header_only_csvs(tmp_path):
    assert tables.results_frame(run([])).empty
    text = tables.write_checks_csv(run([]), tmp_path / "c.csv").read_text()
    assert text.startswith("id,name,verdict")


@pytest.mark.parametrize("function", [
    figures.scaling_figure, figures.image_size_figure, figures.precision_figure,
    figures.pin_memory_figure, figures.step_time_figure, figures_llm.llm_iteration_figure,
    figures_llm.llm_pin_memory_figure, figures_profile.profile_figure])
def test_figures_return_none_without_data(function):
    assert function([], PaperReference()) is None
    assert function([cell(status="skipped")], PaperReference()) is None


def test_precision_pairs_each_cell_with_its_fp64_twin(results):
    from perfsuite.report import cellview

    pairs = cellview.ratios_to_twin(cellview.ok_cells(results["cells"]), "precision", "fp64")
    by_value = {(p["value"], p["world_size"]): p for p in pairs}
    assert by_value[("fp32", 1)]["ratio"] == pytest.approx(2.0)  # 0.20 s / 0.10 s
    assert by_value[("bf16", 2)]["ratio"] == 1.9  # the check's estimate, with its interval
    assert (by_value[("bf16", 2)]["low"], by_value[("bf16", 2)]["high"]) == (1.7, 2.1)


def test_cpu_figures_draw_the_paper_on_its_own_axes(results, paper):
    fig = figures.precision_figure(results["cells"], paper)
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert len(fig.axes) == 2 and "Test CPU" in titles and "H100" in titles
    scaling = figures.scaling_figure(results["cells"], paper)
    assert any("paper" in ax.get_title() for ax in scaling.axes)
    assert "Test CPU" in scaling._suptitle.get_text()


def test_paper_curves_are_the_published_numbers(results, paper):
    fig = figures.scaling_figure(results["cells"], paper)
    curves = {line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.lines}
    table2 = curves["paper Table 2 DDP-DS FP32, 500 px"]  # not Table 3's repeat of FP32
    assert table2 == pytest.approx([1.0, 1.7769, 2.5091, 2.9625])


def test_gpu_figures_put_ours_beside_the_paper(paper):
    cells = [cell(device="cuda", world_size=n, precision=p, px=500, step_s=t * n ** -0.1)
             for n in (1, 2, 4) for p, t in (("fp64", 0.3), ("fp32", 0.2), ("fp16", 0.1))]
    fig = figures.precision_figure(cells, paper)
    assert len(fig.axes) == 1
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"ours fp32", "paper fp32", "ours fp16", "paper fp16"} <= set(labels)


def test_llm_and_profile_figures(paper):
    base, _ = profile_pair()
    llm = [cell(workload="llm", strategy="lora", dataset=d, world_size=n, pin=pin,
                step_s=0.05 * n ** 0.2, profile=base.to_dict() if n == 1 else None)
           for d in ("alpaca_cleaned", "samsum") for n in (1, 2) for pin in (False, True)]
    fig = figures_llm.llm_iteration_figure(llm, paper)
    assert len(fig.axes) == 2 and "Table 5" in fig.axes[1].get_title()
    profile = figures_profile.profile_figure(llm, paper)
    labels = profile.axes[1].get_legend_handles_labels()[1]
    assert "cudaLaunchKernel" in labels and "memcpy HtoD" in labels


def test_html_report_is_self_contained_and_escaped(results, tmp_path):
    out = html.write_html_report(results, tmp_path / "report.html")
    page = out.read_text()
    for c in results["cells"]:
        assert formatting.esc(c["id"]) in page
    assert "&lt;only 2 cores&gt; &amp; no GPU" in page and "<only 2 cores>" not in page
    assert "slower &lt;b&gt;than&lt;/b&gt; baseline" in page
    assert 'class="v-regressed"' in page and "[1.8, 2.2] 95% CI" in page
    assert "RuntimeError: &lt;boom&gt;" in page
    assert "cudaLaunchKernel" in page and "CUDA memcpy Host-to-Device" in page
    assert "Skipped cells" in page and "Test CPU" in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 4
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "http://" not in page and "https://" not in page  # nothing fetched when opened


def test_a_failing_figure_is_reported_not_raised(results, monkeypatch):
    def broken(cells, paper):
        raise ValueError("bad <data>")
    monkeypatch.setattr(figures, "FIGURES", (("broken", "Broken", broken, "caption"),))
    drawn = gallery.render_figures(results["cells"], PaperReference())
    assert drawn[0].png is None and "bad <data>" in drawn[0].error
    page = html.render_html(results, drawn)
    assert "could not be drawn" in page and "bad &lt;data&gt;" in page


def test_write_reports_next_to_results_json(results, tmp_path, monkeypatch):
    monkeypatch.setattr(gallery, "all_figures", lambda: [figures.FIGURES[0]])  # one is enough
    (tmp_path / "results.json").write_text(json.dumps(results))
    written = html.write_reports(tmp_path / "results.json")
    assert set(written) == {"results_csv", "checks_csv", "report_html"}
    assert all(p.parent == tmp_path and p.stat().st_size > 0 for p in written.values())
    assert (tmp_path / "figures" / "step_time.png").read_bytes().startswith(b"\x89PNG")


def test_probe_section_shows_trust_and_flags():
    from perfsuite.report.html import render_html

    probe = {"id": "gate/probe/g4", "status": "ok",
             "metrics": {"matmul_tflops_bf16": {"value": 120.0, "unit": "TFLOP/s"}},
             "assessment": {"trusted": False, "flags": ["matmul_tflops_bf16 120 < 0.5 x 989.5 <dense>"],
                            "notes": []}}
    page = render_html({"cells": [], "probe": probe, "env": {}, "run": {}}, figures=[])
    assert "Pre-flight probe" in page and "NOT TRUSTED" in page
    assert "&lt;dense&gt;" in page  # escaped


def test_a_cells_work_counters_are_shown_per_step(results):
    counted = cell(counters={"window_steps": 2, "ranks": 2, "unstable": ["ops/aten::add"],
                             "per_step": {"flops": 3.5e9, "ops/aten::convolution": 104,
                                          "ops/aten::add": 7, "collectives/allreduce/calls": 4,
                                          "collectives/allreduce/bytes": 17893456,
                                          "cuda/kernel_launches": 812}})
    page = html.render_html(run([counted]))
    assert "work counters per training step, summed over 2 rank(s)" in page
    assert "c10d allreduce" in page and "4 calls, 17.9 MB" in page and "3.5e+09" in page
    assert "111 (2 operators)" in page and "kernel launches" in page and "812" in page
    assert "unstable, not judged: ops/aten::add" in page


# -- the page, its figures and the JUnit XML, against what a reader found wrong ----------

pytest_plugins = ["pytester"]


class Tables(HTMLParser):
    """Each <table> of a page: its header row and body rows as (colspan, text) cells."""

    def __init__(self, page: str):
        super().__init__()
        self.tables, self._row, self._cell, self._part = [], None, None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append({"attrs": attrs, "head": [], "rows": []})
        elif tag in ("thead", "tbody"):
            self._part = tag
        elif tag == "tr" and self.tables:
            self._row = []
            (self.tables[-1]["head"] if self._part == "thead" else self.tables[-1]["rows"]).append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = [int(attrs.get("colspan") or 1), ""]
            self._row.append(self._cell)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data


def misaligned(page: str) -> list:
    width = lambda row: sum(span for span, _ in row)
    return [(t["head"], row) for t in Tables(page).tables for row in t["rows"]
            if not t["head"] or width(row) != width(t["head"][0])]


def column(table: dict, header: str) -> list[str]:
    names = [text.strip() for _, text in table["head"][0]]
    return [row[names.index(header)][1].strip() for row in table["rows"]]


def section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}"')
    return page[start:page.index("</section>", start)]


def sampled(median, n=40, seed=0, **kw):
    rng = np.random.default_rng(seed)
    out = cell(step_s=median, **kw)
    samples = list(median * np.exp(rng.normal(0, 0.03, n)))
    out["metrics"]["step_time"] = {**step(median, n), "samples": samples}
    return out


def test_page_is_rendered_from_autoescaping_jinja_templates(results):
    from jinja2 import Environment

    templates = Path(html.__file__).with_name("templates")
    assert (templates / "report.html.j2").is_file()
    # built anew: one cached by a pytester run in this process may hold the
    # jinja2 that pytester took out of sys.modules again when it ended
    html._environment.cache_clear()
    env = html._environment()
    assert isinstance(env, Environment) and env.autoescape is True
    hostile = cell(reason=None, checks=[{"name": "step_time", "verdict": "fail",
                                         "message": "<script>alert(1)</script>"}])
    hostile["id"] = 'smoke/image/"><img src=x onerror=alert(1)>'
    page = html.render_html(run([hostile]), figures=[])
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    for module in (html, page_data, page_checks, formatting):  # the page's modules build no HTML
        source = Path(module.__file__).read_text()
        assert "<table" not in source and "<td" not in source.replace('f\'<td class="{classes}">', "")
    pyproject = (Path(html.__file__).parents[2] / "pyproject.toml").read_text()
    assert '"report/templates/*"' in pyproject and '"jinja2>=3.1"' in pyproject


def test_probe_table_puts_each_figure_in_its_own_cells():
    probe = {"id": "smoke/probe/c2", "status": "ok",
             "metrics": {"matmul_tflops_fp32": {"value": 0.1264, "unit": "TFLOP/s"},
                         "allreduce_busbw_gbps": {"value": 0.8601, "unit": "GB/s"}},
             "assessment": {"trusted": True, "flags": [], "notes": ["nothing to compare"],
                            "figures": {"matmul_tflops_fp32": {"expected": 0.2, "fraction": 0.63,
                                                               "verdict": "ok"}}}}
    page = html.render_html({"cells": [], "probe": probe, "env": {}, "run": {}}, figures=[])
    assert "matmul_tflops_fp32TFLOP/s" not in page and misaligned(page) == []
    table = next(t for t in Tables(section(page, "probe")).tables)
    assert column(table, "figure") == ["matmul_tflops_fp32", "allreduce_busbw_gbps"]
    assert column(table, "measured") == ["0.1264 TFLOP/s", "0.8601 GB/s"]
    assert column(table, "of expected")[0] == "63%"


def test_every_table_row_has_as_many_cells_as_its_header(results):
    page = html.render_html(results, figures=[])
    assert len(Tables(page).tables) >= 8 and misaligned(page) == []


def test_accuracy_only_where_the_cell_has_a_target():
    brief = cell(checks=[])
    brief["metrics"]["accuracy"] = {"value": 0.1, "unit": "fraction"}  # chance after 14 steps
    target = cell(world_size=2, checks=[])
    target["params"]["min_accuracy"] = 0.9
    lines = summary_lines([brief, target])
    assert "accuracy" not in lines[0] and "accuracy 93 %" in lines[1]
    page = html.render_html(run([brief, target]), figures=[])
    cells_table = Tables(section(page, "cells")).tables[0]
    assert column(cells_table, "accuracy (%)") == ["–", "93"]
    assert ("perf.accuracy", 0.1) not in junit_properties(brief)


def test_gpu_busy_share_in_the_terminal_line_and_the_cells_table():
    on_cpu = cell(checks=[], gpu_busy_share=None)
    on_gpu = cell(device="cuda", checks=[], gpu_busy_share=0.934)
    lines = summary_lines([on_cpu, on_gpu])
    assert "gpu busy" not in lines[0] and "gpu busy 93 %" in lines[1]
    page = html.render_html(run([on_cpu, on_gpu]), figures=[])
    cells_table = Tables(section(page, "cells")).tables[0]
    assert column(cells_table, "GPU busy (%)") == ["–", "93.4"]
    assert misaligned(page) == []


def errorbars(ax) -> list[tuple[float, float]]:
    """(low, high) of every vertical error bar drawn on the axes (bars' and points')."""
    out = []
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            for collection in container.lines[2]:
                out += [(min(s[0][1], s[1][1]), max(s[0][1], s[1][1])) for s in collection.get_segments()
                        if s[0][1] != s[1][1]]  # a point without an interval draws none
    return out


def test_ratio_figures_draw_the_interval_of_the_plotted_ratio(paper):
    # A check compared with a baseline bounds observed / expected (like the real
    # runs': observed 1.65, ratio 0.74 [0.67, 0.89]): the bars must bound 1.65.
    judged = {"name": "precision_speedup", "verdict": "same", "observed": 1.65, "expected": 2.226,
              "ratio": 0.7412, "ci_low": 0.6665, "ci_high": 0.889, "confidence": 0.95}
    cells = [sampled(0.2, precision="fp64", world_size=2, seed=1),
             sampled(0.1, precision="fp32", world_size=2, seed=2),  # no check: from samples
             sampled(0.12, precision="bf16", world_size=2, seed=3, checks=[judged])]
    fig = figures.precision_figure(cells, paper)
    bars = errorbars(fig.axes[0])
    assert len(bars) == 2
    assert any(lo == pytest.approx(0.6665 * 2.226) and hi == pytest.approx(0.889 * 2.226) for lo, hi in bars)
    heights = [p.get_height() for c in fig.axes[0].containers if isinstance(c, BarContainer) for p in c]
    fp32 = next(h for h in heights if h == pytest.approx(2.0, rel=0.05))  # 0.2 s / 0.1 s
    assert any(lo < fp32 < hi for lo, hi in bars)  # its bootstrap interval, from the samples
    scaling = figures.scaling_figure([sampled(0.1, world_size=1, seed=4),
                                      sampled(0.12, world_size=2, seed=5)], paper)
    (low, high), = errorbars(scaling.axes[1])  # the 2-rank speed-up; 1 rank is 1 by definition
    drawn = scaling.axes[1].containers[0].lines[0].get_ydata()[-1]
    assert low < drawn < high and drawn == pytest.approx(2 * 0.1 / 0.12, rel=0.05)
    assert "error bars" in dict((n, c) for n, _, _, c in figures.FIGURES)["precision"]


def test_cpu_pin_memory_is_no_effect_expected_with_its_interval(paper):
    nopin = sampled(0.100, world_size=2, seed=6)
    pinned = sampled(0.0877, world_size=2, pin=True, seed=7, info={"pin_memory_effective": False})
    fig = figures.pin_memory_figure([nopin, pinned], paper)
    ours = fig.axes[0]
    assert not any(isinstance(c, BarContainer) and len(c) for c in ours.containers)  # no gain bar
    labels = ours.get_legend_handles_labels()[1]
    assert any("no effect expected" in label for label in labels)
    (low, high), = errorbars(ours)
    drawn = next(c for c in ours.containers if isinstance(c, ErrorbarContainer)).lines[0].get_ydata()[0]
    assert low < drawn < high and drawn == pytest.approx(0.100 / 0.0877, rel=0.05)
    assert "no effect expected" in fig._suptitle.get_text()


def test_profile_time_is_per_step_and_rank_not_summed_over_ranks(paper):
    from perfsuite.profiling.summary import merge_rank_summaries

    ranks = [ProfileSummary("torch", [ProfileRow("forward", "nvtx", 0.5, 10),
                                      ProfileRow("backward", "nvtx", 1.0, 10)], rank=r, steps=10,
                            window_s=1.6) for r in (0, 1)]
    merged = merge_rank_summaries(ranks)
    fig = figures_profile.profile_figure([cell(world_size=2, profile=merged.to_dict())], paper)
    total = sum(patch.get_width() for patch in fig.axes[1].patches)
    assert total == pytest.approx(150.0)  # (0.5 + 1.0) s / 10 steps, one rank's step
    assert "mean over ranks" in fig.axes[1].get_xlabel()


def test_llm_series_on_one_dataset_get_their_own_colours(paper):
    llm = [cell(workload="llm", strategy=s, dataset="alpaca", world_size=n, step_s=0.05 * n)
           for s in ("lora", "qlora", "qat", "qat-lora", "dpo") for n in (1, 2)]
    fig = figures_llm.llm_iteration_figure(llm, paper)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    colours = {label: handle.lines[0].get_color() for handle, label in zip(handles, labels)}
    assert len(colours) == 5 and len(set(colours.values())) == 5


def test_a_run_whose_step_time_checks_all_skipped_is_not_called_green():
    skipped = {"name": "step_time", "verdict": "skipped", "metric": "step_time",
               "message": "no comparable baseline for this hardware"}
    passed = {"name": "sanity.throughput", "verdict": "pass"}
    page = html.render_html(run([cell(checks=[skipped, passed]),
                                 cell(world_size=2, checks=[dict(skipped), passed])]), figures=[])
    attention = section(page, "attention")
    assert "no check failed or regressed" not in attention.lower()
    assert "No step time was compared with a baseline: all 2 step_time check(s) were skipped" in attention
    assert "2 comparison(s) could not be made" in attention  # the count stays


def test_byte_counts_are_shown_in_binary_units():
    rss = {"name": "peak_rss", "verdict": "same", "observed": 995_100_000, "expected": 1_041_000_000,
           "ratio": 0.956, "ci_low": 0.956, "ci_high": 0.956, "tolerance": 0.6, "metric": "peak_rss",
           "unit": "bytes", "baseline": "recorded run"}
    sanity = {"name": "sanity.peak_rss", "verdict": "pass", "observed": 1_351_000_000}  # no unit
    page = html.render_html(run([cell(checks=[rss, sanity], env={**CPU_ENV, "gpu_memory_bytes": 80 * 2**30})]),
                            figures=[])
    assert not re.search(r"\d\.\d+e\+0\d", page)
    assert "949 MiB" in page and "992.8 MiB ±60%" in page and "1.258 GiB" in page and "80 GiB" in page


def test_profiler_trace_is_written_after_the_timed_steps(tmp_path, monkeypatch):
    import torch

    from perfsuite.profiling.torch_profile import StepProfiler

    finished, exported_after = [], []
    real = torch.profiler.profile.export_chrome_trace
    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace",
                        lambda self, path, *a, **k: (exported_after.append(len(finished)),
                                                     real(self, path, *a, **k))[1])
    model = torch.nn.Linear(8, 8)
    trace = tmp_path / "rank0.trace.json"
    with StepProfiler("torch", wait=0, warmup=1, active=2, cuda=False, trace_path=trace) as prof:
        for i in range(4):  # the loop a workload times, step by step
            with prof.phase("forward"):
                model(torch.randn(4, 8)).sum().backward()
            prof.step()
            assert exported_after == [], f"trace written inside timed step {i}"
            finished.append(i)
    assert exported_after == [4] and trace.is_file()
    summary = prof.summary()
    assert summary.steps == 2 and summary.meta["exported"] == "after the timed steps"


def test_cells_link_to_their_files_and_the_table_sorts_and_filters(results, tmp_path):
    ok = cell(checks=[])
    profiled = cell(world_size=2, checks=[], profile={"source": "torch", "steps": 2, "rows": []})
    skipped = cell(world_size=4, status="skipped", reason="needs 4 ranks")
    for c in (ok, profiled):
        c["dir"] = str(tmp_path / "cells" / c["id"])
        Path(c["dir"]).mkdir(parents=True)
        (Path(c["dir"]) / "output.log").write_text("log")
        (Path(c["dir"]) / "result.json").write_text("{}")
    (Path(profiled["dir"]) / "profile").mkdir()
    (Path(profiled["dir"]) / "profile" / "rank0.trace.json").write_text("{}")
    out = html.write_html_report(run([ok, profiled, skipped]), tmp_path / "report.html", figures=[])
    page = out.read_text()
    hrefs = re.findall(r'<a href="([^"#]+)"', page)
    assert f"cells/{ok['id']}/output.log" in hrefs and f"cells/{ok['id']}/result.json" in hrefs
    assert f"cells/{profiled['id']}/profile/rank0.trace.json" in hrefs
    assert all((tmp_path / h).is_file() for h in hrefs)  # relative, and there
    assert not any(skipped["id"] in h for h in hrefs)
    assert 'class="sortable" id="cells-table"' in page and 'id="cell-filter"' in page
    assert "addEventListener" in page and "<script src" not in page  # inline, nothing fetched
    assert re.search(r'data-sort="100\.0"', page)  # numbers sort as numbers


def test_each_cell_shows_what_changed_against_its_baseline(results):
    page = html.render_html(results, figures=[])
    detail = page[page.index("<h3>smoke/image/ddp-ds/c2/fp32/px32/pin/nchw"):]
    detail = detail[:detail.index("</section>")]
    assert "Against the baseline" in detail
    table = Tables(detail).tables[0]
    assert column(table, "check") == ["step_time"]
    assert column(table, "ratio observed / baseline [interval]") == ["2 [1.8, 2.2] 95% CI"]
    assert 'class="forest v-regressed"' in detail
    cells_table = Tables(section(page, "cells")).tables[0]
    assert "2× [1.8–2.2] regressed" in column(cells_table, "step time vs baseline")


def test_junit_properties_carry_ratio_interval_and_baseline(results):
    props = dict(junit_properties(results["cells"][5]))
    assert props["perf.check.step_time"] == "regressed"
    assert props["perf.check.step_time.ratio"] == 2.0
    assert (props["perf.check.step_time.ci_low"], props["perf.check.step_time.ci_high"]) == (1.8, 2.2)
    assert props["perf.check.step_time.baseline"] == "2503.15252 Table 2"
    assert None not in props.values()


XUNIT2 = {  # pytest's xunit2 (junit-10.xsd): allowed children and attributes
    "testsuites": ({"testsuite"}, {"name", "time", "tests", "failures", "errors", "skipped"}),
    "testsuite": ({"properties", "testcase", "system-out", "system-err"},
                  {"name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname",
                   "id", "package", "file", "log", "url", "version", "disabled"}),
    "properties": ({"property"}, set()),
    "property": (set(), {"name", "value"}),
    "testcase": ({"skipped", "error", "failure", "system-out", "system-err"},
                 {"name", "classname", "time", "assertions", "status"}),
    "skipped": (set(), {"message", "type"}), "error": (set(), {"message", "type"}),
    "failure": (set(), {"message", "type"}), "system-out": (set(), set()), "system-err": (set(), set()),
}


def xunit2_problems(element, parent=None) -> list[str]:
    children, attributes = XUNIT2.get(element.tag, (None, None))
    if children is None:
        return [f"<{element.tag}> not allowed in <{parent}>"]
    problems = [f"<{element.tag}> attribute {a!r}" for a in element.attrib if a not in attributes]
    for child in element:
        if child.tag not in children:
            problems.append(f"<{child.tag}> not allowed in <{element.tag}>")
        problems += xunit2_problems(child, element.tag)
    if element.tag == "testsuite" and [c.tag for c in element].count("properties") > 1:
        problems.append("more than one <properties> in <testsuite>")
    return problems


CHEAP_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"  # skipped before any launch without GPUs


@pytest.mark.parametrize("family", ["xunit2", "xunit1"])
def test_junit_xml_of_a_perf_run_is_valid_for_its_family(pytester, family):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.perf(workload="image")
        def test_cell(perf_cell, perf_result):
            assert perf_result["status"] == "ok"
    """)
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest("--perf-cell", CHEAP_CELL, "--perf-out", str(pytester.path / "out"),
                                "--perf-allow-no-gpu", f"--junitxml={xml}", "-o", f"junit_family={family}")
    result.assert_outcomes(skipped=1)
    root = ElementTree.parse(xml).getroot()
    case = root.find("testsuite/testcase")
    if family == "xunit2":
        assert xunit2_problems(root) == []
        props = {p.get("name"): p.get("value") for p in root.findall("testsuite/properties/property")}
        assert props[f"perf[{CHEAP_CELL}].status"] == "skipped"
        assert "needs 2 GPU" in props[f"perf[{CHEAP_CELL}].reason"]
    else:
        props = {p.get("name"): p.get("value") for p in case.findall("properties/property")}
        assert props["perf.id"] == CHEAP_CELL and props["perf.status"] == "skipped"
