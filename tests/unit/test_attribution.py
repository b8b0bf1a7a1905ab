"""The attribution diff: two profile summaries, the rows that explain the
step-time change, matched across library builds, above the diff's noise.

The two stored summaries (tests/fixtures/profiles/) are real torch.profiler
runs of smoke/image/ddp/c2/fp32/px32/nopin/nchw on a 2-core CPU, the second
with ``fault=conv-spin:*:3:0.1``, trimmed to rows of at least 50 us a step.
"""

import json
from pathlib import Path

import pytest

from perfsuite.profiling.attribution import attribute, format_attribution, markdown_attribution
from perfsuite.profiling.names import match_key, normalise_kernel
from perfsuite.profiling.summary import ProfileRow, ProfileSummary
from perfsuite.rank import faults

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"


def stored(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def summary(rows, step_times, steps=10):
    return ProfileSummary("torch", [ProfileRow(*row) for row in rows], steps=steps,
                          meta={"step_times_s": step_times})


def test_a_conv_spin_is_the_top_row_and_its_level_explains_most_of_the_measured_change():
    a, b = stored("mobilenet-cpu-a"), stored("mobilenet-cpu-conv-spin")
    change = b["meta"]["step_time_s"] - a["meta"]["step_time_s"]
    diff = attribute(a, b, change_s=change)
    top = diff.top[0]
    assert (top.level, top.name, top.status) == ("module", "features.0.0 (Conv2d) forward", "changed")
    assert top.delta_s > diff.noise_s > 0
    assert 0.7 <= diff.explained <= 1.1 and diff.explained == diff.levels["module"].explained
    assert diff.levels["operator"].explained < 0.2  # a Python spin runs no operator
    assert diff.steps == (10, 10) and diff.ranks == (2, 2)
    assert "features.0.0 (Conv2d) forward" in format_attribution(diff)
    assert "| module | `features.0.0 (Conv2d) forward` |" in markdown_attribution(diff)
    json.dumps(diff.to_dict(), allow_nan=False)


def test_a_profile_diffed_with_itself_lists_no_row():
    a = stored("mobilenet-cpu-a")
    diff = attribute(a, a)
    assert diff.change_s == 0 and diff.top == []
    assert "no row changed by more than the noise" in format_attribution(diff)
    text = markdown_attribution(diff)
    assert "| level |" not in text  # a sentence, not a table with no rows
    assert "No row changed by more than the noise" in text


@pytest.mark.parametrize(("a_name", "b_name"), [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
     "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_"
     "tensor16x8x8_execute_kernel__5x_cudnn",
     "sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_"
     "tensor16x8x8_execute_kernel__6x_cudnn"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
     "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
     "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
     "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)"),
    ("triton_poi_fused_add_relu_0", "triton_poi_fused_add_relu_7"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*)",
     "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 256, true, 2>(cudnnTensorStruct, float const*)"),
    ("my_fused_kernel_0x7f3a2b1c", "my_fused_kernel_0x11aa22bb"),
    ("gemm_kernel_lb", "gemm_kernel"),
])
def test_the_same_kernel_from_two_library_builds_has_one_match_key(a_name, b_name):
    assert normalise_kernel(a_name) == normalise_kernel(b_name)


@pytest.mark.parametrize(("one", "other"), [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, int>(int)",
     "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>, int>(int)"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(int)",
     "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(int)"),
    ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_tn"),
])
def test_different_kernels_keep_different_match_keys(one, other):
    assert normalise_kernel(one) != normalise_kernel(other)
    assert match_key("cpu_op", "aten::add_") == "aten::add_"  # only kernels are normalised


def test_renamed_kernels_match_and_new_and_gone_ones_are_named_so():
    gemm_a = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
    gemm_b = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
    steady = [0.100, 0.101, 0.099, 0.100, 0.100, 0.101, 0.099, 0.100, 0.100, 0.100]
    a = summary([(gemm_a, "kernel", 0.30, 10), ("old_reduce_kernel", "kernel", 0.05, 10),
                 ("aten::mm", "cpu_op", 0.3, 10)], steady)
    b = summary([(gemm_b, "kernel", 0.40, 10), ("triton_red_fused_sum_3", "kernel", 0.08, 20),
                 ("aten::mm", "cpu_op", 0.3, 10)], [t + 0.013 for t in steady])
    diff = attribute(a, b, change_s=0.013)
    rows = {row.name: row for row in diff.levels["kernel"].rows}
    assert set(rows) == {gemm_b, "triton_red_fused_sum_3", "old_reduce_kernel"}
    gemm = rows[gemm_b]
    assert (gemm.status, gemm.a_name) == ("changed", gemm_a)
    assert gemm.delta_s == pytest.approx(0.010) and gemm.share == pytest.approx(0.010 / 0.013)
    assert rows["triton_red_fused_sum_3"].status == "appeared" and rows["triton_red_fused_sum_3"].b_calls == 2
    assert rows["old_reduce_kernel"].status == "vanished"
    assert [row.name for row in diff.levels["kernel"].rows][0] == gemm_b  # ranked by |change|
    assert diff.levels["kernel"].explained == pytest.approx(1.0)
    assert diff.levels["operator"].rows == [] and diff.levels["operator"].explained == 0.0
    assert "(appeared)" in format_attribution(diff) and "(vanished)" in format_attribution(diff)


