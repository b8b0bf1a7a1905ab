"""perfsuite doctor: this machine as it is, and GPU machines played on it
(torch, NVML, statvfs and nsys answers replaced; never skipped). Why torch
sees no GPU is hardware.why_no_gpu's answer, asked of the played torch and NVML."""

import gzip
import json
import os
import struct
import sys
import time
import warnings
from types import SimpleNamespace

import pytest

from perfsuite import hardware
from perfsuite.cli.main import main
from perfsuite.doctor import checks as doctor
from perfsuite.doctor import facts as doctor_facts

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


def gpu_torch(count=4, cuda="12.8", version="2.14.0", **more):
    return {"version": f"{version}+cu{cuda.replace('.', '')}", "cuda": cuda, "hip": None, "count": count,
            "names": [H100] * count, "error": None, "nccl": "2.27.3", "torchvision": "0.29.2", **more}


def gpu_nvml(count=4, driver="570.86.10", cuda="12.8"):
    return {"error": None, "count": count, "driver": driver, "cuda": cuda, "names": [H100] * count}


def played_nvml(nvml):
    """pynvml as it answers on the played machine (``raised``: what nvmlInit raises)."""
    def init():
        if nvml.get("error"):
            raise nvml.get("raised") or RuntimeError(nvml["error"])

    major, minor = (int(x) for x in str(nvml.get("cuda") or "0.0").split("."))
    return SimpleNamespace(nvmlInit=init, nvmlShutdown=lambda: None,
                           nvmlSystemGetDriverVersion=lambda: nvml.get("driver"),
                           nvmlSystemGetCudaDriverVersion=lambda: major * 1000 + minor * 10,
                           nvmlDeviceGetCount=lambda: nvml.get("count"))


def played_why_no_gpu(state, why_no_gpu):
    """hardware.why_no_gpu asked of the played torch and NVML (torch says why
    it sees no GPU as a warning, as torch.cuda.is_available does)."""
    def ask():
        import torch

        facts = state["torch"]

        def is_available():
            if facts.get("error"):
                warnings.warn(f"CUDA initialization: {facts['error']}", stacklevel=2)
            return facts.get("count", 0) > 0

        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch.cuda, "is_available", is_available)
            m.setattr(torch.cuda, "device_count", lambda: facts.get("count", 0))
            m.setattr(torch.version, "cuda", facts.get("cuda"))
            m.setattr(torch, "__version__", facts.get("version"))
            m.setitem(sys.modules, "pynvml", played_nvml(state["nvml"]))
            return why_no_gpu()
    return ask


