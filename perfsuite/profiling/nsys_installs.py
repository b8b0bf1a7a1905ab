"""Where NVIDIA installs nsys, and whether an install can write reports.

nsys records a capture into a .qdstrm file; its install's QdstrmImporter
turns that into the .nsys-rep report `nsys stats` reads. Nsight Systems'
own packages ship both. Other places an nsys turns up do not always: Nsight
Compute bundles one (``<ncu>/host/target-linux-x64/nsys``) that was seen to
write a .qdstrm and no report. So an install is described with what was
found beside it, and the search prefers one whose importer is there.
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
_VERSION = re.compile(r"^(?:nsight-systems-(?:cli-)?)?(\d{4}\.\d+(?:\.\d+)*)$")


@dataclass(frozen=True)
class NsysInstall:
    """One nsys binary and what its install has beside it.

    found_by: "$PERFSUITE_NSYS_BIN", "PATH", "given" or one of the kinds
    above; version: the year.release folder it lives in ("" unknown);
    importer: the QdstrmImporter found; recognised: the folder is laid out as
    NVIDIA's installs are (``target-linux-*`` beside the binary's folder), so
    a missing importer there is known to be missing.
    """

    binary: str
    found_by: str
    version: str = ""
    importer: str | None = None
    recognised: bool = False

    @property
    def install(self) -> str:
        return str(Path(os.path.realpath(self.binary)).parent.parent)

    @property
    def can_import(self) -> bool | None:
        """True: its importer is there; False: known to be missing; None: cannot tell."""
        if self.importer:
            return True
        return False if self.recognised else None

    def describe(self) -> str:
        """One line for `perfsuite doctor` and the profiler notes."""
        what = self.found_by + (f" {self.version}" if self.version else "")
        if self.can_import:
            can = f"imports captures ({self.importer})"
        elif self.can_import is False:
            can = f"no QdstrmImporter in {self.install}: captures stay .qdstrm"
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


def describe(binary: str, found_by: str) -> NsysInstall:
    """What is beside ``binary``: its install is the folder above the one it
    is in (``<install>/bin/nsys``, ``<install>/target-linux-x64/nsys``), with
    the importer in it or one level down (``host-linux-x64/QdstrmImporter``)."""
    install = Path(os.path.realpath(binary)).parent.parent
    recognised = any(install.glob("target-linux-*"))
    importer = next((str(p) for pattern in ("QdstrmImporter", "*/QdstrmImporter")
                     for p in sorted(install.glob(pattern)) if os.access(p, os.X_OK)), None)
    return NsysInstall(binary, found_by, _version(binary), importer, recognised)


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
