"""Image-classification cells (MobileNetV2, 2503.15252 sec. 3 and 2505.22905).

Parametrised by the perfsuite plugin over the cells of ``--perf-tier`` (or
``--perf-cell``); each test runs its cell once and asserts every check.
"""

import pytest

from perfsuite.judge import failures


def _explain(result):
    return "\n".join(f"{c['name']}: {c['verdict']}: observed {c['observed']}, expected "
                     f"{c['expected']}. {c.get('message', '')}" for c in failures(result))


@pytest.mark.perf(workload="image")
def test_image_cell(perf_cell, perf_result):
    assert perf_result["checks"], f"{perf_cell.id}: no check was evaluated"
    assert not failures(perf_result), _explain(perf_result)
