"""Cells across nodes: plans, and real runs with two torchrun agents on 127.0.0.1."""

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import types

import pytest

from perfsuite import cells
from perfsuite.launch import multinode
from perfsuite.launch.multinode import Nodes, PlanError
from tests.unit.conftest import no_baselines

CELL = "smoke/image/ddp/c2/fp32/px32/nopin/nchw"


def test_single_node_is_standalone():
    plan = multinode.plan(cells.get(CELL), Nodes())
    assert plan.rendezvous_args() == ["--standalone"] and plan.procs_per_node == 2
    assert plan.wrap(["x"]) == ["x"]


def test_two_nodes_use_c10d_with_one_rendezvous_per_cell():
    nodes = Nodes(nnodes=2, rdzv_endpoint="head:29400", rdzv_id="job7")
    a = multinode.plan(cells.get(CELL), nodes)
    b = multinode.plan(cells.get("smoke/image/ddp-rr/c2/fp32/px32/nopin/nchw"), nodes)
    assert a.procs_per_node == 1
    assert a.rendezvous_args()[:3] == ["--nnodes=2", "--rdzv-backend=c10d",
                                       "--rdzv-endpoint=head:29400"]
    assert a.rdzv_id != b.rdzv_id and a.rdzv_id.startswith("job7-")
    assert a.run_token == multinode.plan(cells.get(CELL), nodes).run_token  # same on every node


def test_bad_layouts_are_explained():
    with pytest.raises(PlanError, match="--rdzv-endpoint"):
        multinode.plan(cells.get(CELL), Nodes(nnodes=2))
    with pytest.raises(PlanError, match="do not split over 2 nodes"):
        multinode.plan(cells.get("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"),
                       Nodes(nnodes=2, rdzv_endpoint="h:1", rdzv_id="j"))
    with pytest.raises(PlanError, match="SLURM allocation"):
        Nodes.from_slurm({})


def test_slurm_environment_and_srun_wrap(monkeypatch):
    monkeypatch.setattr(multinode.shutil, "which", lambda name: None)
    nodes = Nodes.from_slurm({"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "gpu[07-08]",
                              "SLURM_JOB_NUM_NODES": "2", "PERFSUITE_RDZV_PORT": "29411"})
    assert nodes.nnodes == 2 and nodes.rdzv_endpoint == "gpu07:29411"
    plan = multinode.plan(cells.get(CELL), nodes)
    assert plan.wrap(["torchrun"]) == ["srun", "--nodes=2", "--ntasks=2",
                                       "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun"]
    assert multinode.expand_nodelist("a[1-3,5],b") == ["a1", "a2", "a3", "a5", "b"]


def _two_node_plan():
    return multinode.plan(cells.get(CELL), Nodes(nnodes=2, rdzv_endpoint="head:29400", rdzv_id="job7"))


def test_the_node_whose_launcher_ran_rank_0_owns_the_result_also_under_nsys():
    plan = _two_node_plan()
    me = {"host": socket.gethostname(), "pid": str(os.getpid())}
    agent = 1111  # this node's torchrun agent
    # Under `nsys profile` rank 0's parent is nsys (pid 4242), not the agent:
    # ownership follows the launcher the record names.
    under_nsys = {"rank": 0, "agent_pid": 4242, "host": me["host"], "launcher": me}
    assert not plan.partner_of([under_nsys, None], agent)
    assert plan.partner_of([{**under_nsys, "agent_pid": agent,
                             "launcher": {"host": "node02", "pid": me["pid"]}}], agent)
    assert plan.partner_of([{**under_nsys, "launcher": {**me, "pid": str(os.getpid() + 1)}}], agent)
    # records without a launcher (older ranks) still go by the agent
    assert not plan.partner_of([{"rank": 0, "agent_pid": agent}], agent)
    assert plan.partner_of([{"rank": 0, "agent_pid": 4242}], agent)


