"""pytest wiring only: options, cell parametrisation, fixtures, report.

Registered through the ``pytest11`` entry point. A test that takes the
``perf_cell`` fixture and carries ``@pytest.mark.perf(workload=...)`` is
parametrised over the cells of the selected tier (or of ``--perf-cell``);
``perf_result`` runs its cell once per session and hands back the result.
A test marked ``@pytest.mark.perf_ranks(N)`` is itself a cell: it runs in
N ranks with ``perf_dist`` and ``perf_steps`` (``perfsuite.plugin.usercells``,
``perfsuite.plugin.ranktest``), and its result is judged here like any cell's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from perfsuite import cells as cells_mod  # stdlib and tomllib only: pytest_addoption's choices
from perfsuite import options, specs
from perfsuite.plugin import usercells

# The rest of perfsuite (the runner, judging, history, report: numpy, scipy,
# pandas, SQLAlchemy) is imported in the hooks that use it: every pytest run in
# the environment imports this plugin, and one that collects no cell pays for none.
if TYPE_CHECKING:
    from perfsuite.runner import Runner

SESSION_KEY = pytest.StashKey["Runner"]()
PREVIOUS_SIGTERM = pytest.StashKey[object]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfsuite", "perfsuite: measured experiment cells (each --perf-NAME option is "
                                         "`perfsuite run --NAME`)")
    group.addoption("--perf-tier", default="smoke", choices=[*cells_mod.TIERS, "all"],
                    help="cells of this tier (default: smoke, the CPU tier)")
    group.addoption("--perf-cell", action="append", default=[], metavar="ID",
                    help="run exactly this cell id (repeatable); see `perfsuite list` (default: the "
                         "--perf-tier's cells)")
    group.addoption("--perf-out", default=None, metavar="DIR",
                    help="output directory for results.json and cell logs "
                         "(default: .perfsuite/run-<time>-<pid>)")
    options.add_launch_options(group.addoption, options.PYTEST_PREFIX)  # as perfsuite run, ab and bisect's
    group.addoption("--perf-profile", action=options.OldName, dest="perf_profiler", new="--perf-profiler",
                    choices=options.PROFILERS)
    group.addoption("--perf-baselines", default=None, metavar="DIR",
                    help="baselines root (default: $PERFSUITE_BASELINES or the project's baselines/)")
    group.addoption("--perf-no-probe", action="store_true",
                    help="skip the pre-flight probe of GPUs, host link and interconnect")
    group.addoption("--perf-repeats", type=int, default=1, metavar="N",
                    help="launch every cell N times; from 4 (here and in the baseline) the "
                         "step-time verdict weighs the spread between launches (default: %(default)s)")
    group.addoption("--perf-resume", action="store_true",
                    help="keep cells an earlier run into --perf-out measured fully")
    group.addoption("--perf-overwrite", action="store_true",
                    help="replace the run already in --perf-out (refused otherwise)")
    group.addoption("--perf-history", default=None, metavar="URL",
                    help="history store this run is added to (SQLite path or SQLAlchemy URL; "
                         "default $PERFSUITE_HISTORY, else .perfsuite/history.sqlite; 'off' keeps none)")
    group.addoption("--perf-history-purpose", default=None, choices=options.HISTORY_PURPOSES,
                    help="mark the stored run so (default: experiment with --perf-option, ad-hoc with a "
                         "--perf-out outside .perfsuite/ and no store named, else run); an injected fault "
                         "is always an experiment")
    group.addoption("--perf-commit", default=None, metavar="SHA",
                    help="the commit the run is stored under in the history (default: git rev-parse HEAD "
                         "here, else the run's env)")
    group.addoption("--perf-branch", default=None, metavar="NAME",
                    help="the branch it is stored under (default: the one checked out here, none outside git)")
    group.addoption("--perf-fail-on-skipped", action="store_true",
                    help="a comparison that could not be made (no comparable baseline, a "
                         "skipped cell) fails its test: for CI, where a green run must have "
                         "judged something; a cell that needs more GPUs than the machine has "
                         "is listed as not run, and a baseline --perf-record-new recorded "
                         "is said so, neither a failure")
    group.addoption("--perf-runner-baselines", default=None, metavar="DIR",
                    help="this runner's own baselines root, searched after --perf-baselines "
                         "(default: none)")
    group.addoption("--perf-record-new", action="store_true",
                    help="record what a cell had no baseline for (its times on this hardware, "
                         "its counters on this stack) into --perf-runner-baselines: a runner's "
                         "first run records, later runs judge")
    parser.addini("perf_experiments", type="paths", default=[],
                  help="perfsuite: experiment files (or folders of them) of one's own workloads, "
                       "added to the matrix (as $PERFSUITE_EXPERIMENTS)")


def _session_runner(config: pytest.Config) -> Runner:
    from perfsuite.runner import Runner, default_out_dir, launch_options

    get = config.getoption
    try:
        launch = launch_options(
            data_dir=get("--perf-data-dir"), options=get("--perf-option"),
            timeout=get("--perf-timeout"), profiler=get("--perf-profiler"), gpus=get("--perf-gpus"),
            nnodes=get("--perf-nnodes"), rdzv_endpoint=get("--perf-rdzv-endpoint"),
            rdzv_id=get("--perf-rdzv-id"), slurm=get("--perf-slurm"), rank_start=get("--perf-rank-start"))
    except ValueError as err:
        raise pytest.UsageError(f"perfsuite: {err}") from None

    def on_progress(cell, line: str) -> None:  # long cells say where their ranks are
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"    {cell.id}: {line}")

    def on_notice(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"perfsuite: {line}")

    launch.on_progress = on_progress
    # the ranks of a user test find it from the same root and ini file as this run
    launch.env["PERFSUITE_PYTEST_ROOTDIR"] = str(config.rootpath)
    if config.inipath is not None:
        launch.env["PERFSUITE_PYTEST_INIFILE"] = str(config.inipath)
    out = get("--perf-out") or default_out_dir(config.rootpath)
    if get("--perf-repeats") < 1:
        raise pytest.UsageError("perfsuite: --perf-repeats must be at least 1")
    try:
        return Runner(out, launch, resume=get("--perf-resume"), baselines=get("--perf-baselines"),
                      probe=not get("--perf-no-probe"), repeats=get("--perf-repeats"),
                      overwrite=get("--perf-overwrite"), on_notice=on_notice,
                      runner_baselines=get("--perf-runner-baselines"),
                      record_new=get("--perf-record-new"))
    except ValueError as err:
        raise pytest.UsageError(f"perfsuite: {err}") from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perf(workload=NAME): a measured experiment cell")
    config.addinivalue_line("markers", usercells.MARKER_HELP)
    try:
        if config.getini("perf_experiments"):  # this session's, until its end
            cells_mod.set_added_experiments(config.getini("perf_experiments"))
            config.add_cleanup(lambda: cells_mod.set_added_experiments([]))
        cells_mod.select(ids=config.getoption("--perf-cell"))
    except cells_mod.CellError as err:
        raise pytest.UsageError(str(err)) from None
    import os

    from perfsuite.system import envvars

    # every PERFSUITE_* variable takes its value, one option is not given two, before any launch
    found = [*envvars.problems(os.environ), options.old_name_clash(config.option),
             options.history_problem(config.getoption("--perf-history"), "--perf-history")]
    if any(found):
        raise pytest.UsageError("\n".join(f"perfsuite: {line}" for line in found if line))
    for line in envvars.strangers(os.environ) if not _xdist_worker(config) else ():
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"perfsuite: {line}"), stacklevel=2)


def session_runner(config: pytest.Config) -> Runner:
    """The session's Runner, built on first use: a pytest run that collects no
    cell never imports the measuring code (nor scipy, pandas, torch)."""
    runner = config.stash.get(SESSION_KEY, None)
    if runner is None:
        runner = config.stash[SESSION_KEY] = _session_runner(config)
        runner.allow_no_gpu = config.getoption("--perf-allow-no-gpu")  # read by its probe
    return runner


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Check what the session's cells need before the first is launched."""
    config = session.config
    allow_no_gpu = config.getoption("--perf-allow-no-gpu")
    measured = [item for item in session.items if "perf_cell" in getattr(item, "fixturenames", ())]
    if (not measured or config.option.collectonly or _xdist_worker(config)
            or usercells.rank_session() is not None):  # a rank's pytest measures nothing itself
        return
    runner = session_runner(config)  # bad options are a usage error here
    from perfsuite.judge.baselines import BaselineError
    from perfsuite.runner import SessionError

    gpu_cells = [c.id for c in (getattr(getattr(item, "callspec", None), "params", {}).get(
        "perf_cell") for item in measured) if isinstance(c, cells_mod.Cell) and c.device == "cuda"]
    if not allow_no_gpu:
        from perfsuite.hardware import gpu_cells_without_gpu

        problem = gpu_cells_without_gpu(gpu_cells, "--perf-allow-no-gpu")
        if problem:
            raise pytest.UsageError(f"perfsuite: {problem}")
    from perfsuite.history.store import HistoryError, check_store_usable

    try:  # a history store that cannot take the run is said before the first launch
        check_store_usable(config.getoption("--perf-history"))
    except HistoryError as err:
        raise pytest.UsageError(f"perfsuite: {err}") from None
    try:
        runner.begin()
    except (SessionError, BaselineError) as err:
        raise pytest.UsageError(f"perfsuite: {err}") from None
    # Only a session that measures: a CI cancel or a dropped ssh session then ends
    # the running cell, keeps the rest and writes the report (a second Ctrl-C
    # waits for that); other pytest runs keep their signals as they are.
    from perfsuite.runner import handle_sigterm

    config.stash[PREVIOUS_SIGTERM] = handle_sigterm()


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    restore = config.stash.get(PREVIOUS_SIGTERM, None)
    if restore is not None:
        restore()
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.end()
    # The zygotes the session's launches forked from end with it (an in-process
    # pytest.main() would keep them, torch imported, until the process ends).
    agent = sys.modules.get("perfsuite.launch.agent")
    if agent is not None:
        agent.close_zygotes()


