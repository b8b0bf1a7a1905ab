"""The preflight probe: its verdicts on hand-made figures, and one real CPU run."""

import math
import textwrap

import pytest

from perfsuite import cells
from perfsuite.launch.preflight import assess, nvlink_topology, probe_cell

H100 = "NVIDIA H100 80GB HBM3"
PROBE_KNOWN = "probe" in cells.WORKLOADS

# Until cells.py lists the probe workload, the tests (and the ranks they
# start) add it; once it does, this does nothing.
ALLOW_PROBE = textwrap.dedent("""\
    from perfsuite import cells
    if "probe" not in cells.WORKLOADS:
        cells.WORKLOADS = (*cells.WORKLOADS, "probe")
        cells.LLM_TECHNIQUES = (*cells.LLM_TECHNIQUES, "preflight")
""")


@pytest.fixture
def allow_probe(monkeypatch):
    if not PROBE_KNOWN:
        monkeypatch.setattr(cells, "WORKLOADS", (*cells.WORKLOADS, "probe"))
        monkeypatch.setattr(cells, "LLM_TECHNIQUES", (*cells.LLM_TECHNIQUES, "preflight"))


def switch_facts(n):
    return [{"pci_bus_id": f"0000:{0x18 + i:02x}:00.0", "active_links": 18,
             "remote": ["switch"], "peers": []} for i in range(n)]


def gpu_result(bf16=720.0, fp32=50.0, pinned=52.0, pageable=18.0, busbw=360.0,
               name=H100, world=2, nvlink="switch"):
    facts = {"switch": switch_facts(world), "unknown": [None] * world}[nvlink] \
        if isinstance(nvlink, str) else nvlink
    values = {"matmul_tflops_bf16": (bf16, "TFLOP/s"), "matmul_tflops_fp32": (fp32, "TFLOP/s"),
              "h2d_gbps_pinned": (pinned, "GB/s"), "h2d_gbps_pageable": (pageable, "GB/s"),
              "allreduce_busbw_gbps": (busbw, "GB/s")}
    return {"status": "ok", "params": {"device": "cuda", "world_size": world},
            "metrics": {k: {"value": v, "unit": u} for k, (v, u) in values.items()},
            "info": {"device_type": "cuda", "world_size": world,
                     "device_names": [name] * world, "nvlink": facts}}


def gpu_env(name=H100, interconnect="nvlink", pcie_gen=5, pcie_width=16, p2p=None):
    """A fingerprint (perfsuite.hardware) with the PCIe link NVML reports."""
    return {"gpu_name": name, "gpu_count": 8, "interconnect": interconnect,
            "cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "pcie_gen": pcie_gen,
            "pcie_width": pcie_width, "gpu_p2p": p2p}

GEN5_X16, GEN4_X16 = 3.938 * 16, 1.969 * 16  # GB/s one direction


def test_healthy_h100_node_is_trusted():
    verdict = assess(gpu_result(), gpu_env())
    assert verdict["trusted"], verdict["flags"]
    assert verdict["flags"] == []
    assert "H100 SXM5 80GB" in verdict["reference"] and "datasheet" in verdict["reference"]
    figures = verdict["figures"]
    assert figures["matmul_tflops_bf16"]["verdict"] == "ok"
    assert figures["matmul_tflops_bf16"]["expected"] == pytest.approx(989.5)
    assert figures["matmul_tflops_bf16"]["fraction"] == pytest.approx(720 / 989.5)
    assert figures["matmul_tflops_fp32"]["expected"] == pytest.approx(67)
    assert figures["h2d_gbps_pinned"]["expected"] == pytest.approx(GEN5_X16)
    assert "PCIe Gen5 x16" in figures["h2d_gbps_pinned"]["against"]
    assert figures["allreduce_busbw_gbps"]["expected"] == pytest.approx(450)
    assert figures["allreduce_busbw_gbps"]["min_fraction"] == 0.5
    # Pageable copies are kept, and said to be uncompared, never passed.
    assert figures["h2d_gbps_pageable"]["verdict"] == "not compared"
    assert any(n.startswith("h2d_gbps_pageable: not compared") for n in verdict["notes"])


def test_slow_matmul_is_flagged_by_name_with_its_numbers():
    verdict = assess(gpu_result(bf16=300.0), gpu_env())
    assert not verdict["trusted"]
    (flag,) = verdict["flags"]
    assert flag.startswith("matmul_tflops_bf16: measured 300 TFLOP/s, expected >= 494.8")
    assert "fraction 0.30" in flag and "989.5" in flag
    assert verdict["figures"]["matmul_tflops_bf16"]["verdict"] == "low"
    assert verdict["figures"]["matmul_tflops_fp32"]["verdict"] == "ok"


def test_narrow_pcie_link_and_socket_fallback_are_flagged():
    verdict = assess(gpu_result(pinned=13.0, busbw=20.0), gpu_env())
    assert not verdict["trusted"]
    flagged = sorted(f.split(":")[0] for f in verdict["flags"])
    assert flagged == ["allreduce_busbw_gbps", "h2d_gbps_pinned"]


