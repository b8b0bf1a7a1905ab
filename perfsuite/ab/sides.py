"""The two sides of an A/B session: what runs each side's launches, and where it came from.

A side is a Python interpreter (its torch, torchrun and perfsuite run the
cell) and extra environment variables for its launches only; a git ref
becomes a side through a worktree and a venv that reuses the current
interpreter's packages (``checkout_side``).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfsuite.launch.launch import LaunchOptions
from perfsuite.rank.faults import GPU_SLEEP, Fault

# The side venv's own site-packages sorts '__editable__...' before this
# name, so the side's editable install is found before the current one's.
BASE_SITE_PTH = "perfsuite_ab_base_site.pth"
IMPORT_CHECK = "import torch, perfsuite; print(torch.__version__); print(perfsuite.__path__[0])"
# ... and the modules its launches import (argv), the first that fails said on the last line.
MODULES_CHECK = (IMPORT_CHECK + "\nimport importlib, sys\nfor name in sys.argv[1:]:\n    try:\n"
                 "        importlib.import_module(name)\n    except Exception as err:\n"
                 "        print(f'{name}\\t{type(err).__name__}: {err}'); sys.exit(3)\n")
WINDOWS_MODULE = "perfsuite.rank.windows"  # a side's perfsuite serves resident windows
SIDE_DONE = "side.json"  # written last: a side folder without it is a set-up that did not finish


class ABError(ValueError):
    """A usage or environment problem, said in a sentence (exit code 2)."""


@dataclass
class Side:
    """One version under test: what runs its launches, and where it came from."""

    name: str  # "A" or "B"
    python: str
    env: dict[str, str] = field(default_factory=dict)
    ref: str | None = None
    commit: str | None = None
    setup_s: float | None = None  # git worktree + venv + editable install
    torch: str | None = None
    perfsuite: str | None = None  # the package directory this side imports
    workload_options: dict[str, str] = field(default_factory=dict)  # e.g. an injected fault
    imports: list[str] = field(default_factory=list)  # modules its launches import (side_imports)

    @property
    def label(self) -> str:
        return self.name.lower()

    def options(self, launch: LaunchOptions | None = None) -> LaunchOptions:
        """``launch`` (what the session launches with: data dir, workload
        options, timeout, GPUs, nodes, profiler) run by this side's
        interpreter, with its environment and workload options on top."""
        launch = launch or LaunchOptions()
        return replace(launch, python=self.python, env={**launch.env, **self.env},
                       options={**launch.options, **self.workload_options})


def launch_settings(launch: LaunchOptions | None) -> dict[str, Any]:
    """What a session's launches were given, for its JSON file."""
    launch = launch or LaunchOptions()
    return {"data_dir": str(launch.data_dir) if launch.data_dir else None, "options": dict(launch.options),
            "timeout_s": launch.timeout_s, "profiler": launch.profiler, "gpus": launch.gpus,
            "nnodes": launch.nodes.nnodes, "slurm": launch.nodes.slurm,
            "rank_start": launch.rank_start}  # the repro line names it (report.pr_comment)


def _key_values(entries: list[str], flag: str, example: str) -> dict[str, str]:
    """KEY=VALUE entries as a dict; ``example``, a right one, for the message."""
    pairs = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise ABError(f"{flag} {entry!r}: give KEY=VALUE, e.g. {flag} {example}")
        pairs[key] = value
    return pairs


def parse_env(entries: list[str], flag: str) -> dict[str, str]:
    """A side's environment, KEY=VALUE entries, as a dict."""
    return _key_values(entries, flag, "OMP_NUM_THREADS=2")


def parse_options(entries: list[str], flag: str) -> dict[str, str]:
    """A side's workload options, KEY=VALUE entries, as a dict."""
    return _key_values(entries, flag, "fault=gpu-sleep:*:5:0.02")


def check_workload_options(side: Side, cells: list[Any]) -> None:
    """A fault given to a side (perfsuite.rank.faults) read as its ranks will
    read it, before anything is launched: a misspelt one, or ``gpu-sleep``
    for a CPU cell (which it could not slow), is a usage error."""
    text = side.workload_options.get("fault")
    if not text:
        return
    flag = f"--{side.label}-option fault={text}"
    try:
        fault = Fault.parse(text)
    except ValueError as err:
        raise ABError(f"{flag}: {err}") from None
    cpu = [cell.id for cell in cells if cell.device != "cuda"]
    if fault.kind == GPU_SLEEP and cpu:
        raise ABError(f"{flag}: gpu-sleep needs a CUDA cell, and {cpu[0]} runs on cpu "
                      "(slow:RANK:STEP:FRACTION slows a CPU cell)")


def python_side(name: str, python: str, env: dict[str, str] | None = None) -> Side:
    """A side run by an existing interpreter.

    Launches run with PYTHONSAFEPATH=1 so that ``python -m`` does not put the
    working directory first on sys.path: started from a checkout, its
    packages would shadow the side's own installation.
    """
    found = shutil.which(python) if os.sep not in python else python
    if not found or not Path(found).is_file():
        raise ABError(f"side {name}: no Python interpreter at {python}")
    if not os.access(found, os.X_OK):
        raise ABError(f"side {name}: {python} is not executable")
    return Side(name, os.path.abspath(found), {"PYTHONSAFEPATH": "1", **(env or {})})


def side_imports(cells: list[Any], mode: str) -> list[str]:
    """The modules a side's launches of ``cells`` import: the built-in
    workloads' (an image cell's torchvision with it) and, unless launch
    rounds are asked for, the ranks' side of resident windows."""
    from perfsuite.specs import BUILTIN

    modules = sorted({BUILTIN[cell.workload].split(":")[0] for cell in cells if cell.workload in BUILTIN})
    return ([WINDOWS_MODULE] if mode != "launches" else []) + modules  # an older perfsuite said first


