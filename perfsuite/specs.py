"""Workload specs: what a cell runs, found by one resolver in every rank.

A cell's ``workload`` is one of

- a built-in short name, ``image``, ``llm`` or ``probe``: the function
  ``run`` of its module in ``perfsuite.workloads`` (``BUILTIN``: ``image``,
  ``llm``, and ``preflight`` for the pre-flight probe);
- ``package.module:function``: a function of the user's project, imported
  in the rank (the rank's working directory is the launcher's);
- a name in the entry-point group ``perfsuite.workloads`` (``ENTRY_POINTS``):
  a workload shipped as an installed package, ``name = "pkg.mod:function"``
  under ``[project.entry-points."perfsuite.workloads"]``;
- a pytest node id, ``tests/test_train.py::test_step`` (with the test's own
  parameters, if any): the test itself runs in every rank
  (``perfsuite.plugin.ranktest.run``; see ``perfsuite.plugin.usercells``).

Each resolves to a function ``run(cell, ctx) -> dict``, called by
``perfsuite.rank.worker`` with the cell and the rank's ``RankContext``, returning
the rank record's ``metrics``, ``steps``, ``counters`` and ``info`` (what
``perfsuite.steps.Steps.record()`` builds). Standard library only: the
plugin checks specs while collecting, where nothing heavy may be imported.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

BUILTIN = {"image": "perfsuite.workloads.image:run", "llm": "perfsuite.workloads.llm:run",
           "probe": "perfsuite.workloads.preflight:run"}
ENTRY_POINTS = "perfsuite.workloads"  # the entry-point group of installed workloads
TEST_RUNNER = "perfsuite.plugin.ranktest:run"  # what a pytest node id resolves to

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_FUNCTION = re.compile(rf"{_DOTTED}:{_DOTTED}")
_TEST = re.compile(r"[^:\s]+\.py(?:::[^:\s\[\]]+)+(?:\[.*\])?")
_NAME = re.compile(r"[A-Za-z_][\w.-]*")


class SpecError(ValueError):
    """A workload spec that names nothing runnable."""


@functools.lru_cache(maxsize=1)
def entry_point_names() -> frozenset[str]:
    """Names registered in the ``perfsuite.workloads`` entry-point group."""
    from importlib.metadata import entry_points

    return frozenset(ep.name for ep in entry_points(group=ENTRY_POINTS))


def kind(spec: str) -> str | None:
    """"builtin", "test", "function" or "entry point"; None for none of them."""
    if spec in BUILTIN:
        return "builtin"
    if "::" in spec:
        return "test" if _TEST.fullmatch(spec) else None
    if ":" in spec:
        return "function" if _FUNCTION.fullmatch(spec) else None
    if _NAME.fullmatch(spec) and spec in entry_point_names():
        return "entry point"
    return None


def is_test(spec: str) -> bool:
    """A pytest node id: the cell runs that test itself in its ranks."""
    return "::" in spec and kind(spec) == "test"


def problem(spec: Any) -> str | None:
    """Why ``spec`` is not a workload (None: it is one)."""
    if not isinstance(spec, str) or not spec:
        return f"workload {spec!r}: give a name"
    if kind(spec) is not None:
        return None
    if "::" in spec:
        return (f"workload {spec!r}: a pytest node id is path/to/test_file.py::test_name, "
                "as pytest prints it")
    if ":" in spec:
        return f"workload {spec!r}: write package.module:function"
    registered = sorted(entry_point_names())
    return (f"workload {spec!r} is neither built in ({', '.join(BUILTIN)}) nor registered in "
            f"the entry-point group {ENTRY_POINTS!r} ({', '.join(registered) or 'none installed'}); "
            "or write package.module:function")


def target(spec: str) -> str:
    """The ``module:function`` a spec stands for (an entry point's value)."""
    found = kind(spec)
    if found == "builtin":
        return BUILTIN[spec]
    if found == "test":
        return TEST_RUNNER
    if found == "function":
        return spec
    if found == "entry point":
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINTS):
            if ep.name == spec:
                return ep.value if ":" in ep.value else f"{ep.value}:run"  # a module: its run
    raise SpecError(problem(spec))


def _is_module_of(err: ModuleNotFoundError, name: str) -> bool:
    """The missing module is ``name`` or a package of it (not one it imports)."""
    return bool(err.name) and (name == err.name or name.startswith(f"{err.name}."))


def _import(name: str, import_module: Callable[[str], Any]) -> Any:
    """``import_module(name)``; a module of the project the launcher runs in
    is also found where the interpreter does not look first (``python -m``
    under ``PYTHONSAFEPATH``, as ``perfsuite ab`` starts its sides): the
    working directory, after everything installed."""
    try:
        return import_module(name)
    except ModuleNotFoundError as err:
        cwd = os.getcwd()
        if not _is_module_of(err, name) or cwd in sys.path:
            raise
        sys.path.append(cwd)
        return import_module(name)


def resolve(spec: str, import_module: Callable[[str], Any] = importlib.import_module
            ) -> Callable[..., dict[str, Any]]:
    """The function ``run(cell, ctx)`` of a workload spec, imported."""
    module_name, _, attr = target(spec).partition(":")
    try:
        module = _import(module_name, import_module)
    except ModuleNotFoundError as err:
        if _is_module_of(err, module_name):  # the module itself, not one it imports
            raise SpecError(f"workload {spec!r}: no module {module_name!r} here (the rank runs in "
                            "the launcher's working directory; install the package or run from "
                            "its folder)") from err
        raise
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise SpecError(f"workload {spec!r}: {module_name} has no {attr!r}") from None
    if not callable(found):
        raise SpecError(f"workload {spec!r}: {module_name}:{attr} is not a function")
    return found
