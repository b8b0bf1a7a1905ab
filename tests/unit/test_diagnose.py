"""Reading a cell's progress, stacks and torchrun's failure table."""

from perfsuite import diagnose
from perfsuite.meter import Progress


def test_progress_records_are_read_back_with_time_left(tmp_path):
    progress = Progress(tmp_path / "progress-rank0")
    progress.update(10, "train", 100)
    watch = diagnose.ProgressWatch(tmp_path)
    assert watch.line() == "rank 0 step 10/100 (train)"
    progress.update(55, "train", 100)
    line = watch.line()
    assert line.startswith("rank 0 step 55/100 (train), ~") and line.endswith("min left")
    assert diagnose.read_progress(tmp_path)[0]["step"] == 55


def test_hang_report_blames_the_rank_that_is_not_waiting():
    progress = {0: {"step": 3, "phase": "train", "time": 0, "total": 8},
                1: {"step": 3, "phase": "train", "time": 0, "total": 8}}
    stacks = {0: 'Current thread 0x1 (most recent call first):\n  File "x/distributed_c10d.py", line 1 in all_reduce\n',
              1: 'Current thread 0x2 (most recent call first):\n  File "x/faults.py", line 9 in at_step\n'}
    report = diagnose.hang_report(2, progress, stacks)
    assert report.startswith("rank 1 hung at step 3 in train (File \"x/faults.py\", line 9 in at_step)")
    assert "waiting: rank 0 at step 3" in report


def test_torchrun_failure_table_gives_exit_codes():
    log = """[rank0]: hello
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_00:49:45
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 13370)  (SIGKILL)
"""
    assert diagnose.exit_codes(log) == {1: -9}
    assert diagnose.root_cause_rank(log) == 1
    reason, ranks = diagnose.crash_report(log, [{"status": "ok"}, None])
    assert reason == "rank 1 died without a result (killed by SIGKILL)"
    assert ranks[0]["tail"] == "hello"


def test_a_rank_that_only_lost_its_peer_is_not_blamed():
    lost = {"status": "error", "finished": 1.0,
            "error": {"type": "RuntimeError", "message": "[gloo/pair.cc:561] Connection closed by peer"}}
    own = {"status": "error", "finished": 2.0,
           "error": {"type": "RuntimeError", "message": "injected fault: rank 1 raised at step 3"}}
    reason, _ = diagnose.crash_report("", [lost, own])
    assert reason == "rank 1 failed: RuntimeError: injected fault: rank 1 raised at step 3"
    reason, _ = diagnose.crash_report("", [lost, None])  # rank 1 killed, rank 0 lost it
    assert reason == "rank 1 died without a result (exit code unknown)"
