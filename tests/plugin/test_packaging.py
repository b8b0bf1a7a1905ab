"""perfsuite as a user installs it: a built wheel, not this source tree; and
what the pytest plugin costs a pytest run that measures nothing."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parents[2]


def test_the_package_list_is_what_discovery_finds_plus_the_baselines():
    """pyproject lists its packages (to map baselines/ in as perfsuite._baselines):
    a new subpackage or data folder must be listed too, or the wheel lacks it."""
    from setuptools import find_namespace_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {p for p in find_namespace_packages(where=str(ROOT), include=["perfsuite*"])
             if "__pycache__" not in p and "egg-info" not in p}
    assert set(config["packages"]) == found | {"perfsuite._baselines"}
    assert config["package-dir"] == {"perfsuite._baselines": "baselines"}


@pytest.mark.slow
def test_an_installed_wheel_finds_the_project_baselines(tmp_path):
    """pip install . (not -e): the baselines travel inside the package."""
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".perfsuite*")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("perfsuite", "baselines"):  # a copy: the build writes build/ and egg-info
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"),
                    "-q"], cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("perfsuite-*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PERFSUITE_BASELINES", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    probe = ("import perfsuite, perfsuite.judge.baselines as b, perfsuite.cells as c\n"
             "sets = b.load_all()\n"
             "print(perfsuite.__file__); print(b.default_root()); print(len(sets))\n"
             "print(' '.join(sorted(s.path.name for s in sets))); print(len(c.select(tier='smoke')))\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = subprocess.run([sys.executable, "-c", probe], cwd=outside, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    module, root, count, profiles, smoke = done.stdout.splitlines()
    assert Path(module).is_relative_to(target)  # the installed copy, not this checkout
    assert Path(root) == target / "perfsuite" / "_baselines"
    expected = sorted(p.name for p in (ROOT / "baselines").iterdir() if p.is_dir())
    assert int(count) == len(expected) >= 1 and profiles.split() == expected
    assert any(p.endswith("-paper") for p in profiles.split())
    assert int(smoke) > 0  # the experiment data came along too
    shipped = {p.relative_to(ROOT / "perfsuite").as_posix() for p in (ROOT / "perfsuite").rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc")}
    installed = {p.relative_to(target / "perfsuite").as_posix() for p in (target / "perfsuite").rglob("*")
                 if p.is_file()}
    assert shipped <= installed, sorted(shipped - installed)  # every data file of the package


def test_importing_the_plugin_imports_no_heavy_library():
    """Every pytest run in the environment imports the plugin (pytest11 entry
    point); only pytest_addoption runs in a run that measures nothing, and it
    needs no torch, pandas, matplotlib, numpy or scipy."""
    probe = (
        "import sys\n"
        "from _pytest.config.argparsing import Parser\n"
        "import perfsuite.plugin as plugin\n"
        "plugin.pytest_addoption(Parser())\n"
        "heavy = ('torch', 'pandas', 'matplotlib', 'numpy', 'scipy')\n"
        "print(' '.join(sorted(m for m in heavy if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
