"""Cells: one frozen set of experiment parameters with a stable, readable id.

The experiment matrix is data (``perfsuite/experiments/*.toml``): each
experiment names its paper source, a tier, fixed parameters and axes whose
product yields cells. The same parameters reached from two experiments (say
Table 2's FP32 row and Table 3's pin_memory=False row) are one cell with both
sources, so a session measures it once.

A cell's workload is a built-in name or a spec of one's own
(``perfsuite.specs``): ``package.module:function``, an entry point of the
group ``perfsuite.workloads``, or a pytest node id (a test run in every rank:
``perfsuite.plugin.usercells``). Experiment files beyond the suite's own come from
``$PERFSUITE_EXPERIMENTS`` and pytest's ini option ``perf_experiments``.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import tomllib

from perfsuite import specs

TIERS = ("smoke", "gate", "full")
WORKLOADS = ("image", "llm", "probe")
IMAGE_STRATEGIES = ("dp", "ddp", "ddp-rr", "ddp-ds")
LLM_TECHNIQUES = ("lora", "qlora", "dpo", "qat", "qat-lora")
PROBE_STRATEGIES = ("preflight",)  # the pre-flight probe of GPUs and interconnect
PRECISIONS = ("fp64", "fp32", "fp16", "bf16")
MEMORY_FORMATS = ("nchw", "nhwc")
# fp32 math on CUDA: which float32 ops may run on TF32 tensor cores. "conv":
# cuDNN convolutions only (PyTorch's defaults from 1.12 on, what the papers
# most likely ran); "off": strict fp32 everywhere; "all": convolutions and matmuls.
TF32_MODES = ("conv", "off", "all")
# The learning rate over an image cell's run: held ("none", the papers' loop)
# or cosine-decayed to zero by its last step, so that a short run's accuracy
# is not decided by its last batches' noise.
LR_DECAYS = ("none", "cosine")
DEVICES = ("cpu", "cuda")
# The values of the parameters that have few: a cell's, and a finding's subject and twin
CHOICES = {"tier": TIERS, "device": DEVICES, "precision": PRECISIONS, "memory_format": MEMORY_FORMATS, "tf32": TF32_MODES,
           "lr_decay": LR_DECAYS, "strategy": (*IMAGE_STRATEGIES, *LLM_TECHNIQUES, *PROBE_STRATEGIES)}

EXPERIMENTS_DIR = Path(__file__).parent / "experiments"
EXPERIMENTS_ENV = "PERFSUITE_EXPERIMENTS"  # more experiment files or folders, os.pathsep-separated
# What an experiment of a workload of the user's own need not spell out.
USER_DEFAULTS = {"strategy": "", "device": "cpu", "world_size": 1, "precision": "fp32",
                 "pin_memory": False, "dataset": "", "batch_size": 0}
# A pytest test run as a cell (perfsuite.plugin.usercells): user/<node id>/<c|g><ranks>[/prof]
USER_TIER = "user"
_USER_ID = re.compile(r"user/(?P<test>.+::.+)/(?P<dev>[cg])(?P<ranks>[1-9]\d*)(?P<prof>/prof)?")


class CellError(ValueError):
    """A cell or an experiment file that cannot be used as written."""


@dataclass(frozen=True)
class Cell:
    tier: str
    workload: str
    strategy: str  # image: data-parallel strategy; llm: tuning technique
    device: str
    world_size: int  # ranks; for "dp" the GPUs one process drives
    precision: str
    pin_memory: bool
    dataset: str
    batch_size: int  # per rank
    epochs: int = 1
    max_steps: int = 0  # cap on training steps per epoch per rank; 0 = whole epoch
    warmup_steps: int = 3  # measured-step warm-up, excluded from samples
    lr: float = 1e-3
    loader_workers: int = 0  # DataLoader worker processes per rank
    image_size: int = 0  # image only
    memory_format: str = "nchw"  # image only
    tf32: str = "conv"  # image only: TF32_MODES; in the id when not "conv"
    lr_warmup_steps: int = 0  # llm scheduler warm-up (the paper's "warm-up steps")
    lr_decay: str = "none"  # image only: LR_DECAYS
    max_seq_len: int = 0  # llm only
    timeout_s: int = 600
    min_accuracy: float = 0.0  # accuracy target kept with the experiment data
    profile: bool = False  # a profile cell (Fig. 3, 5, 6): profiled by default
    sources: tuple[str, ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        problems = [f"{name} {getattr(self, name)!r} not in {allowed}" for name, allowed in CHOICES.items()
                    if name != "strategy" and getattr(self, name) not in allowed]  # by workload: below
        if self.workload not in WORKLOADS and specs.problem(self.workload):
            problems.append(f"workload {self.workload!r} not in {WORKLOADS}, nor a spec of "
                            f"one's own: {specs.problem(self.workload)}")
        strategies = {"image": IMAGE_STRATEGIES, "llm": LLM_TECHNIQUES,
                      "probe": PROBE_STRATEGIES}.get(self.workload)
        if strategies is not None and self.strategy not in strategies:
            problems.append(f"strategy {self.strategy!r} not in {strategies}")
        if self.precision == "fp16" and self.device == "cpu":
            problems.append("fp16 autocast needs CUDA; CPU cells use bf16")
        if self.world_size < 1:
            problems.append("world_size must be >= 1")
        if self.strategy == "dp" and self.device == "cpu" and self.world_size != 1:
            problems.append("DataParallel on CPU has one device: world_size must be 1")
        if self.workload == "image" and self.image_size < 8:
            problems.append("image cells need image_size >= 8")
        if problems:
            raise CellError(f"invalid cell {self.__dict__}: " + "; ".join(problems))

    @property
    def id(self) -> str:
        ranks = f"{'g' if self.device == 'cuda' else 'c'}{self.world_size}"
        pin = "pin" if self.pin_memory else "nopin"
        if self.workload == "image":
            parts = [self.strategy, ranks, self.precision, f"px{self.image_size}", pin,
                     self.memory_format] + ([f"tf32-{self.tf32}"] if self.tf32 != "conv" else [])
        elif self.workload == "probe":
            parts = [ranks]
        elif self.workload == "llm":
            parts = [self.strategy, self.dataset, ranks, self.precision, pin]
        elif specs.is_test(self.workload):  # its parameters are the test's own
            return "/".join([USER_TIER, self.workload, ranks] + (["prof"] if self.profile else []))
        else:  # a workload of one's own: what differs from the defaults, by name
            parts = [self.strategy] if self.strategy else []
            parts += [ranks, self.precision] + [
                f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if f.name not in _OWN_ID_SKIPS
                and getattr(self, f.name) != USER_DEFAULTS.get(f.name, f.default)]
        if self.profile:
            parts.append("prof")
        return "/".join([self.tier, self.workload, *parts])

    @property
    def gpus_needed(self) -> int:
        return self.world_size if self.device == "cuda" else 0

    @property
    def processes(self) -> int:
        """Ranks torchrun starts: DataParallel is one process driving N GPUs."""
        return 1 if self.strategy == "dp" else self.world_size

    def params(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["sources"] = list(self.sources)
        return out

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Cell:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise CellError(f"unknown cell parameters {unknown}; known: {sorted(known)}")
        values = dict(params)
        values["sources"] = tuple(values.get("sources", ()))
        return cls(**values)

    def replace(self, **changes: Any) -> Cell:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return self.id


# Fields an id of a workload of one's own spells elsewhere, or not at all.
_OWN_ID_SKIPS = {"tier", "workload", "strategy", "device", "world_size", "precision", "timeout_s",
                 "profile", "sources", "min_accuracy"}


def cell_of_test(test: str, world_size: int, device: str = "cpu", **params: Any) -> Cell:
    """The cell of pytest test ``test`` (a node id) on ``world_size`` ranks."""
    base = {**USER_DEFAULTS, "tier": "smoke" if device == "cpu" else "gate"}
    return Cell(**{**base, **params, "workload": test, "device": device,
                   "world_size": world_size})


def cell_of_user_id(cell_id: str) -> Cell | None:
    """The cell of a user test's id (``user/<node id>/c2``), as far as the id
    says (the test's marker may also set its timeout); None for other ids."""
    found = _USER_ID.fullmatch(cell_id)
    if found is None or not specs.is_test(found["test"]):
        return None
    return cell_of_test(found["test"], int(found["ranks"]), "cpu" if found["dev"] == "c" else "cuda",
                     profile=bool(found["prof"]))


def _cells_of_experiment(exp: dict[str, Any], defaults: dict[str, Any], origin: str) -> list[Cell]:
    try:
        name, tier, workload = exp["name"], exp["tier"], exp["workload"]
    except KeyError as missing:
        raise CellError(f"{origin}: experiment lacks {missing}; every experiment needs "
                        "name, tier, workload") from None
    base = {**defaults.get(tier, {}).get(workload, {}), **exp.get("fixed", {})}
    if workload not in WORKLOADS:  # one's own: the suite's axes need not be named
        base = {**USER_DEFAULTS, **base}
    axes = exp.get("axes", {})
    source = exp.get("source", name)
    cells = []
    for combo in itertools.product(*axes.values()):
        params = {**base, **dict(zip(axes.keys(), combo)), "tier": tier, "workload": workload,
                  "sources": (source,)}
        try:
            cells.append(Cell.from_params(params))
        except (CellError, TypeError) as err:
            raise CellError(f"{origin}: experiment {name!r}: {err}") from None
    return cells


_added_experiments: list[Path] = []


def experiment_paths() -> list[Path]:
    """The suite's experiment files, then those of ``set_added_experiments``
    and ``$PERFSUITE_EXPERIMENTS`` (files, or folders of ``*.toml``)."""
    given = [*_added_experiments, *(Path(p) for p in os.environ.get(EXPERIMENTS_ENV, "").split(os.pathsep) if p)]
    out = sorted(EXPERIMENTS_DIR.glob("*.toml"))
    for path in given:
        files = sorted(path.glob("*.toml")) if path.is_dir() else [path] if path.exists() else []
        if not files:
            raise CellError(f"experiment {'folder' if path.is_dir() else 'file'} {path} " + (
                "holds no *.toml file" if path.exists() else "does not exist")
                + f" (from ${EXPERIMENTS_ENV} or perf_experiments); fix the path")
        for file in files:
            if file.resolve() not in {p.resolve() for p in out}:
                out.append(file)
    return out


def set_added_experiments(paths: Iterable[Path | str]) -> None:
    """The experiment files ``matrix()`` reads beyond the suite's own and
    ``$PERFSUITE_EXPERIMENTS`` (pytest's ``perf_experiments``, for a session)."""
    _added_experiments[:] = [Path(p) for p in paths]
    matrix.cache_clear()
    findings.cache_clear()


_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
TABLES = {"experiment": "[[experiment]]", "finding": "[[finding]]", "defaults": "[defaults]", "limits": "[limits]"}


def experiment_schema() -> dict[str, Any]:
    """The JSON Schema of an experiment file, its parameters' types read from ``Cell``."""
    hints = typing.get_type_hints(Cell)
    param = {name: {"type": _JSON_TYPES[hints[name]]} for name in hints if hints[name] in _JSON_TYPES}
    param["sources"] = {"type": "array", "items": {"type": "string"}}
    params = {"type": "object", "properties": param, "additionalProperties": False}
    axes = {"type": "object", "additionalProperties": False,
            "properties": {k: {"type": "array", "minItems": 1, "items": v} for k, v in param.items()}}
    experiment = {"type": "object", "required": ["name", "tier", "workload"], "additionalProperties": False,
                  "properties": {"name": {"type": "string"}, "tier": {"type": "string"},
                                 "workload": {"type": "string"}, "source": {"type": "string"},
                                 "fixed": params, "axes": axes}}
    typed = {"type": "object", "properties": param}  # an unknown parameter: load_findings names it
    finding = {"type": "object", "required": ["name", "source", "subject", "twin"], "additionalProperties": False,
               "properties": {"name": {"type": "string"}, "source": {"type": "string"}, "subject": typed,
                              "twin": typed, "low": {"type": "number"}, "high": {"type": "number"},
                              "devices": {"type": "array", "items": {"enum": list(DEVICES)}},
                              "metric": {"type": "string"}, "measured": {"type": "string"}}}
    return {"type": "object", "additionalProperties": False, "properties": {
        "experiment": {"type": "array", "items": experiment},
        "defaults": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": params}},
        "finding": {"type": "array", "items": finding},
        "limits": {"type": "object"}}}


def check_experiment_file(data: dict[str, Any], path: Path | str) -> None:
    """Refuse an experiment file of the wrong shape, naming the place and the type expected."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(experiment_schema()).iter_errors(data), key=lambda e: list(e.path))
    if not errors:
        for exp in data.get("experiment", []):
            both = sorted(set(exp.get("fixed", {})) & set(exp.get("axes", {})))
            if both:
                raise CellError(f"{path}: experiment {exp['name']!r}: {both[0]} is both fixed and on an "
                                "axis; keep one")
        return
    err = errors[0]
    where = list(err.path)
    if where[:1] in (["experiment"], ["finding"]) and len(where) > 1:
        entry = data[where[0]][where[1]]
        name = entry.get("name") if isinstance(entry, dict) else None
        place = (f"{where[0]} {name!r}" if isinstance(name, str) else f"{where[0]} #{where[1] + 1}") + "".join(
            f".{p}" for p in where[2:])
    else:
        place = ".".join(str(p) for p in where) or "the file"
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        why = f"unknown key(s) {extra}; known: {sorted(err.schema.get('properties', {}))}"
        near = difflib.get_close_matches(extra[0], TABLES, n=1) if not where else []
        why += f"; did you mean {TABLES[near[0]]}?" if near else ""
    elif err.validator == "type":
        why = f"is {err.instance!r}, expected {err.validator_value}"
        if where == ["experiment"]:
            why += " (write [[experiment]] for each experiment, not [experiment])"
    else:
        why = err.message
    raise CellError(f"{path}: {place}: {why}")


def read_experiment_file(path: Path | str) -> dict[str, Any]:
    """An experiment file, parsed and checked (``check_experiment_file``)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise CellError(f"{path}: not valid TOML ({err}); fix the file") from None
    except UnicodeDecodeError as err:
        raise CellError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); "
                        "save it as UTF-8") from None
    check_experiment_file(data, path)
    return data


