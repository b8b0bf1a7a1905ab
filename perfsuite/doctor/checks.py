"""``perfsuite doctor``: what will and will not work here, before a GPU run.

One line per check: ``ok``, ``warn`` or ``BLOCKER`` with the fix. A blocker
is something that stops the chosen tier from running at all (a torch outside
the versions perfsuite supports, no GPU for a GPU tier, a driver too old for
this torch's CUDA, no space for the LLM checkpoint, no MNIST for the full
tier, a launch that fails); a warning costs some cells, a profile or speed.
Without ``--tier`` nothing is a blocker for lack of a GPU: the lines then
say which tiers can run.

The last check launches: one rank of the preflight probe through perfsuite's
own launch path, on a GPU for the GPU tiers (and without a tier where torch
sees one), else on the CPU, so that "nothing blocks" means a cell's launch
worked here (a torchrun that refuses an option perfsuite passes fails on the
CPU as on a GPU). On the 2-core VM the CPU launch takes 3-5 s: a rank's
interpreter importing torch, one 1024 x 1024 matmul warm-up and repetition,
the exit.

Everything torch, NVML, the filesystems and nsys answer comes through
``perfsuite.doctor.facts``, so the tests can play a GPU machine on a CPU
one; why torch sees no GPU is ``hardware.why_no_gpu``'s answer, as for
``perfsuite run`` and the pytest plugin.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perfsuite import cells as cells_mod
from perfsuite import extras, hardware
from perfsuite.context import default_cache_dir
from perfsuite.doctor import facts as doctor_facts
from perfsuite.history.errors import HistoryError
from perfsuite.history.schema import resolve_url, shown_url
from perfsuite.history.store import check_store_usable
from perfsuite.launch.starting import start_here
from perfsuite.runner import CACHE_FIX, cache_problem
from perfsuite.system import envvars

GPU_TIERS = ("gate", "full")
SHM_MIN_BYTES = 1 << 30  # Docker's default /dev/shm is 64 MB
# A GPU a 500 px image cell drives: its 4 workers hold two batches each and the
# rank one more, 9 x 384 MB in fp64 (3.5 GB); a dp process's batches of 64 per GPU
# from 4 workers per GPU come to ~6.1 GB per GPU in fp32 (25 GB on 4 GPUs).
SHM_PER_GPU_BYTES = int(6.5 * 2**30)
LLM_8B_CHECKPOINT_BYTES = 16_100_000_000  # 8.03 G bf16 parameters, written once into the cache
LLM_CHECKPOINT_DIR = Path("llm") / "checkpoints" / "llama3-8b-random-v1"  # perfsuite.workloads.llm_assets
WHEEL_INDEXES = {(12, 6): "cu126", (12, 8): "cu128", (13, 0): "cu130"}  # download.pytorch.org/whl/<tag>
LAUNCH_TAIL_LINES = 12  # of a failed launch's output: torchrun's error table is about this long
OK, WARN, BLOCKER = "ok", "warn", "BLOCKER"
STATUSES = (OK, WARN, BLOCKER)


@dataclass
class Check:
    name: str
    status: str  # ok | warn | BLOCKER
    message: str
    fix: str = ""
    detail: str = ""  # lines shown under the check, e.g. a failed launch's output tail

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix else ""
        below = "".join(f"\n    | {line}" for line in self.detail.splitlines())
        return f"{self.status:<8} {self.name:<7} {self.message}{fix}{below}"


# -- the checks ---------------------------------------------------------------

def _tier_cells(tier: str | None) -> list:
    return cells_mod.select(tier=tier) if tier else cells_mod.select(tier="all")


def _index_for(cuda: tuple[int, int] | None) -> str | None:
    """The newest PyTorch wheel index a driver running up to ``cuda`` can use."""
    fits = [tag for version, tag in sorted(WHEEL_INDEXES.items()) if cuda and version <= cuda]
    return fits[-1] if fits else None


def _version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def _outside(installed: dict[str, str | None], supported: dict[str, str]) -> list[str]:
    """"torch 2.10.0" for each installed version outside its range.
    Nightlies and local builds count by their release (2.15.0.dev2026 is newer than 2.11)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    found = []
    for name, specifier in supported.items():
        version = installed.get(name)
        try:
            fits = version is None or SpecifierSet(specifier).contains(Version(version), prereleases=True)
        except InvalidVersion:  # not a version packaging reads: the launch check still tries it
            fits = True
        if not fits:
            found.append(f"{name} {version}")
    return found


