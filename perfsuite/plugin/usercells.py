"""A pytest test as a cell: the plugin's side of ``@pytest.mark.perf_ranks``.

    @pytest.mark.perf_ranks(2)              # or [1, 2, 4]: one cell each
    def test_step(perf_dist, perf_steps):
        ...
        for batch in perf_steps(batches(), warmup=3):
            train_step(model, batch)

Collected, such a test is parametrised over its cells (``perf_cell``, ids
``c2``, ``g2``): workload = the test's node id (with its own parameters),
``world_size`` = the ranks, device = the marker's ``device`` or the tier's
(smoke: CPU over gloo; gate, full: one GPU per rank over NCCL; all: both).
In the pytest process its body never runs: the call launches the cell
(``Runner.result`` -> ``run_cell`` -> torchrun -> ``perfsuite.rank.worker``),
and the rank's worker runs pytest on that one test (``perfsuite.plugin.ranktest``),
where ``perf_dist`` and ``perf_steps`` come from. So none of its fixtures is
set up in the pytest process either: they all run in the ranks.

Standard library and pytest only: collecting imports nothing heavy and
starts no process.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

from perfsuite import cells as cells_mod
from perfsuite import options, specs

MARKER = "perf_ranks"
MARKER_HELP = ("perf_ranks(ranks, *, device=None, timeout=None): run this test itself as a "
               "measured cell in every rank (torchrun); ranks: a count or a list (one cell "
               "each); device: 'cpu' (gloo) or 'cuda' (NCCL, a GPU per rank), default by "
               "--perf-tier; timeout: seconds for the whole launch")
FIXTURES = ("perf_dist", "perf_steps")
# In the pytest process a user test needs only these: its own fixtures run in the ranks.
LAUNCHER_FIXTURES = ["request", "perf_cell"]
TIER_DEVICES = {"smoke": ("cpu",), "gate": ("cuda",), "full": ("cuda",), "all": ("cpu", "cuda")}


def rank_session() -> Any:
    """The rank's ``perfsuite.plugin.ranktest.RankSession`` when this pytest runs
    inside a rank; None in the pytest process that launches."""
    module = sys.modules.get("perfsuite.plugin.ranktest")
    return getattr(module, "CURRENT", None)


def param_id(cell: cells_mod.Cell) -> str:
    """The test's parameter id of its cell: c2 (CPU ranks) or g2 (GPUs), as in cell ids."""
    return f"{'g' if cell.device == 'cuda' else 'c'}{cell.world_size}"


RANKS_KEYWORDS = ("ranks", "timeout", "device")


def check_perf_marker(marker: pytest.Mark, nodeid: str) -> None:
    """``@pytest.mark.perf(workload=NAME)`` and nothing else: a typo
    (``workloads=``) or a positional name would quietly select every cell."""
    if marker.args or set(marker.kwargs) - {"workload"}:
        given = [*map(repr, marker.args), *(f"{k}={v!r}" for k, v in marker.kwargs.items())]
        pytest.fail(f"{nodeid}: @pytest.mark.perf({', '.join(given)}): it takes one keyword, "
                    "workload=NAME (e.g. @pytest.mark.perf(workload=\"image\"))", pytrace=False)


def _ranks(marker: pytest.Mark) -> list[int]:
    given = marker.args[0] if marker.args else marker.kwargs.get("ranks", 1)
    ranks = list(given) if isinstance(given, (list, tuple, range)) else [given]
    if not ranks or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ranks):
        pytest.fail(f"@pytest.mark.{MARKER}({given!r}): give a number of ranks (>= 1) or a list "
                    "of them", pytrace=False)
    return list(dict.fromkeys(ranks))


def _timeout(marker: pytest.Mark) -> dict[str, int]:
    given = marker.kwargs.get("timeout")
    if given is None:
        return {}
    number = isinstance(given, (int, float)) and not isinstance(given, bool)
    if not number or options.timeout_problem(given):
        pytest.fail(f"@pytest.mark.{MARKER}(timeout={given!r}): give a number of seconds (> 0) "
                    "for the whole launch, or leave it out", pytrace=False)
    return {"timeout_s": math.ceil(given)}  # whole seconds, as a cell keeps them


def _devices(marker: pytest.Mark, config: pytest.Config) -> tuple[str, ...]:
    session = rank_session()
    if session is not None:  # in a rank: the device of the cell it runs
        return (session.cell.device,)
    given = marker.kwargs.get("device")
    if given is None:
        if config.getoption("--perf-cell"):
            return ("cpu", "cuda")  # the ids choose
        return TIER_DEVICES[config.getoption("--perf-tier")]
    devices = (given,) if isinstance(given, str) else tuple(given)
    bad = [d for d in devices if d not in cells_mod.DEVICES]
    if bad or not devices:
        pytest.fail(f"@pytest.mark.{MARKER}(device={given!r}): devices are "
                    f"{', '.join(cells_mod.DEVICES)}", pytrace=False)
    return devices


