"""perfsuite's extras, and the one sentence that names one where it is missing.

``pip install perfsuite`` brings what the image cells, the history in an
SQLite file, change points and the reports need. The rest is an extra:

- ``llm``: the LLM cells (torchtune's recipes): torchtune, torchao,
  omegaconf, regex (``perfsuite.workloads.llm``);
- ``postgres``: a history at a ``postgresql://`` URL: psycopg
  (``perfsuite.history.schema``).

Every place that needs an extra asks here, so the fix reads the same from a
cell's error, ``perfsuite doctor`` and the history. Standard library only:
a module is looked for (``importlib.util.find_spec``), not imported, so
asking costs nothing and a package that is there but broken still fails
with its own error where it is imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    name: str
    needs: str  # the start of the sentence: "<needs> perfsuite's <name> extra"
    modules: tuple[str, ...]  # top-level modules it installs that perfsuite imports


EXTRAS = {
    "llm": Extra("llm", "the LLM cells need", ("torchtune", "torchao", "omegaconf", "regex")),
    "postgres": Extra("postgres", "a history at a postgresql:// URL needs", ("psycopg",)),
}


class MissingExtra(ImportError):
    """An extra that is not installed; the message names it and its install line."""

    def __init__(self, extra: str, missing: list[str]) -> None:
        super().__init__(message(extra, missing), name=missing[0] if missing else None)
        self.extra = extra
        self.missing = missing


def install_line(extra: str) -> str:
    return f"pip install 'perfsuite[{extra}]'"


def message(extra: str, missing: list[str] | tuple[str, ...] = ()) -> str:
    """"the LLM cells need perfsuite's llm extra: pip install 'perfsuite[llm]' (torchtune is not installed)"."""
    found = EXTRAS[extra]
    text = f"{found.needs} perfsuite's {extra} extra: {install_line(extra)}"
    if missing:
        text += f" ({', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed)"
    return text


def installed(module: str) -> bool:
    """``module`` can be imported here (looked for, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails, a module without a spec
        return False


def missing(extra: str) -> list[str]:
    """The extra's modules that are not installed (empty: it is installed)."""
    return [m for m in EXTRAS[extra].modules if not installed(m)]


def require(extra: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` is installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, absent)


# Built-in workloads (perfsuite.specs.BUILTIN) that need an extra.
WORKLOAD_EXTRAS = {"llm": "llm"}


def workload_problem(workload: str) -> str | None:
    """The sentence naming the extra a built-in workload needs and lacks here; None if nothing lacks."""
    extra = WORKLOAD_EXTRAS.get(workload)
    absent = missing(extra) if extra else []
    return message(extra, absent) if absent else None
