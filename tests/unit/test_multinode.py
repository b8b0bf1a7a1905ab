"""Cells across nodes: plans, and real runs with two torchrun agents on 127.0.0.1."""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from perfsuite import cells, multinode
from perfsuite.multinode import Nodes, PlanError

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


def _run(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "perfsuite.cli", "run", CELL, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_two_agents_on_localhost_share_one_cell(tmp_path):
    port = multinode.free_port()
    common = ["--out", str(tmp_path), "--no-probe", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "two-agents"]
    agents = [_run(*common), _run(*common)]
    outputs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outputs
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
    proc = _run("--out", str(out_dir), "--no-probe", "--slurm", env=env)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    (cell,) = json.loads((out_dir / "results.json").read_text())["cells"]
    assert cell["status"] == "ok", cell.get("reason")
    assert cell["argv"][:2] == ["srun", "--nodes=2"]
    assert "--rdzv-backend=c10d" in cell["argv"] and len(cell["ranks"]) == 2
