"""Reports from a hand-built results.json: CSV tables, figures and the HTML page."""

import base64
import json
import re

import pandas as pd
import pytest

from perfsuite.profiling.summary import ProfileRow, ProfileSummary, attribute_change
from perfsuite.report import figures, figures_llm, figures_profile, html, tables
from perfsuite.report.paper import PaperReference, load_paper_reference

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
    base, current = profile_pair()
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
                  profile=current.to_dict(),
                  attribution=[d.to_dict() for d in attribute_change(base, current)]),
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
        assert html.esc(c["id"]) in page
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
    drawn = figures.render_figures(results["cells"], PaperReference())
    assert drawn[0].png is None and "bad <data>" in drawn[0].error
    page = html.render_html(results, drawn)
    assert "could not be drawn" in page and "bad &lt;data&gt;" in page


def test_write_reports_next_to_results_json(results, tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "all_figures", lambda: [figures.FIGURES[0]])  # one is enough
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