def check_torch(torch: dict[str, Any], gpu_tier: bool, supported: dict[str, str] | None = None) -> Check:
    if "import_error" in torch:
        return Check("torch", BLOCKER, f"torch cannot be imported ({torch['import_error']})",
                     "reinstall it: pip install -c constraints.txt torch torchvision")
    outside = _outside({"torch": torch.get("version"), "torchvision": torch.get("torchvision")},
                       supported or {})
    if outside:
        ranges = sorted(f"{name}{spec}" for name, spec in (supported or {}).items())
        return Check("torch", BLOCKER, f"{' and '.join(outside)} {'is' if len(outside) == 1 else 'are'} "
                     f"outside the versions perfsuite supports ({', '.join(ranges)}: its pyproject.toml)",
                     f"pip install {' '.join(repr(r) for r in ranges)} from the wheel index that "
                     "matches the driver (docs/how-to/gpu-runners.md)")
    if torch.get("hip"):
        return Check("torch", BLOCKER if gpu_tier else WARN,
                     f"torch {torch['version']} is a ROCm build (HIP {torch['hip']}): the GPU tiers "
                     "need CUDA and NCCL", "install a CUDA build of torch (docs/how-to/gpu-runners.md)")
    if torch.get("cuda") is None:
        return Check("torch", BLOCKER if gpu_tier else OK,
                     f"torch {torch['version']} is a CPU-only build (torch.version.cuda is None)"
                     + ("" if gpu_tier else ": enough for the CPU tier, not for gate or full"),
                     "install a CUDA build from the wheel index that matches the driver, e.g. pip "
                     "install -c constraints.txt --index-url https://download.pytorch.org/whl/cu128 "
                     "torch torchvision" if gpu_tier else "")
    return Check("torch", OK, f"torch {torch['version']}, built for CUDA {torch['cuda']}")


def _no_gpu_reason(torch: dict[str, Any]) -> str:
    """Why torch sees no GPU: ``hardware.why_no_gpu`` where this torch is a
    CUDA build it can ask."""
    if "import_error" in torch:
        return "torch cannot be imported"
    if torch.get("hip"):
        return f"this torch ({torch.get('version')}) is a ROCm build"
    return hardware.why_no_gpu() or "torch.cuda.device_count() is 0"


def check_gpus(torch: dict[str, Any], nvml: dict[str, Any], tier: str | None,
               cells: list) -> Check:
    gpu_tier = tier in GPU_TIERS
    seen = torch.get("count") or 0
    by_nvml = ("NVML: " + nvml["error"]) if nvml.get("error") else (
        f"NVML sees {nvml.get('count')}")
    if seen == 0:
        reason = _no_gpu_reason(torch)
        if tier == "smoke":
            return Check("gpus", OK, f"the CPU tier needs no GPU (torch sees none: {reason})")
        fix = ("run on a machine with NVIDIA GPUs and their driver (in a container: --gpus all "
               "with the NVIDIA Container Toolkit), or run the CPU tier: --tier smoke")
        if torch.get("cuda") is None and "import_error" not in torch:
            fix = "install a CUDA build of torch (see the torch line)"
        elif nvml.get("count") and "CUDA_VISIBLE_DEVICES" in reason:
            fix = "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (perfsuite run --gpus 0,1)"
        if gpu_tier:
            return Check("gpus", BLOCKER, f"torch sees no GPU: {reason}", fix)
        return Check("gpus", WARN, f"torch sees no GPU ({reason}): the GPU tiers (gate, full) "
                                   "cannot run here; the CPU tier (smoke) can", fix)
    names = ", ".join(sorted(set(torch.get("names") or [])))
    message = f"torch sees {seen} GPU(s) ({names}); {by_nvml}"
    status, fix = OK, ""
    if not nvml.get("error") and nvml.get("count") is not None and nvml["count"] != seen:
        status = WARN
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        message += (f": CUDA_VISIBLE_DEVICES={hidden!r} hides some" if hidden is not None
                    else ": the two disagree")
        fix = "perfsuite run --gpus picks GPUs; check CUDA_VISIBLE_DEVICES and nvidia-smi"
    needed = [c for c in cells if c.gpus_needed > seen]
    if needed:
        status = WARN
        most = max(c.gpus_needed for c in needed)
        message += (f"; {len(needed)} cell(s){f' of the {tier} tier' if tier else ''} need more "
                    f"(up to {most}): not run here, and listed as such (no failure)")
        fix = fix or f"run on a machine with {most} GPUs to measure them"
    return Check("gpus", status, message, fix)