def test_min_fraction_replaces_the_table_thresholds():
    assert assess(gpu_result(bf16=600.0), gpu_env())["trusted"]
    strict = assess(gpu_result(bf16=600.0), gpu_env(), min_fraction=0.9)
    assert not strict["trusted"]
    assert all(f["min_fraction"] == 0.9 for f in strict["figures"].values()
               if f["verdict"] in ("ok", "low"))


def test_cpu_probe_is_trusted_with_no_comparison_made():
    result = {"status": "ok", "params": {"device": "cpu", "world_size": 2},
              "metrics": {"matmul_tflops_fp32": {"value": 0.03, "unit": "TFLOP/s"},
                          "allreduce_busbw_gbps": {"value": 0.5, "unit": "GB/s"}},
              "info": {"device_type": "cpu", "device_names": ["AMD EPYC", "AMD EPYC"]}}
    verdict = assess(result, {"cpu_model": "AMD EPYC", "gpu_count": 0})
    assert verdict["trusted"]
    assert verdict["notes"] == ["no reference figures for AMD EPYC: probe ran, nothing to compare"]
    assert verdict["reference"] is None
    assert {f["verdict"] for f in verdict["figures"].values()} == {"not compared"}
    assert verdict["figures"]["matmul_tflops_fp32"]["measured"] == 0.03


def test_unknown_gpu_is_not_compared_with_a_guess():
    verdict = assess(gpu_result(bf16=1.0, name="NVIDIA H800"), gpu_env("NVIDIA H800"))
    assert verdict["trusted"]
    assert verdict["notes"] == [("no reference figures for NVIDIA H800: probe ran, "
                                 "nothing to compare")]
    assert verdict["figures"]["matmul_tflops_bf16"]["expected"] is None


def test_failed_or_broken_probe_is_never_trusted():
    failed = assess({"status": "timeout", "reason": "timed out after 300 s"}, gpu_env())
    assert not failed["trusted"]
    assert failed["flags"] == [("probe timeout: timed out after 300 s; the node's figures "
                                "were not measured")]
    broken = assess(gpu_result(fp32=math.nan), gpu_env())
    assert not broken["trusted"]
    assert broken["figures"]["matmul_tflops_fp32"]["verdict"] == "invalid"
    cpu_zero = {"status": "ok", "params": {"device": "cpu"},
                "metrics": {"matmul_tflops_fp32": {"value": 0.0, "unit": "TFLOP/s"}}}
    assert not assess(cpu_zero, {"cpu_model": "AMD EPYC"})["trusted"]


