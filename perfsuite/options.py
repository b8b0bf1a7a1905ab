"""The option vocabulary the ``perfsuite`` command and the pytest plugin share.

One name per concept. A ``perfsuite`` option ``--NAME`` is pytest's
``--perf-NAME`` (``--history`` / ``--perf-history``, ``--baselines`` /
``--perf-baselines``, ``--profiler`` / ``--perf-profiler``). The options that
launch cells are one group (``add_launch_options``), given to ``perfsuite
run``, ``ab`` and ``bisect`` and, prefixed, to pytest. An old name stays for
one release (``OldName``): it does what the new name does and says once, on
stderr, which name replaces it. And a default that several commands would
otherwise each state: the launch statistic.

Standard library only: every command and pytest's option parsing import it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

PYTEST_PREFIX = "--perf-"

# What one launch contributes to a step-time verdict between launches: by
# default (compare, ab, bisect, history, the self-tests), and for a baseline
# folder whose profile.json names none (one that names it is judged so).
# The median, the launch's typical step, means the same on every machine and
# cell. The floor (its fastest step) pays only where noise only ever adds
# time: on the shared 2-core VM identical launches' floors scattered 5.5 %
# against 14.5 % for their medians within a session (14.6 % against 15.2 %
# over five sessions), and that machine's baseline folders ask for floors.
# Where launches are quiet it buys nothing (an H100's launch medians
# scattered 0.08 %), and it follows whichever step is cheapest rather than
# the code: on that H100 the floors were each epoch's partial last batch
# until partial batches left the samples, and an LLM cell's floor is the
# step of its shortest sequences.
DEFAULT_LAUNCH_STATISTIC = "median"
LAUNCH_STATISTICS = ("median", "floor")  # perfsuite.stats.launches.LAUNCH_STATISTICS (a test checks)
# Repeated launches (d.o.f. of their pooled spread) before recording judges a
# folder whose launch statistic nobody set by the steadier of the two: two
# cells of perfsuite.judge.recording.RECORD_LAUNCHES launches.
STEADIER_DOF = 6
LAUNCH_STATISTIC_HELP = ("what each launch contributes to a step-time verdict: its median step, or its floor "
                         "(fastest step), for a shared machine whose neighbours only ever add time")

PROFILERS = ("nsys", "torch", "off")
HISTORY_PURPOSES = ("run", "experiment", "ad-hoc")  # perfsuite.history.schema.PURPOSES (a test checks)
# The history's readers, as perfsuite.history.store and .changes have them (a
# test checks), for parsers that must not import them.
DEFAULT_METRIC, DEFAULT_MAX_PVALUE, DEFAULT_WINDOW = "step_time", 0.0001, 20
HISTORY_HELP = ("history store: an SQLite file or any SQLAlchemy URL, e.g. postgresql://user@host/db "
                "(default: $PERFSUITE_HISTORY, else .perfsuite/history.sqlite)")
INCLUDE_HELP = ("take runs of these purposes too: experiment (an injected fault or a workload option), "
                "ad-hoc (outside .perfsuite/), all; comma-separated (default: runs only)")

_said: set[str] = set()


def say_renamed(old: str, new: str) -> None:
    """Tell, once per command (``forget_said``), that ``old`` is now ``new``."""
    if old in _said:
        return
    _said.add(old)
    print(f"perfsuite: {old} is now {new}; the old name goes after this release", file=sys.stderr, flush=True)


def forget_said() -> None:
    _said.clear()


class OldName(argparse.Action):
    """The old name of an option that takes one value, kept for one release:
    it stores into the new option's dest and names the new option on stderr.
    Hidden from --help; ``new`` is the option that replaces it."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                         type=kwargs.get("type"), choices=kwargs.get("choices"), metavar=kwargs.get("metavar"))
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        old = option_string or self.option_strings[0]
        given = _old_given(namespace)
        current = getattr(namespace, self.dest, None)
        unset = [a.default for a in parser._actions if a.dest == self.dest and not isinstance(a, OldName)]
        if self.dest not in given and current not in (*unset, values):
            # the new name came first, with another value: which one was meant?
            raise argparse.ArgumentError(self, _clash(old, values, self.new, current))
        say_renamed(old, self.new)
        setattr(namespace, self.dest, values)
        given[self.dest] = (old, self.new, values)


_OLD_GIVEN = "_perfsuite_old_names"  # namespace attribute: dest -> (old name, new name, value)


def _old_given(namespace: argparse.Namespace) -> dict[str, tuple[str, str, Any]]:
    if not hasattr(namespace, _OLD_GIVEN):
        setattr(namespace, _OLD_GIVEN, {})
    return getattr(namespace, _OLD_GIVEN)


def _clash(old: str, old_value: Any, new: str, new_value: Any) -> str:
    return (f"{old} {old_value} and {new} {new_value} are one option by its old and new name, given "
            f"different values; give only {new}")


def old_name_clash(namespace: argparse.Namespace) -> str | None:
    """Why the parsed ``namespace`` cannot be run: an old name given one value
    and its new name, after it, another (the last would silently win); None
    where there is no such pair. The order the other way round is refused
    while parsing (``OldName``)."""
    for dest, (old, new, value) in getattr(namespace, _OLD_GIVEN, {}).items():
        if getattr(namespace, dest, value) != value:
            return _clash(old, value, new, getattr(namespace, dest))
    return None


def history_problem(value: str | None, option: str = "--history") -> str | None:
    """Why ``value`` is no history store to name: "OFF" or "Off" would make a
    store of that name where "off" keeps none (None: it is one)."""
    if value and value.lower() == "off" and value != "off":
        return (f"{option} {value}: off, in lower case, keeps no history; for a store of that name "
                f"write ./{value}")
    return None


