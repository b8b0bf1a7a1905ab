"""Finding nsys where NVIDIA installs it, and telling an install that can
write reports from one that leaves .qdstrm captures: a fake file tree under
$PERFSUITE_NSYS_SEARCH_ROOT, fake nsys binaries (small scripts). The lent
H100 image's Nsight Compute folder is built as it was measured
(tests/fixtures/nsys/h100-nsight-compute/layout.txt): the resolver, the
profiler choice, a profile cell's launch and the doctor's line on it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfsuite.doctor import checks as doctor
from perfsuite.doctor import facts as doctor_facts
from perfsuite.profiling import nsys
from perfsuite.profiling.nsys_installs import NSIGHT_COMPUTE, NSIGHT_SYSTEMS, SEARCH_ROOT_ENV, installed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"

# nsys of Nsight Systems' own layout, for the doctor's 1-second capture: a
# report where its install has its importer (``host-linux-*/QdstrmImporter``),
# else only the .qdstrm.
FAKE_NSYS = f"""#!{sys.executable}
import glob, os, sys
out = sys.argv[sys.argv.index("-o") + 1]
install = os.path.dirname(os.path.dirname(os.path.realpath(sys.argv[0])))
importer = glob.glob(os.path.join(install, "host-linux-*", "QdstrmImporter"))
open(out + (".nsys-rep" if importer else ".qdstrm"), "wb").write(b"x")
"""

# The nsys bundled with Nsight Compute on the lent H100 image, as it behaved
# there: `nsys profile` leaves only the .qdstrm, whatever lies beside it.
# Its `--version` answer was not recorded: this one has nsys's form and the
# version of its folder. Every call's argv goes to the log.
NSIGHT_COMPUTE_NSYS = """#!{python}
import json, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:1] == ["--version"]:
    print("NVIDIA Nsight Systems version {version}")
    sys.exit(0)
