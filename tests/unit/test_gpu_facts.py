"""The GPU path on a machine without one: what torch and NVML would answer on
a GPU node is stood in for (torch.cuda's functions, a fake ``pynvml``
module, the environment), so the decisions built on those answers run here.

- dp cells skip on the GPUs they drive, not on their one process;
- a GPU run where torch sees no GPU fails before any launch, saying why,
  unless told to skip the GPU cells;
- the fingerprint describes the devices torch sees (CUDA_VISIBLE_DEVICES),
  found in NVML by PCI address, with their PCIe link, and names the link
  between them only from what NVML says of links between GPUs.
"""

import sys
from types import SimpleNamespace

import pytest
import torch

from perfsuite import cells, hardware
from perfsuite.cli.main import main as cli_main
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.runner import Runner, SessionError

pytest_plugins = ["pytester"]

GPU_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"
CELL_TEST = """
import pytest

@pytest.mark.perf(workload="image")
def test_cell(perf_cell, perf_result):
    assert perf_result["status"] == "ok"
"""


def see_gpus(monkeypatch, count):
    """torch as it answers on a node where it sees ``count`` GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError


def pci(address):
    domain, bus, rest = address.lower().split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


class NVMLError(Exception):
    pass


NVLINK_INDEX, NOT_SUPPORTED = 2, 5  # NVML_P2P_CAPS_INDEX_NVLINK, NVML_P2P_STATUS_NOT_SUPPORTED


def fake_nvml(gpus, driver="550.54.15", cuda=12040, p2p=0, fail_init=None, nvlink_p2p=None):
    """A stand-in for nvidia-ml-py over ``gpus`` (dicts: bus, name, memory,
    gen, width, gen_now, width_now, nvlinks), in NVML's index order.
    ``p2p``: every pair's P2P status; ``nvlink_p2p``: its status for the
    NVLink capability where it differs (an exception class: NVML raises it)."""
    def init():
        if fail_init:
            raise NVMLError(fail_init)

    def by_bus(address):
        for gpu in gpus:
            if pci(gpu["bus"]) == pci(address):
                return gpu
        raise NVMLError("Not Found")

    def link_state(handle, link):
        if not handle["nvlinks"]:
            raise NVMLError("Not Supported")
        if link >= 18:
            raise NVMLError("Invalid Argument")
        return int(link < handle["nvlinks"])

    def p2p_status(a, b, index):
        if index == NVLINK_INDEX and nvlink_p2p is not None:
            if isinstance(nvlink_p2p, type):
                raise nvlink_p2p("Not Supported")
            return nvlink_p2p
        return p2p

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=18, NVML_P2P_CAPS_INDEX_READ=(0,),
        NVML_P2P_CAPS_INDEX_NVLINK=NVLINK_INDEX, NVML_P2P_STATUS_OK=0, nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: driver, nvmlSystemGetCudaDriverVersion=lambda: cuda,
        nvmlDeviceGetCount=lambda: len(gpus), nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetHandleByPciBusId=by_bus, nvmlDeviceGetName=lambda h: h["name"],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=h["memory"]),
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: h["gen"],
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: h["width"],
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: h["gen_now"],
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: h["width_now"],
        nvmlDeviceGetP2PStatus=p2p_status)


# --------------------------------------------------- 1. dp skips on its GPUs

class Launched(Exception):
    """The launch began: the cell was not skipped."""


@pytest.fixture
def no_launch(monkeypatch):
    def launched(cell, opts):
        raise Launched(cell.id)

    monkeypatch.setattr("perfsuite.launch.launch.profiler_mode", launched)


@pytest.mark.parametrize("cell_id,present,gpus,reason", [
    ("gate/image/dp/g4/fp32/px500/nopin/nchw", 2, None, "needs 4 GPU(s), 2 present"),
    ("gate/image/dp/g2/fp32/px500/nopin/nchw", 1, None, "needs 2 GPU(s), 1 present"),
    ("gate/image/dp/g2/fp32/px500/nopin/nchw", 4, [3], "needs 2 GPU(s), 1 present"),
    ("gate/image/ddp/g4/fp32/px500/nopin/nchw", 2, None, "needs 4 GPU(s), 2 present"),
    ("gate/image/dp/g2/fp32/px500/nopin/nchw", 2, [0, 5],
     "GPU(s) 5 given with --gpus are not present (2 GPU(s) here)"),
])
def test_dp_cells_skip_on_the_gpus_they_drive_not_their_one_process(
        tmp_path, monkeypatch, no_launch, cell_id, present, gpus, reason):
    see_gpus(monkeypatch, present)
    result = run_cell(cells.get(cell_id), tmp_path, LaunchOptions(gpus=gpus))
    assert (result["status"], result["reason"]) == ("skipped", reason)


@pytest.mark.parametrize("cell_id,present,gpus", [
    ("gate/image/dp/g2/fp32/px500/nopin/nchw", 2, None),
    ("gate/image/dp/g4/fp32/px500/nopin/nchw", 8, [4, 5, 6, 7]),
    ("gate/image/ddp/g2/fp32/px500/nopin/nchw", 2, None),
])
def test_cells_whose_gpus_are_here_are_launched(tmp_path, monkeypatch, no_launch, cell_id,
                                                present, gpus):
    see_gpus(monkeypatch, present)
    with pytest.raises(Launched):
        run_cell(cells.get(cell_id), tmp_path, LaunchOptions(gpus=gpus))


# ------------------------------------------ 2. no usable GPU: fail, say why

def test_a_cpu_only_torch_build_is_named_with_its_fix(monkeypatch):
    see_gpus(monkeypatch, 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    no_nvml(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    why = hardware.why_no_gpu()
    assert why.startswith("torch.cuda.is_available() is false")
    assert "is a CPU-only build; install a CUDA wheel" in why
    assert "NVML does not load (nvidia-ml-py (pynvml) is not installed)" in why
    assert "CUDA_VISIBLE_DEVICES" not in why


def test_a_driver_older_than_the_torch_build_is_named_with_both_versions(monkeypatch):
    see_gpus(monkeypatch, 0)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    gpus = [{"bus": "00000000:18:00.0", "name": "NVIDIA H100 80GB HBM3"}] * 4
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus, driver="535.104.05", cuda=12020))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    why = hardware.why_no_gpu()
    assert "built for CUDA 13.0" in why
    assert "NVIDIA driver 535.104.05 supports CUDA up to 12.2, NVML sees 4 GPU(s)" in why
    assert "the driver is older than the CUDA 13.0 this torch needs" in why
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus, driver="580.65.06", cuda=13000))
    assert "older than" not in hardware.why_no_gpu()


@pytest.mark.parametrize("visible,says", [
    ("", "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    ("-1", "CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
    ("7", "CUDA_VISIBLE_DEVICES='7' (an index or UUID that is not here hides it"),
])
def test_cuda_visible_devices_is_named(monkeypatch, visible, says):
    see_gpus(monkeypatch, 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], fail_init="Driver Not Loaded"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    why = hardware.why_no_gpu()
    assert says in why and "NVML does not load (NVMLError: Driver Not Loaded)" in why


def test_a_visible_gpu_needs_no_explanation(monkeypatch):
    see_gpus(monkeypatch, 2)
    assert hardware.why_no_gpu() is None


def test_a_gpu_tier_without_a_gpu_is_a_usage_error_in_pytest(pytester, monkeypatch):
    see_gpus(monkeypatch, 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    no_nvml(monkeypatch)
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    result = pytester.runpytest("--perf-tier", "gate", "--perf-out", str(out))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*GPU cell(s) selected (gate/image/*, ...), and torch sees no GPU: "
        "torch.cuda.is_available() is false; this torch (*) is a CPU-only build; install a CUDA "
        "wheel;*Nothing was launched; pass --perf-allow-no-gpu to skip the GPU cells instead*"])
    assert not out.exists()  # refused before the session took its output directory
    listed = pytester.runpytest("--perf-tier", "gate", "--collect-only", "-q")
    assert listed.ret == pytest.ExitCode.OK  # listing cells needs no GPU


def test_perfsuite_run_of_gpu_cells_without_a_gpu_exits_2(tmp_path, monkeypatch, capsys):
    see_gpus(monkeypatch, 0)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    no_nvml(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (f"perfsuite run: 1 GPU cell(s) selected ({GPU_CELL}), and torch sees no GPU: "
            "torch.cuda.is_available() is false; this torch") in err
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU" in err and "--allow-no-gpu" in err
    assert not (tmp_path / "out").exists()


def test_the_gpu_preflight_fails_without_a_gpu_unless_told_to_skip(tmp_path, monkeypatch):
    see_gpus(monkeypatch, 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    no_nvml(monkeypatch)
    with pytest.raises(SessionError, match=r"torch sees no GPU: torch.cuda.is_available\(\) is "
                                           r"false; .*CPU-only build.*--perf-allow-no-gpu"):
        Runner(tmp_path / "a").preflight("cuda")
    allowed = Runner(tmp_path / "b")
    allowed.allow_no_gpu = True
    probe = allowed.preflight("cuda")
    assert probe["status"] == "skipped"
    assert probe["reason"].startswith("no usable GPU: torch.cuda.is_available() is false")
    assert Runner(tmp_path / "c", probe=False).preflight("cuda")["reason"] == "disabled"


# ------------------------------ 4. the fingerprint: the devices torch sees

H100 = "NVIDIA H100 80GB HBM3"
NODE = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
        "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


def nvml_gpu(bus, name=H100, gen=5, width=16, nvlinks=18, memory=81559 * 2**20):
    return {"bus": bus, "name": name, "memory": memory, "gen": gen, "width": width,
            "gen_now": 1, "width_now": width, "nvlinks": nvlinks}  # idle: link at Gen1


def torch_sees(monkeypatch, buses, name=H100, pci_ids=True):
    """torch under CUDA_VISIBLE_DEVICES: only these devices, renumbered from 0."""
    props = []
    for bus in buses:
        domain, number, device, _ = pci(bus)
        extra = ({"pci_domain_id": domain, "pci_bus_id": number, "pci_device_id": device}
                 if pci_ids else {})
        props.append(SimpleNamespace(name=name, total_memory=81_008 * 2**20, **extra))
    see_gpus(monkeypatch, len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))


def fresh_fingerprint():
    return hardware.fingerprint.__wrapped__()  # not the session's cached one


def test_the_fingerprint_describes_the_gpus_torch_sees_not_the_whole_node(monkeypatch):
    # --perf-gpus 2,3 on an 8-GPU node: NVML still counts 8 and its index 0 is
    # another GPU; GPU 3 sits behind a Gen4 link.
    node = [nvml_gpu(b) for b in NODE]
    node[3] = nvml_gpu(NODE[3], gen=4)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node, p2p=0))
    torch_sees(monkeypatch, [NODE[2], NODE[3]])
    env = fresh_fingerprint()
    assert env["gpu_count"] == 2 and env["gpu_name"] == H100
    assert [g["pci_bus_id"] for g in env["gpus"]] == ["00000000:3a:00.0", "00000000:5d:00.0"]
    assert env["gpu_memory_bytes"] == 81559 * 2**20  # NVML's total, as before
    assert env["interconnect"] == "nvlink" and env["gpu_p2p"] is True
    assert (env["driver"], env["driver_cuda"], env["nccl"]) == ("550.54.15", "12.4", "2.27.3")
    # the link the GPUs train to (the slowest of the two), and the idle link as read
    assert (env["pcie_gen"], env["pcie_width"]) == (4, 16)
    assert (env["pcie_gen_current"], env["pcie_width_current"]) == (1, 16)
    assert [g["pcie_gen"] for g in env["gpus"]] == [5, 4]
    assert hardware.profile_id(env) == "h100-80gb-hbm3-80gb-x2-nvlink"


def test_pcie_gpus_without_peer_access_are_recorded_so(monkeypatch):
    node = [nvml_gpu(b, name="NVIDIA H100 PCIe", nvlinks=0) for b in NODE[:4]]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node, p2p=4))  # disabled by regkey
    torch_sees(monkeypatch, NODE[:4], name="NVIDIA H100 PCIe")
    env = fresh_fingerprint()
    assert env["interconnect"] == "pcie" and env["gpu_p2p"] is False
    assert hardware.profile_id(env) == "h100-pcie-80gb-x4-pcie"


def test_a_device_nvml_cannot_find_keeps_torchs_facts_not_another_gpus(monkeypatch):
    node = [nvml_gpu(b, name="NVIDIA A100-SXM4-80GB") for b in NODE]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node))
    torch_sees(monkeypatch, [NODE[6]], pci_ids=False)  # a torch without PCI ids
    env = fresh_fingerprint()
    assert env["gpu_count"] == 1 and env["gpu_name"] == H100
    assert env["gpu_memory_bytes"] == 81_008 * 2**20 and env["interconnect"] is None
    assert env["pcie_gen"] is None and env["driver"] == "550.54.15"


def test_one_gpu_has_no_link_to_name_whatever_its_nvlinks(monkeypatch):
    # The H100 SXM5 of the first real run: one GPU, its NVLinks idle (no peer),
    # which the fingerprint used to call "pcie".
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([nvml_gpu(NODE[0], nvlinks=0)]))
    torch_sees(monkeypatch, [NODE[0]])
    env = fresh_fingerprint()
    assert env["gpu_count"] == 1 and env["interconnect"] is None
    assert hardware.profile_id(env) == "h100-80gb-hbm3-80gb-x1"
    # and a 1-GPU env written before (interconnect "pcie") names the same profile
    assert hardware.profile_id({**env, "interconnect": "pcie"}) == "h100-80gb-hbm3-80gb-x1"


def test_nvlink_is_what_nvml_says_of_the_pairs_not_of_each_gpus_links(monkeypatch):
    # Each GPU has active NVLinks (to the NVSwitches of a larger node), but NVML
    # reports no NVLink peer-to-peer between the two torch sees: not "nvlink".
    node = [nvml_gpu(b) for b in NODE[:2]]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node, p2p=0, nvlink_p2p=NOT_SUPPORTED))
    torch_sees(monkeypatch, NODE[:2])
    env = fresh_fingerprint()
    assert env["interconnect"] == "pcie" and env["gpu_p2p"] is True
    assert hardware.profile_id(env) == "h100-80gb-hbm3-80gb-x2-pcie"
    # NVLink between them without the per-GPU link query: NVML's pair status decides
    bridged = [nvml_gpu(b, nvlinks=0) for b in NODE[:2]]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(bridged, p2p=0, nvlink_p2p=0))
    assert fresh_fingerprint()["interconnect"] == "nvlink"


def test_without_a_pair_answer_every_gpus_active_nvlinks_decide(monkeypatch):
    node = [nvml_gpu(b) for b in NODE[:4]]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node, nvlink_p2p=NVMLError))
    torch_sees(monkeypatch, NODE[:4])
    assert fresh_fingerprint()["interconnect"] == "nvlink"
    node[1] = nvml_gpu(NODE[1], nvlinks=0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(node, nvlink_p2p=NVMLError))
    assert fresh_fingerprint()["interconnect"] == "mixed"


def test_pcie_bandwidth_per_generation():
    assert hardware.pcie_gbps(5, 16) == pytest.approx(63.0, abs=0.01)
    assert hardware.pcie_gbps(4, 16) == pytest.approx(31.5, abs=0.01)
    assert hardware.pcie_gbps(3, 8) == pytest.approx(7.88)
    assert hardware.pcie_gbps(None, 16) is None and hardware.pcie_gbps(7, 16) is None
