"""Finding nsys where NVIDIA installs it, and telling an install that can
write reports from one that leaves .qdstrm captures: a fake file tree under
$PERFSUITE_NSYS_SEARCH_ROOT, fake nsys binaries (small scripts)."""

import os
import sys
from pathlib import Path

import pytest

from perfsuite.doctor import checks as doctor
from perfsuite.doctor import facts as doctor_facts
from perfsuite.profiling import nsys
from perfsuite.profiling.nsys_installs import NSIGHT_COMPUTE, NSIGHT_SYSTEMS, SEARCH_ROOT_ENV, installed

# nsys for the doctor's 1-second capture: a report where its install has the
# importer, else only the .qdstrm (as the one in Nsight Compute's folder did).
FAKE_NSYS = f"""#!{sys.executable}
import os, sys
out = sys.argv[sys.argv.index("-o") + 1]
install = os.path.dirname(os.path.dirname(os.path.realpath(sys.argv[0])))
importer = any(os.path.exists(os.path.join(install, d, "QdstrmImporter")) for d in os.listdir(install))
open(out + (".nsys-rep" if importer else ".qdstrm"), "wb").write(b"x")
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
    """The lent H100 image's only nsys: Nsight Compute's, without an importer."""
    host = root / "opt" / "nvidia" / "nsight-compute" / version / "host"
    (host / "linux-desktop-glibc_2_11_3-x64").mkdir(parents=True)
    return _binary(host / "target-linux-x64" / "nsys")


def test_nsight_computes_nsys_is_found_and_known_to_leave_qdstrm(root):
    bundled = nsight_compute(root)
    found = nsys.locate_nsys()
    assert found.binary == str(bundled) and nsys.resolve_nsys() == str(bundled)
    assert found.found_by == NSIGHT_COMPUTE and found.version == "2025.3.1"
    assert found.can_import is False and "no QdstrmImporter" in found.describe()
    # decided before any launch: torch.profiler, the reason naming the install
    mode, why = nsys.choose_profiler("auto", cuda_available=True)
    assert mode == "torch" and str(bundled.parent.parent) in why and why.endswith("using torch.profiler instead")


def test_a_profile_cell_on_such_a_machine_goes_to_torch_profiler_from_the_start(root):
    from cellkit import tiny_image_cell

    from perfsuite.launch.launch import LaunchOptions, profiler_mode

    bundled = nsight_compute(root)
    mode, note = profiler_mode(tiny_image_cell(device="cuda", world_size=1, profile=True), LaunchOptions())
    assert mode == "torch" and f"the install of {bundled}, has none" in note


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