def add_old_name(parser: Any, old: str, new: argparse.Action) -> None:
    """``old`` as an alias of the argparse option ``new`` (one that takes a value)."""
    parser.add_argument(old, action=OldName, dest=new.dest, new=new.option_strings[0], type=new.type,
                        choices=new.choices, metavar=new.metavar)


RANK_STARTS = ("fork", "exec")  # perfsuite.launch.starting


def timeout_problem(value: float) -> str | None:
    """Why ``value`` is no timeout, or None: it must be a finite number of
    seconds above 0 (``inf`` would keep a hung cell for ever, ``0`` or less
    end every launch at once). The CLI, the plugin, launch_options and
    perf_ranks(timeout=) all ask here."""
    if math.isfinite(value) and value > 0:
        return None
    return "give a positive number of seconds, or leave it out to use each cell's own timeout"


def seconds(text: str) -> float:
    """An argparse type: a timeout (``timeout_problem``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    problem = timeout_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return value


def add_launch_options(add: Callable[..., Any], prefix: str = "--") -> dict[str, Any]:
    """The options that launch cells, through ``add`` (an argparse group's
    ``add_argument``, or pytest's ``addoption`` with ``prefix`` ``--perf-``);
    what ``add`` returned, by dest without the prefix."""
    def option(name: str, **kwargs: Any) -> None:
        added[name.replace("-", "_")] = add(f"{prefix}{name}", **kwargs)

    added: dict[str, Any] = {}
    option("data-dir", default=None, metavar="DIR",
           help="directory with real datasets, MNIST's IDX files for the full tier (default: none, the "
                "generated and bundled data)")
    option("option", action="append", default=[], metavar="KEY=VALUE",
           help="workload option, repeatable, e.g. llm_checkpoint_dir=/models/llama3-8b (default: none)")
    option("timeout", type=seconds, default=None, metavar="S",
           help="override every cell's own timeout, in seconds (default: each cell's own)")
    option("profiler", default=None, choices=PROFILERS,
           help="profile every cell with Nsight Systems (torch.profiler where nsys or a GPU is missing), "
                "with torch.profiler, or none (default: only the profile cells, nsys where it works)")
    option("gpus", default=None, metavar="0,1",
           help="the GPUs this session may use, CUDA_VISIBLE_DEVICES for its cells (default: all)")
    option("allow-no-gpu", action="store_true",
           help="where torch sees no GPU, skip the GPU cells instead of refusing to start (a GPU run "
                "that measured nothing must not pass)")
    option("nnodes", type=int, default=1, metavar="N",
           help=f"nodes a cell spans, torchrun's c10d rendezvous: the same command on every node "
                f"(default: %(default)s; {prefix}slurm takes it from the job)")
    option("rdzv-endpoint", default=None, metavar="HOST:PORT",
           help=f"with {prefix}nnodes: the rendezvous host and port, the same on every node (default: none)")
    option("rdzv-id", default=None, metavar="JOB",
           help="rendezvous id, the same on every node, new for every job (default: none)")
    option("slurm", action="store_true",
           help="inside a SLURM allocation: nodes from the job, torchrun started through srun")
    option("rank-start", default=None, choices=RANK_STARTS,
           help="fork: ranks forked from an interpreter that imported torch and the workload once (one "
                "node, no srun, no nsys; seconds less a launch); exec: each rank a fresh interpreter "
                "(default: $PERFSUITE_RANK_START, else fork)")
    return added

# perfsuite ab's resident windows (perfsuite.ab.resident). On the 2-core VM a
# smoke step takes ~50 ms: a quad of 5-step windows ~1.2 s, a launch pair ~30 s.
# What slows side B in the A/B detection benchmark (perfsuite.selftest.detection)
AB_FAULT_KINDS = ("slow", "gpu-sleep")
AB_MODES = ("auto", "resident", "launches")  # auto: resident where the cell allows it
DEFAULT_WINDOW_STEPS, DEFAULT_QUADS, DEFAULT_MAX_PAIRS = 5, 16, 4
# --quads auto: per cell, the quads at which its recorded steps forecast that
# unchanged code reads `same` by the last look 4 times in 5 (perfsuite.ab.forecast),
# within these bounds
AUTO_QUADS, AUTO_QUADS_RANGE = "auto", (4, 64)


def quads_value(text: str) -> int | str:
    """--quads: a number, or auto."""
    if text == AUTO_QUADS:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of quads, or {AUTO_QUADS}") from None


def add_resident_options(add: Callable[..., Any], note: str = "") -> None:
    """perfsuite ab's --mode, --window-steps, --quads, --max-pairs, through
    ``add``; ``note`` starts each help (``selftest``: "with --ab: ")."""
    add("--mode", choices=AB_MODES, default=AB_MODES[0],
        help=f"{note}auto: both sides' launches kept up and short windows alternated ABBA where the cell "
             "allows it (image cells on one node), else launch rounds")
    add("--window-steps", type=int, default=DEFAULT_WINDOW_STEPS, metavar="N", help=f"{note}steps in one window")
    add("--quads", type=quads_value, default=DEFAULT_QUADS, metavar="N",
        help=f"{note}ABBA quads of windows in one launch pair; auto: per cell, as many as the step times "
             f"recorded for it on this hardware forecast make unchanged code `same` at --tolerance 4 times in 5 "
             f"({AUTO_QUADS_RANGE[0]}-{AUTO_QUADS_RANGE[1]}; {DEFAULT_QUADS} where none are recorded)")
    add("--max-pairs", type=int, default=DEFAULT_MAX_PAIRS, metavar="N",
        help=f"{note}launch pairs before a cell is left unknown (2, or 4 or more: looks after pairs 2, 4, 5, ...)")