def selected_cells(config: pytest.Config, workload: str | None) -> list[cells_mod.Cell]:
    ids = config.getoption("--perf-cell")
    if ids:  # a user test's cell runs only as that test
        return [c for c in cells_mod.select(ids=ids) if workload in (None, c.workload)
                and not specs.is_test(c.workload)]
    return cells_mod.select(tier=config.getoption("--perf-tier"), workload=workload)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (metafunc.definition.get_closest_marker(usercells.MARKER) is not None
            or any(name in metafunc.fixturenames for name in usercells.FIXTURES)):
        usercells.parametrize(metafunc)  # the test itself is the cell
        return
    if "perf_cell" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("perf")
    if marker is not None:
        usercells.check_perf_marker(marker, metafunc.definition.nodeid)
    workload = marker.kwargs.get("workload") if marker else None
    chosen = selected_cells(metafunc.config, workload)
    metafunc.parametrize("perf_cell", chosen, ids=[c.id for c in chosen])


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest) -> Runner:
    return session_runner(request.config)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                   items: list[pytest.Item]) -> None:
    usercells.prepare(config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A user test's call in the pytest process: launch its cell (the body
    runs in the ranks), then judge it as any cell."""
    cell = usercells.cell_of(pyfuncitem)
    if cell is None or usercells.rank_session() is not None:
        return None
    from perfsuite.judge.judging import explain, failures

    request = pyfuncitem.funcargs["request"]
    result = judged_result(cell, session_runner(pyfuncitem.config), request)
    if failures(result):
        pytest.fail(f"{cell.id}:\n{explain(result)}", pytrace=False)
    return True


@pytest.fixture
def perf_dist(request: pytest.FixtureRequest, perf_cell) -> Any:
    """In a rank of a @pytest.mark.perf_ranks test: its process group, rank,
    world size and device (``perfsuite.steps.Dist``)."""
    return _in_rank(request).dist


@pytest.fixture
def perf_steps(perf_dist, request: pytest.FixtureRequest) -> Any:
    """In a rank: ``for batch in perf_steps(iterable, warmup=3): ...`` times
    each step with the suite's meter (``perfsuite.steps.Steps``)."""
    return _in_rank(request).steps


