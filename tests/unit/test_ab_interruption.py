"""Resident A/B sessions under what ends them early: Ctrl-C (three quick
ones), a full disk, a window past its timeout, a side that fails, a
session killed outright, and settings refused before any launch.

The launches are stood in for by a ``run_cell`` of a thread serving
windows over the real coordinator socket (perfsuite.rank.windows' own
client), as in test_resident.py; the sessions, pairs and their stopping
are the real ones."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time

import pytest

from perfsuite.ab import resident
from perfsuite.ab import session as ab
from perfsuite.cli import main as cli
from perfsuite.rank.windows import SIDE_ENV, Windows, WindowsLost
from tests.unit.cellkit import tiny_image_cell

SMOKE_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
LLM_CELL = "smoke/llm/lora/alpaca/c1/fp32/nopin"


class ServedLaunches:
    """run_cell's stand-in: each launch serves windows (side B's steps 10 %
    slower). ``on_window(side, pair, n)`` runs before a window's times are
    sent (n from 1); ``on_lost(side)`` where the coordinator went away;
    ``fail(side, pair)`` returns a result that fails before the ranks are ready."""

    def __init__(self, on_window=None, on_lost=None, fail=None):
        self.on_window, self.on_lost, self.fail = on_window, on_lost, fail
        self.opts, self.pairs = [], {}

    def __call__(self, cell, directory, opts):
        side = opts.env[SIDE_ENV]
        pair = self.pairs[side] = self.pairs.get(side, 0) + 1
        self.opts.append(opts)
        base = {"id": cell.id, "params": cell.params(), "checks": [], "ranks": [], "dir": str(directory)}
        failed = self.fail(side, pair) if self.fail else None
        if failed is not None:
            return {**base, **failed}
        windows = Windows.from_env(0, 1, opts.env)
        served, n = [], 0
        try:
            while (steps := windows.next_window()) > 0:
                n += 1
                if self.on_window:
                    self.on_window(side, pair, n)
                times = [0.01 * (1.1 if side == "B" else 1.0)] * steps
                windows._send({"times": times})
                served += times
        except WindowsLost as err:
            if self.on_lost:
                self.on_lost(side)
            return {**base, "status": "error", "reason": f"WindowsLost: {err}", "metrics": {}}
        finally:
            windows.close()
        return {**base, "status": "ok", "reason": None, "duration_s": 1.0,
                "metrics": {"step_time": {"value": 0.01, "unit": "s", "samples": served}}}


def resident_session(tmp_path, monkeypatch, launches, **settings):
    monkeypatch.setattr(resident, "run_cell", launches)
    settings = {"mode": "resident", "window_steps": 2, "quads": 4, "max_pairs": 2, **settings}
    lines = []
    session = ab.ABSession([tiny_image_cell(world_size=1)], ab.Side("A", sys.executable),
                           ab.Side("B", sys.executable), tmp_path, log=lines.append, **settings)
    return session, lines


def saved(tmp_path):
    return json.loads((tmp_path / "ab.json").read_text())


@pytest.fixture
def thread_tracebacks(monkeypatch):
    """What would reach the terminal as a thread's traceback."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def side_threads():
    return [t for t in threading.enumerate() if t.name.startswith("perfsuite-ab-side")]


# -- Ctrl-C ------------------------------------------------------------------------------

def test_three_quick_ctrl_cs_mid_pair_stop_both_sides_in_order_and_keep_the_windows_measured(
        tmp_path, monkeypatch, thread_tracebacks, capsys):
    from perfsuite.ab import stopping

    def ctrl_c(side, pair, n):
        if side == "A" and n == 3:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the window never ends: the main thread is interrupted waiting for it

    def again(side):  # two more while both sides stop
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)

    session, lines = resident_session(tmp_path, monkeypatch, ServedLaunches(ctrl_c, again))
    assert session.run() == ab.EXIT_INTERRUPTED
    data = saved(tmp_path)
    record = data["cells"][0]
    assert data["interrupted"] is True and data["exit_code"] == 130 and record["verdict"] == "interrupted"
    (partial,) = record["partial_pairs"]
    assert partial["ended"] == "interrupted" and [w["side"] for w in partial["windows"]] == list("ABBA")
    assert thread_tracebacks == [] and side_threads() == []
    assert capsys.readouterr().err.count(stopping.STOPPING) == 1  # the later Ctrl-Cs, said once
    assert (tmp_path / "ab.html").is_file()