def check_interpreter(side: Side) -> None:
    """Run the side's interpreter once: it must import torch and perfsuite,
    and the modules its launches import (``side.imports``), in its environment."""
    try:
        proc = subprocess.run([side.python, "-c", MODULES_CHECK, *side.imports], capture_output=True, text=True,
                              env={**os.environ, **side.env}, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ABError(f"side {side.name}: {side.python} could not be run ({err})") from None
    if proc.returncode == 3 and "\t" in proc.stdout:
        module, error = proc.stdout.strip().splitlines()[-1].split("\t", 1)
        perfsuite = proc.stdout.splitlines()[1] if len(proc.stdout.splitlines()) > 2 else "?"
        if module == WINDOWS_MODULE:
            raise ABError(f"side {side.name}: its perfsuite ({perfsuite}) cannot serve resident windows "
                          f"({error}): it predates resident A/B; compare in launch rounds with --mode launches")
        raise ABError(f"side {side.name}: {side.python} cannot import {module}, which its launches need "
                      f"({error}); install it into that environment")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ABError(f"side {side.name}: {side.python} cannot import torch and perfsuite "
                      f"({last}); install both into that environment")
    side.torch, side.perfsuite = proc.stdout.splitlines()[-2:]


def _run(argv: list[Any], what: str, cwd: Path | None = None) -> str:
    """stdout of a setup command; its failure as an ABError naming ``what``."""
    try:
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd)
    except OSError as err:
        raise ABError(f"{what}: {err}") from None
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit status {proc.returncode}"
        raise ABError(f"{what} failed: {tail}")
    return proc.stdout.strip()


def check_refs(repo: Path, refs: dict[str, str]) -> dict[str, str]:
    """The commit of each ref, by the option it came from ({"--a-ref": "HEAD~1"}):
    every ref is looked up before any worktree is made, so a missing one
    leaves nothing behind."""
    return {flag: _run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                       f"{flag} {ref}: finding the commit in {repo}")
            for flag, ref in refs.items()}


def _forget_worktree(repo: Path, side_dir: Path) -> None:
    """A side's folder and its worktree gone from ``repo``'s list, as far as git lets."""
    if (side_dir / "src").exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(side_dir / "src")],
                       capture_output=True)
    shutil.rmtree(side_dir, ignore_errors=True)
    subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def checkout_side(name: str, ref: str, repo: Path, side_dir: Path,
                  env: dict[str, str] | None = None, flag: str | None = None) -> Side:
    """A side from a git ref of ``repo``: a worktree of the ref, a venv that
    sees the current interpreter's packages (torch is reused, not
    reinstalled), and the worktree installed into it in editable mode.
    ``flag`` names the option the ref came from in messages (default --a-ref/--b-ref).
    A side of the same commit that ``side_dir`` already holds is used again
    (a session that failed after setting it up, retried); one whose set-up
    did not finish is set up again, and one that fails here leaves no worktree."""
    started = time.monotonic()
    flag = f"{flag or f'--{name.lower()}-ref'} {ref}"
    commit = _run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                  f"{flag}: finding the commit in {repo}")
    src, venv = side_dir / "src", side_dir / "venv"
    python = venv / "bin" / "python"
    side = Side(name, str(python), {"PYTHONSAFEPATH": "1", **(env or {})}, ref=ref, commit=commit)
    try:
        held = json.loads((side_dir / SIDE_DONE).read_text())
    except (OSError, ValueError):
        held = None
    if held is not None and held.get("commit") == commit and held.get("base") == sys.executable \
            and python.exists() and src.is_dir():
        return replace(side, setup_s=round(time.monotonic() - started, 2))
    if held is not None and held.get("commit") != commit:
        raise ABError(f"{flag}: {side_dir} already holds a side of {held.get('ref')} "
                      f"({str(held.get('commit'))[:12]}); choose another --out")
    if side_dir.exists():  # a set-up that did not finish, or of another interpreter: again
        other = sorted(p.name for p in side_dir.iterdir() if p.name not in ("src", "venv", SIDE_DONE))
        if other:
            raise ABError(f"{flag}: {side_dir} holds {other[0]}, not a side; choose another --out")
        _forget_worktree(repo, side_dir)
    else:  # a worktree whose folder was deleted stays registered until pruned
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)
    try:
        _set_up(repo, commit, src, venv, python, flag, side_dir)
    except BaseException:  # an error or an interrupt: no half-made side stays registered
        _forget_worktree(repo, side_dir)
        raise
    (side_dir / SIDE_DONE).write_text(json.dumps({"ref": ref, "commit": commit, "base": sys.executable}))
    return replace(side, setup_s=round(time.monotonic() - started, 2))


def _set_up(repo: Path, commit: str, src: Path, venv: Path, python: Path, flag: str, side_dir: Path) -> None:
    _run(["git", "-C", repo, "worktree", "add", "--detach", src, commit], f"{flag}: git worktree add")
    # No pip of its own: through the .pth below the venv runs the current one.
    _run([sys.executable, "-m", "venv", "--without-pip", venv], f"{flag}: python -m venv")
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        f"{flag}: the venv's site-packages"))
    # addsitedir, not a bare path: the current site-packages' own .pth files
    # (editable installs, such as perfsuite's) must be processed too.
    adds = "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages())
    (purelib / BASE_SITE_PTH).write_text(f"import site; {adds}\n")
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", src],
         f"{flag}: pip install -e {src}", cwd=side_dir)