def check_driver(torch: dict[str, Any], nvml: dict[str, Any], gpu_tier: bool) -> Check:
    build = torch.get("cuda")
    if nvml.get("error"):
        return Check("driver", WARN if gpu_tier else OK,
                     f"driver unknown: {nvml['error']}"
                     + ("" if gpu_tier else " (the CPU tier needs none)"))
    driver, runs = nvml.get("driver"), nvml.get("cuda")
    if build is None:
        return Check("driver", OK, f"NVIDIA driver {driver} (runs CUDA up to {runs}); this torch "
                                   "is a CPU-only build (see the torch line)")
    ours, theirs = _version(build), _version(runs)
    index = _index_for(theirs)
    switch = (f"install torch from https://download.pytorch.org/whl/{index} (docs/how-to/gpu-runners.md)"
              if index else "torch's current wheels need CUDA 12.6 or newer")
    if ours and theirs and ours[0] > theirs[0]:
        return Check("driver", BLOCKER if gpu_tier else WARN,
                     f"NVIDIA driver {driver} runs CUDA up to {runs}; this torch is built for CUDA "
                     f"{build} and cannot use the GPUs",
                     f"upgrade the driver (CUDA {ours[0]} needs R{580 if ours[0] >= 13 else 525}+) "
                     f"or {switch}")
    if ours and theirs and ours > theirs:
        return Check("driver", WARN,
                     f"NVIDIA driver {driver} runs CUDA up to {runs}, older than this torch's CUDA "
                     f"{build}: it runs through CUDA minor-version compatibility, but kernels "
                     "compiled from PTX at run time fail", f"upgrade the driver or {switch}")
    return Check("driver", OK, f"NVIDIA driver {driver} runs CUDA up to {runs}; torch's CUDA "
                               f"{build} fits")


def check_nccl(torch: dict[str, Any], gpu_tier: bool) -> Check:
    if torch.get("nccl"):
        note = "" if torch.get("count") else " (used once GPUs are seen)"
        return Check("nccl", OK, f"NCCL {torch['nccl']} in torch{note}")
    if not gpu_tier:
        return Check("nccl", OK, "no NCCL in this torch; the CPU tier uses gloo")
    return Check("nccl", BLOCKER, "no NCCL in this torch: multi-GPU cells cannot run",
                 "install a CUDA build of torch for Linux (it bundles NCCL)")


def check_nsys(tier: str | None) -> Check:
    found, why = doctor_facts.nsys_binary()
    note = "profile cells fall back to torch.profiler"
    status = OK if tier == "smoke" else WARN
    if found is None:
        return Check("nsys", status, f"no nsys ({why}): {note}; the capture test is skipped",
                     "" if status == OK else "install Nsight Systems, or set $PERFSUITE_NSYS_BIN "
                                             "to its bin/nsys")
    others = doctor_facts.nsys_others(found)
    also = f"; also found: {', '.join(o.describe() for o in others)}" if others else ""
    written, what = doctor_facts.nsys_capture(found.binary)
    if written and found.can_import is False:  # the layout says otherwise: profile cells would not use it
        return Check("nsys", status, f"{found.describe(imported=True)} {what}{also}: yet perfsuite finds no "
                     f"importer in {found.importer_place} and profile cells use torch.profiler",
                     "install the full Nsight Systems package (with host-linux-*/QdstrmImporter) and point "
                     "$PERFSUITE_NSYS_BIN at its bin/nsys")
    if written:
        return Check("nsys", OK, f"{found.describe(imported=True)} {what}{also}")
    better = next((o for o in others if o.can_import), None)
    fix = (f"set $PERFSUITE_NSYS_BIN={better.binary} (that install has its QdstrmImporter)" if better else
           "install the full Nsight Systems package (with host-linux-*/QdstrmImporter), or point "
           "$PERFSUITE_NSYS_BIN at one that works")
    if found.can_import is False:  # profiler_mode knows it from the layout, before any launch
        note = "profile cells use torch.profiler from the start"
    elif what == doctor_facts.QDSTRM_ONLY:
        note = ("a session's first profile cell falls back to torch.profiler after its launch under nsys "
                "(a second, profile-only launch), later ones use it from the start")
    imported = False if what == doctor_facts.QDSTRM_ONLY else None
    return Check("nsys", status, f"{found.describe(imported=imported)} {what}: {note}{also}", fix)


