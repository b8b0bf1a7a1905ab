"""The hostile probe's cases: config. PERFSUITE_* variables of values they do
not take (refused before any launch, naming the variable, the value and what
it takes) or of a name perfsuite does not read (said); findings and
experiments that could never judge or never pass; an old and a new option
name given different values; --json on an error; a cell given twice;
thousands of unknown ids."""

from __future__ import annotations

from pathlib import Path

from tests.plugin.probekit import (
    EXPERIMENT,
    FINDING,
    GPU_CELL,
    NO_LAUNCH,
    RUN_CELL,
    SMOKE_CELL,
    Case,
    exp_case,
    nothing_under,
    run_folder,
)

PROBED = {"test_probed_cells.py": 'import pytest\n\n@pytest.mark.perf(workload="image")\n'
                                  'def test_cell(perf_cell, perf_result):\n    pass\n'}
RUN = ("run", SMOKE_CELL, "--out", "{t}/out", *NO_LAUNCH)
SKIPPED_RUN = ("run", GPU_CELL, "--allow-no-gpu", "--out", "{t}/out", *NO_LAUNCH)  # no launch, exit 0
UNKNOWN = tuple(f"smoke/image/nosuch/c{i}" for i in range(5000))
JUDGED = 'subject = {world_size = 2}\nlow = 1.1\n'


def env_case(id_: str, name: str, value: str, *says: str, argv=RUN) -> Case:
    named = (repr(value),) if "{t}" not in value else ()  # a path: said in *says
    return Case(id_, "cli", argv, 2, (f"${name}", *named, *says), env={name: value}, check=nothing_under("out"))


def pytest_env_case(id_: str, name: str, value: str, *says: str) -> Case:
    return Case(id_, "pytest", ("--perf-out", "{t}/out"), 4, (f"${name}", repr(value), *says), env={name: value},
                files=PROBED, check=nothing_under("out", "OFF", "Off"))


def empty_folder(t: Path) -> None:
    (t / "exp").mkdir()
    (t / "exp" / "mine.tml").write_text(EXPERIMENT)  # not *.toml


def said_once(t: Path, text: str) -> None:
    assert "[1/1]" in text and "[2/2]" not in text, text


def short(t: Path, text: str) -> None:
    assert len(text) < 2000, f"{len(text)} characters said"
    assert not (t / "out").exists()


