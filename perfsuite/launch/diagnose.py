"""Why a cell failed: per-rank exit codes, output tails, progress and stacks.

Read after the fact from the cell directory and torchrun's output, so the
launcher stays a thin wrapper around torch.distributed.run:

- ``output.log``: every rank's output, each line prefixed by torchrun's
  ``--tee``: ``[rank<N>]: `` where its ``--log-line-prefix-template`` is
  there (perfsuite.launch.launch asks each torchrun), else its default
  ``[default<local rank>]:``; and torchrun's own failure table (rank, exit code);
- ``progress-rank<N>``: the step and phase a rank last entered;
- ``stacks-rank<N>.txt``: every thread's Python stack, dumped by the rank's
  faulthandler when the launcher sends SIGUSR1 to a stuck cell.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from perfsuite.rank.peers import is_peer_failure

RANK_PREFIX = "[rank${rank}]: "  # torchrun's --log-line-prefix-template
# The template names the global rank; torchrun's default prefix (no template,
# as in torch 2.11) names the role, "default" unless --role, and the local rank,
# with no space after its colon: a traceback's indent stays as printed.
_PREFIXED = re.compile(r"^\[(?:(rank)(\d+)\]: ?|(default)(\d+)\]:)(.*)$")
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
# Frames of a rank that waits for its peers rather than being the one stuck.
_WAITING = re.compile(r"all_reduce|allreduce|barrier|broadcast|all_gather|reduce_scatter|"
                      r"_wait|wait\b|synchronize|distributed_c10d|_sync_buffers|"
                      r"_pre_forward|_post_forward|_run_ddp_forward|backward")


def signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def rank_tails(log_text: str, lines: int = 25, nnodes: int = 1) -> dict[int, str]:
    """The last lines each rank printed.

    On one node a local rank is the rank. On several, a default prefix's
    local rank could be any node's (which node holds which ranks is the
    rendezvous' choice), so those lines are left to the output tail and only
    template-prefixed lines are given to a rank.
    """
    per_rank: dict[int, list[str]] = {}
    for line in log_text.splitlines():
        m = _PREFIXED.match(line)
        if m and (m.group(1) or nnodes == 1):
            per_rank.setdefault(int(m.group(2) or m.group(4)), []).append(m.group(5))
    return {rank: "\n".join(out[-lines:]) for rank, out in sorted(per_rank.items())}


def exit_codes(log_text: str) -> dict[int, int]:
    """Exit code per failed rank, from torchrun's failure table."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(log_text)}


def root_cause_rank(log_text: str) -> int | None:
    _, _, after = log_text.partition("Root Cause (first observed failure)")
    found = _FAILURE.search(after)
    return int(found.group(1)) if found else None