def shm_needed(cells: list, gpus: int) -> int:
    """Bytes of /dev/shm the GPU cells that can run here hold at most at once:
    ``SHM_PER_GPU_BYTES`` for each GPU the largest of them drives."""
    driven = [min(c.gpus_needed, gpus) for c in cells if c.device == "cuda" and c.gpus_needed <= gpus]
    return SHM_PER_GPU_BYTES * max(driven, default=0)


def check_shm(tier: str | None, cells: list | None = None, gpus: int = 0) -> Check:
    path = "/dev/shm"
    try:
        size, free = doctor_facts.statvfs(path)
    except OSError as err:
        return Check("shm", WARN, f"{path}: cannot read its size ({err.strerror or err}); "
                                  "DataLoader workers share batches through it")
    gib = f"{size / 2**30:.2f} GiB ({free / 2**30:.2f} free)"
    needed = max(SHM_MIN_BYTES, shm_needed(cells or [], gpus))
    if size >= needed:
        return Check("shm", OK, f"{path} {gib}")
    status = OK if tier == "smoke" else WARN
    return Check("shm", status,
                 f"{path} is {gib}, under the {needed / 2**30:.0f} GiB the cells here can hold at once "
                 "(500 px batches of 64, 4 DataLoader workers per GPU): workers die with 'Bus error' "
                 "(Docker's default is 64 MB)",
                 "" if status == OK else f"docker run --ipc=host (or --shm-size={-(-needed // 2**30) + 1}g), "
                                         "or remount /dev/shm larger")


def check_disk(tier: str | None, cells: list) -> Check:
    cache, unusable = default_cache_dir(), cache_problem()
    if unusable:  # perfsuite run and pytest refuse to begin: not a matter of free space
        return Check("disk", BLOCKER, unusable, CACHE_FIX)
    llm_gpu = sum(c.workload == "llm" and c.device == "cuda" for c in cells)
    existing = cache
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        _, free = doctor_facts.statvfs(str(existing))
    except OSError as err:
        return Check("disk", WARN, f"{cache}: cannot read free space ({err.strerror or err})")
    where = f"LLM cache {cache}: {free / 1e9:.1f} GB free"
    if (cache / LLM_CHECKPOINT_DIR).is_dir() and any((cache / LLM_CHECKPOINT_DIR).glob("*.pt")):
        return Check("disk", OK, f"{where}; the random Llama3-8B checkpoint is already there")
    if not llm_gpu and tier is not None:
        return Check("disk", OK, f"{where}; the {tier} tier needs no 8B checkpoint")
    if free >= LLM_8B_CHECKPOINT_BYTES + 1e9:
        return Check("disk", OK, f"{where}, room for the ~16 GB random Llama3-8B checkpoint "
                                 "the GPU LLM cells write once")
    status = BLOCKER if tier in GPU_TIERS else WARN
    return Check("disk", status,
                 f"{where}: the GPU LLM cells ({llm_gpu}{f' in the {tier} tier' if tier else ''}) "
                 "first write a ~16 GB random Llama3-8B checkpoint there, which will not fit",
                 "free space, point $PERFSUITE_CACHE_DIR at a disk with 17 GB free, or give a real "
                 "checkpoint: --option llm_checkpoint_dir=DIR")


