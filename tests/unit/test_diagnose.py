"""Reading a cell's progress, stacks and torchrun's failure table."""

from perfsuite.launch import diagnose
from perfsuite.rank.meter import Progress


def test_progress_records_are_read_back_with_time_left(tmp_path):
    progress = Progress(tmp_path / "progress-rank0")
    progress.update(10, "train", 100)
    watch = diagnose.ProgressWatch(tmp_path)
    assert watch.line() == "rank 0 step 10/100 (train)"
    progress.update(55, "train", 100)
    line = watch.line()
    assert line.startswith("rank 0 step 55/100 (train), ~") and line.endswith("min left")
    assert diagnose.read_progress(tmp_path)[0]["step"] == 55


def test_a_rank_that_opened_its_record_but_wrote_nothing_yet_has_no_progress(tmp_path):
    """A rank creates its record when it starts and writes it at its first
    step: a launcher reading in between (seen under CI's load) found an
    empty file and ended with an IndexError."""
    Progress(tmp_path / "progress-rank1")  # created, no step yet
    (tmp_path / "progress-rank2").write_text("7 1795708245.331")  # cut short
    written = Progress(tmp_path / "progress-rank0")
    written.update(4, "train", 8)
    progress = diagnose.read_progress(tmp_path)
    assert list(progress) == [0]
    assert (progress[0]["step"], progress[0]["phase"], progress[0]["total"]) == (4, "train", 8)
    assert diagnose.ProgressWatch(tmp_path).line() == "rank 0 step 4/8 (train)"


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


# torch 2.11's torchrun has no --log-line-prefix-template: under --tee its
# lines carry its default prefix, [<role><local rank>]: (a real log's head).
DEFAULT_PREFIX_LOG = """[default0]:unknown option --log-line-prefix-template=[rank${rank}]:\x20
[default0]:usage: /opt/torch/.venv/bin/python3 [option] ... [-c cmd | -m mod | file | -] [arg] ...
[default0]:Try `python -h' for more information.
E1125 16:44:20.486000 583 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 2) local_rank: 0
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_16:44:20
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 587)
"""


def test_each_ranks_tail_is_read_under_the_template_prefix_and_torchruns_default_one():
    template = "[rank0]: step 1\n[rank1]: step 1\n[rank1]: Traceback\n[rank1]:   File x.py\n"
    assert diagnose.rank_tails(template) == {0: "step 1", 1: "step 1\nTraceback\n  File x.py"}
    default = "[default0]:step 1\n[default1]:step 1\n[default1]:Traceback\n[default1]:  File x.py\n"
    assert diagnose.rank_tails(default) == diagnose.rank_tails(template)  # one node: local rank = rank
    reason, ranks = diagnose.crash_report(DEFAULT_PREFIX_LOG, [None])
    assert reason == "rank 0 died without a result (exit code 2)"
    assert ranks[0]["tail"].splitlines()[0] == "unknown option --log-line-prefix-template=[rank${rank}]: "
    assert ranks[0]["tail"].splitlines()[-1] == "Try `python -h' for more information."


def test_on_several_nodes_only_the_template_prefix_names_a_rank():
    # [default1] on a node of a 2-node cell is rank 1 or rank 3: a tail is not pinned on a guess.
    log = "[default1]:from a local rank\n[rank3]: from global rank 3\n"
    assert diagnose.rank_tails(log, nnodes=2) == {3: "from global rank 3"}
    assert diagnose.rank_tails(log) == {1: "from a local rank", 3: "from global rank 3"}
    _, ranks = diagnose.crash_report(log, [None] * 4, nnodes=2)
    assert ranks[1]["tail"] == "" and ranks[3]["tail"] == "from global rank 3"


def test_the_agents_exit_status_is_said_where_the_failure_table_names_no_code():
    lost = {"status": "error", "finished": 1.0,
            "error": {"type": "RuntimeError", "message": "[gloo/pair.cc:561] Connection closed by peer"}}
    only_rank0 = ("Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
                  "  exitcode  : 1 (pid: 4242)\n")
    # rank 1 ended without its result and torchrun's table names rank 0 alone
    reason, ranks = diagnose.crash_report(only_rank0 + diagnose.agent_exit_line(1), [lost, None])
    assert reason == "rank 1 died without a result (torch.distributed.run exited with code 1)"
    assert ranks[0]["exit_code"] == 1 and ranks[1]["exit_code"] is None
    # no table at all (the agent itself was killed, or failed before any rank): the launcher's line
    killed = "[rank0]: step 3\n" + diagnose.agent_exit_line(-9)
    assert diagnose.agent_exit(killed) == -9 and diagnose.agent_exit("") is None
    reason, _ = diagnose.crash_report(killed, [None, None])
    assert reason == "rank 0 died without a result (torch.distributed.run was killed by SIGKILL)"
    assert diagnose.rank_tails(killed) == {0: "step 3"}
    reason, _ = diagnose.crash_report("RendezvousError\n" + diagnose.agent_exit_line(1), [])
    assert reason == "torch.distributed.run exited with code 1; see output.log"