def test_a_rank_records_the_launcher_that_started_it(tmp_path, monkeypatch):
    from perfsuite.rank import worker

    # the worker's own process set-up would act on the test process: left out
    monkeypatch.setattr(worker, "die_with_parent", lambda ppid: True)
    monkeypatch.setattr(worker, "watch_launcher", lambda: None)
    monkeypatch.setattr(worker, "faulthandler", types.SimpleNamespace(register=lambda *a, **k: None))
    workload = types.SimpleNamespace(run=lambda cell, ctx: {"metrics": {}, "steps": 0})
    monkeypatch.setattr(worker, "importlib", types.SimpleNamespace(import_module=lambda name: workload))
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "PERFSUITE_RUN_TOKEN": "t",
                       "PERFSUITE_LAUNCHER_HOST": socket.gethostname(),
                       "PERFSUITE_LAUNCHER_PID": str(os.getpid())}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "cell.json").write_text(json.dumps(cells.get(CELL).params()))
    assert worker.main(["--cell-file", str(tmp_path / "cell.json"), "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "rank1.json").read_text())
    assert record["launcher"] == {"host": socket.gethostname(), "pid": str(os.getpid())}
    # this process launched it: it owns the result, whoever the rank's parent was
    assert not _two_node_plan().partner_of([{**record, "agent_pid": -1}], agent_pid=os.getppid())


def _run(tmp_path, *args, env=None):
    # judged against no baselines: these tests are about the launch path, and a
    # step time or peak memory taken beside the other test workers is no verdict
    return subprocess.Popen([sys.executable, "-m", "perfsuite.cli.main", "run", CELL,
                             "--baselines", str(no_baselines(tmp_path)), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_two_agents_on_localhost_share_one_cell(tmp_path):
    port = multinode.free_port()
    common = ["--out", str(tmp_path), "--no-probe", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "two-agents"]
    agents = [_run(tmp_path, *common), _run(tmp_path, *common)]
    outputs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n----\n".join(outputs)
    assert sum("no result written here" in out for out in outputs) == 1, outputs
    saved = json.loads((tmp_path / "results.json").read_text())
    (cell,) = saved["cells"]
    assert cell["status"] == "ok" and [r["rank"] for r in cell["ranks"]] == [0, 1]
    assert cell["metrics"]["step_time"]["n"] > 0


@pytest.mark.slow
def test_slurm_path_launches_torchrun_through_srun(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"
    # A stand-in for srun on one machine: one task per node, as srun would start.
    srun.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, subprocess, sys
        args = sys.argv[1:]
        nodes = int(next(a for a in args if a.startswith("--nodes=")).split("=")[1])
        command = args[next(i for i, a in enumerate(args) if not a.startswith("--")):]
        procs = [subprocess.Popen(command, env={{**os.environ, "SLURM_NODEID": str(n)}})
                 for n in range(nodes)]
        sys.exit(max(p.wait() for p in procs))
        """))
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "2"}
    out_dir = tmp_path / "out"
    proc = _run(tmp_path, "--out", str(out_dir), "--no-probe", "--slurm", env=env)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    (cell,) = json.loads((out_dir / "results.json").read_text())["cells"]
    assert cell["status"] == "ok", cell.get("reason")
    assert cell["argv"][:2] == ["srun", "--nodes=2"]
    assert "--rdzv-backend=c10d" in cell["argv"] and len(cell["ranks"]) == 2


@pytest.mark.parametrize("locks", [True, False])
def test_nodes_sharing_an_output_directory_keep_each_others_cells(tmp_path, fake, monkeypatch, locks):
    """Each cell's result is written by the node that ran its rank 0, which
    torchrun's rendezvous may place on either node: neither node's write, nor
    the end-of-run mark of a node that owned no cell, drops the other's; on a
    file system without POSIX locks too."""
    if not locks:
        import errno
        import fcntl

        def no_locks(*args):
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(fcntl, "lockf", no_locks)
    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.results import skipped_result
    from perfsuite.runner import Runner

    ids = [c.id for c in cells.select(tier="smoke", workload="image")[:3]]
    nodes = Nodes(nnodes=2, rdzv_endpoint="127.0.0.1:29400", rdzv_id="shared")
    # a third node that owned no cell: its end-of-run mark must not empty the file
    a, b, idle = (Runner(tmp_path, launch=LaunchOptions(nodes=nodes), probe=False,
                         baselines=no_baselines(tmp_path)) for _ in range(3))
    owners = {ids[0]: a, ids[1]: b, ids[2]: a}
    running = {}

    def launch(cell, out_dir, opts=None):  # this node's half of the cell
        node = running["node"]
        if owners[cell.id] is node:
            return fake(cell, out_dir, opts)
        return skipped_result(cell, "reported by the node that ran rank 0", partner=True)

    monkeypatch.setattr("perfsuite.launch.launch.run_cell", launch)
    for cell in (cells.get(i) for i in ids):
        for node in (a, b, idle):
            running["node"] = node
            node.result(cell)
    for node in (a, b, idle):
        assert node.finish() is None
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [c["id"] for c in saved["cells"]] == ids
    assert all(c["status"] == "ok" and not c.get("partner") for c in saved["cells"])
    assert saved["run"]["status"] == "complete"


def test_a_resumed_node_does_not_write_back_the_cells_another_node_measured_again(tmp_path, fake, monkeypatch):
    """`--resume` of a multi-node run: a cell that failed before and that the
    other node measured again stays as that node wrote it when this node
    writes its own cell (it kept no copy of the earlier file's cells)."""
    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.results import ResultsFile, skipped_result
    from perfsuite.runner import Runner

    first, second = (cells.get(c.id) for c in cells.select(tier="smoke", workload="image")[:2])
    earlier = ResultsFile(tmp_path)
    earlier.add({**fake(second, tmp_path), "status": "error", "reason": "rank 1 failed"})
    nodes = Nodes(nnodes=2, rdzv_endpoint="127.0.0.1:29400", rdzv_id="resumed")
    here = Runner(tmp_path, launch=LaunchOptions(nodes=nodes), probe=False, resume=True,
                  baselines=no_baselines(tmp_path))
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", lambda cell, out_dir, opts=None: (
        fake(cell, out_dir, opts) if cell.id == first.id else skipped_result(cell, "the other node's", partner=True)))
    here.result(second)  # rank 0 on the other node, which writes it again:
    other = ResultsFile(tmp_path, shared=True)
    other.add(fake(second, tmp_path))
    here.result(first)
    assert here.finish() is None
    saved = {c["id"]: c for c in json.loads((tmp_path / "results.json").read_text())["cells"]}
    assert saved[second.id]["status"] == "ok" and saved[first.id]["status"] == "ok"