def load_matrix(paths: Iterable[Path] | None = None) -> dict[str, Cell]:
    """Every cell of the experiment files, keyed by id, sources merged."""
    paths = experiment_paths() if paths is None else list(paths)
    matrix, named = {}, {}
    for path in paths:
        data = read_experiment_file(path)
        for exp in data.get("experiment", []):
            _name_once("experiment", exp["name"], path, named)
            for cell in _cells_of_experiment(exp, data.get("defaults", {}), str(path)):
                seen = matrix.get(cell.id)
                if seen is not None and seen != cell:
                    raise CellError(f"{path}: two experiments give id {cell.id} different "
                                    "parameters; make the ids distinct")
                sources = (seen.sources if seen else ()) + cell.sources
                matrix[cell.id] = cell.replace(sources=tuple(dict.fromkeys(sources)))
    return matrix


@dataclass(frozen=True)
class Finding:
    """A paper's finding as a ratio between two cells: ``subject`` cells (those
    whose parameters include these) against their twin with ``twin`` changed.
    ``metric`` "speedup" is throughput(subject) / throughput(twin), judged
    within [low, high]; ``devices`` are where it holds (measured, in ``measured``)."""

    name: str
    source: str
    subject: dict[str, Any]
    twin: dict[str, Any]
    low: float | None = None
    high: float | None = None
    devices: tuple[str, ...] = DEVICES
    metric: str = "speedup"
    measured: str = ""

    def applies(self, params: dict[str, Any]) -> bool:
        return (params.get("device") in self.devices
                and all(params.get(k) == v for k, v in self.subject.items())
                and any(params.get(k) != v for k, v in self.twin.items()))


