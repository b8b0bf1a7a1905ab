"""Where NVIDIA installs nsys, and whether an install can write reports.

nsys records a capture into a .qdstrm file; its install's QdstrmImporter
turns that into the .nsys-rep report `nsys stats` reads. Nsight Systems lays
an install out as ``<install>/target-linux-*/nsys`` (and ``bin/nsys``) with
the importer in ``<install>/host-linux-*/``, where its nsys looks for it.
Other places an nsys turns up do not always have one: Nsight
Compute bundles an nsys (``<ncu>/host/target-linux-x64/nsys``) whose
``host/`` has no ``host-linux-*`` folder; a QdstrmImporter in its desktop
folder (``host/linux-desktop-glibc_2_11_3-x64/``) is not this nsys's, and on
the lent H100 image that nsys wrote a .qdstrm and no report. So an install
is described with what was found where nsys looks, and the search prefers
one whose importer is there.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

SEARCH_ROOT_ENV = "PERFSUITE_NSYS_SEARCH_ROOT"  # the tree the paths below are under (tests: a fake one)

NSIGHT_SYSTEMS = "Nsight Systems"
CUDA_TOOLKIT = "CUDA toolkit"
NSIGHT_COMPUTE = "Nsight Compute's bundled nsys"

# Where NVIDIA's installers and the distributions' packages put nsys, under
# the search root; a '*' is a version (2025.3.1, cuda-12.8) or an arch (x64).
INSTALL_GLOBS: tuple[tuple[str, str], ...] = (
    (NSIGHT_SYSTEMS, "opt/nvidia/nsight-systems/*/bin/nsys"),
    (NSIGHT_SYSTEMS, "opt/nvidia/nsight-systems/*/target-linux-*/nsys"),
    (NSIGHT_SYSTEMS, "opt/nvidia/nsight-systems-cli/*/bin/nsys"),
    (NSIGHT_SYSTEMS, "opt/nvidia/nsight-systems-cli/*/target-linux-*/nsys"),
    (NSIGHT_SYSTEMS, "usr/lib/nsight-systems/bin/nsys"),
    (NSIGHT_SYSTEMS, "usr/lib/nsight-systems/target-linux-*/nsys"),
    (NSIGHT_SYSTEMS, "usr/local/cuda*/nsight-systems-*/bin/nsys"),
    (NSIGHT_SYSTEMS, "usr/local/cuda*/nsight-systems-*/target-linux-*/nsys"),
    (CUDA_TOOLKIT, "usr/local/cuda/bin/nsys"),
    (CUDA_TOOLKIT, "usr/local/cuda-*/bin/nsys"),
    (NSIGHT_COMPUTE, "opt/nvidia/nsight-compute/*/host/target-linux-*/nsys"),
)
_KIND_ORDER = {NSIGHT_SYSTEMS: 2, CUDA_TOOLKIT: 1, NSIGHT_COMPUTE: 0}
# Where an nsys looks for its QdstrmImporter, under its install.
IMPORTER_GLOB = "host-linux-*/QdstrmImporter"
_VERSION = re.compile(r"^(?:nsight-systems-(?:cli-)?)?(\d{4}\.\d+(?:\.\d+)*)$")


@dataclass(frozen=True)
class NsysInstall:
    """One nsys binary and what its install has beside it.

    found_by: "$PERFSUITE_NSYS_BIN", "PATH", "given" or one of the kinds
    above; version: the year.release folder it lives in ("" unknown);
    importer: the QdstrmImporter where nsys looks for it (IMPORTER_GLOB);
    recognised: the folder is laid out as NVIDIA's installs are
    (``target-linux-*`` beside the binary's folder), so a missing importer
    there is known to be missing; elsewhere: a QdstrmImporter in another
    folder of the install, which this nsys does not use (Nsight Compute's
    desktop folder has one).
    """

    binary: str
    found_by: str
    version: str = ""
    importer: str | None = None
    recognised: bool = False
    elsewhere: str | None = None

    @property
    def install(self) -> str:
        return str(Path(os.path.realpath(self.binary)).parent.parent)

    @property
    def can_import(self) -> bool | None:
        """True: its importer is there; False: known to be missing; None: cannot tell."""
        if self.importer:
            return True
        return False if self.recognised else None

    @property
    def importer_place(self) -> str:
        """Where this nsys looks for its QdstrmImporter, for a message."""
        return str(Path(self.install) / IMPORTER_GLOB.rpartition("/")[0])

    def describe(self, imported: bool | None = None) -> str:
        """One line for `perfsuite doctor` and the profiler notes; ``imported``:
        whether a capture was seen to become a report (the doctor's capture
        test), which a line never contradicts."""
        what = self.found_by + (f" {self.version}" if self.version else "")
        if self.can_import and imported is False:
            can = f"{self.importer} is there, yet did not import the capture"
        elif self.can_import:
            can = f"imports captures ({self.importer})"
        elif self.can_import is False and imported:
            can = f"imports captures, with no QdstrmImporter in {self.importer_place}"
        elif self.can_import is False:
            unused = f" (it does not use {self.elsewhere})" if self.elsewhere else ""
            can = (f"no QdstrmImporter in {self.importer_place}, where nsys looks for it{unused}: "
                   "captures stay .qdstrm")
        else:
            can = "importer not found beside it (layout not recognised)"
        return f"{self.binary} ({what}; {can})"


def search_root() -> Path:
    return Path(os.environ.get(SEARCH_ROOT_ENV) or "/")


def _version(path: str) -> str:
    for part in reversed(Path(os.path.realpath(path)).parts):
        match = _VERSION.match(part)
        if match:
            return match.group(1)
    return ""


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")) if version else ()


def _first_executable(paths) -> str | None:
    return next((str(p) for p in sorted(paths) if os.access(p, os.X_OK)), None)


def describe(binary: str, found_by: str) -> NsysInstall:
    """What is beside ``binary``: its install is the folder above the one it
    is in (``<install>/bin/nsys``, ``<install>/target-linux-x64/nsys``), its
    importer in ``<install>/host-linux-*/`` (IMPORTER_GLOB). A QdstrmImporter
    anywhere else in the install (directly in it, or in another folder) is
    only noted: that nsys did not use one in Nsight Compute's desktop folder."""
    install = Path(os.path.realpath(binary)).parent.parent
    recognised = any(install.glob("target-linux-*"))
    importer = _first_executable(install.glob(IMPORTER_GLOB))
    elsewhere = None if importer else _first_executable(
        [*install.glob("QdstrmImporter"), *install.glob("*/QdstrmImporter")])
    return NsysInstall(binary, found_by, _version(binary), importer, recognised, elsewhere)


def _rank(found: NsysInstall) -> tuple:
    importer = {True: 2, None: 1, False: 0}[found.can_import]
    return (importer, _KIND_ORDER.get(found.found_by, 0), _version_key(found.version))


def installed(root: str | os.PathLike | None = None) -> list[NsysInstall]:
    """Every nsys under NVIDIA's install folders, best first: one that can
    import its captures, then Nsight Systems' own install, then the newest."""
    base = Path(root) if root is not None else search_root()
    seen: set[str] = set()
    found: list[NsysInstall] = []
    for kind, pattern in INSTALL_GLOBS:
        for path in sorted(base.glob(pattern)):
            real = os.path.realpath(path)
            if real in seen or not (os.path.isfile(path) and os.access(path, os.X_OK)):
                continue
            seen.add(real)
            found.append(describe(str(path), kind))
    return sorted(found, key=_rank, reverse=True)


def where_searched() -> str:
    """The folders installed() looks in, for a message."""
    tops = list(dict.fromkeys("/".join(pattern.split("/")[:3]) for _, pattern in INSTALL_GLOBS))
    tops = [t for t in tops if not any(o != t and fnmatch.fnmatchcase(t, o) for o in tops)]
    return ", ".join(str(search_root() / top) for top in tops)
