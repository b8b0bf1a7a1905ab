"""`perfsuite selftest attribution`: what side B changes on a CPU cell and on
a CUDA cell, which cell each side launches, and how the figures judge the
diff. Launches are stood in for by results whose profile summaries are what
torch.profiler gives on a GPU (cuDNN's fp32 and fp16 convolution kernels,
ATen's spin_kernel for ``torch.cuda._sleep``), so the GPU path runs here."""

from __future__ import annotations

import json

import pytest

from perfsuite import cells
from perfsuite.cli import main as cli
from perfsuite.profiling.summary import ProfileRow, ProfileSummary
from perfsuite.selftest import attribution as selftest

GPU = "gate/image/ddp-ds/g1/fp32/px500/pin/nchw"
CPU = "smoke/image/ddp/c2/fp32/px32/nopin/nchw"
STEPS = 10
CONV32 = ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
          "warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn")
CONV16 = ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_"
          "warpsize2x2x1_g1_tensor16x8x16_execute_kernel__5x_cudnn")
SPIN = "at::cuda::(anonymous namespace)::spin_kernel(long)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int)"


def gpu_result(cell: cells.Cell, fault: str | None, jitter: float) -> dict:
    """A profiled launch's result as a one-GPU cell gives it: per step 100 ms of
    convolution (60 ms at fp16), 20 ms of element-wise adds, and with the
    gpu-sleep fault 10 % of the step as ATen's spin kernel."""
    conv, conv_s = (CONV16, 0.060) if cell.precision == "fp16" else (CONV32, 0.100)
    step = conv_s + 0.020
    rows = [ProfileRow(conv, "kernel", conv_s * STEPS, 52 * STEPS, step_sd_s=0.0002),
            ProfileRow(ADD, "kernel", 0.020 * STEPS, 30 * STEPS, step_sd_s=0.0001),
            ProfileRow("aten::cudnn_convolution", "cpu_op", 0.004 * STEPS, 52 * STEPS, step_sd_s=0.0001)]
    if fault and fault.startswith("gpu-sleep"):
        rows.append(ProfileRow(SPIN, "kernel", 0.1 * step * STEPS, STEPS, step_sd_s=0.0001))
        step *= 1.1
    times = [step + jitter * ((i % 3) - 1) for i in range(STEPS)]
    summary = ProfileSummary("torch", rows, steps=STEPS, meta={"step_times_s": times})
    return {"status": "ok", "metrics": {"step_time": {"value": step}}, "profile": summary.to_dict()}


@pytest.fixture
def launches(monkeypatch):
    """The launches asked for: (cell id, fault, profiler), each answered as a GPU would."""
    asked = []

    def run_cell(cell, out, options):
        fault = options.options.get("fault")
        asked.append((cell.id, fault, options.profiler, cell.max_steps))
        return gpu_result(cell, fault, jitter=0.0005)

    monkeypatch.setattr(selftest, "run_cell", run_cell)
    return asked


def test_a_cuda_cells_changes_are_a_device_slowdown_and_fp16_and_the_diff_names_their_kernels(tmp_path, launches):
    out = selftest.measure_attribution(2, None, GPU, tmp_path, log=lambda line: None, steps=20)
    assert list(out["figures"]) == ["gpu-sleep", "precision", "unchanged"]
    sleep_fault = f"gpu-sleep:*:{cells.get(GPU).warmup_steps}:0.1"  # sized from the warm-up, as ab's
    assert launches[:5] == [(GPU, None, "torch", 20), (GPU, sleep_fault, "torch", 20),
                            (GPU, None, "torch", 20), (GPU.replace("fp32", "fp16"), None, "torch", 20),
                            (GPU, None, "torch", 20)]
    assert launches[6] == (GPU, None, "off", 20)  # the unchanged pair's bare launch
    figures = out["figures"]
    assert figures["gpu-sleep"]["hits"] == 2 and figures["precision"]["hits"] == 2
    assert figures["unchanged"]["sessions_with_rows_above_noise"] == 0
    (sleep,) = [k for k in figures["gpu-sleep"]["kernels"] if "spin_kernel" in k]
    assert sleep.startswith(f"{SPIN} (appeared, +")
    kernels = figures["precision"]["kernels"]
    assert any(k.startswith(f"{CONV16} (appeared") for k in kernels)
    assert any(k.startswith(f"{CONV32} (vanished") for k in kernels)
    run = out["runs"]["precision"][0]
    assert run["b_cell"] == GPU.replace("fp32", "fp16") and run["top"].startswith("kernel: ")
    assert 0.7 <= figures["precision"]["median_explained"] <= 1.3
    lines = selftest.figure_lines(out)
    assert lines[0].startswith("gpu-sleep: top row names the changed place 2/2")
    assert any(line.startswith("  precision: its kernel rows (the last session's): ") for line in lines)
    saved = json.loads((tmp_path / "attribution-selftest.json").read_text())
    assert saved["figures"] == json.loads(json.dumps(figures)) and saved["steps"] == 20


def test_a_changed_place_the_top_row_does_not_name_is_no_hit(tmp_path, monkeypatch):
    """fp16 whose largest change is the adds, not a convolution: the diff did not name the place."""
    def run_cell(cell, out, options):
        result = gpu_result(cell, None, jitter=0.0005)
        if cell.precision == "fp16":
            profile = result["profile"]
            profile["rows"][0]["name"] = CONV32  # the same convolution kernel, as fast
            profile["rows"][0]["total_s"] = 0.100 * STEPS
            profile["rows"][1]["total_s"] = 0.050 * STEPS  # the adds slower
        return result

    monkeypatch.setattr(selftest, "run_cell", run_cell)
    out = selftest.measure_attribution(1, ("precision",), GPU, tmp_path, log=lambda line: None)
    assert out["figures"]["precision"]["hits"] == 0
    assert out["runs"]["precision"][0]["top"] == f"kernel: {ADD}"


def test_the_default_cell_and_changes_follow_whether_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert selftest.default_cell() == GPU
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert selftest.default_cell() == CPU
    assert selftest.DEFAULT_CHANGES["cpu"] == ("conv-spin", "allreduce", "copy", "slow-linear", "unchanged")


@pytest.mark.parametrize(("argv", "said"), [
    (["--cell", CPU, "--faults", "gpu-sleep,unchanged"], f"gpu-sleep: a cuda cell's change only; {CPU} runs on cpu"),
    (["--cell", CPU, "--faults", "precision"], "precision: a cuda cell's change only"),
    (["--cell", GPU, "--steps", "5"], f"--steps 5: give more than {GPU}'s 5 warm-up steps"),
    (["--cell", CPU, "--faults", "nosuch"], "faults among conv-spin, allreduce, copy, slow-linear, gpu-sleep"),
])
def test_changes_a_cell_cannot_take_are_refused_before_any_launch(argv, said, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(selftest, "run_cell", lambda *a, **kw: pytest.fail("launched"))
    code = cli.main(["selftest", "attribution", "--sessions", "1", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err