def read_progress(directory: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in Path(directory).glob("progress-rank*"):
        try:
            fields = path.read_text().split()
            if len(fields) < 3:
                continue  # created at the rank's start, written at its first step: none yet
            out[int(path.name.removeprefix("progress-rank"))] = {
                "step": int(fields[0]), "time": float(fields[1]), "phase": fields[2],
                "total": int(fields[3]) if len(fields) > 3 else 0}
        except (OSError, ValueError):
            continue  # a rank that died mid-write: no progress known
    return out


def read_stacks(directory: Path) -> dict[int, str]:
    out = {}
    for path in Path(directory).glob("stacks-rank*.txt"):
        text = path.read_text(errors="replace").strip()
        if text:
            out[int(path.stem.removeprefix("stacks-rank"))] = text
    return out


def _main_thread_frames(stack: str) -> list[str]:
    """The frames of the thread faulthandler calls 'most recent call first', innermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[-1])
    return [ln.strip() for ln in main.splitlines()[1:] if ln.strip().startswith("File")]


def _main_thread_top(stack: str) -> str:
    """The innermost frame of that thread."""
    frames = _main_thread_frames(stack)
    return frames[0] if frames else "no Python frame"


class ProgressWatch:
    """Lines like "rank 0 step 120/938 (train), ~3.1 min left" for a running cell."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._first: dict[int, tuple[float, int]] = {}

    def line(self) -> str | None:
        progress = read_progress(self.directory)
        if not progress:
            return None
        parts = []
        for rank, p in sorted(progress.items()):
            first_time, first_step = self._first.setdefault(rank, (p["time"], p["step"]))
            text = f"rank {rank} step {p['step']}" + (f"/{p['total']}" if p["total"] else "")
            text += f" ({p['phase']})"
            done = p["step"] - first_step
            if p["total"] and done > 0:
                left = (p["total"] - p["step"]) * (p["time"] - first_time) / done
                text += f", ~{left / 60:.1f} min left"
            parts.append(text)
        return "; ".join(parts)


# What a rank imports before it reports anything (perfsuite.rank.worker): a
# fresh interpreter's seconds under --rank-start exec.
STARTING = "importing torch and perfsuite, before its first report"
_MODULE_FRAME = re.compile(r'File "([^"<>]+)", line \d+ in <module>')


def importing(stack: str) -> str | None:
    """The module the stack's main thread is importing, by the innermost
    module body run under importlib; None where it imports nothing."""
    frames = _main_thread_frames(stack)
    if not any("importlib._bootstrap" in frame for frame in frames):
        return None
    for frame in frames:
        found = _MODULE_FRAME.search(frame)
        if found:
            return _module_name(found.group(1))
    return None


def _module_name(path: str) -> str:
    """torchvision.models for .../site-packages/torchvision/models/__init__.py;
    a file outside an installed package by its own name."""
    for root in ("site-packages/", "dist-packages/"):
        if root in path:
            return path.rsplit(root, 1)[1].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    file = Path(path)
    return file.parent.name if file.stem == "__init__" else file.stem


def _where(rank: int, progress: dict[int, dict], stacks: dict[int, str]) -> str:
    """Where one rank was: still starting, stuck in its set-up, or at a step."""
    if rank not in progress:
        return f"rank {rank} still starting ({STARTING})"
    stack = stacks.get(rank)
    module = importing(stack) if stack else None
    frame = f" ({_main_thread_top(stack)})" if stack else ""
    if progress[rank]["phase"] == "start":  # its workload had not begun its first step
        if module:
            return f"rank {rank} still starting: importing {module}{frame}"
        return f"rank {rank} hung in its set-up, before its first step{frame}"
    return (f"rank {rank} hung at step {progress[rank]['step']} in {progress[rank]['phase']}"
            + (f", importing {module}" if module else "") + frame)


def hang_report(processes: int, progress: dict[int, dict], stacks: dict[int, str]) -> str:
    """Which rank is stuck at which step, and where the others wait; ranks
    still starting (importing) are said so, not called hung."""
    if not progress:
        return (f"no rank had begun its workload: the ranks were still starting ({STARTING}; "
                "seconds for a fresh interpreter, --rank-start exec) when the timeout ended them; "
                "give the launch a timeout longer than its start")
    steps = {r: p["step"] for r, p in progress.items()}
    lowest = min(steps.values())
    behind = [r for r, s in steps.items() if s == lowest]
    silent = [r for r in range(processes) if r not in progress]
    stuck = [r for r in behind if r in stacks and not _WAITING.search(stacks[r])]
    culprits = silent or stuck or behind
    parts = [_where(r, progress, stacks) for r in culprits]
    waiting = [r for r in sorted(steps) if r not in culprits]
    if waiting:
        parts.append("waiting: " + ", ".join(
            f"rank {r} at step {steps[r]} ({_main_thread_top(stacks[r]) if r in stacks else 'no stack'})"
            for r in waiting))
    return "; ".join(parts)


def crash_report(log_text: str, records: list[dict | None],
                 nnodes: int = 1) -> tuple[str, dict[int, Any]]:
    """A reason naming the first failed rank, and per-rank exit facts."""
    codes = exit_codes(log_text)
    tails = rank_tails(log_text, nnodes=nnodes)
    ranks: dict[int, Any] = {}
    for rank in range(len(records)):
        code = codes.get(rank)
        ranks[rank] = {"exit_code": code, "signal": signal_name(code), "tail": tails.get(rank, "")}
    first = root_cause_rank(log_text)
    failed = [r for r, rec in enumerate(records) if rec and rec.get("status") == "error"]
    own = [r for r in failed if not is_peer_failure(records[r]["error"].get("message", ""))]
    missing = [r for r, rec in enumerate(records) if rec is None]
    if own or (failed and not missing):  # the rank whose own error came first
        rank = min(own or failed, key=lambda r: records[r].get("finished", 0.0))
        err = records[rank]["error"]
        reason = f"rank {rank} failed: {err.get('type')}: {err.get('message')}"
        if err.get("oom"):
            reason = (f"rank {rank} ran out of CUDA memory (peak allocated "
                      f"{err.get('peak_mem_allocated', 0) / 2**30:.2f} GiB, reserved "
                      f"{err.get('peak_mem_reserved', 0) / 2**30:.2f} GiB): {err.get('message')}")
        return reason, ranks
    if missing:  # a rank died without a word; the others only lost their peer
        first = first if first in missing else missing[0]
    rank, agent = first, agent_exit(log_text)
    agent_how = None if agent is None else (f"torch.distributed.run was killed by {signal_name(agent)}"
                                            if signal_name(agent) else
                                            f"torch.distributed.run exited with code {agent}")
    if rank is None:
        return f"{agent_how or 'torch.distributed.run failed'}; see output.log", ranks
    code = ranks.get(rank, {}).get("exit_code")
    how = (f"killed by {signal_name(code)}" if signal_name(code)
           else f"exit code {code}" if code is not None else agent_how or "exit code unknown")
    return f"rank {rank} died without a result ({how})", ranks


# The launcher's last line in output.log where torchrun's agent ended non-zero:
# a killed agent, or one that failed before any rank, prints no failure table.
_AGENT_EXIT = re.compile(r"^perfsuite: torch\.distributed\.run ended with exit status (-?\d+)$", re.MULTILINE)


def agent_exit_line(code: int) -> str:
    return f"perfsuite: torch.distributed.run ended with exit status {code}\n"


def agent_exit(log_text: str) -> int | None:
    """The agent's exit status the launcher wrote into output.log, if any."""
    found = _AGENT_EXIT.findall(log_text)
    return int(found[-1]) if found else None