def check_mnist(data_dir: Path | None, tier: str | None, cells: list) -> Check:
    mnist = sum(c.dataset == "mnist" for c in cells)
    needed = mnist > 0
    if data_dir is None:
        if not needed:
            return Check("mnist", OK, f"the {tier} tier trains on the bundled digits; no MNIST needed")
        status = BLOCKER if tier == "full" else WARN
        return Check("mnist", status, f"{mnist} cell(s){f' of the {tier} tier' if tier else ' (full tier)'} "
                                      "train on MNIST and no --data-dir was given",
                     "pass --data-dir DIR holding train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                     "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (gzipped or not)")
    fail = BLOCKER if tier == "full" else WARN
    try:  # torch and torchvision: here, so that a broken install is this check's answer
        from perfsuite.workloads.image_data import MNIST_FILES, _find, idx_problem
    except Exception as err:  # noqa: BLE001
        return Check("mnist", fail, f"cannot import the image workload ({type(err).__name__}: {err})",
                     "reinstall torchvision: pip install -c constraints.txt torchvision")
    if not data_dir.is_dir():
        return Check("mnist", fail, f"--data-dir {data_dir}: no such directory",
                     "pass the directory that holds the four MNIST IDX files")
    counts, problems, found = {}, [], []
    for key, stem in MNIST_FILES.items():
        try:
            path = _find(data_dir, stem)
        except FileNotFoundError:
            problems.append(f"{stem}[.gz] missing")
            continue
        problem, counts[key] = idx_problem(path, 3 if key.endswith("images") else 1)
        if problem:
            problems.append(f"{path.name}: {problem}")
        else:
            found.append(path.name)
    for split in ("train", "test"):
        images, labels = counts.get(f"{split}_images"), counts.get(f"{split}_labels")
        if images and labels and images != labels:
            problems.append(f"{split}: {images} images but {labels} labels (two downloads mixed)")
    if problems:
        return Check("mnist", fail, f"{data_dir}: " + "; ".join(problems),
                     "put an intact copy of the four MNIST IDX files there (from one download)")
    return Check("mnist", OK, f"{data_dir}: the four IDX files are there and readable "
                              f"({counts['train_images']} train, {counts['test_images']} test images)")


def check_extras(tier: str | None, cells: list, history_url: str | None) -> Check:
    """perfsuite's extras: the llm extra for the tier's LLM cells (without it each
    fails, naming it), the postgres extra for a postgresql:// $PERFSUITE_HISTORY."""
    missing = doctor_facts.extras_missing()
    problems, fixes = [], []
    llm_cells = sum(c.workload == "llm" for c in cells)
    if missing.get("llm") and llm_cells:
        problems.append(f"{llm_cells} LLM cell(s){f' of the {tier} tier' if tier else ''} will fail "
                        f"({', '.join(missing['llm'])} not installed)")
        fixes.append(f"{extras.message('llm')} (or run only the image cells: perfsuite run --workload image, "
                     "pytest -k image)")
    if missing.get("postgres") and str(history_url or "").startswith(("postgres://", "postgresql")):
        try:
            resolve_url(history_url)  # psycopg2, if installed, serves it instead
        except HistoryError:
            problems.append(f"runs cannot be added to $PERFSUITE_HISTORY {shown_url(history_url)} "
                            f"({', '.join(missing['postgres'])} not installed)")
            fixes.append(extras.message("postgres"))
    if problems:
        return Check("extras", WARN, "; ".join(problems), "; ".join(fixes))
    have = [name for name, absent in missing.items() if not absent]
    lacking = [name for name, absent in missing.items() if absent]
    return Check("extras", OK, (f"{', '.join(have)} installed" if have else "none installed")
                 + "".join(f"; {name} not installed ({extras.EXTRAS[name].needs} it)" for name in lacking))


def check_history(url: str | None) -> Check:
    """The store runs are added to unless told otherwise ($PERFSUITE_HISTORY,
    else the default file), checked as ``perfsuite run`` checks it before its
    first launch: one that cannot take a run stops it there."""
    named = "$PERFSUITE_HISTORY" if url else "the default store"
    try:
        shown = check_store_usable(url)
        if shown is None:  # $PERFSUITE_HISTORY=off
            return Check("history", OK, "runs are kept in no history ($PERFSUITE_HISTORY=off)")
        return Check("history", OK, f"runs are added to {shown} ({named})")
    except HistoryError as err:
        return Check("history", BLOCKER, f"{named}: {err}", "set $PERFSUITE_HISTORY to a store you can "
                     "write, or pass --history off (pytest: --perf-history off)")


def check_launch(torch: dict[str, Any], tier: str | None) -> Check:
    """One real launch: on a GPU for a GPU tier (without a tier, where torch
    sees one), else on the CPU. A launch that fails blocks every tier."""
    device = "cuda" if (torch.get("count") or 0) and tier != "smoke" else "cpu"
    why_cpu = " (no GPU to launch on: see the gpus line)" if tier in GPU_TIERS and device == "cpu" else ""
    done = doctor_facts.tiny_launch(device)
    what = f"a 1-rank torchrun launch of the probe on {device}"
    if done["status"] == "ok":  # and which rank start it ran: what that means for code run at import
        return Check("launch", OK, f"{what} worked ({done['wall_s']:.1f} s){why_cpu}; {start_here()}")
    if done["status"] == "skipped":
        return Check("launch", WARN, f"{what} was skipped: {done['reason']}{why_cpu}")
    # What the rank printed says why (torchrun's own error table ends the output)
    detail = [f"rank {rank}: {line}" for rank, tail in sorted((done.get("rank_tails") or {}).items())
              for line in tail.splitlines()[-LAUNCH_TAIL_LINES:]]
    detail += (done.get("tail") or "").rstrip().splitlines()[-LAUNCH_TAIL_LINES:]
    return Check("launch", BLOCKER, f"{what} failed: {done['reason']}{why_cpu}",
                 "see its output below; `perfsuite run` of any cell fails the same way",
                 detail="\n".join(detail))


def check_environment(environ: dict[str, str] | os._Environ) -> Check:
    """Each PERFSUITE_* variable set takes its value (else other commands exit 2) and is one perfsuite reads."""
    bad, unknown = envvars.problems(environ), envvars.strangers(environ)
    if bad or unknown:
        return Check("env", BLOCKER if bad else WARN, "; ".join(bad + unknown), f"set or unset them as {envvars.PAGE} says")
    n = sum(name in envvars.by_name() for name in environ)
    return Check("env", OK, f"{n} PERFSUITE_* variable(s) set, each to a value it takes" if n else "no PERFSUITE_* set")


def run_checks(tier: str | None = None, data_dir: Path | None = None) -> list[Check]:
    cells = _tier_cells(tier)
    torch, nvml = doctor_facts.torch_facts(), doctor_facts.nvml_facts()
    gpu_tier = tier in GPU_TIERS
    return [check_environment(os.environ), check_torch(torch, gpu_tier, doctor_facts.supported_versions()),
            check_gpus(torch, nvml, tier, cells), check_driver(torch, nvml, gpu_tier),
            check_nccl(torch, gpu_tier), check_nsys(tier), check_shm(tier, cells, torch.get("count") or 0),
            check_disk(tier, cells),
            check_mnist(data_dir, tier, cells), check_extras(tier, cells, os.environ.get("PERFSUITE_HISTORY")),
            check_history(os.environ.get("PERFSUITE_HISTORY")), check_launch(torch, tier)]


def summary(checks: list[Check], tier: str | None) -> dict[str, Any]:
    blockers = sum(c.status == BLOCKER for c in checks)
    return {"tier": tier, "ok": blockers == 0, "blockers": blockers,
            "warnings": sum(c.status == WARN for c in checks),
            "checks": [asdict(c) for c in checks]}


def text(checks: list[Check], tier: str | None) -> str:
    s = summary(checks, tier)
    if tier is None:
        verdict = "no tier judged (pass --tier smoke|gate|full for its blockers)"
    elif s["blockers"]:
        verdict = f"{s['blockers']} blocker(s): the {tier} tier cannot run here"
    else:
        verdict = f"nothing blocks the {tier} tier"
    return "\n".join([*(c.line() for c in checks),
                      f"perfsuite doctor: {verdict}; {s['warnings']} warning(s)"])