def test_nested_levels_each_explain_their_share_and_are_not_added_together():
    steady = [0.050, 0.051, 0.049, 0.050, 0.050, 0.050, 0.051, 0.049, 0.050, 0.050]
    a = summary([("head (Linear) forward", "module", 0.10, 10), ("aten::addmm", "cpu_op", 0.08, 10),
                 ("gemm", "kernel", 0.07, 10)], steady)
    b = summary([("head (Linear) forward", "module", 0.20, 10), ("aten::addmm", "cpu_op", 0.16, 10),
                 ("gemm", "kernel", 0.15, 10)], [t + 0.01 for t in steady])
    diff = attribute(a, b, change_s=0.01)
    explained = {name: level.explained for name, level in diff.levels.items()}
    assert explained["module"] == pytest.approx(1.0)
    assert explained["operator"] == pytest.approx(0.8) and explained["kernel"] == pytest.approx(0.8)
    assert explained["collective"] is None  # no collective row on either side: nothing to say
    assert diff.explained == pytest.approx(1.0)  # the top row's level, not 2.6


def test_rows_under_the_noise_of_the_profiled_steps_are_not_listed():
    noisy = [0.100, 0.120, 0.080, 0.110, 0.090, 0.100, 0.125, 0.075, 0.105, 0.095]
    a = summary([("aten::mm", "cpu_op", 0.30, 10), ("aten::add", "cpu_op", 0.10, 10)], noisy)
    b = summary([("aten::mm", "cpu_op", 0.31, 10), ("aten::add", "cpu_op", 0.50, 10)], noisy[::-1])
    diff = attribute(a, b, change_s=0.04)
    assert diff.noise_s > 0.001  # 1 ms a step: aten::mm's change
    assert [row.name for row in diff.levels["operator"].rows] == ["aten::add"]
    assert diff.levels["operator"].unlisted == 1


def test_a_row_whose_calls_per_step_changed_is_listed_under_the_time_noise_and_said_so():
    """Calls are counted, not timed: an extra clone of every parameter adds
    158 exact calls a step even where its time drowns in the steps' noise,
    and an unchanged count lists nothing more."""
    noisy = [0.100, 0.120, 0.080, 0.110, 0.090, 0.100, 0.125, 0.075, 0.105, 0.095]
    a = summary([("aten::mm", "cpu_op", 0.30, 10), ("aten::copy_", "cpu_op", 0.010, 20)], noisy)
    b = summary([("aten::mm", "cpu_op", 0.31, 10), ("aten::copy_", "cpu_op", 0.012, 1600)], noisy[::-1])
    diff = attribute(a, b, change_s=0.0005)
    assert abs(diff.levels["operator"].rows[0].delta_s) < diff.noise_s  # its time alone would not list it
    (row,) = diff.levels["operator"].rows
    assert row.name == "aten::copy_" and row.calls_changed and (row.a_calls, row.b_calls) == (2, 160)
    assert diff.top[0] is row and diff.levels["operator"].unlisted == 1  # aten::mm: same calls, time in the noise
    assert "calls 2 -> 160 a step" in format_attribution(diff)
    assert attribute(a, a).top == []
    assert type(diff).from_dict(diff.to_dict()).top[0].calls_changed


def _train(model, steps, fault=None):
    """Steps 4 on of ``model``, profiled in this process; their summary. On
    one thread: the suite's workers share 2 cores, and torch's threads
    spinning against another worker's made a step 0.6 ms one moment and 36 ms
    the next, which sized the faults wrong and buried them."""
    import torch

    from perfsuite.profiling.torch_profile import StepProfiler

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.randn(4, 3, 16, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with StepProfiler("torch", wait=3, warmup=1, active=steps - 4, cuda=False) as prof:
            for step in range(steps):
                faults.extra_work(fault, 0, step, model)
                optimizer.zero_grad()
                model(images).sum().backward()
                optimizer.step()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    return prof.summary()


def _model():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))


@pytest.mark.parametrize(("kind", "place"), [("conv-spin", "0 (Conv2d) forward"),
                                             ("slow-linear", "3 (Linear) forward")])
