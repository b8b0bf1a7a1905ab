"""Cells across nodes: torchrun's c10d rendezvous, or SLURM through srun.

Two ways, both the engines' own:

- rendezvous: the same ``perfsuite run`` / pytest command on every node with
  ``--nnodes N --rdzv-endpoint HOST:PORT --rdzv-id JOB``; each node's
  torchrun agent joins the c10d rendezvous, the ranks write their records
  into the shared output directory, and the node whose agent ran rank 0
  writes the cell's result (the others report the cell as measured there).
- SLURM: inside an allocation (``sbatch``/``salloc``), ``--slurm`` takes the
  node count and node list from the job's environment and runs torchrun once
  per node through ``srun``; the launching process collects every rank.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass, field

from perfsuite.cells import Cell


class PlanError(ValueError):
    """A cell that cannot be laid out on the given nodes."""


@dataclass
class Nodes:
    nnodes: int = 1
    rdzv_endpoint: str | None = None  # HOST:PORT of the c10d rendezvous
    rdzv_id: str | None = None  # one per job, the same on every node
    slurm: bool = False
    record_wait_s: float = 60.0  # how long to wait for other nodes' rank records
    srun: str = "srun"

    @classmethod
    def from_slurm(cls, environ: dict[str, str] | None = None, **kw) -> Nodes:
        env = os.environ if environ is None else environ
        missing = [k for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST") if k not in env]
        if missing:
            raise PlanError(f"--slurm needs a SLURM allocation (sbatch/salloc): {missing} "
                            "not set in the environment")
        hosts = expand_nodelist(env["SLURM_JOB_NODELIST"])
        nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or len(hosts))
        here = socket.gethostname()
        head = here if here in hosts else hosts[0]
        port = env.get("PERFSUITE_RDZV_PORT") or str(free_port())
        return cls(nnodes=nnodes, rdzv_endpoint=f"{head}:{port}",
                   rdzv_id=f"slurm-{env['SLURM_JOB_ID']}", slurm=True, **kw)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, through scontrol where it is installed."""
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True)
        return out.stdout.split()
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(n).zfill(len(lo))}")
    return hosts


@dataclass
class Plan:
    nnodes: int
    procs_per_node: int
    nodes: Nodes
    cell_key: str
    run_token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def rdzv_id(self) -> str:
        # One rendezvous per cell: cells of one job must not join each other's.
        return f"{self.nodes.rdzv_id}-{self.cell_key}"

    def rendezvous_args(self) -> list[str]:
        if not self.multi:
            return ["--standalone"]
        return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.nodes.rdzv_endpoint}", f"--rdzv-id={self.rdzv_id}"]

    def wrap(self, argv: list[str]) -> list[str]:
        if not self.nodes.slurm:
            return argv
        return [self.nodes.srun, f"--nodes={self.nnodes}", f"--ntasks={self.nnodes}",
                "--ntasks-per-node=1", "--kill-on-bad-exit=1", *argv]

    @property
    def log_name(self) -> str:
        if self.multi and not self.nodes.slurm:  # one log per node in a shared directory
            return f"output-{socket.gethostname()}-{os.getpid()}.log"
        return "output.log"

    @property
    def record_wait_s(self) -> float:
        return self.nodes.record_wait_s if self.multi else 0.0

    def partner_of(self, records: list[dict | None], agent_pid: int) -> bool:
        """True on a rendezvous node whose launch did not run rank 0.

        Rank 0's record names the launcher that started it (``launcher``: the
        PERFSUITE_LAUNCHER_HOST/PID of launch.launcher_env, passed down
        through the environment), compared with this process. Not the rank's
        parent: under ``nsys profile`` that is nsys, never the agent, and no
        node would own the result. ``agent_pid`` is for records without it.
        """
        if not self.multi or self.nodes.slurm or not records or records[0] is None:
            return False
        launcher = records[0].get("launcher") or {}
        if launcher.get("pid"):
            return launcher != launcher_identity()
        return records[0].get("agent_pid") != agent_pid

    def partner_reason(self, records: list[dict | None]) -> str:
        host = (records[0] or {}).get("host", "?")
        return (f"ran its share of a {self.nnodes}-node cell; the result is written by the "
                f"node running rank 0 ({host})")


def launcher_identity() -> dict[str, str]:
    """This launching process as its ranks record it (perfsuite.rank.worker, from
    the PERFSUITE_LAUNCHER_HOST/PID that launch.launcher_env sets)."""
    return {"host": socket.gethostname(), "pid": str(os.getpid())}


def plan(cell: Cell, nodes: Nodes) -> Plan:
    if nodes.nnodes < 1:
        raise PlanError(f"nnodes must be >= 1, got {nodes.nnodes}")
    if nodes.nnodes > 1:
        if cell.processes % nodes.nnodes:
            raise PlanError(f"{cell.processes} rank(s) do not split over {nodes.nnodes} nodes")
        if not nodes.rdzv_endpoint or not nodes.rdzv_id:
            raise PlanError("a multi-node cell needs --rdzv-endpoint HOST:PORT and --rdzv-id "
                            "(the same on every node), or --slurm inside an allocation")
    key = hashlib.sha1(cell.id.encode()).hexdigest()[:10]
    made = Plan(nnodes=nodes.nnodes, procs_per_node=cell.processes // nodes.nnodes,
                nodes=nodes, cell_key=key)
    if made.multi and not nodes.slurm:
        # Every node's agent must recognise the same run's records.
        made.run_token = f"{nodes.rdzv_id}-{key}"
    return made
