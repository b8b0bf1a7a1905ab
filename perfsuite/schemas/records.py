"""The records that cross the suite's packages, typed for a reader and a
type checker: what a rank writes (``RankRecord``), a cell's result
(``CellResult``), one check's verdict (``CheckRecord``), an A/B session
(``ABRecord``). They are TypedDicts: at run time the plain dicts the JSON
files hold, so nothing is converted on the way. The files' contract stays
their JSON Schemas (``results.schema.json``); tests keep these keys and the
schema's, and what stored runs hold, together.

Standard library only: ranks import it.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Status = Literal["ok", "failed", "error", "timeout", "skipped"]  # schemas.results.STATUSES


class Metric(TypedDict, total=False):
    """One metric of a rank or a cell: its value and unit; step times (and
    LLM cells' per-step metrics) also their samples, each launch's apart
    where launches were repeated, and their summary (``stats.samples.summary``)."""

    value: float | None
    unit: str
    samples: list[float]
    launches: list[list[float]]
    launch_medians: list[float]
    launch_floors: list[float]
    n: int
    median: float
    min: float
    max: float
    p10: float
    p90: float
    iqr: float
    mad: float


class Counters(TypedDict, total=False):
    """Work counters per training step, summed over the ranks (``rank.counters``)."""

    per_step: dict[str, float]
    window_steps: int
    ranks: int
    unstable: list[str]
    device_time: dict[str, float]  # the GPU's own time per step, by kind (CUDA)


class CheckRecord(TypedDict, total=False):
    """One entry of a cell's ``checks``: ``judge.checks.Verdict.to_dict()``,
    or a sanity, target or judging check made as a dict."""

    name: str
    verdict: str  # judge.checks.STATES, or "untrustworthy"
    observed: Any
    expected: Any
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float | None
    p_value: float | None
    tolerance: float | None
    metric: str | None
    unit: str | None
    baseline: str | None
    message: str | None
    cell: str | None
    missing: str  # "baseline", "counters" or "spread": wanting one (judge.recording.record_missing)
    recorded: str  # the runner's baseline folder the missing one was recorded into
    measured_verdict: str  # what an untrustworthy node's check measured
    # a step-time check that regressed or could not decide, of a cell profiled here and in its
    # baseline: the profile diff (perfsuite.profiling.attribution.Attribution.to_dict())
    attribution: dict[str, Any]
    accepted: dict[str, Any]  # judge.accepted.judged: the accepted change it was judged against
    traceback: str  # where judging itself failed


class RankRecord(TypedDict, total=False):
    """``rank<N>.json``: what one rank's worker writes (``rank.worker``), the
    workload's own record merged in."""

    schema: str  # "perfsuite.rank/1"
    cell: str
    rank: int
    world_size: int
    local_rank: int
    device: str
    pid: int
    agent_pid: int
    host: str
    launcher: dict[str, str | None]
    run_token: str | None
    started: float
    workload_imported: float
    training_started: float | None
    finished: float
    status: str
    reason: str
    error: dict[str, Any]
    env: dict[str, Any]
    metrics: dict[str, Metric]
    steps: int
    counters: Counters
    info: dict[str, Any]
    profile: dict[str, Any]


class CellResult(TypedDict, total=False):
    """One cell of ``results.json``: the ranks' records aggregated
    (``results.aggregate``), judged (``checks``), as the launcher and the
    session hand it on."""

    id: str
    params: dict[str, Any]
    status: Status
    reason: str | None
    env: dict[str, Any]
    metrics: dict[str, Metric]
    checks: list[CheckRecord]
    counters: Counters | None
    ranks: list[dict[str, Any]]
    info: dict[str, Any]
    duration_s: float
    argv: list[str]
    dir: str
    output_tail: str
    timeline: dict[str, Any]
    gpu_busy_share: float | None
    profiler: dict[str, Any]
    profile: dict[str, Any]
    remeasured: int
    repeats: int
    resumed: bool
    partner: bool  # measured on this node, reported by another (several nodes)
    needs_gpus: int  # not run: it needs this many GPUs (a node), and
    gpus_present: int  # the machine has this many


class ABCellRecord(TypedDict, total=False):
    """One cell of ``ab.json``: its verdict of B against A, how it was
    measured (``mode``: resident windows or launch rounds) and what was."""

    id: str
    mode: str
    mode_reason: str
    verdict: str
    reason: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    detectable: float | None  # the smallest change the session resolved
    p_value: float | None  # launch rounds: the test of B's launches against A's
    method: str
    dof: float
    tau2: float
    heterogeneity_p: float | None
    order_effect: float | None
    n_a: int
    n_b: int
    quads: int
    memory: dict[str, Any] | None  # the resident sides' plan (ab.resident.plan_memory)
    pairs: list[dict[str, Any]]
    partial_pairs: list[dict[str, Any]]  # a pair's windows until it is whole (or cut short: "ended")
    rounds: list[dict[str, Any]]
    launches: list[dict[str, Any]]
    checks: list[CheckRecord]
    attribution: dict[str, Any]  # profiling.attribution.Attribution.to_dict() and "profiled", or {"error": ...}
    accepted: dict[str, Any]  # judge.accepted.judged: the accepted change it was judged against


class ABRecord(TypedDict, total=False):
    """``ab.json``: one ``perfsuite ab`` session (``ab.session.ABSession.data``)."""

    schema: str
    what: str
    argv: list[str]
    started: float
    finished: float
    settings: dict[str, Any]
    sides: dict[str, Any]
    env: dict[str, Any]
    cells: list[ABCellRecord]
    exit_code: int
    interrupted: bool
    attribution_wall_s: float  # what the attribution's profiled launches added to the session
