"""Every ``PERFSUITE_*`` environment variable in one place: what it means, its
default, who reads it and, for those perfsuite sets itself, who sets it.

Each says what values it takes (``Accepts``): ``perfsuite`` and the pytest
plugin check them all before anything is launched (``problems``), and say a
``PERFSUITE_*`` variable set that is none of these (``strangers``).

docs/reference/environment.md is made from this registry, and
tests/unit/test_docs.py checks that page against it and that every
``PERFSUITE_*`` name in perfsuite/, .ci/ and .github/ is listed here, so a
variable cannot go undocumented:

    python -m perfsuite.system.envvars > docs/reference/environment.md

Standard library only, and nothing of perfsuite: every floor may import it.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE, SCRIPTS, WORKFLOW, INTERNAL = "package", "scripts", "workflow", "internal"
PAGE = "docs/reference/environment.md"


@dataclass(frozen=True)
class Accepts:
    """The values a variable takes: ``text`` says them (in a refusal and on
    the page), ``why`` tells why a value is not one of them (None: it is)."""
    text: str
    why: Callable[[str], str | None]


def one_of(*values: str) -> Accepts:
    return Accepts(", ".join(values), lambda v: None if v in values else "not one of them")


def whole(low: int, high: int | None = None) -> Accepts:
    def why(value: str) -> str | None:
        try:
            number = int(value)
        except ValueError:
            return "not a whole number"
        return None if number >= low and (high is None or number <= high) else "out of range"
    return Accepts(f"a whole number from {low}" + (f" to {high}" if high is not None else ""), why)


def number(text: str, positive: bool) -> Accepts:
    def why(value: str) -> str | None:
        try:
            found = float(value)
        except ValueError:
            return "not a number"
        if not math.isfinite(found) or (positive and found <= 0):
            return "not a finite number above 0" if positive else "not a finite number"
        return None
    return Accepts(text, why)


def _folder(value: str) -> str | None:
    # one that does not exist holds nothing, as the tests' empty trees do
    return "a file, not a folder" if Path(value).expanduser().is_file() else None


def _executable(value: str) -> str | None:
    path = Path(value).expanduser()
    return None if path.is_file() and os.access(path, os.X_OK) else "no executable file there"


def _experiments(value: str) -> str | None:
    for part in filter(None, value.split(os.pathsep)):
        path = Path(part).expanduser()
        if not path.exists():
            return f"{part} does not exist"
        if path.is_dir() and not any(path.glob("*.toml")):
            return f"the folder {part} holds no *.toml file"
    return None


def _history(value: str) -> str | None:
    # "OFF" would make a store of that name, where "off" keeps none: ambiguous
    if value.lower() == "off" and value != "off":
        return f"off is written in lower case; for a store of that name write ./{value}"
    return None


ANY_TEXT = Accepts("any text", lambda v: None)
A_PATH = Accepts("a path", lambda v: None)
A_FOLDER = Accepts("a folder", _folder)
EXECUTABLE = Accepts("an executable file", _executable)
EXPERIMENT_FILES = Accepts(f"experiment files, or folders holding *.toml files, separated by {os.pathsep!r}",
                           _experiments)
HISTORY_STORE = Accepts("off, an SQLite file path or an SQLAlchemy URL", _history)


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str
    default: str  # what holds while it is unset
    read_by: tuple[str, ...]  # files that read it, relative to the repository root
    set_by: tuple[str, ...] = ()  # files that set it for the processes they start
    internal: bool = False  # perfsuite sets it for its own processes; nobody sets it by hand
    accepts: Accepts = ANY_TEXT  # checked before perfsuite launches anything

    @property
    def section(self) -> str:
        """Where it belongs on the page: perfsuite's own (internal), read by
        the package, by the scripts in .ci/, or a repository variable of the
        example workflow."""
        if self.internal:
            return INTERNAL
        if any(path.startswith("perfsuite/") for path in self.read_by):
            return PACKAGE
        return SCRIPTS if any(path.startswith(".ci/") for path in self.read_by) else WORKFLOW


def _user(name: str, meaning: str, default: str, *read_by: str, set_by: tuple[str, ...] = (),
          accepts: Accepts = ANY_TEXT) -> Variable:
    return Variable(name, meaning, default, read_by, set_by, accepts=accepts)


def _internal(name: str, meaning: str, default: str, set_by: tuple[str, ...], *read_by: str,
              accepts: Accepts = ANY_TEXT) -> Variable:
    return Variable(name, meaning, default, read_by, set_by, internal=True, accepts=accepts)


WORKFLOW_FILE = ".github/workflows/perfsuite-gpu.yml"

VARIABLES: tuple[Variable, ...] = (
    # -- set by you, read by perfsuite itself
    _user("PERFSUITE_ACCEPT_FILE",
          "The file of regressions accepted on purpose that `perfsuite ab`, the gate's step-time check and "
          "`history changes` read (docs/how-to/gate-a-change.md). Named here, it must exist.",
          "perfsuite-accept.toml in the current folder or one above it, up to the repository's root",
          "perfsuite/judge/accepted.py",
          accepts=A_PATH),
    _user("PERFSUITE_BASELINES",
          "The baselines root: one folder per hardware profile (baselines/README.md). A root named here "
          "must be one: a misspelt path is an error, never every check quietly skipped. `--baselines` "
          "(pytest: `--perf-baselines`) wins over it.",
          "the project's baselines/ (perfsuite/_baselines in a wheel)",
          "perfsuite/judge/baselines.py",
          accepts=A_PATH),
    _user("PERFSUITE_CACHE_DIR",
          "Where files made once and reused by later launches go: generated data sets, the 16 GB random "
          "Llama3-8B checkpoint. `--option cache_dir=DIR` wins over it.",
          "$XDG_CACHE_HOME/perfsuite, else ~/.cache/perfsuite",
          "perfsuite/context.py", "perfsuite/runner.py", "perfsuite/doctor/checks.py",
          set_by=(".ci/gpu-acceptance", ".ci/runner-venv"),
          accepts=A_PATH),
    _user("PERFSUITE_CACHE",
          "The short form of PERFSUITE_CACHE_DIR, read where that is unset.",
          "unset",
          "perfsuite/context.py", "perfsuite/runner.py",
          accepts=A_PATH),
    _user("PERFSUITE_EXPERIMENTS",
          "More experiment files, or folders of `*.toml`, separated by `os.pathsep` (`:`): their cells join "
          "the matrix. pytest's ini option `perf_experiments` does the same for a session.",
          "none: the suite's own experiments only",
          "perfsuite/cells.py",
          accepts=EXPERIMENT_FILES),
    _user("PERFSUITE_HISTORY",
          "The history store a run is added to and `history` reads when none is named: an SQLite file or "
          "any SQLAlchemy URL (`postgresql://user@host/db`); `off` keeps no history. `--history` (pytest: "
          "`--perf-history`) wins over it.",
          ".perfsuite/history.sqlite",
          "perfsuite/history/schema.py", "perfsuite/history/purpose.py", "perfsuite/doctor/checks.py",
          accepts=HISTORY_STORE),
    _user("PERFSUITE_NSYS_BIN",
          "The nsys binary every part of perfsuite runs. Set to nothing executable, it is an error naming "
          "it, never a quiet fall-back to another nsys.",
          "`nsys` on PATH, else the best of NVIDIA's install folders",
          "perfsuite/profiling/nsys.py",
          accepts=EXECUTABLE),
    _user("PERFSUITE_NSYS_SEARCH_ROOT",
          "The tree NVIDIA's install folders are looked for under when nsys is searched for; the suite's "
          "tests point it at a fake tree.",
          "/",
          "perfsuite/profiling/nsys_installs.py",
          accepts=A_FOLDER),
    _user("PERFSUITE_RANK_START",
          "How a launch's ranks start: `fork` (forked from a zygote that imported torch and the workload "
          "once; one node, no srun, no nsys) or `exec` (each rank a fresh interpreter). `--rank-start` "
          "(pytest: `--perf-rank-start`) wins over it.",
          "fork",
          "perfsuite/launch/starting.py",
          accepts=one_of("fork", "exec")),
    _user("PERFSUITE_FORK_AGENT",
          "`0`: torchrun's agent is never forked from a zygote (the launcher never forks) but started "
          "as a fresh interpreter.",
          "forked from a zygote where there is one (Linux, one node, no srun)",
          "perfsuite/launch/launch.py",
          accepts=one_of("0", "1")),
    _user("PERFSUITE_RDZV_PORT",
          "The port of the c10d rendezvous a `--slurm` launch sets up on its head node.",
          "a free port found at launch",
          "perfsuite/launch/multinode.py",
          accepts=whole(1, 65535)),
    # -- set by you, read by the install and acceptance scripts
    _user("PERFSUITE_TORCH_INDEX",
          "Where `.ci/install` takes torch and torchvision from: `auto` (the index for the driver's CUDA "
          "from nvidia-smi; PyPI without an NVIDIA driver), `pypi`, `cpu`, `cu126`, `cu128`, `cu130`, or "
          "`runner` (keep the torch of PERFSUITE_PYTHON). Also a repository variable of the example "
          "workflow, handed to the install.",
          "auto",
          ".ci/install", ".ci/runner-venv", WORKFLOW_FILE,
          accepts=one_of("auto", "pypi", "cpu", "cu126", "cu128", "cu130", "runner")),
    _user("PERFSUITE_INSTALLER",
          "What `.ci/install` installs with: `uv` or `pip`.",
          "uv (pip with PERFSUITE_TORCH_INDEX=runner)",
          ".ci/install",
          accepts=one_of("uv", "pip")),
    _user("PERFSUITE_PYTHON",
          "The interpreter whose torch PERFSUITE_TORCH_INDEX=runner keeps (a venv is made from it), and "
          "the one `.ci/gpu-acceptance` runs.",
          "python3",
          ".ci/install", ".ci/gpu-acceptance", ".ci/runner-venv",
          accepts=Accepts("an interpreter: a command or a path", lambda v: None)),
    _user("PERFSUITE_ACCEPTANCE_DIR",
          "Where `.ci/gpu-acceptance` puts everything it measures.",
          "/tmp/perfsuite-acceptance",
          ".ci/gpu-acceptance",
          accepts=A_PATH),
    _user("PERFSUITE_ACCEPTANCE_AB_QUADS",
          "The quads a launch pair of `.ci/gpu-acceptance`'s A/B part: a number (4 or more), or auto (each "
          "cell as many as its recorded steps forecast make unchanged code `same` at ±2 % 4 times in 5).",
          "auto",
          ".ci/gpu-acceptance",
          accepts=Accepts("a number of quads (4 or more), or auto",
                          lambda v: None if v == "auto" else whole(4).why(v))),
    _user("PERFSUITE_ACCEPTANCE_AB_SLOWDOWN",
          "Side B's device-side slowdown in `.ci/gpu-acceptance`'s A/B and error-rate parts, judged at ±2 %: "
          "one equal to the tolerance is called regressed only where its estimate lands above it.",
          "0.03",
          ".ci/gpu-acceptance",
          accepts=number("a fraction above 0", positive=True)),
    _user("PERFSUITE_ACCEPTANCE_BUDGET_S",
          "The seconds `.ci/gpu-acceptance` may take in all; a part that would start with under 30 s "
          "left is not run.",
          "540",
          ".ci/gpu-acceptance",
          accepts=number("seconds, a number above 0", positive=True)),
    # -- repository variables of the example workflow
    _user("PERFSUITE_MNIST_DIR",
          "A repository variable of the example workflow: the runner's folder holding the four MNIST IDX "
          "files the full tier reads (nothing is downloaded).",
          "/data/mnist",
          WORKFLOW_FILE, ".ci/full-shard",
          accepts=A_PATH),
    _user("PERFSUITE_HISTORY_SINCE",
          "A repository variable of the example workflow: a commit from which `history changes --since` "
          "reads main's series. A regression accepted on purpose needs none: perfsuite-accept.toml starts "
          "its series' level at its commit.",
          "none: the whole history",
          WORKFLOW_FILE, ".ci/history-changes",
          accepts=Accepts("a commit", lambda v: None)),
    # -- set by perfsuite for the processes it starts
    _internal("PERFSUITE_RUN_TOKEN",
              "One launch's token: each rank writes it into its record, so the launcher takes only its own "
              "launch's records; with PERFSUITE_LAUNCHER_PID it marks the launch's processes, which the "
              "launcher ends by it; a test's ranks match their peers' skip notes by it.",
              "outside a launch",
              ("perfsuite/launch/launch.py",),
              "perfsuite/rank/worker.py", "perfsuite/plugin/ranktest.py",
              accepts=ANY_TEXT),
    _internal("PERFSUITE_LAUNCHER_PID",
              "The launching process: a rank ends itself once it is gone, and rank 0's record names it as "
              "the owner of the result (across nodes).",
              "a rank started by hand: no launcher watched",
              ("perfsuite/launch/launch.py",),
              "perfsuite/rank/worker.py",
              accepts=whole(1)),
    _internal("PERFSUITE_LAUNCHER_START",
              "The launching process's start time, which tells it from a later process given the same pid.",
              "no launcher watched",
              ("perfsuite/launch/launch.py",),
              "perfsuite/rank/worker.py",
              accepts=number("a process start time, in seconds since the epoch", positive=False)),
    _internal("PERFSUITE_LAUNCHER_HOST",
              "The launching process's host: a rank on another node watches no launcher, and rank 0's "
              "record names it.",
              "no launcher watched",
              ("perfsuite/launch/launch.py",),
              "perfsuite/rank/worker.py", "perfsuite/launch/multinode.py",
              accepts=Accepts("a host name", lambda v: None)),
    _internal("PERFSUITE_PROFILER",
              "The profiler of a rank: `torch`, `nsys` or `off`.",
              "`off`",
              ("perfsuite/launch/launch.py",),
              "perfsuite/profiling/torch_profile.py",
              accepts=one_of("nsys", "torch", "off")),
    _internal("PERFSUITE_PROFILE_DIR",
              "Where a rank writes its trace and profile summary.",
              "no trace written",
              ("perfsuite/launch/launch.py",),
              "perfsuite/profiling/torch_profile.py",
              accepts=A_PATH),
    _internal("PERFSUITE_PYTEST_ROOTDIR",
              "The pytest root of the session that launched a `@perf_ranks` test: its ranks find the test "
              "from it.",
              "the ranks look from the working directory",
              ("perfsuite/plugin/__init__.py",),
              "perfsuite/plugin/ranktest.py",
              accepts=A_PATH),
    _internal("PERFSUITE_PYTEST_INIFILE",
              "The ini file of that session, which the ranks' pytest reads as well.",
              "pytest finds its own",
              ("perfsuite/plugin/__init__.py",),
              "perfsuite/plugin/ranktest.py",
              accepts=A_PATH),
    _internal("PERFSUITE_WINDOWS",
              "The Unix socket of a resident A/B session's coordinator: a rank that has it measures windows "
              "when told to.",
              "an ordinary launch",
              ("perfsuite/ab/resident.py",),
              "perfsuite/rank/windows.py",
              accepts=A_PATH),
    _internal("PERFSUITE_WINDOWS_SIDE",
              "Which side of the resident A/B session a rank belongs to: `A` or `B`.",
              "side `?`",
              ("perfsuite/ab/resident.py",),
              "perfsuite/rank/windows.py",
              accepts=one_of("A", "B")),
    _internal("PERFSUITE_WINDOWS_RELEASE",
              "`1`: a CUDA rank empties its cache whenever it is parked, so that the other side's window "
              "finds the memory free.",
              "the cache is kept",
              ("perfsuite/ab/resident.py",),
              "perfsuite/rank/windows.py",
              accepts=one_of("0", "1")),
    _internal("PERFSUITE_NVML_CHECK_SET",
              "`1` where perfsuite set PYTORCH_NVML_BASED_CUDA_CHECK for torchrun's agent; a forked rank "
              "then takes both out of its environment again.",
              "PYTORCH_NVML_BASED_CUDA_CHECK left as the rank found it",
              ("perfsuite/launch/starting.py",),
              "perfsuite/rank/forked.py",
              accepts=one_of("1")),
)

# Names that look like one of these variables but are none (Python names).
NOT_VARIABLES = {
    "PERFSUITE_TABLES": "perfsuite/history/schema.py: the history's own tables",
}

SECTIONS = (
    (PACKAGE, "Set by you, read by perfsuite",
     "An option on the command line wins over its variable where there is one."),
    (SCRIPTS, "Set by you, read by the install and acceptance scripts", ""),
    (WORKFLOW, "Repository variables of the example workflow",
     "Set under the repository's Settings > Secrets and variables > Actions > Variables; "
     f"`{WORKFLOW_FILE}` reads them as `vars.NAME`."),
    (INTERNAL, "Set by perfsuite for the processes it starts",
     "Never set by hand: the launcher, the pytest plugin or an A/B session sets them in the environment of "
     "the ranks (or torchrun agents) it starts, and those read them. Listed to tell what a rank's environment "
     "holds."),
)

HEADER = """# Environment variables

