"""pytester's in-process runs drop the modules they import when they end, and
torch and pandas cannot be imported a second time into one process: import
them here, once, before any in-process run."""

import pandas  # noqa: F401
import torch  # noqa: F401

import perfsuite.baselines  # noqa: F401
import perfsuite.launch  # noqa: F401
import perfsuite.report.html  # noqa: F401