def test_a_ctrl_c_during_the_cleanup_is_said_once_and_put_off(capsys):
    from perfsuite.ab import stopping

    before = signal.getsignal(signal.SIGINT)
    with stopping.deferred_interrupts() as came:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)  # a dropped ssh session, as perfsuite run takes it
        time.sleep(0.1)
    assert came == [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    assert capsys.readouterr().err.count("stopping: both sides' launches are ending") == 1
    assert signal.getsignal(signal.SIGINT) is before  # given back


# -- a full disk -------------------------------------------------------------------------

def test_a_full_disk_in_a_sides_launch_is_one_sentence_exit_2_and_keeps_the_finished_pair(
        tmp_path, monkeypatch, thread_tracebacks):
    launches = ServedLaunches()
    real = launches.__call__

    def filling(cell, directory, opts):
        if opts.env[SIDE_ENV] == "B" and launches.pairs.get("B", 0) == 1:
            launches.pairs["B"] = 2
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "cell.json"))
        return real(cell, directory, opts)

    session, lines = resident_session(tmp_path, monkeypatch, filling, max_pairs=4)
    assert session.run() == ab.EXIT_USAGE
    record = saved(tmp_path)["cells"][0]
    assert len(record["pairs"]) == 1 and len(record["pairs"][0]["windows"]) == 20
    said = [line for line in lines if "No space left on device" in line and line.startswith("perfsuite ab:")]
    assert len(said) == 1 and "free some space" in said[0], lines
    assert (tmp_path / "ab.html").is_file() and thread_tracebacks == [] and side_threads() == []


def test_ab_json_that_cannot_be_written_mid_pair_stops_the_session_and_says_which_file(
        tmp_path, monkeypatch, thread_tracebacks):
    from perfsuite.system import atomic

    writes, real = [], atomic.atomic_write_json

    def full_after(path, data):
        writes.append(path)
        if len(writes) > 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(ab, "atomic_write_json", full_after)
    session, lines = resident_session(tmp_path, monkeypatch, ServedLaunches())
    assert session.run() == ab.EXIT_USAGE
    kept = saved(tmp_path)["cells"][0]["partial_pairs"][0]["windows"]
    assert len(kept) >= 4  # the windows written before the disk filled stay readable
    assert any(line.startswith(f"ab.json: not written (No space left on device); {tmp_path}") for line in lines)
    assert thread_tracebacks == [] and side_threads() == []


# -- timeouts ----------------------------------------------------------------------------

def test_a_timeout_bounds_each_window_not_the_resident_launch(tmp_path, monkeypatch):
    launches = ServedLaunches()
    session, _ = resident_session(tmp_path, monkeypatch, launches,
                                  launch=ab.LaunchOptions(timeout_s=1.0))
    session.run()
    assert {o.timeout_s for o in launches.opts} == {resident.launch_bound(1.0, 4)}
    assert resident.launch_bound(1.0, 4) > 20  # 2 starts, 20 windows of both sides, the end
    assert len(saved(tmp_path)["cells"][0]["pairs"]) == 2


def test_a_window_past_its_timeout_names_the_side_and_keeps_what_was_measured(tmp_path, monkeypatch):
    def hang(side, pair, n):
        if side == "B" and n == 3:
            time.sleep(2.5)  # a hung step: the coordinator gives up on it after 1 s

    session, lines = resident_session(tmp_path, monkeypatch, ServedLaunches(hang),
                                      launch=ab.LaunchOptions(timeout_s=1.0))
    assert session.run() == ab.EXIT_REGRESSED
    record = saved(tmp_path)["cells"][0]
    assert record["verdict"] == "error"
    assert "side B: a rank did not finish its 2-step window within the timeout of 1 s" in record["reason"]
    (partial,) = record["partial_pairs"]
    assert [w["side"] for w in partial["windows"]] == list("ABBAA")  # up to B's hung window


# -- a failing side ----------------------------------------------------------------------

def test_a_side_b_that_fails_to_start_is_named_with_its_first_error_not_side_a(tmp_path, monkeypatch):
    tail = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1\n"
            "[rank0]: ModuleNotFoundError: No module named 'torchvision'\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    fail = (lambda side, pair: {"status": "error", "reason": "rank 0 died without a result (exit code 1)",
                                "output_tail": tail} if side == "B" else None)
    session, lines = resident_session(tmp_path, monkeypatch, ServedLaunches(fail=fail))
    assert session.run() == ab.EXIT_REGRESSED
    reason = saved(tmp_path)["cells"][0]["reason"]
    assert reason.startswith("pair 1: side B's launch ended before its ranks were ready; side B's launch ended error")
    assert "first error in its log: ModuleNotFoundError: No module named 'torchvision'" in reason
    assert "side A" not in reason