def load_findings(paths: Iterable[Path] | None = None) -> list[Finding]:
    """Every ``[[finding]]`` of the experiment files, validated."""
    paths = experiment_paths() if paths is None else list(paths)
    known = {f.name for f in dataclasses.fields(Cell)}
    out, named = [], {}
    for path in paths:  # each field's type checked first: a wrong one would fail every cell it judges
        for entry in read_experiment_file(path).get("finding", []):
            try:
                finding = Finding(**{**entry, "devices": tuple(entry.get("devices", DEVICES))})
            except TypeError as err:
                raise CellError(f"{path}: finding {entry.get('name')!r}: {err}") from None
            bad = sorted((set(finding.subject) | set(finding.twin)) - known)
            if bad or finding.metric != "speedup" or finding.low is None and finding.high is None:
                raise CellError(f"{path}: finding {finding.name!r}: subject and twin take cell "
                                f"parameters (not {bad}), metric 'speedup', and low or high")
            if problem := _never_judges(finding):
                raise CellError(f"{path}: finding {finding.name!r}{problem}")
            _name_once("finding", finding.name, path, named)
            out.append(finding)
    return out


def _never_judges(finding: Finding) -> str | None:
    """Why ``finding`` could never judge a cell, or never pass (None: it can), said after its name."""
    if not finding.devices:
        return f".devices: is empty, so the finding holds on no device; name some of {', '.join(DEVICES)}"
    for side in ("subject", "twin"):
        for key, value in getattr(finding, side).items():
            if key in CHOICES and value not in CHOICES[key]:
                return f".{side}.{key}: {value!r} is not one of {', '.join(CHOICES[key])}"
    if all(finding.subject.get(k) == v for k, v in finding.twin.items()):
        return f".twin: {finding.twin} changes nothing of its subject; change a parameter of the subject's"
    ends = [x for x in (finding.low, finding.high) if x is not None]
    if (not all(map(math.isfinite, ends)) or len(ends) == 2 and ends[0] >= ends[1]
            or finding.high is not None and finding.high <= 0):
        return (f": low {finding.low} and high {finding.high} could never pass: give finite bounds, low below "
                "high, high above 0 (a speedup is)")
    return None