assert args[:1] == ["profile"], args
flag = "-o" if "-o" in args else "--output"
open(args[args.index(flag) + 1] + ".qdstrm", "wb").write(b"QDSTRM")
print("Importer error status: Importation failed.", file=sys.stderr)
"""


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty machine: no nsys on PATH, none set, nothing remembered."""
    monkeypatch.setenv(SEARCH_ROOT_ENV, str(tmp_path / "root"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.delenv(nsys.NSYS_BIN_ENV, raising=False)
    monkeypatch.setattr(nsys, "_IMPORT_FAILED", {})
    return tmp_path / "root"


def _binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_NSYS)
    path.chmod(0o755)
    return path


def nsight_systems(root, version, importer=True, cli=False):
    install = root / "opt" / "nvidia" / ("nsight-systems-cli" if cli else "nsight-systems") / version
    (install / "target-linux-x64").mkdir(parents=True)
    if importer:
        _binary(install / "host-linux-x64" / "QdstrmImporter")
    return _binary(install / "bin" / "nsys")


def nsight_compute(root, version="2025.3.1"):
    """The lent H100 image's only nsys: Nsight Compute's, laid out as it was
    there (tests/fixtures/nsys/h100-nsight-compute/layout.txt), a
    QdstrmImporter in its desktop folder included; its calls are logged in
    ``<binary>.calls``."""
    binary = None
    for line in (FIXTURES / "h100-nsight-compute" / "layout.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, rel = line.split()
        path = root / rel.format(version=version)
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "nsys":
            binary = path
            path.write_text(NSIGHT_COMPUTE_NSYS.format(python=sys.executable, log=str(calls(path)),
                                                       version=version))
        else:
            path.write_text("#!/bin/sh\nexit 0\n" if kind == "exec" else "")
        path.chmod(0o755 if kind in ("nsys", "exec") else 0o644)
    return binary


def calls(binary: Path) -> Path:
    return binary.with_name(binary.name + ".calls")


def called(binary: Path) -> list[list[str]]:
    log = calls(binary)
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_h100_layout_is_the_one_measured(root):
    bundled = nsight_compute(root)
    ncu = root / "opt" / "nvidia" / "nsight-compute" / "2025.3.1"
    desktop = ncu / "host" / "linux-desktop-glibc_2_11_3-x64" / "QdstrmImporter"
    assert bundled == ncu / "host" / "target-linux-x64" / "nsys" and os.access(desktop, os.X_OK)
    assert sorted(p.name for p in (root / "opt" / "nvidia").iterdir()) == [
        "entrypoint.d", "nsight-compute", "nvidia_entrypoint.sh"]
    seen = (Path(__file__).resolve().parents[1] / "data" / "h100-2026-11-26" / "doctor.txt").read_text()
    for path in (bundled, desktop):
        assert "/" + str(path.relative_to(root)) in seen
    # the stand-in answers as that nsys did: its version, a capture that stays .qdstrm
    version = subprocess.run([str(bundled), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "NVIDIA Nsight Systems version 2025.3.1"
    written, what = doctor_facts.nsys_capture(str(bundled))
    assert not written and what.startswith("left only a .qdstrm capture")
    assert [args[0] for args in called(bundled)] == ["--version", "profile"]


def test_nsight_computes_nsys_does_not_count_the_importer_of_its_desktop_folder(root):
    bundled = nsight_compute(root)
    desktop = bundled.parent.parent / "linux-desktop-glibc_2_11_3-x64" / "QdstrmImporter"
    found = nsys.locate_nsys()
    assert found.binary == str(bundled) and nsys.resolve_nsys() == str(bundled)
    assert found.found_by == NSIGHT_COMPUTE and found.version == "2025.3.1"
    assert found.importer is None and found.can_import is False
    line = found.describe()
    assert "imports captures" not in line and "no QdstrmImporter in" in line
    assert f"host-linux-*, where nsys looks for it (it does not use {desktop})" in line
    assert called(bundled) == []  # told from the layout, without running nsys


@pytest.mark.parametrize("requested", ["auto", "nsys"])
def test_the_h100_layout_gives_torch_profiler_before_any_launch(root, requested):
    """`--perf-profiler nsys` as the default: torch.profiler where nsys cannot
    work (as without a GPU or without nsys), the note naming the nsys and the fix."""
    bundled = nsight_compute(root)
    mode, why = nsys.choose_profiler(requested, cuda_available=True)
    assert mode == "torch" and why.startswith(".qdstrm only: nsys could not import its capture")
    assert str(bundled) in why and str(bundled.parent.parent / "host-linux-*") in why
    assert "or set $PERFSUITE_NSYS_BIN to the bin/nsys of one" in why
    assert why.endswith("using torch.profiler instead")
    assert called(bundled) == []


def test_a_profile_cell_on_the_h100_layout_is_one_launch_under_torch_profiler(root, monkeypatch):
    """The launch path on that machine, its torchrun agent stood in for: one
    launch, no nsys in it, the torch.profiler summary its ranks wrote."""
    from cellkit import tiny_image_cell

    from perfsuite.launch import launch, starting
    from perfsuite.profiling import fallback
    from perfsuite.profiling.summary import ProfileRow, ProfileSummary

    bundled = nsight_compute(root)
    profile = ProfileSummary("torch", [ProfileRow("forward", "nvtx", 0.3, 3)], rank=0, steps=3).to_dict()
    launches = []

    def start_agent(argv, log_fd, env):
        launches.append((argv, env))
        out = Path(argv[argv.index("--out") + 1])
        samples = [0.101, 0.102, 0.103]
        record = {"rank": 0, "status": "ok", "steps": 3, "run_token": env["PERFSUITE_RUN_TOKEN"],
                  "metrics": {"step_time": {"value": 0.102, "unit": "s", "samples": samples}},
                  "profile": profile if env["PERFSUITE_PROFILER"] == "torch" else None}
        (out / "rank0.json").write_text(json.dumps(record))
        return subprocess.Popen([sys.executable, "-c", "pass"], stdout=log_fd, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def second_launch(*args, **kwargs):
        raise AssertionError("a second, profile-only launch")

    monkeypatch.setattr(launch, "gpus_present", lambda: 1)
    # torchrun's agent as a fresh interpreter (no zygote), whose launch is this fake
    monkeypatch.setattr(starting, "choose", lambda opts, *rest, **kw: (starting.ExecStarter(opts.python), None))
    monkeypatch.setattr(starting, "fresh_agent", start_agent)
    monkeypatch.setattr(fallback, "profile_with_torch", second_launch)
    cell = tiny_image_cell(device="cuda", world_size=1, profile=True)
    result = launch.run_cell(cell, root.parent / "out", launch.LaunchOptions())
    assert result["status"] == "ok", (result.get("reason"), result.get("output_tail"))
    (argv, env), = launches
    assert env["PERFSUITE_PROFILER"] == "torch" and not any("nsys" in part for part in argv)
    assert called(bundled) == []
    assert result["profile"]["source"] == "torch" and result["profile"]["rows"][0]["name"] == "forward"
    profiler = result["profiler"]
    assert profiler["mode"] == "torch" and "error" not in profiler and "profile_launch" not in profiler
    assert str(bundled) in profiler["note"] and profiler["note"].endswith("using torch.profiler instead")


def test_a_full_nsight_systems_install_is_preferred_then_the_newest(root):
    nsight_compute(root, "2026.1.0")
    nsight_systems(root, "2025.6.1", importer=False)  # newest, but cannot import
    nsight_systems(root, "2024.5.1")
    chosen = nsight_systems(root, "2025.1.1", cli=True)
    assert [(i.found_by, i.version, i.can_import) for i in installed()] == [
        (NSIGHT_SYSTEMS, "2025.1.1", True), (NSIGHT_SYSTEMS, "2024.5.1", True),
        (NSIGHT_SYSTEMS, "2025.6.1", False), (NSIGHT_COMPUTE, "2026.1.0", False)]
    assert nsys.resolve_nsys() == str(chosen)
    assert nsys.choose_profiler("auto", cuda_available=True) == ("nsys", "")


def test_cuda_toolkit_links_are_one_install_and_an_unknown_layout_beats_a_known_missing_importer(root):
    bundled = nsight_compute(root)
    wrapper = _binary(root / "usr" / "local" / "cuda-12.8" / "bin" / "nsys")  # a script that runs nsys
    (root / "usr" / "local" / "cuda").symlink_to(root / "usr" / "local" / "cuda-12.8")
    found = installed()
    assert [i.binary for i in found] == [str(root / "usr" / "local" / "cuda" / "bin" / "nsys"), str(bundled)]
    assert found[0].can_import is None and os.path.realpath(found[0].binary) == str(wrapper)


def test_PATH_and_PERFSUITE_NSYS_BIN_come_first(root, tmp_path, monkeypatch):
    full = nsight_systems(root, "2024.5.1")
    on_path = _binary(tmp_path / "bin" / "nsys")  # a layout nothing is known of: used as it is
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert nsys.resolve_nsys() == str(on_path)
    # PATH's nsys known to lack its importer gives way to an install that has one
    broken = nsight_compute(tmp_path)
    monkeypatch.setenv("PATH", str(broken.parent))
    assert nsys.resolve_nsys() == str(full)
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(broken))
    assert nsys.resolve_nsys() == str(broken)
    assert nsys.choose_profiler("auto", cuda_available=True)[0] == "torch"


def test_nothing_anywhere_names_where_it_looked(root):
    with pytest.raises(nsys.NsysNotFoundError) as err:
        nsys.resolve_nsys()
    assert str(root / "opt" / "nvidia" / "nsight-systems") in str(err.value)
    assert str(root / "opt" / "nvidia" / "nsight-compute") in str(err.value)
    mode, why = nsys.choose_profiler("auto", cuda_available=True)
    assert mode == "torch" and "nsys not found" in why and str(root / "usr" / "local" / "cuda*") in why


def test_doctor_names_the_nsys_it_found_and_whether_it_imports(root, monkeypatch):
    bundled = nsight_compute(root)
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN
    assert check.message.startswith(f"{bundled} ({NSIGHT_COMPUTE} 2025.3.1; no QdstrmImporter in ")
    assert "left only a .qdstrm capture" in check.message and "torch.profiler" in check.message
    assert "install the full Nsight Systems package" in check.fix
    full = nsight_systems(root, "2024.5.1")
    check = doctor.check_nsys("gate")
    assert check.status == doctor.OK
    assert check.message.startswith(f"{full} ({NSIGHT_SYSTEMS} 2024.5.1; imports captures (")
    assert "wrote doctor.nsys-rep" in check.message and f"also found: {bundled}" in check.message
    # one chosen by hand that leaves .qdstrm: the fix names the install that imports
    monkeypatch.setenv(nsys.NSYS_BIN_ENV, str(bundled))
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN and check.fix.startswith(f"set $PERFSUITE_NSYS_BIN={full}")
    assert doctor_facts.nsys_binary()[0].found_by == "$PERFSUITE_NSYS_BIN"


def test_doctor_on_the_h100_layout_says_one_thing(root):
    """The line seen there named the desktop folder's importer as one that
    imports captures, then said the install lacks it."""
    bundled = nsight_compute(root)
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN
    assert check.message.startswith(f"{bundled} ({NSIGHT_COMPUTE} 2025.3.1; no QdstrmImporter in "
                                    f"{bundled.parent.parent / 'host-linux-*'}, where nsys looks for it")
    assert "imports captures" not in check.message and "lacks" not in check.message
    assert "left only a .qdstrm capture" in check.message
    assert "profile cells use torch.profiler from the start" in check.message
    assert [args[0] for args in called(bundled)] == ["profile"]  # the capture test still runs
    assert "install the full Nsight Systems package" in check.fix and "$PERFSUITE_NSYS_BIN" in check.fix


def test_doctor_never_says_imports_captures_of_an_nsys_whose_capture_stayed_qdstrm(root):
    full = nsight_systems(root, "2024.5.1")
    importer = full.parent.parent / "host-linux-x64" / "QdstrmImporter"
    full.write_text(NSIGHT_COMPUTE_NSYS.format(python=sys.executable, log=str(calls(full)), version="2024.5.1"))
    assert nsys.locate_nsys().can_import is True  # the layout alone says it can
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN and "imports captures" not in check.message
    assert check.message.startswith(f"{full} ({NSIGHT_SYSTEMS} 2024.5.1; {importer} is there, yet did not "
                                    "import the capture) left only a .qdstrm capture")
    assert "torch.profiler" in check.message


def test_doctor_never_says_captures_stay_qdstrm_of_an_nsys_that_wrote_a_report(root):
    bundled = nsight_compute(root)
    bundled.write_text(FAKE_NSYS.replace('if importer else ".qdstrm"', 'if True else ".qdstrm"'))
    check = doctor.check_nsys("gate")
    assert check.status == doctor.WARN and "stay .qdstrm" not in check.message
    assert check.message.startswith(f"{bundled} ({NSIGHT_COMPUTE} 2025.3.1; imports captures, with no "
                                    f"QdstrmImporter in {bundled.parent.parent / 'host-linux-*'}) wrote doctor.nsys-rep")
    assert check.message.endswith("profile cells use torch.profiler") and "$PERFSUITE_NSYS_BIN" in check.fix