def launched(device, status="ok", reason=None, tail="", wall_s=11.5):
    """What doctor_facts.tiny_launch answers after a 1-rank launch on ``device``."""
    return {"device": device, "status": status, "reason": reason, "wall_s": wall_s, "tail": tail}


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A 4-GPU machine with room everywhere, a working nsys, and a torchrun that
    launches (``launches``: the devices a launch was asked for); tests change one answer."""
    state = {"torch": gpu_torch(), "nvml": gpu_nvml(), "shm": (32 * GIB, 32 * GIB),
             "disk": (500e9, 200e9), "launch": {}, "launches": []}

    def tiny_launch(device):
        state["launches"].append(device)
        return {**launched(device), **state["launch"]}

    monkeypatch.setattr(doctor_facts, "tiny_launch", tiny_launch)
    monkeypatch.setattr(doctor_facts, "torch_facts", lambda: state["torch"])
    monkeypatch.setattr(doctor_facts, "nvml_facts", lambda: state["nvml"])
    monkeypatch.setattr(doctor_facts, "statvfs",
                        lambda path: state["shm"] if path == "/dev/shm" else state["disk"])
    monkeypatch.setattr(hardware, "why_no_gpu", played_why_no_gpu(state, hardware.why_no_gpu))
    monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nsys(tmp_path, monkeypatch, "report")
    return state


def fake_nsys(tmp_path, monkeypatch, behaviour):
    """An `nsys` on PATH: `report` writes <-o>.nsys-rep, `qdstrm` only a .qdstrm,
    `fail` exits 1, `hang` sleeps (for the time limit)."""
    bin_dir = tmp_path / "nsys-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n"
        f"behaviour = {behaviour!r}\n"
        "if behaviour == 'report': open(out + '.nsys-rep', 'wb').write(b'rep')\n"
        "if behaviour == 'qdstrm': open(out + '.qdstrm', 'wb').write(b'raw')\n"
        "if behaviour == 'fail': print('Error: no permission to collect'); sys.exit(1)\n"
        "if behaviour == 'hang': time.sleep(60)\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PERFSUITE_NSYS_BIN", raising=False)
    return script


def by_name(checks):
    return {c.name: c for c in checks}


def doctor_cli(capsys, *args):
    code = main(["doctor", *args])
    return code, capsys.readouterr().out


# -- this machine, as it is --------------------------------------------------

@pytest.mark.slow
def test_gate_on_this_machine_says_whether_torch_sees_a_gpu_and_why(capsys):
    code, out = doctor_cli(capsys, "--tier", "gate")
    facts = doctor_facts.torch_facts()
    if facts.get("count"):
        assert "torch sees no GPU" not in out
        return
    assert code == 1
    (line,) = [line for line in out.splitlines() if line.startswith("BLOCKER  gpus")]
    assert "torch sees no GPU: " in line and "Fix: " in line
    if facts.get("cuda") is None:
        assert "CPU-only build" in line
    else:  # a CUDA build with no GPU in sight says what torch and NVML said
        assert "torch says:" in line or "NVML" in line
    assert "nothing blocks" not in out and "blocker(s): the gate tier cannot run here" in out
    code, out = doctor_cli(capsys, "--tier", "smoke")
    assert code == 0 and "the CPU tier needs no GPU" in out


# -- GPU machines, played --------------------------------------------------------

def test_a_healthy_gpu_machine_passes_the_gate_tier(machine, capsys):
    code, out = doctor_cli(capsys, "--tier", "gate")
    assert code == 0, out
    assert "torch sees 4 GPU(s) (NVIDIA H100 80GB HBM3); NVML sees 4" in out
    assert "NVIDIA driver 570.86.10 runs CUDA up to 12.8; torch's CUDA 12.8 fits" in out
    assert "NCCL 2.27.3" in out and ".nsys-rep from a 1-second capture" in out
    assert "WARN" not in out.upper().replace("WARNING", "") and "BLOCKER" not in out


def test_a_driver_older_than_torchs_cuda_is_a_blocker_with_the_wheel_index(machine):
    machine["torch"] = gpu_torch(count=0, cuda="13.0",
                                 error="The NVIDIA driver on your system is too old (found version 12080)")
    machine["nvml"] = gpu_nvml(driver="570.86.10", cuda="12.8")
    checks = by_name(doctor.run_checks(tier="gate"))
    assert checks["gpus"].status == doctor.BLOCKER
    assert "too old" in checks["gpus"].message and "NVML sees 4 GPU(s)" in checks["gpus"].message
    assert "the driver is older than the CUDA 13.0 this torch needs" in checks["gpus"].message
    driver = checks["driver"]
    assert driver.status == doctor.BLOCKER and "cannot use the GPUs" in driver.message
    assert "https://download.pytorch.org/whl/cu128" in driver.fix and "R580" in driver.fix


def test_a_newer_cuda_minor_than_the_driver_warns():
    check = doctor.check_driver(gpu_torch(cuda="12.8"), gpu_nvml(driver="560.35.03", cuda="12.6"), True)
    assert check.status == doctor.WARN and "minor-version compatibility" in check.message
    assert "whl/cu126" in check.fix
    too_old = doctor.check_driver(gpu_torch(cuda="12.8"), gpu_nvml(driver="550.54.14", cuda="12.4"), True)
    assert "12.6 or newer" in too_old.fix  # no current wheel index fits


def test_a_cpu_only_torch_build_blocks_gpu_tiers_and_names_the_index(machine):
    machine["torch"] = {"version": "2.14.0+cpu", "cuda": None, "hip": None, "count": 0, "names": [],
                        "error": None, "nccl": None}
    checks = by_name(doctor.run_checks(tier="full"))
    assert checks["torch"].status == doctor.BLOCKER and "CPU-only build" in checks["torch"].message
    assert "download.pytorch.org/whl/cu" in checks["torch"].fix
    assert checks["gpus"].status == doctor.BLOCKER and "CPU-only build" in checks["gpus"].message
    assert checks["nccl"].status == doctor.BLOCKER
    smoke = by_name(doctor.run_checks(tier="smoke"))
    assert {c.status for c in smoke.values()} == {doctor.OK}, smoke


def test_no_driver_at_all_says_nvml_fails_to_load(machine, capsys):
    machine["torch"] = gpu_torch(count=0, names=[], error="Found no NVIDIA driver on your system.")
    no_library = type("NVMLError_LibraryNotFound", (Exception,), {})("NVML Shared Library Not Found")
    machine["nvml"] = {"error": doctor_facts.nvml_error(no_library), "raised": no_library}
    code, out = doctor_cli(capsys, "--tier", "gate")
    assert code == 1
    gpus = [line for line in out.splitlines() if " gpus " in line][0]
    assert gpus.startswith("BLOCKER") and "Found no NVIDIA driver" in gpus
    assert ("NVML does not load (NVMLError_LibraryNotFound: NVML Shared Library Not Found): "
            "no NVIDIA driver is visible here") in gpus
    code, out = doctor_cli(capsys)  # no tier: nothing blocks, the lines say which tiers can run
    assert code == 0 and "the GPU tiers (gate, full) cannot run here; the CPU tier (smoke) can" in out


def test_torch_and_nvml_counts_that_differ_warn(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    machine["torch"] = gpu_torch(count=2)
    check = by_name(doctor.run_checks(tier="gate"))["gpus"]
    assert check.status == doctor.WARN
    assert "torch sees 2 GPU(s)" in check.message and "NVML sees 4" in check.message
    assert "CUDA_VISIBLE_DEVICES='0,1' hides some" in check.message
    assert "need more (up to 4): not run here, and listed as such (no failure)" in check.message


def test_hidden_gpus_are_named_as_the_reason(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    machine["torch"] = gpu_torch(count=0, names=[], error="No CUDA GPUs are available")
    check = by_name(doctor.run_checks(tier="gate"))["gpus"]
    assert check.status == doctor.BLOCKER and "CUDA_VISIBLE_DEVICES=''" in check.message
    assert "unset CUDA_VISIBLE_DEVICES" in check.fix


def test_dev_shm_is_sized_for_the_gpus_the_tier_drives(machine):
    # 16 GiB holds one GPU's 500 px batches, not those of the 4-GPU dp and ddp cells
    machine["shm"] = (16 * GIB, 16 * GIB)
    check = by_name(doctor.run_checks(tier="gate"))["shm"]
    assert check.status == doctor.WARN and "under the 26 GiB" in check.message
    assert "--ipc=host" in check.fix and "--shm-size=27g" in check.fix
    machine["torch"] = {**machine["torch"], "count": 1}
    assert by_name(doctor.run_checks(tier="gate"))["shm"].status == doctor.OK


def test_small_dev_shm_warns_of_bus_errors(machine):
    machine["shm"] = (64 * 2**20, 64 * 2**20)
    check = by_name(doctor.run_checks(tier="gate"))["shm"]
    assert check.status == doctor.WARN and "Bus error" in check.message and "--shm-size" in check.fix
    assert by_name(doctor.run_checks(tier="smoke"))["shm"].status == doctor.OK


def test_no_room_for_the_8b_checkpoint_blocks_gpu_tiers(machine, tmp_path):
    machine["disk"] = (500e9, 5e9)
    check = by_name(doctor.run_checks(tier="gate"))["disk"]
    assert check.status == doctor.BLOCKER and "16 GB" in check.message
    assert str(tmp_path / "cache") in check.message and "PERFSUITE_CACHE_DIR" in check.fix
    assert by_name(doctor.run_checks(tier="smoke"))["disk"].status == doctor.OK
    written = tmp_path / "cache" / doctor.LLM_CHECKPOINT_DIR
    written.mkdir(parents=True)
    (written / "model.pt").write_bytes(b"")
    check = by_name(doctor.run_checks(tier="gate"))["disk"]
    assert check.status == doctor.OK and "already there" in check.message


@pytest.mark.parametrize("behaviour, expected", [
    ("qdstrm", "QdstrmImporter"), ("fail", "exit 1 and no report"), ("hang", "did not end in 1 s")])
def test_an_nsys_that_cannot_write_a_report_warns(machine, tmp_path, monkeypatch, behaviour, expected):
    fake_nsys(tmp_path, monkeypatch, behaviour)
    monkeypatch.setattr(doctor_facts, "NSYS_TIMEOUT_S", 1.0)
    started = time.monotonic()
    check = doctor.check_nsys("gate")
    assert time.monotonic() - started < 20
    assert check.status == doctor.WARN and expected in check.message, check
    assert "torch.profiler" in check.message
    if behaviour == "fail":
        assert "no permission to collect" in check.message


def test_no_nsys_skips_the_capture(machine, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN and check.message.startswith("no nsys")
    assert "capture test is skipped" in check.message
    assert doctor.check_nsys("smoke").status == doctor.OK
    monkeypatch.setenv("PERFSUITE_NSYS_BIN", str(tmp_path / "nowhere" / "nsys"))
    check = doctor.check_nsys("gate")
    assert "$PERFSUITE_NSYS_BIN=" in check.message and "names no executable" in check.message


# -- MNIST --------------------------------------------------------------------

def idx(path, dims, zipped=False, cut=0):
    data = struct.pack(">BBBB", 0, 0, 0x08, len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    count = 1
    for d in dims:
        count *= d
    data += bytes(count - cut)
    if zipped:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def mnist_dir(root, test_labels=10, cut_train=0):
    root.mkdir()
    idx(root / "train-images-idx3-ubyte", (20, 28, 28), zipped=True, cut=cut_train)
    idx(root / "train-labels-idx1-ubyte", (20,), zipped=True)
    idx(root / "t10k-images-idx3-ubyte", (10, 28, 28))
    idx(root / "t10k-labels-idx1-ubyte", (test_labels,))
    return root


def test_mnist_files_are_checked_without_reading_them_all(machine, tmp_path, capsys):
    good = mnist_dir(tmp_path / "good")
    check = doctor.check_mnist(good, "full", doctor._tier_cells("full"))
    assert check.status == doctor.OK and "20 train, 10 test images" in check.message
    bad = mnist_dir(tmp_path / "bad", test_labels=9, cut_train=5)
    check = doctor.check_mnist(bad, "full", doctor._tier_cells("full"))
    assert check.status == doctor.BLOCKER
    assert "train-images-idx3-ubyte.gz" in check.message and "truncated" in check.message
    assert "test: 10 images but 9 labels" in check.message
    (good / "t10k-labels-idx1-ubyte").unlink()
    code, out = doctor_cli(capsys, "--tier", "full", "--data-dir", str(good))
    assert code == 1 and "t10k-labels-idx1-ubyte[.gz] missing" in out


def test_mnist_is_needed_by_the_full_tier_only(machine):
    assert doctor.check_mnist(None, "full", doctor._tier_cells("full")).status == doctor.BLOCKER
    gate = doctor.check_mnist(None, "gate", doctor._tier_cells("gate"))
    assert gate.status == doctor.OK and "bundled digits" in gate.message


def test_json_output(machine, capsys):
    machine["shm"] = (64 * 2**20, 64 * 2**20)
    code, out = doctor_cli(capsys, "--tier", "gate", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["tier"] == "gate"
    assert data["blockers"] == 0 and data["warnings"] == 1
    assert [c["name"] for c in data["checks"]] == ["env", "torch", "gpus", "driver", "nccl", "nsys", "shm",
                                                   "disk", "mnist", "extras", "history", "launch"]
    assert all(c["status"] in doctor.STATUSES for c in data["checks"])


# -- the torch perfsuite supports, and a launch that works ----------------------

def pyproject_requirements():
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    required = {Requirement(r).name: str(Requirement(r).specifier) for r in pyproject["project"]["dependencies"]}
    return {name: required[name] for name in ("torch", "torchvision")}


def test_the_supported_range_is_pyprojects(monkeypatch):
    assert doctor_facts.supported_versions() == pyproject_requirements()
    # installed from a wheel, not run from a checkout: the distribution's metadata says it
    monkeypatch.setattr(doctor_facts, "_checkout_pyproject", lambda: None)
    monkeypatch.setattr(doctor_facts.importlib.metadata, "requires", lambda name: [
        "torch>=2.11", "torchvision>=0.26", "pytest>=8.3", "psycopg[binary]>=3.2"])
    assert doctor_facts.supported_versions() == {"torch": ">=2.11", "torchvision": ">=0.26"}


@pytest.mark.parametrize("torch_version, torchvision, blocked", [
    ("2.10.0", "0.25.0", "torch 2.10.0+cu128"), ("2.11.0", "0.25.0", "torchvision 0.25.0"),
    ("2.11.0", "0.26.0", None), ("2.15.0.dev20261201", "0.30.0.dev20261201", None)])
def test_a_torch_outside_the_supported_range_is_a_blocker(machine, monkeypatch, torch_version, torchvision,
                                                            blocked):
    monkeypatch.setattr(doctor_facts, "supported_versions", lambda: {"torch": ">=2.11", "torchvision": ">=0.26"})
    machine["torch"] = gpu_torch(version=torch_version, torchvision=torchvision)
    for tier in ("smoke", "gate", None):
        check = by_name(doctor.run_checks(tier=tier))["torch"]
        if blocked:
            assert check.status == doctor.BLOCKER and blocked in check.message, check
            assert "outside the versions perfsuite supports" in check.message
            assert "torch>=2.11" in check.message and "torchvision>=0.26" in check.fix
        else:  # a nightly is newer than the range's floor, not outside it
            assert check.status == doctor.OK and "CUDA 12.8" in check.message, check


def test_gpu_tiers_launch_one_rank_on_a_gpu_and_the_cpu_tier_on_the_cpu(machine, capsys):
    code, out = doctor_cli(capsys, "--tier", "gate")
    assert code == 0 and machine["launches"] == ["cuda"]
    assert "ok       launch  a 1-rank torchrun launch of the probe on cuda worked (11.5 s)" in out
    assert "nothing blocks the gate tier" in out
    code, out = doctor_cli(capsys, "--tier", "smoke")
    assert code == 0 and machine["launches"] == ["cuda", "cpu"]
    machine["torch"] = gpu_torch(count=0, names=[], error="Found no NVIDIA driver on your system.")
    check = by_name(doctor.run_checks(tier="full"))["launch"]
    assert machine["launches"][-1] == "cpu" and check.status == doctor.OK
    assert "no GPU to launch on" in check.message


def test_a_launch_that_fails_blocks_every_tier_with_its_output(machine, capsys):
    tail = "\n".join([f"line {i}" for i in range(40)] + [
        "[default0]:unknown option --log-line-prefix-template=[rank${rank}]: ",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "])
    machine["launch"] = {"status": "error", "reason": "rank 0 died without a result (exit code 2)",
                         "tail": tail, "rank_tails": {0: "unknown option --log-line-prefix-template"}}
    for tier in ("gate", "smoke"):
        code, out = doctor_cli(capsys, "--tier", tier)
        assert code == 1 and f"1 blocker(s): the {tier} tier cannot run here" in out
        line = next(line for line in out.splitlines() if " launch " in line)
        assert line.startswith("BLOCKER") and "rank 0 died without a result (exit code 2)" in line
        assert "    | rank 0: unknown option --log-line-prefix-template\n" in out and "    | line 39\n" in out
        assert "line 5\n" not in out  # the tail, not the whole output
    machine["launch"] = {"status": "timeout", "reason": "no result within 180 s: rank 0 hung", "tail": ""}
    check = by_name(doctor.run_checks(tier="gate"))["launch"]
    assert check.status == doctor.BLOCKER and "rank 0 hung" in check.message


def test_a_real_tiny_launch_on_this_machines_cpu():
    answer = doctor_facts.tiny_launch("cpu")
    assert answer["status"] == "ok", answer
    assert answer["device"] == "cpu" and 0 < answer["wall_s"] < doctor_facts.LAUNCH_TIMEOUT_S


# -- the cache and the history store, as perfsuite run checks them before its first launch --

def test_a_cache_that_is_a_file_is_a_blocker_not_ok(machine, tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(a_file))
    for tier in ("smoke", "gate", None):
        check = by_name(doctor.run_checks(tier=tier))["disk"]
        assert check.status == doctor.BLOCKER, (tier, check)
        assert f"{a_file} is a file" in check.message and "$PERFSUITE_CACHE_DIR" in check.message
        assert "PERFSUITE_CACHE_DIR" in check.fix
    code, out = doctor_cli(capsys, "--tier", "smoke")
    assert code == 1 and "blocker(s): the smoke tier cannot run here" in out


def test_a_cache_folder_that_cannot_be_written_is_a_blocker(machine, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if os.fspath(path) == str(cache)
                        else real(path, mode, **kw))  # root writes anywhere: access(2) played
    check = by_name(doctor.run_checks(tier="smoke"))["disk"]
    assert check.status == doctor.BLOCKER and f"cannot write in {cache}" in check.message


@pytest.mark.parametrize("url, says", [("sqlit:///x.db", "no database kind 'sqlit'"),
                                       ("{file}/sub/h.sqlite", "is a file"),
                                       ("postgresql://u:secret@127.0.0.1:9/db", "cannot open it")])
def test_a_history_store_that_cannot_be_used_is_a_blocker(machine, tmp_path, monkeypatch, capsys, url, says):
    pytest.importorskip("psycopg")
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("PERFSUITE_HISTORY", url.format(file=tmp_path / "a-file"))
    check = by_name(doctor.run_checks(tier="smoke"))["history"]
    assert check.status == doctor.BLOCKER and says in check.message and "secret" not in check.message
    assert "$PERFSUITE_HISTORY" in check.message and "--history off" in check.fix
    code, out = doctor_cli(capsys, "--tier", "smoke")
    assert code == 1


def test_history_off_in_the_environment_is_said_as_off(machine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFSUITE_HISTORY", "off")
    check = by_name(doctor.run_checks(tier="smoke"))["history"]
    assert check.status == doctor.OK and check.message == "runs are kept in no history ($PERFSUITE_HISTORY=off)"
    assert not (tmp_path / "off").exists() and not (tmp_path / ".perfsuite").exists()


def test_a_usable_history_store_is_ok_and_not_created(machine, tmp_path, monkeypatch):
    monkeypatch.setenv("PERFSUITE_HISTORY", str(tmp_path / "new" / "h.sqlite"))
    check = by_name(doctor.run_checks(tier="smoke"))["history"]
    assert check.status == doctor.OK and str(tmp_path / "new" / "h.sqlite") in check.message
    assert not (tmp_path / "new").exists()


def test_a_perfsuite_variable_with_a_value_it_does_not_take_is_a_blocker_and_a_typo_a_warning(
        machine, monkeypatch, capsys):
    """Every other command refuses to start on such a value (exit 2); the
    doctor runs anyway and says which, so one command finds every problem."""
    check = by_name(doctor.run_checks(tier="smoke"))["env"]
    assert check.status == doctor.OK
    monkeypatch.setenv("PERFSUITE_FORK_AGENT", "maybe")
    monkeypatch.setenv("PERFSUITE_FORK_AGNT", "0")
    check = by_name(doctor.run_checks(tier="smoke"))["env"]
    assert check.status == doctor.BLOCKER
    assert "$PERFSUITE_FORK_AGENT is 'maybe'" in check.message and "it takes 0, 1" in check.message
    assert "did you mean PERFSUITE_FORK_AGENT?" in check.message
    assert "docs/reference/environment.md" in check.fix
    code, out = doctor_cli(capsys, "--tier", "smoke")
    assert code == 1 and "BLOCKER  env" in out
    monkeypatch.delenv("PERFSUITE_FORK_AGENT")
    check = by_name(doctor.run_checks(tier="smoke"))["env"]
    assert check.status == doctor.WARN and "did you mean PERFSUITE_FORK_AGENT?" in check.message
