"""LLM fine-tuning cells: torchtune's own recipes (2503.15252 sec. 4, 2505.22905).

Parametrised by the perfsuite plugin over the llm cells of ``--perf-tier``
(or ``--perf-cell``); each test runs its cell once and asserts every check.
"""

import pytest

from perfsuite.judge import failures


def _explain(result):
    return "\n".join(f"{c['name']}: {c['verdict']}: observed {c['observed']}, expected "
                     f"{c['expected']}. {c.get('message', '')}" for c in failures(result))


@pytest.mark.perf(workload="llm")
def test_llm_cell(perf_cell, perf_result):
    assert perf_result["checks"], f"{perf_cell.id}: no check was evaluated"
    assert not failures(perf_result), _explain(perf_result)