def _in_rank(request: pytest.FixtureRequest) -> Any:
    session = usercells.rank_session()
    if session is None:
        pytest.fail(f"{request.node.nodeid}: perf_dist and perf_steps exist in the ranks of a "
                    f"@pytest.mark.{usercells.MARKER} test, which the perfsuite plugin launches",
                    pytrace=False)
    return session


@pytest.fixture
def perf_result(perf_cell, perf_session: Runner, request) -> dict[str, Any]:
    """The measured result of this test's cell; skips or fails with the reason."""
    return judged_result(perf_cell, perf_session, request)


def judged_result(perf_cell: cells_mod.Cell, perf_session: Runner,
                  request: pytest.FixtureRequest) -> dict[str, Any]:
    """The cell's judged result, reported with the test; skips or fails with the reason."""
    from perfsuite import report
    from perfsuite.judge.judging import unjudged

    if _xdist_worker(request.config):
        pytest.fail(f"{perf_cell.id}: perfsuite cells do not run under pytest-xdist: its workers "
                    "would measure on top of each other and each rewrite results.json. Run the "
                    "perf tests in one process (-n 0, or -p no:xdist)", pytrace=False)
    try:
        result = perf_session.result(perf_cell)
    except OSError as err:  # a full disk, a mount gone read-only: every later cell would fail too
        request.session.shouldstop = f"perfsuite: cannot write under {perf_session.out_dir}"
        raise pytest.fail.Exception(
            f"{perf_cell.id}: its result could not be written ({err.strerror or err}); "
            f"{perf_session.file.path} keeps every cell written before it. The session stops "
            "here: make room (or choose another --perf-out), then run again with --perf-resume",
            pytrace=False) from None
    # JUnit XML: xunit2 (pytest's default) allows no <properties> in a <testcase>;
    # there the cell's figures go to <testsuite> properties, named by cell.
    if request.config.getini("junit_family") in ("xunit1", "legacy"):
        request.node.user_properties.extend(report.junit_properties(result))
    else:
        record = request.getfixturevalue("record_testsuite_property")
        for name, value in report.junit_suite_properties(result):
            record(name, value)
    request.node.add_report_section("call", "perfsuite", report.cell_text(result))
    _record_in_benchmark(request, result)
    strict = request.config.getoption("--perf-fail-on-skipped")
    unmade = unjudged(result)
    if result["status"] == "skipped":
        (pytest.fail if strict and unmade else pytest.skip)(f"{perf_cell.id}: {result['reason']}")
    if result["status"] != "ok":
        tail = result.get("output_tail", "")
        where = _where_ranks_were(result)
        pytest.fail(f"{perf_cell.id}: {result['status']}: {result['reason']}\n"
                    + (f"--- where the ranks were: {where}\n" if where else "")
                    + f"--- output tail ({result.get('dir')}/output.log) ---\n{tail}",
                    pytrace=False)
    if strict and unmade:
        pytest.fail(f"{perf_cell.id}: {len(unmade)} comparison(s) could not be made "
                    "(--perf-fail-on-skipped):\n" + "\n".join(f"  {line}" for line in unmade),
                    pytrace=False)
    return result