CASES: list[Case] = [
    # -- PERFSUITE_* variables, perfsuite: refused before anything is launched or written
    env_case("env-rank-start-spawn", "PERFSUITE_RANK_START", "spawn", "fork, exec"),
    env_case("env-rank-start-Fork-ab", "PERFSUITE_RANK_START", "Fork", "fork, exec",
             argv=("ab", SMOKE_CELL, "--out", "{t}/out")),
    env_case("env-fork-agent-yes", "PERFSUITE_FORK_AGENT", "yes", "0, 1"),
    env_case("env-rdzv-port-http", "PERFSUITE_RDZV_PORT", "http", "1 to 65535"),
    env_case("env-nsys-bin-nowhere", "PERFSUITE_NSYS_BIN", "{t}/nowhere/nsys", "{t}/nowhere/nsys", "executable"),
    Case("env-nsys-search-root-a-file", "cli", RUN, 2, ("$PERFSUITE_NSYS_SEARCH_ROOT", "{t}/exp.toml", "a folder"),
         lambda t: (t / "exp.toml").write_text(EXPERIMENT), env={"PERFSUITE_NSYS_SEARCH_ROOT": "{t}/exp.toml"},
         check=nothing_under("out")),
    env_case("env-installer-conda", "PERFSUITE_INSTALLER", "conda", "uv, pip"),
    Case("env-history-OFF-history-add", "cli", ("history", "add", "{t}/run", "--commit", "a" * 40), 2,
         ("$PERFSUITE_HISTORY", "'OFF'", "lower case", "./OFF"), run_folder(), env={"PERFSUITE_HISTORY": "OFF"},
         check=nothing_under("cwd/OFF", "OFF")),
    Case("env-experiments-folder-without-toml", "cli", ("list",), 2, ("{t}/exp", "no *.toml"), empty_folder,
         env={"PERFSUITE_EXPERIMENTS": "{t}/exp"}),
    Case("env-typo-rank-strat-said-run-goes-on", "cli", SKIPPED_RUN, 0,
         ("$PERFSUITE_RANK_STRAT", "did you mean PERFSUITE_RANK_START"), env={"PERFSUITE_RANK_STRAT": "exec"},
         writes=("out",)),
    # -- the same under pytest: a usage error
    pytest_env_case("pytest-env-rank-start-spawn", "PERFSUITE_RANK_START", "spawn", "fork, exec"),
    pytest_env_case("pytest-env-history-Off", "PERFSUITE_HISTORY", "Off", "lower case"),
    pytest_env_case("pytest-env-rdzv-port-0", "PERFSUITE_RDZV_PORT", "0", "1 to 65535"),
    pytest_env_case("pytest-env-acceptance-budget-nan", "PERFSUITE_ACCEPTANCE_BUDGET_S", "nan", "above 0"),
    Case("pytest-perf-history-OFF", "pytest", ("--perf-out", "{t}/out", "--perf-history", "OFF"), 4,
         ("--perf-history OFF", "./OFF"), files=PROBED, check=nothing_under("out", "OFF")),
    Case("pytest-old-and-new-profiler-names", "pytest",
         ("--perf-out", "{t}/out", "--perf-profile", "nsys", "--perf-profiler", "torch"), 4,
         ("--perf-profile nsys", "--perf-profiler torch"), files=PROBED, check=nothing_under("out")),

    # -- findings and experiments that could never judge or never pass
    exp_case("finding-devices-empty", FINDING + JUDGED + "devices = []\n", ("finding 'x'.devices", "no device")),
    exp_case("finding-twin-is-its-subject", FINDING + 'subject = {precision = "fp64"}\nlow = 1.1\n',
             ("finding 'x'.twin", "changes nothing of its subject")),
    exp_case("finding-twin-fp128", FINDING.replace('"fp64"', '"fp128"') + JUDGED,
             ("finding 'x'.twin.precision", "'fp128'", "fp64, fp32, fp16, bf16")),
    exp_case("finding-bounds-never-pass", FINDING + 'subject = {world_size = 2}\nlow = -5\nhigh = 0\n',
             ("finding 'x'", "high 0", "never pass")),
    exp_case("finding-a-built-in-name", FINDING.replace('"x"', '"fp32-faster-than-fp64"') + JUDGED,
             ("finding 'fp32-faster-than-fp64'", "built-in", "image.toml")),
    exp_case("experiment-a-built-in-name", EXPERIMENT.replace('"mine"', '"smoke-ddp"'),
             ("experiment 'smoke-ddp'", "built-in")),
    exp_case("experiments-table-misspelt", EXPERIMENT.replace("[[experiment]]", "[[experiments]]"),
             ("['experiments']", "did you mean [[experiment]]?")),
    exp_case("findings-table-misspelt", (FINDING + JUDGED).replace("[[finding]]", "[[findings]]"),
             ("['findings']", "did you mean [[finding]]?"), argv=("list",)),
    Case("pytest-perf-experiments-finding-fp128", "pytest", ("--perf-out", "{t}/out"), 4,
         ("mine.toml", "finding 'x'.twin.precision", "'fp128'"),
         files={"pyproject.toml": '[tool.pytest.ini_options]\nperf_experiments = ["mine.toml"]\n',
                "mine.toml": FINDING.replace('"fp64"', '"fp128"') + JUDGED, **PROBED},
         check=nothing_under("out")),

    # -- an old and a new option name given different values (argparse's refusal: a process of its own)
    Case("run-old-and-new-profiler-names", "sub", (*SKIPPED_RUN, "--profile", "nsys", "--profiler", "torch"), 2,
         ("--profile nsys", "--profiler torch"), check=nothing_under("out")),
    Case("history-old-and-new-store-names", "sub",
         ("history", "show", RUN_CELL, "--url", "{t}/a.sqlite", "--history", "{t}/b.sqlite"), 2,
         ("--url {t}/a.sqlite", "--history {t}/b.sqlite"), check=nothing_under("a.sqlite", "b.sqlite")),

    # -- output: --json on an error, a cell given twice, thousands of unknown ids
    Case("run-json-unknown-id", "cli", ("run", "smoke/image/nosuch/c1", "--json", *NO_LAUNCH), 2,
         ('"error": "perfsuite: unknown cell id(s)', "smoke/image/nosuch/c1", '"exit_code": 2')),
    Case("list-json-bad-variable", "cli", ("list", "--json"), 2,
         ('"error": "perfsuite list: $PERFSUITE_RANK_START', '"exit_code": 2'), env={"PERFSUITE_RANK_START": "spawn"}),
    Case("run-json-command-line-error", "sub", ("run", SMOKE_CELL, "--json", "--repeats", "x"), 2,
         ('"error": ', "--repeats", '"exit_code": 2')),
    Case("run-a-cell-given-twice", "cli", (*SKIPPED_RUN[:2], GPU_CELL, *SKIPPED_RUN[2:]), 0,
         (f"{GPU_CELL} is given twice; it is measured once",), writes=("out",), check=said_once),
    Case("run-five-thousand-unknown-ids", "cli", ("run", *UNKNOWN, "--out", "{t}/out", *NO_LAUNCH), 2,
         (UNKNOWN[0], "and 4995 more", "perfsuite list"), check=short),
]
