"""LLM fine-tuning cells: torchtune's own recipes (2503.15252 sec. 4, 2505.22905).

Parametrised by the perfsuite plugin over the llm cells of ``--perf-tier``
(or ``--perf-cell``); each test runs its cell once and asserts every check.
"""

import pytest

from perfsuite.judge.judging import explain, failures


@pytest.mark.perf(workload="llm")
def test_llm_cell(perf_cell, perf_result):
    assert perf_result["checks"], f"{perf_cell.id}: no check was evaluated"
    assert not failures(perf_result), explain(perf_result)
