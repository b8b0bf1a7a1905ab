"""The GPU runner's path, run here: the example workflow's Install step and
tox's gpu environment install perfsuite with .ci/install into a venv of their
own, without the test extra, and collect the gate tier there
(``pytest tests/perf --perf-tier gate --collect-only``, which needs no GPU).

A root conftest that imported hypothesis (the test extra) once made every
such run stop at pytest's exit 4 before its first cell; the suite's own venv
has hypothesis, so only a venv without it shows that.

The fresh venvs are faithful and take seconds, not a 5 GB torch download:
the venv is made by the step's own ``python3 -m venv`` (tox's by tox), and a
``.pth`` file adds a folder of links to the packages this venv already has,
only those that perfsuite's requirements in pyproject.toml (and the extras
the command names) reach, at the versions CI tested (constraints.txt). pip
then resolves the command's requirements against them as it would against
packages a runner installed earlier: it installs perfsuite itself, and
whatever the links do not cover it downloads. The test extra's packages
(hypothesis, pytest-xdist, scikit-learn, ...) are not among the links.
"""

from __future__ import annotations

import configparser
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from perfsuite import cells

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "perfsuite-gpu.yml"
INSTALL = ROOT / ".ci" / "install"
SITE = Path(sysconfig.get_paths()["purelib"])
TEST_ONLY = ("hypothesis", "xdist", "sklearn")  # modules of the test extra the runner must do without


# ----------------------------------------------------------------- the links
def _pyproject_requirements(extras: set[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found, todo, done = [], set(extras), set()
    reqs = [Requirement(r) for r in project["dependencies"]]
    while todo:
        extra = todo.pop()
        done.add(extra)
        for text in project.get("optional-dependencies", {}).get(extra, []):
            req = Requirement(text)
            if canonicalize_name(req.name) == "perfsuite":  # "perfsuite[llm,postgres]"
                todo |= set(req.extras) - done
            else:
                reqs.append(req)
    for req in reqs:
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(req)
    return found


def reached(extras: set[str]) -> dict[str, md.Distribution]:
    """The installed distributions perfsuite's requirements (with these
    extras) reach, as pip would resolve them: name -> distribution."""
    installed = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions(path=[str(SITE)])}
    reach: dict[str, set[str]] = {}
    todo = [(canonicalize_name(r.name), set(r.extras)) for r in _pyproject_requirements(extras)]
    while todo:
        name, wanted = todo.pop()
        if name not in installed or (name in reach and wanted <= reach[name]):
            continue  # not here (pip downloads it), or seen with these extras
        reach[name] = reach.get(name, set()) | wanted
        for text in installed[name].requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in reach[name] | {""}):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    reach.pop("pip", None)  # every venv has its own
    return {name: installed[name] for name in reach}


def top_level(dist: md.Distribution) -> set[str]:
    """The entries of site-packages a distribution installed (its packages,
    modules, .dist-info and .pth files)."""
    names = set()
    for file in dist.files or []:
        first = Path(file).parts[0]
        if first not in ("..", "__pycache__") and not Path(file).is_absolute():
            names.add(first)
    return names


@cache
def links(extras: frozenset[str], where: Path) -> Path:
    """A folder of links to the site-packages entries of ``reached(extras)``."""
    folder = where / ("links-" + "-".join(sorted(extras)) if extras else "links")
    folder.mkdir(parents=True)
    for dist in reached(set(extras)).values():
        for name in top_level(dist):
            if (SITE / name).exists() and not (folder / name).exists():
                (folder / name).symlink_to(SITE / name)
    return folder


def add_links(venv: Path, folder: Path) -> None:
    """The venv sees the links as installed packages. addsitedir, not a bare
    path: their own .pth files are processed, as in site-packages."""
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir(), site
    (site / "perfsuite_test_links.pth").write_text(f"import site; site.addsitedir({str(folder)!r})\n")


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    """links() for the runner's extras, once per module."""
    where = tmp_path_factory.mktemp("links")
    return lambda extras: links(frozenset(extras), where)


def test_the_links_hold_the_runners_packages_and_not_the_test_extras():
    runner = reached({"llm"})
    assert {"torch", "torchvision", "pytest", "pytest-benchmark"} <= set(runner)
    assert not {"hypothesis", "pytest-xdist", "scikit-learn", "perfsuite"} & set(runner)
    assert {"hypothesis", "pytest-xdist"} <= set(reached({"test"}))  # the test extra does reach them


