"""A marker that names nothing is a collection error, never a quiet skip."""

import pytest

pytest_plugins = ["pytester"]

TYPO = '''
import pytest

@pytest.mark.perf(workload="imgae")
@pytest.mark.parametrize("size", [16, 32])
def test_typo(perf_cell, perf_result, size):
    pass

@pytest.mark.perf(workload="image")
def test_fine(perf_cell, perf_result):
    pass
'''


def test_an_unknown_workload_in_the_perf_marker_is_a_collection_error_naming_it(pytester):
    pytester.makepyfile(test_typo=TYPO)
    run = pytester.runpytest("--collect-only", "-q")
    text = run.stdout.str()
    assert run.ret == pytest.ExitCode.INTERRUPTED, text  # red in CI, as a collection error is
    assert "empty parameter set" not in text and "Traceback" not in text and "INTERNALERROR" not in text
    line = next(ln for ln in run.outlines if "no cell has that workload" in ln)
    assert line.startswith("test_typo.py::test_typo: @pytest.mark.perf(workload='imgae')")
    assert "known: image, llm" in line  # the known ones
    assert "1 error" in text and "NOTSET" not in text and "test_fine[" in text


def test_a_known_workload_with_no_cell_in_the_tier_stays_a_plain_skip(pytester):
    pytester.makepyfile('''
import pytest

@pytest.mark.perf(workload="image")
def test_image(perf_cell, perf_result):
    pass
''')
    run = pytester.runpytest("--collect-only", "-q", "--perf-cell", "smoke/llm/lora/alpaca/c1/fp32/nopin")
    assert run.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), run.stdout.str()
    assert "error" not in run.stdout.str().lower()