def _where_ranks_were(result: dict[str, Any]) -> str | None:
    """"rank 0 step 3/7 (train); rank 1 ...": each rank's last step, from its progress file."""
    if not result.get("dir"):
        return None
    from perfsuite.launch.diagnose import ProgressWatch

    return ProgressWatch(result["dir"]).line()


def _record_in_benchmark(request: pytest.FixtureRequest, result: dict[str, Any]) -> None:
    """Hand the cell's measured step times to pytest-benchmark's machinery.

    They then appear in --benchmark-json, --benchmark-autosave runs and
    --benchmark-compare(-fail), as if pytest-benchmark had timed each step.
    """
    session = getattr(request.config, "_benchmarksession", None)
    samples = result.get("metrics", {}).get("step_time", {}).get("samples")
    if session is None or session.skip or session.disabled or not samples:
        return
    benchmark = request.getfixturevalue("benchmark")
    stats = benchmark._make_stats(1)
    for seconds in samples:
        stats.update(seconds)
    benchmark._mode = "perfsuite step-time samples"  # marks the fixture as used
    benchmark.extra_info.update({"perfsuite_id": result["id"], "status": result["status"],
                                 "metric": "step_time", "unit": "s"})


REPORT_PATHS = pytest.StashKey[object]()
HISTORY_LINE = pytest.StashKey[object]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    """Write the report before any other plugin's end of session can raise
    (pytest-benchmark's --benchmark-compare-fail does)."""
    runner: Runner = session.config.stash.get(SESSION_KEY, None)
    config = session.config
    if (config.getoption("--perf-fail-on-skipped") and not config.option.collectonly
            and not _xdist_worker(config) and usercells.rank_session() is None
            and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)):
        from perfsuite.judge.judging import none_could_run

        why = ("no cell was measured (--perf-fail-on-skipped): every perf test was deselected or "
               "skipped at collection (an empty axis?)" if runner is None or not runner.results
               else none_could_run(runner.results))
        why = why and why.replace(": ", " (--perf-fail-on-skipped): ", 1)
        if why:  # a green run must have judged something
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"perfsuite: {why}", red=True)
    if runner is not None and runner.results and runner.file.path.exists():
        try:  # the report is for people; it never changes the session's outcome
            from perfsuite.report.html import write_reports

            session.config.stash[REPORT_PATHS] = write_reports(runner.file.path.parent)
        except Exception as err:  # noqa: BLE001
            session.config.stash[REPORT_PATHS] = f"{type(err).__name__}: {err}"
        asked = session.config.getoption("--perf-history-purpose")
        if asked is not None:  # else the purpose already set on the session's runner, if any
            runner.history_purpose = asked
        session.config.stash[HISTORY_LINE] = runner.add_to_history(
            session.config.getoption("--perf-history"),
            interrupted=exitstatus == pytest.ExitCode.INTERRUPTED,
            commit=session.config.getoption("--perf-commit"), branch=session.config.getoption("--perf-branch"))
        if getattr(runner, "history_unwritten", None) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # measured, but its history not written
    yield


# A wrapper, innermost: perfsuite's lines come after every other plugin's summary
# (pytest-benchmark's wide table) and before pytest's short summary, so that a
# run's last lines say where its results, report and history are; also when
# another plugin's summary raises (--benchmark-compare-fail).
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config):
    try:
        return (yield)
    finally:
        _perfsuite_summary(terminalreporter, config)


def _perfsuite_summary(terminalreporter, config: pytest.Config) -> None:
    session: Runner = config.stash.get(SESSION_KEY, None)
    if session is None or not session.results:
        return
    from perfsuite import report

    terminalreporter.section("perfsuite")
    for line in report.probe_lines(session.probe):
        terminalreporter.write_line(line)
    for line in report.summary_lines(session.results) + report.skipped_lines(session.results):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"results: {session.file.path}")
    written = config.stash.get(REPORT_PATHS, None)
    if isinstance(written, dict):
        terminalreporter.write_line(f"report: {written['report_html']}")
    elif written is not None:
        terminalreporter.write_line(f"report not written: {written}")
    history = config.stash.get(HISTORY_LINE, None)
    if history:
        terminalreporter.write_line(history)
