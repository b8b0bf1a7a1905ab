"""What another interpreter's torchrun accepts: asked once, asked again after a
reinstall, and a launch built from the answer. The other interpreter is this
one with a stand-in torch first on its path (a parser like torch 2.11's)."""

import os
import subprocess
import sys
import textwrap

import pytest
from cellkit import tiny_image_cell

from perfsuite.launch import torchrun_options
from perfsuite.launch.launch import LaunchOptions, torchrun_argv
from perfsuite.launch.torchrun_options import LINE_PREFIX_TEMPLATE


@pytest.fixture(autouse=True)
def nothing_known(monkeypatch):
    monkeypatch.setattr(torchrun_options, "_answers", {})


def other_interpreter(tmp_path, prefix_template=False, version="2.11.0+cu130"):
    """A python whose torch is a stand-in: its torchrun parser has the options
    a launch uses, with or without the prefix template; each import of its
    torch.distributed.run appends a line to asked.log."""
    torch_dir = tmp_path / "site" / "torch"
    (torch_dir / "distributed").mkdir(parents=True)
    (torch_dir / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (torch_dir / "distributed" / "__init__.py").write_text("")
    (torch_dir / "distributed" / "run.py").write_text(textwrap.dedent(f"""\
        import argparse
        open({str(tmp_path / "asked.log")!r}, "a").write("asked\\n")

        def get_args_parser():
            parser = argparse.ArgumentParser(prog="torchrun")
            parser.add_argument("--standalone", action="store_true")
            parser.add_argument("--nproc-per-node", "--nproc_per_node")
            parser.add_argument("--tee")
            if {prefix_template!r}:
                parser.add_argument("--log-line-prefix-template")
            return parser
        """))
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python), torch_dir / "__init__.py"


def times_asked(tmp_path):
    log = tmp_path / "asked.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_another_interpreters_torchrun_is_asked_once_and_again_after_its_torch_changes(tmp_path):
    python, torch_init = other_interpreter(tmp_path)
    answer = torchrun_options.accepted(python)
    assert answer.error is None and answer.torch_version == "2.11.0+cu130"
    assert answer.accepts("--nproc-per-node") and answer.accepts("--nproc_per_node")
    assert not answer.accepts(LINE_PREFIX_TEMPLATE)
    assert torchrun_options.accepted(python) is answer and times_asked(tmp_path) == 1
    stat = torch_init.stat()
    os.utime(torch_init, (stat.st_atime, stat.st_mtime + 10))  # torch reinstalled in that venv
    assert torchrun_options.accepted(python) is not answer and times_asked(tmp_path) == 2
    torchrun_options.accepted(python, {"OMP_NUM_THREADS": "1"})  # another environment: asked apart
    assert times_asked(tmp_path) == 3


def test_this_interpreter_with_another_pythonpath_is_asked_in_a_subprocess(tmp_path):
    other_interpreter(tmp_path)  # its stand-in torch, chosen here by PYTHONPATH alone
    answer = torchrun_options.accepted(sys.executable, {"PYTHONPATH": str(tmp_path / "site")})
    assert answer.torch_version == "2.11.0+cu130" and not answer.accepts(LINE_PREFIX_TEMPLATE)
    assert times_asked(tmp_path) == 1


def test_the_launch_command_follows_the_launching_interpreters_torchrun(tmp_path):
    older, _ = other_interpreter(tmp_path / "a")
    newer, _ = other_interpreter(tmp_path / "b", prefix_template=True, version="2.14.0+cu130")
    cell = tiny_image_cell()
    argv = torchrun_argv(cell, tmp_path, LaunchOptions(python=older))
    assert argv[0] == older and not any(a.startswith(LINE_PREFIX_TEMPLATE) for a in argv)
    argv = torchrun_argv(cell, tmp_path, LaunchOptions(python=newer))
    assert argv[0] == newer and any(a.startswith(f"{LINE_PREFIX_TEMPLATE}=") for a in argv)


def test_an_interpreter_that_cannot_answer_gets_only_options_every_torchrun_has(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    answer = torchrun_options.accepted(str(broken))
    assert answer.options == frozenset() and "No module named torch" in answer.error
    argv = torchrun_argv(tiny_image_cell(), tmp_path, LaunchOptions(python=str(broken)))
    assert not any(a.startswith(LINE_PREFIX_TEMPLATE) for a in argv) and "--tee=3" in argv


def test_this_interpreter_is_asked_in_process(monkeypatch, tmp_path):
    from torch.distributed.run import get_args_parser

    def no_subprocess(*args, **kwargs):
        raise AssertionError("this interpreter's torchrun was asked through a subprocess")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    answer = torchrun_options.accepted(sys.executable)
    assert answer.options == {o for a in get_args_parser()._actions for o in a.option_strings}
    assert answer.error is None and torchrun_options.accepted() is answer
    # a link beside it (a venv's python3 for its python) is this interpreter; one in another
    # folder is not, as another venv's python links to the same binary but has its own packages
    beside, elsewhere = tmp_path / "beside", tmp_path / "venv" / "bin" / "python"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.symlink_to(sys.executable)
    assert not torchrun_options._is_this_interpreter(str(elsewhere))
    monkeypatch.setattr(sys, "executable", str(beside / "python3"))
    beside.mkdir()
    (beside / "python3").symlink_to(elsewhere)
    (beside / "python").symlink_to("python3")
    assert torchrun_options._is_this_interpreter(str(beside / "python"))
