"""What a torchrun accepts: the options of its argument parser, asked once per interpreter.

torchrun's options differ between torch releases (torch 2.11's has no
``--log-line-prefix-template``, and refuses a launch that passes it), and a
launch may run another environment's interpreter (``perfsuite ab --a-python``).
So the command is built from what that interpreter's
``torch.distributed.run.get_args_parser()`` accepts: asked in this process for
its own interpreter, else by one short run of the other one. The answer is
kept for the life of this process and asked again only when that
interpreter's torch was reinstalled (its ``torch/__init__.py`` has another
modification time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

LINE_PREFIX_TEMPLATE = "--log-line-prefix-template"
ASK_TIMEOUT_S = 180.0  # importing torch in a cold interpreter on a busy 2-core VM
_ASK = """
import json, torch
from torch.distributed.run import get_args_parser
options = sorted({o for action in get_args_parser()._actions for o in action.option_strings})
print(json.dumps({"options": options, "torch_file": torch.__file__, "torch_version": torch.__version__}))
"""


@dataclass(frozen=True)
class Accepted:
    """The options one interpreter's torchrun accepts, and its torch."""

    python: str
    options: frozenset[str]
    torch_version: str | None = None
    torch_file: str | None = None
    error: str | None = None  # why its parser could not be asked (options is then empty)

    def accepts(self, option: str) -> bool:
        return option in self.options


# (interpreter, extra environment) -> (its torch's mtime when asked, the answer)
_answers: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float | None, Accepted]] = {}


def accepted(python: str = sys.executable, env: dict[str, str] | None = None) -> Accepted:
    """What ``python -m torch.distributed.run`` accepts, run with ``env``
    added to this process's environment (its PYTHONPATH may choose another torch)."""
    python = os.path.abspath(python)  # not resolved: a venv's python links to the system's
    key = (python, tuple(sorted((env or {}).items())))
    known = _answers.get(key)
    if known is not None and known[0] == _mtime(known[1].torch_file):
        return known[1]
    here = _is_this_interpreter(python) and not {"PYTHONPATH", "PYTHONHOME"} & set(env or {})
    answer = _ask_here() if here else _ask(python, env or {})
    _answers[key] = (_mtime(answer.torch_file), answer)
    return answer


def _is_this_interpreter(python: str) -> bool:
    """``python`` is this process's interpreter: the same file in the same
    folder (a venv's python and python3). Not merely the same file: every
    venv's python links to the one it was made from."""
    here = os.path.abspath(sys.executable)
    try:
        return os.path.dirname(python) == os.path.dirname(here) and os.path.samefile(python, here)
    except OSError:
        return False


def _mtime(path: str | None) -> float | None:
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


def _ask_here() -> Accepted:
    """This interpreter's torchrun, without a subprocess."""
    try:
        import torch
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
    except Exception as err:  # noqa: BLE001 - the launch itself will say more
        return Accepted(sys.executable, frozenset(), error=f"{type(err).__name__}: {err}")
    options = frozenset(o for action in parser._actions for o in action.option_strings)
    return Accepted(sys.executable, options, torch.__version__, torch.__file__)


def _ask(python: str, env: dict[str, str]) -> Accepted:
    """Another interpreter's torchrun, by one run of that interpreter."""
    try:
        proc = subprocess.run([python, "-c", _ASK], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Accepted(python, frozenset(), error=str(err))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Accepted(python, frozenset(), error=f"exit {proc.returncode}: {last}")
    try:
        answer = json.loads(lines[-1])
        return Accepted(python, frozenset(answer["options"]), answer["torch_version"], answer["torch_file"])
    except (ValueError, KeyError, TypeError) as err:
        return Accepted(python, frozenset(), error=f"unreadable answer ({err}): {lines[-1][:200]}")