Every `PERFSUITE_*` environment variable, with its meaning, its default and
the files that read it, made from perfsuite's own registry
(`perfsuite/system/envvars.py`; `python -m perfsuite.system.envvars >
docs/reference/environment.md`). A test checks this page is what the registry
says, and that every `PERFSUITE_*` name in `perfsuite/`, `.ci/` and `.github/`
is in the registry. A value a variable does not take (the column *takes*)
stops perfsuite before anything is launched: `perfsuite` exits 2, pytest with
a usage error. A `PERFSUITE_*` variable set that is none of these is said.
"""


def by_name() -> dict[str, Variable]:
    return {v.name: v for v in VARIABLES}


def problems(environ: Mapping[str, str]) -> list[str]:
    """A sentence for each registered variable set in ``environ`` to a value
    it does not take; an empty value counts as unset, as every reader reads it."""
    out = []
    for variable in VARIABLES:
        value = environ.get(variable.name)
        why = variable.accepts.why(value) if value else None
        if why:
            out.append(f"${variable.name} is {value!r} ({why}); it takes {variable.accepts.text}: fix it or "
                       f"unset it ({PAGE})")
    return out


def strangers(environ: Mapping[str, str]) -> list[str]:
    """A sentence for each ``PERFSUITE_*`` variable set in ``environ`` that
    perfsuite does not know, naming the nearest one it does (a typo)."""
    known = list(by_name())
    out = []
    for name in sorted(n for n in environ if n.startswith("PERFSUITE_") and n not in by_name()):
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        out.append(f"${name} is set, but perfsuite reads no such variable"
                   + (f"; did you mean {near[0]}?" if near else f" ({PAGE} lists those it reads)"))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _files(paths: tuple[str, ...]) -> str:
    return ", ".join(f"`{p}`" for p in paths)


def render() -> str:
    out = [HEADER]
    for section, title, intro in SECTIONS:
        rows = [v for v in VARIABLES if v.section == section]
        out.append(f"## {title}\n")
        if intro:
            out.append(f"{intro}\n")
        if section == INTERNAL:
            out += ["| variable | meaning | takes | unset | set by | read by |", "|---|---|---|---|---|---|"]
            out += [f"| `{v.name}` | {_cell(v.meaning)} | {_cell(v.accepts.text)} | {_cell(v.default)} | "
                    f"{_files(v.set_by)} | {_files(v.read_by)} |" for v in rows]
        else:
            out += ["| variable | meaning | takes | default | read by |", "|---|---|---|---|---|"]
            out += [f"| `{v.name}` | {_cell(v.meaning + (f' Also set by {_files(v.set_by)}.' if v.set_by else ''))} "
                    f"| {_cell(v.accepts.text)} | {_cell(v.default)} | {_files(v.read_by)} |" for v in rows]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