# ------------------------------------------------------------ commands here
def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a runner's job: no CI venv on PATH, no PYTHON* of
    ours; pip's own settings and cache kept (a runner has its own)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST", "PERFSUITE", "HYPOTHESIS", "COV_"))}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    env.update(HOME=str(home), PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def python3_that_adds(folder: Path, where: Path) -> Path:
    """A bin folder whose python3 is this interpreter (its venvs are made from
    the base Python, as a runner's are) and gives each venv it makes the links."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    pth = f"import site; site.addsitedir({str(folder)!r})"
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    shim = bin_dir / "python3"
    shim.write_text(f"""#!/bin/sh
"{sys.executable}" "$@" || exit $?
if [ "$1" = -m ] && [ "$2" = venv ]; then
  for venv; do :; done
  echo "{pth}" > "$venv/{site}/perfsuite_test_links.pth"
fi
""")
    shim.chmod(0o755)
    return bin_dir


def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def step(job: str, name: str) -> dict:
    return next(s for s in workflow()["jobs"][job]["steps"] if s.get("name") == name)


def run_step(script: str, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    """As a runner runs a `run:` with `shell: bash`."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def import_check(python: Path) -> subprocess.CompletedProcess:
    code = ("import importlib.util as u, importlib.metadata as m; "
            f"print('MISSING', [n for n in {TEST_ONLY!r} if u.find_spec(n)], m.version('torch'))")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)


def collected_every_gate_cell(output: str) -> None:
    missing = [c.id for c in cells.select(tier="gate") if f"[{c.id}]" not in output]
    assert not missing, f"{len(missing)} gate cells not collected, e.g. {missing[:3]}\n{output[-3000:]}"


# --------------------------------------------------------------- the runner
@pytest.mark.slow
def test_the_workflows_install_and_gate_collect_in_a_fresh_venv(tmp_path, linked):
    """The gate job's Install and Gate tier steps, as written in the workflow
    (the gate step with --collect-only added), on a runner whose venv has
    what .ci/install put there and nothing else."""
    github_env = tmp_path / "github_env"
    github_env.touch()
    summary = tmp_path / "summary.md"
    home = tmp_path / "home"
    home.mkdir()
    extras = set(re.search(r'bash \.ci/runner-venv\s*(\S*)', step("gate", "Install")["run"]).group(1).split(","))
    shim = python3_that_adds(linked(extras - {""}), tmp_path)
    env = clean_env(home, GITHUB_ENV=str(github_env), RUNNER_TEMP=str(tmp_path), GITHUB_STEP_SUMMARY=str(summary))
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    env.update({k: str(v) for k, v in workflow().get("env", {}).items() if "${{" not in str(v)})
    env.update(PERFSUITE_TORCH_INDEX="")  # ${{ vars.PERFSUITE_TORCH_INDEX }} unset
    env.update(PERFSUITE_INSTALLER="pip")  # pip sees the links (a .pth folder); uv reads site-packages only

    installed = run_step(step("gate", "Install")["run"], env)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    written = dict(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line)
    venv = Path(written["VENV"])
    assert venv.is_relative_to(home / ".cache" / "perfsuite")  # on the runner's disk, not in the checkout
    assert Path(written["HISTORY_URL"]).is_relative_to(home / ".cache" / "perfsuite")
    probe = import_check(venv / "bin" / "python")
    assert probe.stdout.startswith("MISSING [] 2."), probe.stdout + probe.stderr  # no test extra; the linked torch
    assert summary.read_text().startswith(f"perfsuite installed in {venv}: extras llm, torch 2.")  # which torch

    gate = step("gate", "Gate tier")["run"].rstrip()
    assert gate.splitlines()[-1].strip().startswith("--perf-out")  # the pytest line ends the step
    env.update(written, RUN_DIR=str(tmp_path / "gate"), RECORD_HISTORY="true")
    collected = run_step(gate + " --collect-only -q -p no:cacheprovider", env, timeout=300)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    collected_every_gate_cell(collected.stdout)


