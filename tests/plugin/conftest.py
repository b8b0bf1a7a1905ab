"""pytester's in-process runs drop the modules they import when they end, and
torch, pandas and SQLAlchemy (a perf run adds itself to the history) cannot be
imported a second time into one process: import them here, once, before any
in-process run."""

import pandas  # noqa: F401
import sqlalchemy  # noqa: F401
import torch  # noqa: F401

import perfsuite.judge.baselines  # noqa: F401
import perfsuite.launch.launch  # noqa: F401
import perfsuite.report.html  # noqa: F401
