"""Root conftest: hypothesis profiles for the suite's own tests.

The perfsuite plugin itself is loaded through its ``pytest11`` entry point.
hypothesis comes with the ``test`` extra: a GPU runner that installed only
perfsuite (``pip install -e .``) runs ``pytest tests/perf`` without it.
"""

import os

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the perf tiers need no hypothesis; the property tests import it themselves
    settings = None

if settings is not None:
    # CI draws the same examples every run, so a gate never fails on a new draw
    # that has nothing to do with the change under review; "dev" keeps exploring.
    settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", max_examples=30, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