@pytest.mark.slow
def test_tox_gpu_installs_and_collects_the_gate_in_a_fresh_venv(tmp_path, linked):
    """`tox -e gpu -- --collect-only`: tox makes its venv (set up first with
    --notest, then given the links), .ci/install installs into it."""
    pytest.importorskip("tox", reason="tox comes with the test extra")
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    extras = set(re.search(r"\.ci/install \{envdir\}\s*(\S*)", tox["testenv:gpu"]["commands_pre"]).group(1).split(","))
    env = clean_env(tmp_path / "home", PERFSUITE_INSTALLER="pip")  # as above: pip sees the links
    (tmp_path / "home").mkdir()
    work = tmp_path / "tox"
    base = [sys.executable, "-m", "tox", "-e", "gpu", "--workdir", str(work)]
    made = subprocess.run([*base, "--notest"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    add_links(work / "gpu", linked(extras - {""}))
    ran = subprocess.run([*base, "--", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--perf-out", str(tmp_path / "gate")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert ".ci/install" in ran.stdout  # tox ran the one install, not an install of its own
    probe = import_check(work / "gpu" / "bin" / "python")
    assert probe.stdout.startswith("MISSING [] 2."), probe.stdout + probe.stderr
    collected_every_gate_cell(ran.stdout)


# ------------------------------------------------------------ .ci/install
def fake_driver(tmp_path: Path, version: str | None) -> dict[str, str]:
    """An environment whose nvidia-smi reports this driver (None: no nvidia-smi)."""
    env = clean_env(tmp_path)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if version is not None:
        smi.write_text(f"#!/bin/sh\necho {version}\n")
        smi.chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    else:  # only what a machine without an NVIDIA driver has
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    return env


def dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INSTALL), "--dry-run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize(("driver", "choice", "index"), [
    (None, "", None), ("580.65.06", "", None), ("575.51.03", "", "cu128"), ("565.57.01", "", "cu126"),
    ("575.51.03", "pypi", None), (None, "cpu", "cpu"), ("560.35.03", "cu130", "cu130")])
def test_torch_comes_from_the_index_the_driver_needs(tmp_path, driver, choice, index, installer):
    env = fake_driver(tmp_path, driver)
    env["PERFSUITE_TORCH_INDEX"] = choice
    if installer == "pip":
        env["PERFSUITE_INSTALLER"] = "pip"  # uv, unset
    done = dry_run(env, "venv", "llm")
    assert done.returncode == 0, done.stderr
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    venv = ROOT / "venv"
    installs = {"uv": f"{venv}/bin/python -m uv pip install --quiet --compile-bytecode --python {venv}/bin/python",
                "pip": f"{venv}/bin/python -m pip install --quiet"}[installer]
    assert commands[:2] == [f"python3 -m venv {venv}", f"{venv}/bin/python -m pip install --quiet --upgrade pip"]
    assert (f"{venv}/bin/python -m pip install --quiet uv" in commands) == (installer == "uv")
    torch = [c for c in commands if "--index-url" in c]
    if index is None:
        assert not torch
    else:  # torch first, with the constraints, from that index
        assert torch == [f"{installs} -c constraints.txt "
                         f"--index-url https://download.pytorch.org/whl/{index} torch torchvision"]
        assert commands.index(torch[0]) < len(commands) - 1
    assert commands[-1] == f"{installs} -c constraints.txt -e .[llm]"


def test_an_unknown_installer_is_named_before_anything_is_installed(tmp_path):
    env = fake_driver(tmp_path, None)
    env["PERFSUITE_INSTALLER"] = "conda"
    done = dry_run(env, "venv")
    assert done.returncode == 2 and "PERFSUITE_INSTALLER=conda: expected uv or pip" in done.stderr
    assert "+ " not in done.stdout


def test_where_uv_cannot_be_had_pip_installs_the_same(tmp_path):
    """A registry that only pip is configured for: uv is not there, or its
    install fails; pip then installs the same, and the run says so."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls"
    # a venv python that records its calls and fails those of uv
    (venv / "bin" / "python").write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in *uv*) exit 1 ;; *" -c import"*) echo 2.14.0 ;; esac
""")
    (venv / "bin" / "python").chmod(0o755)
    env = fake_driver(tmp_path, None)
    done = subprocess.run(["bash", str(INSTALL), str(venv), "llm"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "uv could not be installed" in done.stderr and "installer: pip" in done.stdout
    calls = log.read_text().splitlines()
    assert calls[-2:] == ["-m pip install --quiet -c constraints.txt -e .[llm]",
                          "-c import importlib.metadata as m; print(m.version(\"torch\"))"]
    (venv / "bin" / "python").write_text((venv / "bin" / "python").read_text().replace(
        '*uv*) exit 1', '*"uv pip install"*) exit 1'))  # uv installs, its pip install fails
    log.unlink()
    done = subprocess.run(["bash", str(INSTALL), str(venv), "llm"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "uv pip install failed" in done.stderr
    calls = log.read_text().splitlines()
    assert calls[-3:-1] == [f"-m uv pip install --quiet --compile-bytecode --python {venv}/bin/python "
                            "-c constraints.txt -e .[llm]",
                            "-m pip install --quiet -c constraints.txt -e .[llm]"]


def test_a_driver_too_old_for_any_torch_build_stops_the_install(tmp_path):
    done = dry_run(fake_driver(tmp_path, "535.104.05"), "venv")
    assert done.returncode == 2
    assert "535.104.05" in done.stderr and "PERFSUITE_TORCH_INDEX" in done.stderr
    assert "pip install" not in done.stdout


def test_usage(tmp_path):
    env = fake_driver(tmp_path, None)
    assert dry_run(env).returncode == 2
    assert dry_run(env, "a", "b", "c").returncode == 2
    env["PERFSUITE_TORCH_INDEX"] = "cuda"
    wrong = dry_run(env, "venv")
    assert wrong.returncode == 2 and "PERFSUITE_TORCH_INDEX=cuda" in wrong.stderr
    plain = dry_run(fake_driver(tmp_path, None), str(tmp_path / "v"))
    assert plain.stdout.splitlines()[-1].endswith("-c constraints.txt -e .")  # no extras: no brackets


def test_the_install_script_passes_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    done = subprocess.run([shellcheck, str(INSTALL)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_install_runs_the_one_script():
    """tox's, CI's and the workflow's: one script, the same step in every job."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    for name in ("cpu", "gpu", "full"):
        section = tox[f"testenv:{name}"]
        assert section.get("commands_pre", "").startswith("bash {toxinidir}/.ci/install {envdir}"), name
        assert "pip install" not in section.get("commands", "") + section.get("deps", ""), name
    assert tox["testenv"].getboolean("skip_install")  # tox's own install would take no constraints
    assert "bash .ci/install .venv test" in (ROOT / ".ci" / "run").read_text()
    steps = [s["run"] for job in workflow()["jobs"].values() for s in job["steps"] if s.get("name") == "Install"]
    # every job but the ab job, which installs through this repository's action (.ci/perfsuite-action install)
    by_action = [job for job in workflow()["jobs"].values()
                 if any(s.get("uses") == "$/.github/actions/perfsuite" for s in job["steps"])]
    assert len(steps) + len(by_action) == len(workflow()["jobs"]) and set(steps) == {"bash .ci/runner-venv llm"}
    assert 'exec bash "$here/runner-venv" llm' in (ROOT / ".ci" / "perfsuite-action").read_text()
    runner_venv = (ROOT / ".ci" / "runner-venv").read_text()
    assert re.search(r'^bash \.ci/install "\$VENV" "\$@" \| tee "\$RUNNER_TEMP/install.txt"$', runner_venv, re.M)
    assert "pip install" not in runner_venv


# ----------------------------------------------- the runner's own torch
RUNNER = {"PERFSUITE_TORCH_INDEX": "runner"}


def pinned(name: str) -> str:
    return re.search(rf"^{name}==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)


def fake_site(where: Path, torch: str | None = "2.11.0+cu130", vision: str = "0.26.0",
              requires: tuple[str, ...] = (), wheels: tuple[str, ...] = ()) -> Path:
    """A site folder whose torch and torchvision are tiny packages of these
    versions, with the metadata pip reads (torch's Requires-Dist lines too;
    ``wheels``: installed distributions, "name==version"), and packaging
    (which a runner's python has with its pip)."""
    import packaging

    site = where / "site"
    site.mkdir(parents=True)
    (site / "packaging").symlink_to(Path(packaging.__file__).parent)
    dists = dict(w.split("==") for w in wheels)
    if torch is not None:
        dists.update(torch=torch, torchvision=vision)
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(f"__version__ = {torch!r}\n")
        (site / "torchvision").mkdir()
        (site / "torchvision" / "__init__.py").write_text(f"import torch\n__version__ = {vision!r}\n")
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in (requires if name == "torch" else ())]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return site


def base_python() -> str:
    """The interpreter this venv was made from: a runner's python is no venv's."""
    return getattr(sys, "_base_executable", sys.executable)


def runner_python(where: Path, site: Path, python: str | None = None) -> Path:
    """A bin folder whose python3 is the runner's: the base interpreter with ``site`` on its path."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{python or base_python()}" "$@"\n')
    shim.chmod(0o755)
    return shim


def runner_dry_run(tmp_path: Path, *args: str, site: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """.ci/install --dry-run with PERFSUITE_TORCH_INDEX=runner and the runner's python3 on PATH."""
    python = runner_python(tmp_path, site or fake_site(tmp_path))
    environ = fake_driver(tmp_path, "580.65.06")  # any driver: the index is not asked
    environ.update(RUNNER, PATH=f"{python.parent}{os.pathsep}{environ['PATH']}", **env)
    return dry_run(environ, *args)


def commands_of(done: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("extras", ["llm", ""])
def test_the_runners_torch_is_kept_and_no_command_installs_torch(tmp_path, extras):
    venv = tmp_path / "venv"
    done = runner_dry_run(tmp_path, str(venv), *([extras] if extras else []))
    assert done.returncode == 0, done.stderr
    commands = commands_of(done)
    assert commands[:2] == [f"python3 -m venv --system-site-packages {venv}",  # it sees the image's packages
                            f"{venv}/bin/python -m pip install --quiet --upgrade pip"]
    installs = commands[2:]
    assert len(installs) == 1 and re.fullmatch(
        rf"{venv}/bin/python -m pip install --quiet -c \S+ -e \.{re.escape(f'[{extras}]' if extras else '')}",
        installs[0]), installs  # pip (uv would not see the runner's torch), perfsuite alone
    assert not any({"torch", "torchvision", "--index-url", "uv", "constraints.txt"} & set(c.split()) for c in commands)
    constraints = next(line for line in done.stdout.splitlines() if line.startswith("constraints: ")).split()[1:]
    assert constraints == [f"torchtune=={pinned('torchtune')}", f"torchao=={pinned('torchao')}",
                           "torch==2.11.0+cu130", "torchvision==0.26.0"]  # the rest as CI tests it
    assert done.stdout.splitlines()[-1] == (f"perfsuite install: the runner's torch 2.11.0+cu130 (torchvision 0.26.0) "
                                            f"from {tmp_path / 'site'}, not constraints.txt's {pinned('torch')}")


def test_the_runners_python_is_the_one_named(tmp_path):
    site = fake_site(tmp_path / "image")
    python = runner_python(tmp_path / "image", site)
    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), "llm", PERFSUITE_PYTHON=str(python))
    assert done.returncode == 0, done.stderr
    assert commands_of(done)[0] == f"{python} -m venv --system-site-packages {tmp_path / 'venv'}"
    assert done.stdout.splitlines()[-1].startswith(f"perfsuite install: the runner's torch 2.11.0+cu130 (torchvision 0.26.0) from {site},")


@pytest.mark.parametrize(("torch", "vision", "ok"), [
    ("2.8.0", "0.23.0", False), ("2.11.0+cu130", "0.23.0", False), ("2.8.0+cu128", "0.26.0", False),
    ("2.9.1", "0.24.1", True), ("2.15.0.dev20260101+cu130", "0.30.0.dev20260101", True),  # as doctor: by release
    ("2.6.0a0+ecf3bae40a", "0.21.0a0", False)])
def test_a_runners_torch_outside_pyprojects_range_is_refused_before_anything_is_made(tmp_path, torch, vision, ok):
    from perfsuite.doctor.facts import supported_versions

    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), "llm", site=fake_site(tmp_path, torch, vision))
    if ok:
        assert done.returncode == 0, done.stderr
        assert f"the runner's torch {torch} (torchvision {vision})" in done.stdout.splitlines()[-1]
        return
    assert done.returncode == 2 and "+ " not in done.stdout  # nothing made, nothing installed
    supported = supported_versions()
    outside = [f"{name} {version}" for name, version in (("torch", torch), ("torchvision", vision))
               if not version.startswith(("2.11", "0.26"))]
    assert f"PERFSUITE_TORCH_INDEX=runner: {' and '.join(outside)} (" in done.stderr
    assert "outside the versions perfsuite supports" in done.stderr
    assert all(f"{name}{spec}" in done.stderr for name, spec in supported.items())  # pyproject's range, named
    assert f"unset PERFSUITE_TORCH_INDEX to install constraints.txt's torch {pinned('torch')}" in done.stderr


def test_a_runner_python_without_torch_is_refused_with_the_fix(tmp_path):
    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), site=fake_site(tmp_path, None))
    assert done.returncode == 2 and "+ " not in done.stdout
    assert "torch cannot be imported by" in done.stderr and "ModuleNotFoundError" in done.stderr
    assert "PERFSUITE_PYTHON" in done.stderr and "unset PERFSUITE_TORCH_INDEX" in done.stderr


@pytest.mark.parametrize(("requires", "wheels", "ok"), [
    (('nvidia-cublas==13.0.0.19; platform_system == "Linux"', "filelock"), (), False),
    (('nvidia-cublas==13.0.0.19; platform_system == "Linux"',), ("nvidia-cublas==13.0.0.18",), False),
    (('nvidia-cublas==13.0.0.19; platform_system == "Linux"', "triton==3.5.0"),
     ("nvidia-cublas==13.0.0.19", "triton==3.5.0"), True),
    (('nvidia-cublas==13.0.0.19; platform_system == "Windows"', "filelock"), (), True)])
def test_cuda_wheels_the_runners_torch_lacks_are_refused_not_installed_beside_it(tmp_path, requires, wheels, ok):
    """pip would install them into the venv, where they come before the image's CUDA libraries."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the markers are Linux's")
    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), site=fake_site(tmp_path, requires=requires, wheels=wheels))
    if ok:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and "+ " not in done.stdout
    assert "lacks CUDA wheels its torch requires" in done.stderr and "nvidia-cublas==13.0.0.19" in done.stderr
    assert "filelock" not in done.stderr  # pip installs the others into the venv: harmless


def test_a_venv_that_does_not_see_the_runners_torch_is_refused_with_the_fix(tmp_path):
    """A venv made without --system-site-packages (tox's, say)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{base_python()}" -S "$@"\n')  # no site-packages
    (venv / "bin" / "python").chmod(0o755)
    env = fake_driver(tmp_path, None)
    env.update(RUNNER)
    done = dry_run(env, str(venv))
    assert done.returncode == 2 and "+ " not in done.stdout
    assert "torch cannot be imported by" in done.stderr
    assert f"remove {venv}, so that .ci/install makes it from the runner's python with --system-site-packages" \
        in done.stderr


def test_uv_is_refused_for_the_runners_torch(tmp_path):
    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), PERFSUITE_INSTALLER="uv")
    assert done.returncode == 2 and "+ " not in done.stdout
    assert "PERFSUITE_INSTALLER=uv with PERFSUITE_TORCH_INDEX=runner" in done.stderr


