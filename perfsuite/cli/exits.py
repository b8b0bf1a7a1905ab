"""What every ``perfsuite`` command exits with, the problem a command raises
for a command line that cannot be run (``perfsuite.cli.main.main`` prints it and
exits 2), and how a command hands its results to a machine (``--json``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


class UsageProblem(Exception):
    """A command-line problem found before anything was measured: exit 2."""


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def emit_json(args: argparse.Namespace, document: Any) -> None:
    """The command's one JSON document, on the stdout ``main`` kept for it
    while everything else a --json command says goes to stderr."""
    print(json.dumps(document, indent=1, default=str), file=getattr(args, "json_out", None) or sys.stdout,
          flush=True)