def test_a_failed_launch_in_rounds_names_its_side_and_the_first_error_of_its_log(tmp_path, monkeypatch):
    from tests.unit.test_ab import FakeLaunches

    fake = FakeLaunches(fail_at=2)
    real = fake.__call__

    def with_log(cell, out_dir, opts=None):
        result = real(cell, out_dir, opts)
        if result["status"] == "error":
            result["output_tail"] = "[rank0]: ImportError: cannot import name 'Steps' from 'perfsuite.steps'\n"
        return result

    monkeypatch.setattr("perfsuite.ab.session.run_cell", with_log)
    session = ab.ABSession([tiny_image_cell(world_size=1)], ab.Side("A", sys.executable),
                           ab.Side("B", sys.executable), tmp_path, mode="launches", log=lambda line: None)
    assert session.run() == ab.EXIT_REGRESSED
    reason = saved(tmp_path)["cells"][0]["reason"]
    assert reason.startswith("side B launch 1 ended error")
    assert "first error in its log: ImportError: cannot import name 'Steps'" in reason


# -- killed outright ---------------------------------------------------------------------

def test_ab_json_says_interrupted_until_the_session_ends_in_order(tmp_path, monkeypatch):
    from tests.unit.test_ab import FakeLaunches

    seen = []
    fake = FakeLaunches(launch_sigma=0.02)
    real = fake.__call__
    monkeypatch.setattr("perfsuite.ab.session.run_cell", lambda *a: seen.append(
        saved(tmp_path)["interrupted"] if (tmp_path / "ab.json").exists() else None) or real(*a))
    ab.ABSession([tiny_image_cell(world_size=1)], ab.Side("A", sys.executable), ab.Side("B", sys.executable),
                 tmp_path, mode="launches", max_launches=4, log=lambda line: None).run()
    assert set(seen[1:]) == {True}  # what a session killed with SIGKILL leaves says so
    assert saved(tmp_path)["interrupted"] is False


def test_a_socket_folder_whose_session_is_gone_is_swept_and_a_live_ones_kept(tmp_path):
    from perfsuite.ab import stopping

    dead = subprocess_pid_gone()
    gone = tmp_path / f"perfsuite-ab-{dead}-x1"
    live = tmp_path / f"perfsuite-ab-{os.getpid()}-x2"
    for folder in (gone, live):
        folder.mkdir()
        (folder / "windows.sock").write_text("")
    assert stopping.sweep_stale(tmp_path) == [gone]
    assert not gone.exists() and live.exists()
    coordinator = resident.Coordinator()
    try:
        assert os.path.basename(coordinator.folder).startswith(f"perfsuite-ab-{os.getpid()}-")
    finally:
        coordinator.close()
    assert not os.path.exists(coordinator.folder)


def subprocess_pid_gone():
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- refused before any launch -----------------------------------------------------------

@pytest.mark.parametrize("argv, said", [
    (["--mode", "resident", "--window-steps", "1000000"], "--window-steps 1000000: a window is meant to last"),
    (["--mode", "resident", "--quads", "100000"], "--quads 100000"),
    (["--mode", "resident", "--profiler", "torch"], "--mode resident: " + SMOKE_CELL),
])
def test_resident_settings_that_cannot_finish_or_be_resident_exit_2_before_any_launch(
        tmp_path, capsys, monkeypatch, argv, said):
    monkeypatch.setattr("perfsuite.ab.session.run_cell", lambda *a, **kw: pytest.fail("launched"))
    monkeypatch.setattr(resident, "run_cell", lambda *a, **kw: pytest.fail("launched"))
    assert cli.main(["ab", SMOKE_CELL, "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not (tmp_path / "out" / "ab.json").exists()


def test_resident_mode_for_an_llm_cell_exits_2_before_any_launch(tmp_path, capsys):
    assert cli.main(["ab", LLM_CELL, "--mode", "resident", "--out", str(tmp_path / "out")]) == 2
    assert f"--mode resident: {LLM_CELL}: the llm workload does not serve" in capsys.readouterr().err


def test_a_side_without_torchvision_is_refused_naming_it_before_any_launch(tmp_path, capsys):
    shadow = tmp_path / "shadow" / "torchvision"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torchvision'\")\n")
    code = cli.main(["ab", SMOKE_CELL, "--out", str(tmp_path / "out"), "--b-env",
                     f"PYTHONPATH={shadow.parent}"])
    err = capsys.readouterr().err
    assert code == 2 and "side B:" in err and "No module named 'torchvision'" in err
    assert not (tmp_path / "out" / "ab.json").exists()