@lru_cache(maxsize=1)
def _built_in_names() -> dict[tuple[str, str], Path]:
    return {(kind, entry["name"]): path for path in sorted(EXPERIMENTS_DIR.glob("*.toml"))
            for kind, entries in tomllib.loads(path.read_text(encoding="utf-8")).items()
            if kind in ("experiment", "finding") for entry in entries}


def _name_once(kind: str, name: str, path: Path, named: dict[str, Path]) -> None:
    """Refuse a second ``kind`` named ``name`` in one's own files: a built-in's name, or one given twice."""
    built_in, seen, named[name] = _built_in_names().get((kind, name)), named.get(name), Path(path)
    if Path(path).parent.resolve() != EXPERIMENTS_DIR.resolve() and (built_in or seen):
        raise CellError(f"{path}: {kind} {name!r} is " + (f"the name of a built-in {kind} ({built_in.name})" if built_in
                        else f"given twice ({'in this file' if seen == Path(path) else f'also in {seen}'})")
                        + "; give yours another name")


@lru_cache(maxsize=1)
def findings() -> tuple[Finding, ...]:
    return tuple(load_findings())


@lru_cache(maxsize=1)
def matrix() -> dict[str, Cell]:
    findings()  # a finding that could never judge is refused with the matrix, before any launch
    return load_matrix()


def select(tier: str | None = None, workload: str | None = None, ids: Iterable[str] = ()) -> list[Cell]:
    """Cells of a tier/workload, or exactly the given ids (unknown ids raise).

    An id of a user's pytest test (``user/<node id>/c2``) is its cell: such
    cells live in test files, not in the matrix."""
    every = matrix()
    wanted = list(dict.fromkeys(ids))  # an id given twice is one cell
    if wanted:
        every = {**every, **{i: c for i in wanted if i not in every
                             for c in [cell_of_user_id(i)] if c is not None}}
        if unknown := [i for i in wanted if i not in every]:  # thousands are said in one short line
            raise CellError(f"unknown cell id(s) {unknown[:5]}{f' and {len(unknown) - 5} more' if unknown[5:] else ''}; "
                            "`perfsuite list --tier all` prints every id")
        return [every[i] for i in wanted]
    if tier not in (None, "all") and tier not in TIERS:
        raise CellError(f"unknown tier {tier!r}; tiers: {', '.join(TIERS)}, all")
    return [c for c in every.values()
            if tier in (None, "all", c.tier) and workload in (None, c.workload)]


def get(cell_id: str) -> Cell:
    return select(ids=[cell_id])[0]