def test_allreduce_reference_follows_the_measured_topology():
    # Four SXM GPUs joined GPU to GPU (no NVSwitch): per-pair bandwidth unknown.
    direct = [{"pci_bus_id": b, "active_links": 18, "remote": ["gpu"],
               "peers": sorted({"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                "0000:5d:00.0"} - {b})}
              for b in ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")]
    verdict = assess(gpu_result(busbw=100.0, world=4, nvlink=direct), gpu_env())
    assert verdict["trusted"]
    assert verdict["figures"]["allreduce_busbw_gbps"]["verdict"] == "not compared"
    assert any("'direct'" in n for n in verdict["notes"])
    # A bridged H100 NVL pair: the datasheet's 600 GB/s joins exactly these two.
    pair = [dict(direct[0], peers=["0000:2a:00.0"]), dict(direct[1], peers=["0000:18:00.0"])]
    nvl = assess(gpu_result(busbw=100.0, name="NVIDIA H100 NVL", nvlink=pair),
                 gpu_env("NVIDIA H100 NVL"))
    assert nvl["figures"]["allreduce_busbw_gbps"]["expected"] == pytest.approx(300)
    assert not nvl["trusted"]
    # No NVLink: the PCIe Gen4 link (31.5 GB/s one way) at the looser PCIe
    # threshold, GPU to GPU where peer access is on, half of it through host
    # memory where it is off or not known.
    none = [dict(f, active_links=0, remote=[]) for f in switch_facts(2)]
    l40s = assess(gpu_result(bf16=300.0, fp32=70.0, pinned=24.0, busbw=10.0,
                             name="NVIDIA L40S", nvlink=none),
                  gpu_env("NVIDIA L40S", "pcie", pcie_gen=4, p2p=True))
    assert l40s["trusted"], l40s["flags"]
    assert l40s["figures"]["allreduce_busbw_gbps"]["expected"] == pytest.approx(GEN4_X16)
    assert l40s["figures"]["allreduce_busbw_gbps"]["min_fraction"] == 0.2
    staged = assess(gpu_result(bf16=300.0, fp32=70.0, pinned=24.0, busbw=10.0,
                               name="NVIDIA L40S", nvlink=none),
                    gpu_env("NVIDIA L40S", "pcie", pcie_gen=4))
    assert staged["figures"]["allreduce_busbw_gbps"]["expected"] == pytest.approx(GEN4_X16 / 2)
    assert "peer-to-peer not known" in staged["figures"]["allreduce_busbw_gbps"]["against"]
    # Without NVML facts, NVLink is not assumed.
    unknown = assess(gpu_result(busbw=1.0, nvlink="unknown"), gpu_env())
    assert unknown["trusted"]
    assert unknown["figures"]["allreduce_busbw_gbps"]["verdict"] == "not compared"


def test_an_h100_pcie_in_a_gen4_server_is_judged_by_its_gen4_link():
    # The datasheet's Gen5 x16 (64 GB/s) would flag ~25 GB/s copies as a broken link.
    pcie = [dict(f, active_links=0, remote=[]) for f in switch_facts(2)]
    result = gpu_result(bf16=600.0, fp32=40.0, pinned=25.0, busbw=12.0,
                        name="NVIDIA H100 PCIe", nvlink=pcie)
    verdict = assess(result, gpu_env("NVIDIA H100 PCIe", "pcie", pcie_gen=4, p2p=True))
    assert verdict["trusted"], verdict["flags"]
    h2d = verdict["figures"]["h2d_gbps_pinned"]
    assert h2d["expected"] == pytest.approx(GEN4_X16) and h2d["verdict"] == "ok"
    assert h2d["against"] == "PCIe Gen4 x16 31.5 GB/s one direction (NVML)"
    # a link trained at x4 in that slot is still caught
    narrow = assess(gpu_result(pinned=6.0, busbw=12.0, name="NVIDIA H100 PCIe", nvlink=pcie),
                    gpu_env("NVIDIA H100 PCIe", "pcie", pcie_gen=4, p2p=True))
    assert [f.split(":")[0] for f in narrow["flags"]] == ["h2d_gbps_pinned"]


def test_a_pcie_node_without_peer_to_peer_is_not_flagged_for_its_staged_all_reduce():
    pcie = [dict(f, active_links=0, remote=[]) for f in switch_facts(4)]
    result = gpu_result(pinned=50.0, busbw=10.0, name="NVIDIA H100 PCIe", world=4, nvlink=pcie)
    verdict = assess(result, gpu_env("NVIDIA H100 PCIe", "pcie", p2p=False))
    assert verdict["trusted"], verdict["flags"]
    allreduce = verdict["figures"]["allreduce_busbw_gbps"]
    assert allreduce["expected"] == pytest.approx(GEN5_X16 / 2)
    assert "peer-to-peer off (staged through host memory)" in allreduce["against"]
    # Through NVLink an SXM node is held to its NVLink figure, whatever its PCIe link.
    sxm = assess(gpu_result(busbw=10.0, world=4), gpu_env(pcie_gen=4, p2p=True))
    assert sxm["figures"]["allreduce_busbw_gbps"]["expected"] == pytest.approx(450)
    assert not sxm["trusted"]


def test_without_the_pcie_link_from_nvml_host_bandwidth_is_not_compared():
    verdict = assess(gpu_result(pinned=1.0, busbw=1.0, nvlink="unknown"),
                     gpu_env(interconnect="pcie", pcie_gen=None, pcie_width=None))
    assert verdict["trusted"], verdict["flags"]
    for name in ("h2d_gbps_pinned", "allreduce_busbw_gbps"):
        assert verdict["figures"][name]["verdict"] == "not compared"
        assert any(n.startswith(f"{name}: not compared") and "PCIe link not reported by NVML"
                   in n for n in verdict["notes"])


def test_nvlink_topology():
    assert nvlink_topology(None) is None
    assert nvlink_topology([None, None]) is None
    assert nvlink_topology(switch_facts(8)) == "switch"
    four = [{"pci_bus_id": f"0000:0{i}:00.0", "active_links": 4, "remote": ["gpu"],
             "peers": ["0000:01:00.0"] if i == 0 else ["0000:00:00.0"]} for i in range(4)]
    assert nvlink_topology(four[:2]) == "direct"
    assert nvlink_topology(four) == "partial"  # two bridged pairs, not all joined
    assert nvlink_topology([dict(f, active_links=0, remote=[]) for f in four]) == "none"


def test_probe_cell(allow_probe):
    cell = probe_cell("cpu", 2)
    assert (cell.workload, cell.strategy, cell.device, cell.world_size) == \
        ("probe", "preflight", "cpu", 2)
    assert cell.processes == 2 and cell.gpus_needed == 0 and cell.tier == "smoke"
    gpu = probe_cell("cuda", 8)
    assert (gpu.tier, gpu.gpus_needed, gpu.precision) == ("gate", 8, "bf16")
    assert probe_cell("cuda", 4, tier="full").tier == "full"


@pytest.mark.skipif(not PROBE_KNOWN, reason="cells.py does not list the probe workload yet")
def test_probe_cell_id():
    assert probe_cell("cpu", 2).id == "smoke/probe/c2"
    assert probe_cell("cuda", 8).id == "gate/probe/g8"
