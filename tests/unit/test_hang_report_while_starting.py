"""A timeout's reason tells ranks still starting (importing) from ranks that
hung: a `--timeout 1` with `--rank-start exec` ends ranks still importing
torch, which is no hang before a first step."""

from perfsuite.launch import diagnose

IMPORTING = """Current thread 0x00007f (most recent call first):
  File "/venv/lib/python3.11/site-packages/torchvision/models/resnet.py", line 9 in <module>
  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed
  File "<frozen importlib._bootstrap_external>", line 940 in exec_module
  File "<frozen importlib._bootstrap>", line 1147 in _find_and_load
  File "/venv/lib/python3.11/site-packages/torchvision/models/__init__.py", line 2 in <module>
  File "<frozen importlib._bootstrap>", line 1147 in _find_and_load
  File "/work/probework.py", line 3 in <module>
  File "/work/perfsuite/rank/worker.py", line 236 in main
"""
SETTING_UP = """Current thread 0x00007f (most recent call first):
  File "/work/probework.py", line 30 in build_dataset
  File "/work/probework.py", line 41 in run
  File "/work/perfsuite/rank/worker.py", line 238 in main
"""
START = {"step": 0, "phase": "start", "time": 0.0, "total": 0}


def test_ranks_that_reported_nothing_were_still_starting_not_hung():
    report = diagnose.hang_report(2, {}, {})
    assert "still starting" in report and "importing torch and perfsuite" in report
    assert "hung" not in report


def test_a_rank_importing_in_its_set_up_is_still_starting_and_names_the_module():
    report = diagnose.hang_report(1, {0: START}, {0: IMPORTING})
    assert report.startswith("rank 0 still starting: importing torchvision.models.resnet (File ")
    assert diagnose.importing(IMPORTING) == "torchvision.models.resnet"


def test_a_rank_stuck_in_its_set_up_is_hung_before_its_first_step_with_its_frame():
    report = diagnose.hang_report(1, {0: START}, {0: SETTING_UP})
    assert report == ('rank 0 hung in its set-up, before its first step '
                      '(File "/work/probework.py", line 30 in build_dataset)')
    assert diagnose.importing(SETTING_UP) is None


def test_a_silent_rank_beside_a_started_one_is_still_starting():
    report = diagnose.hang_report(2, {0: {**START, "step": 3, "phase": "train"}}, {})
    assert report.startswith("rank 1 still starting (importing torch and perfsuite")
    assert "waiting: rank 0 at step 3" in report


def test_a_workload_module_of_its_own_is_named_by_its_file():
    stack = IMPORTING.split("\n", 1)[0] + "\n" + "\n".join(IMPORTING.splitlines()[6:])
    assert diagnose.importing(stack) == "probework"
