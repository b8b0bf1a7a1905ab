"""Image-classification cells (MobileNetV2, 2503.15252 sec. 3 and 2505.22905).

Parametrised by the perfsuite plugin over the cells of ``--perf-tier`` (or
``--perf-cell``); each test runs its cell once and asserts every check.
"""

import pytest

from perfsuite.judge.judging import explain, failures


@pytest.mark.perf(workload="image")
def test_image_cell(perf_cell, perf_result):
    assert perf_result["checks"], f"{perf_cell.id}: no check was evaluated"
    assert not failures(perf_result), explain(perf_result)