def test_a_venvs_python_as_the_runners_is_refused_it_would_not_pass_its_packages_on(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("these tests run outside a venv")
    done = runner_dry_run(tmp_path, str(tmp_path / "venv"), PERFSUITE_PYTHON=str(
        runner_python(tmp_path / "image", fake_site(tmp_path / "image"), python=sys.executable)))
    assert done.returncode == 2 and "+ " not in done.stdout
    assert f"is the python of the venv {sys.prefix}" in done.stderr
    assert f"bash .ci/install {sys.prefix} EXTRAS" in done.stderr


@pytest.mark.parametrize("replaces", [False, True])
def test_an_install_into_a_venv_checks_the_runners_torch_before_and_after(tmp_path, replaces):
    """A real run into an existing venv whose python is the runner's and whose
    pip records what it is asked (the constraints file too); a pip that
    replaces torch fails the install."""
    site = fake_site(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log, seen = tmp_path / "calls", tmp_path / "constraints.seen"
    replace = f"sed -i 's/^Version: .*/Version: 2.14.0/' {site}/torch-2.11.0+cu130.dist-info/METADATA" if replaces else ":"
    (venv / "bin" / "python").write_text(f"""#!/bin/sh
case "$*" in
  "-m pip install"*)
    echo "$*" >> {log}
    prev=""
    for arg; do if [ "$prev" = -c ]; then cp "$arg" {seen}; fi; prev="$arg"; done
    {replace}
    exit 0 ;;
esac
PYTHONPATH="{site}" exec "{base_python()}" "$@"
""")
    (venv / "bin" / "python").chmod(0o755)
    env = fake_driver(tmp_path, None)
    env.update(RUNNER)
    done = subprocess.run(["bash", str(INSTALL), str(venv), "llm"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    calls = log.read_text().splitlines()
    assert calls[0] == "-m pip install --quiet --upgrade pip" and len(calls) == 2
    assert re.fullmatch(r"-m pip install --quiet -c \S+ -e \.\[llm\]", calls[1])
    assert "torch==2.11.0+cu130\ntorchvision==0.26.0\n" in seen.read_text()
    assert f"torchao=={pinned('torchao')}" in seen.read_text() and "torch==2.14.0" not in seen.read_text()
    if replaces:
        assert done.returncode == 1
        assert f"the install changed what {venv} sees: torch 2.14.0 ({site}), torchvision 0.26.0" in done.stderr
        assert "perfsuite install:" not in done.stdout
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == (f"perfsuite install: the runner's torch 2.11.0+cu130 (torchvision "
                                                f"0.26.0) from {site}, not constraints.txt's {pinned('torch')}")


# -------------------------------------------- the workflow's choice of torch
@pytest.mark.parametrize(("choice", "python3_has", "suffix"), [
    ("", "2.11.0+cu130", ""), ("cu128", "2.11.0+cu130", "-cu128"),
    ("runner", "2.11.0+cu130", f"-runner-py{sys.version_info[0]}.{sys.version_info[1]}-torch2.11.0+cu130"),
    ("runner", None, "-runner-none")])
def test_the_install_step_keys_its_venv_by_the_torch_chosen_and_says_which_it_used(tmp_path, choice, python3_has,
                                                                                   suffix):
    """The Install step as written, in a copy of the checkout whose .ci/install
    only says what it was asked: the venv's name carries the repository
    variable's choice and, for the runner's torch, its python's and torch's
    versions (an image's upgrade gets a new venv); the install's last line
    goes to the job summary."""
    install = step("gate", "Install")
    assert install["env"] == {"PERFSUITE_TORCH_INDEX": "${{ vars.PERFSUITE_TORCH_INDEX }}"}
    work = tmp_path / "checkout"
    (work / ".ci").mkdir(parents=True)
    for name in ("pyproject.toml", "constraints.txt", ".ci/runner-venv"):
        (work / name).write_bytes((ROOT / name).read_bytes())
    (work / ".ci" / "install").write_text('mkdir -p "$1"\necho "asked: $*"\n'
                                          'echo "perfsuite install: torch index ${PERFSUITE_TORCH_INDEX:-auto}"\n')
    python3 = runner_python(tmp_path, fake_site(tmp_path, python3_has))
    home, summary, github_env = tmp_path / "home", tmp_path / "summary.md", tmp_path / "github_env"
    env = clean_env(home, GITHUB_ENV=str(github_env), GITHUB_STEP_SUMMARY=str(summary), RUNNER_TEMP=str(tmp_path),
                    PERFSUITE_TORCH_INDEX=choice)
    env["PATH"] = f"{python3.parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install["run"]], cwd=work,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    venv = dict(line.split("=", 1) for line in github_env.read_text().splitlines())["VENV"]
    assert re.fullmatch(rf"{re.escape(str(home))}/\.cache/perfsuite/venv-[0-9a-f]{{16}}{re.escape(suffix)}", venv)
    assert done.stdout.splitlines() == [f"asked: {venv} llm", f"perfsuite install: torch index {choice or 'auto'}"]
    assert summary.read_text() == f"perfsuite install: torch index {choice or 'auto'}\n"
