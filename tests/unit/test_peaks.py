"""The datasheet peaks table: exact name matching, dense figures, sources."""

import pytest

from perfsuite.rank import peaks


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H100 NVL", "h100-nvl-94gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("NVIDIA H200 NVL", "h200-nvl-141gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA L40S", "l40s-48gb"),
    ("nvidia h100 80gb hbm3", "h100-sxm5-80gb"),  # case and spacing aside
    ("h100-80gb-hbm3", "h100-sxm5-80gb"),  # a slugged name
])
def test_known_device_names_find_their_row(name, key):
    assert peaks.lookup(name).key == key


@pytest.mark.parametrize("name", [
    "NVIDIA H100",  # which one? never guessed
    "NVIDIA H800",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a slice has no full-GPU peaks
    "NVIDIA GH200 480GB",
    "NVIDIA GeForce RTX 4090",
    "AMD EPYC",
    "",
    None,
])
def test_unknown_names_have_no_peaks(name):
    assert peaks.lookup(name) is None
    assert peaks.peak_flops(name, "bf16") is None


def test_dense_flops_in_flop_per_second():
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.5e12)
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "tf32") == pytest.approx(494.5e12)
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(67e12)
    assert peaks.peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756.5e12)
    assert peaks.peak_flops("NVIDIA H100 NVL", "bf16") == pytest.approx(835.5e12)
    assert peaks.peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(312e12)
    assert peaks.peak_flops("NVIDIA A100-SXM4-80GB", "fp64_tensor") == pytest.approx(19.5e12)
    assert peaks.peak_flops("NVIDIA H200", "fp16") == peaks.peak_flops("NVIDIA H200", "bf16")


def test_a_figure_the_datasheet_does_not_state_is_none():
    assert peaks.peak_flops("NVIDIA L40S", "fp64") is None
    assert peaks.lookup("NVIDIA L40S").nvlink_gbps is None


def test_unknown_precision_fails_even_for_an_unknown_gpu():
    with pytest.raises(ValueError, match="unknown precision"):
        peaks.peak_flops("NVIDIA H100 80GB HBM3", "fp8-sparse")
    with pytest.raises(ValueError, match="unknown precision"):
        peaks.peak_flops("NVIDIA H800", "bf17")


def test_links_per_direction_are_half_the_datasheet_figure():
    h100 = peaks.lookup("NVIDIA H100 80GB HBM3")
    assert (h100.host_link_gbps, h100.nvlink_gbps) == (64, 450)  # Gen5 x16; 900 GB/s NVLink
    a100 = peaks.lookup("NVIDIA A100-SXM4-40GB")
    assert (a100.host_link_gbps, a100.nvlink_gbps) == (32, 300)  # Gen4 x16; 600 GB/s NVLink
    assert peaks.lookup("NVIDIA L40S").host_link_gbps == 32


def test_every_row_is_sourced_and_ordered_like_hardware():
    table = peaks.table()
    assert len(table.rows) >= 10
    for row in table.rows:
        assert "datasheet" in row.source.lower(), row.key
        assert row.memory_gbps and row.host_link_gbps, row.key
        flops = {p: row.flops(p) for p in peaks.PRECISIONS}
        # Tensor cores: bf16 = fp16 >= tf32 > fp32 (non-tensor) on every model here.
        assert flops["bf16"] == flops["fp16"] >= flops["tf32"] > flops["fp32"], row.key
        if flops["fp64"] is not None:
            assert flops["fp64_tensor"] >= flops["fp64"], row.key
    assert set(peaks.thresholds()) == {"matmul", "h2d_pinned", "allreduce_nvlink",
                                       "allreduce_pcie"}


def test_table_rejects_a_row_without_source_or_a_name_in_two_rows(tmp_path):
    bad = tmp_path / "peaks.toml"
    bad.write_text('[[gpu]]\nkey = "x"\nmodel = "X"\nnames = ["X"]\nsource = " "\n'
                   "[gpu.tflops]\nbf16 = 1\n")
    with pytest.raises(peaks.PeaksError, match="source"):
        peaks.load_table(bad)
    twice = ('[[gpu]]\nkey = "{k}"\nmodel = "X"\nnames = ["NVIDIA X"]\nsource = "sheet"\n'
             "[gpu.tflops]\nbf16 = 1\n")
    bad.write_text(twice.format(k="a") + twice.format(k="b"))
    with pytest.raises(peaks.PeaksError, match="more than one row"):
        peaks.load_table(bad)


def test_normalize_name():
    assert peaks.normalize_name("NVIDIA A100-SXM4-80GB") == "a100 sxm4 80gb"
    assert peaks.normalize_name("  NVIDIA  H200 ") == "h200"