def parametrize(metafunc: pytest.Metafunc) -> None:
    """``perf_cell`` over the cells of a ``perf_ranks`` test."""
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(f"{metafunc.definition.nodeid}: {' and '.join(FIXTURES)} run in the ranks of a "
                    f"measured test: mark it @pytest.mark.{MARKER}(N)", pytrace=False)
    unknown = sorted(set(marker.kwargs) - set(RANKS_KEYWORDS))
    if unknown or len(marker.args) > 1:  # a typo (devices=) would quietly mean the default
        pytest.fail(f"{metafunc.definition.nodeid}: @pytest.mark.{MARKER}: "
                    f"{'unknown keyword ' + repr(unknown[0]) if unknown else 'one number or list of ranks'}; "
                    f"it takes ranks (first argument), {', '.join(RANKS_KEYWORDS[1:])}", pytrace=False)
    extra = _timeout(marker)
    try:
        chosen = [cells_mod.cell_of_test(metafunc.definition.nodeid, n, device, **extra)
                  for device in _devices(marker, metafunc.config) for n in _ranks(marker)]
    except cells_mod.CellError as err:
        pytest.fail(f"{metafunc.definition.nodeid}: {err}", pytrace=False)
    if "perf_cell" not in metafunc.fixturenames:  # a test that asks for none of the fixtures
        metafunc.fixturenames.append("perf_cell")
    metafunc.parametrize("perf_cell", chosen, ids=[param_id(c) for c in chosen])


def cell_of(item: pytest.Item) -> cells_mod.Cell | None:
    cell = getattr(getattr(item, "callspec", None), "params", {}).get("perf_cell")
    return cell if isinstance(cell, cells_mod.Cell) and specs.is_test(cell.workload) else None


def _test_id(item: pytest.Item, cell: cells_mod.Cell) -> str:
    """The item's node id without its ``c2`` part: the test with its own parameters."""
    name, original = item.name, getattr(item, "originalname", item.name)
    prefix = item.nodeid[: len(item.nodeid) - len(name)] + original
    ids = name[len(original) + 1:-1].split("-") if name.endswith("]") else []
    if param_id(cell) in ids:
        ids.remove(param_id(cell))
    return prefix + (f"[{'-'.join(ids)}]" if ids else "")


def _unknown_workloads(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``@pytest.mark.perf(workload=...)`` naming no workload of any cell
    (a typo) is a collection error naming the test and the known ones; pytest
    would only skip it, "got empty parameter set", and CI would stay green."""
    marked = [(item, item.get_closest_marker("perf")) for item in items
              if item.get_closest_marker(MARKER) is None]
    marked = [(item, mark.kwargs.get("workload")) for item, mark in marked if mark is not None]
    if not any(workload is not None for _, workload in marked):
        return
    known = sorted(set(cells_mod.WORKLOADS) | {c.workload for c in cells_mod.matrix().values()})
    reported: set[str] = set()
    for item, workload in marked:
        if workload is None or workload in known:
            continue
        items.remove(item)
        test = item.nodeid.split("[")[0]  # its items: test[NOTSET], one per own parameter
        if test not in reported:
            reported.add(test)
            message = (f"{test}: @pytest.mark.perf(workload={workload!r}): no cell has that workload; "
                       f"known: {', '.join(known)} (one's own needs an experiment file: perf_experiments)")
            config.hook.pytest_collectreport(report=pytest.CollectReport(test, "failed", message, []))


def prepare(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each user test's cell named after its own parameters too; then in a
    rank only the one test it runs is kept, and in the pytest process the
    ``--perf-cell`` ids choose and the tests' own fixtures are left to the
    ranks (``LAUNCHER_FIXTURES``)."""
    session = rank_session()
    if session is None:
        _unknown_workloads(config, items)
    wanted = set(config.getoption("--perf-cell"))
    kept, dropped = [], []
    for item in items:
        cell = cell_of(item) if item.get_closest_marker(MARKER) is not None else None
        if cell is None:
            (dropped if session is not None else kept).append(item)
            continue
        test = _test_id(item, cell)
        if test != cell.workload:
            cell = cell.replace(workload=test)
            item.callspec.params["perf_cell"] = cell
        if session is not None:
            (kept if cell.id == session.cell.id else dropped).append(item)
        elif wanted and cell.id not in wanted:
            dropped.append(item)
        else:
            item.fixturenames = list(LAUNCHER_FIXTURES)
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