def test_a_module_fault_is_found_in_its_module_by_the_diff(kind, place):
    a = _train(_model(), 12)
    b = _train(_model(), 12, faults.Fault.parse(f"{kind}:*:4:3.0"))  # 3 steps more: clear of a busy machine
    modules = {row.name for row in b.rows if row.category == "module"}
    assert {"0 (Conv2d) forward", "0 (Conv2d) backward", "3 (Linear) forward"} <= modules
    diff = attribute(a, b)
    assert diff.top[0].name == place and diff.top[0].level == "module"
    if kind == "slow-linear":  # its time is the Linear's own operators, run again
        b_mm = sum(r.calls for r in b.rows if r.name in ("aten::addmm", "aten::linear"))
        a_mm = sum(r.calls for r in a.rows if r.name in ("aten::addmm", "aten::linear"))
        assert b_mm > a_mm


@pytest.mark.parametrize("text", ["conv-spin:*:3", "conv-spin:*:1:0.1", "slow-linear:0:3:0", "copy:*:3:0.5",
                                  "allreduce:*:3:-4"])
def test_module_faults_and_sized_work_faults_refuse_what_cannot_be_injected(text):
    with pytest.raises(ValueError, match="fault"):
        faults.Fault.parse(text)


def test_a_model_without_the_faulted_class_is_refused_by_name():
    from torch import nn

    with pytest.raises(ValueError, match="no Conv2d"):
        faults.extra_work(faults.Fault.parse("conv-spin:*:2:0.1"), 0, 0, nn.Sequential(nn.Linear(2, 2)))


RUN = Path(__file__).resolve().parents[1] / "data" / "h100-2026-11-26" / "gate-px500-g1.results.json"


def _run(tmp_path, name, profile=None, step_time=None):
    run = json.loads(RUN.read_text())
    if profile is not None:
        run["cells"][1]["profile"] = stored(profile)
        run["cells"][1]["metrics"]["step_time"]["value"] = step_time
    path = tmp_path / name / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(run))
    return path, run["cells"][1]["id"]


def test_diff_refuses_runs_without_profile_summaries_naming_the_file_and_how_to_get_one(tmp_path, capsys):
    from perfsuite.cli.main import main

    a, _ = _run(tmp_path, "a")
    b, _ = _run(tmp_path, "b")
    assert main(["diff", str(a.parent), str(b)]) == 2
    err = capsys.readouterr().err
    assert str(a) in err and "--profiler torch" in err and "has no profile summary" in err


def test_diff_prints_each_profiled_cells_change_and_its_top_row(tmp_path, capsys):
    from perfsuite.cli.main import main

    a, cell = _run(tmp_path, "a", "mobilenet-cpu-a", 0.1219)
    b, _ = _run(tmp_path, "b", "mobilenet-cpu-conv-spin", 0.1365)
    assert main(["diff", str(a), str(b), "--cell", cell]) == 0
    out = capsys.readouterr().out
    assert f"{cell}: step time 121.90 ms -> 136.50 ms (+12.0 %)" in out
    assert "features.0.0 (Conv2d) forward" in out and "explained: module" in out
    assert main(["diff", str(a), str(b), "--cell", cell, "--json"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert document["attribution"]["top"][0]["name"] == "features.0.0 (Conv2d) forward"


def _row(level, name, delta, noise):
    from perfsuite.profiling.attribution import AttributionRow

    return AttributionRow(level, name, 0.1, 0.1 + delta, 1, 1, "changed", None, noise)


def test_a_module_whose_change_is_its_operators_within_their_noise_leads_it():
    """A slower Linear: its module's forward and its addmm change alike; which
    reads larger is the profiler's noise (on a loaded 2-core VM the addmm once
    read 0.2 ms more), and the module says where. An operator slower in
    several modules stays first: no one module holds its change."""
    from perfsuite.profiling.attribution import Attribution, LevelShare

    def diff(*rows):
        levels = {level: LevelShare(level, None, [r for r in rows if r.level == level])
                  for level in ("module", "operator", "kernel", "collective", "copy")}
        return Attribution(0.1, 0.12, 0.02, 0.001, levels, (8, 8), (1, 1))

    linear = _row("module", "3 (Linear) forward", 0.0100, 0.0004)
    assert diff(linear, _row("operator", "aten::addmm", 0.0102, 0.0004)).top[0].name == "3 (Linear) forward"
    spread = diff(_row("module", "1 (Linear) forward", 0.0100, 0.0004),
                  _row("module", "2 (Linear) forward", 0.0100, 0.0004),
                  _row("operator", "aten::addmm", 0.0200, 0.0004))
    assert [r.name for r in spread.top] == ["aten::addmm", "1 (Linear) forward", "2 (Linear) forward"]
    assert diff(linear, _row("operator", "aten::addmm", 0.0110, 0.0004)).top[0].name == "aten::addmm"
