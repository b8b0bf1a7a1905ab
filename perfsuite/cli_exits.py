"""What every ``perfsuite`` command exits with, and the problem a command
raises for a command line that cannot be run (``perfsuite.cli.main`` prints
it and exits 2)."""

from __future__ import annotations


class UsageProblem(Exception):
    """A command-line problem found before anything was measured: exit 2."""


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
