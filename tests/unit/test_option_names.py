"""One name and one default per concept, across the perfsuite command and pytest.

Every option of every command (the argparse parsers, walked) and of pytest's
perfsuite group is checked against a table of concepts: an option whose dest
means a concept must carry that concept's one name (pytest: the same name
with the --perf- prefix). Old names are OldName aliases: hidden, they say on
use which name replaces them."""

import argparse

import pytest

from perfsuite import options, plugin
from perfsuite.cli import main as cli
from perfsuite.cli.main import HelpFormatter

# concept: (its one name, dests that mean it, whatever the option is called)
CONCEPTS = {
    "history store": ("--history", {"history", "url", "store", "history_url", "history_store", "db", "database"}),
    "history purpose": ("--history-purpose", {"history_purpose", "purpose"}),
    "baselines root": ("--baselines", {"baselines", "root", "baselines_root", "baseline_root", "baselines_dir"}),
    # "profile" alone would mean either of these two: refused by both
    "profiler": ("--profiler", {"profiler", "profiling", "profile"}),
    "hardware profile": ("--hardware-profile", {"hardware_profile", "profile_id", "hardware", "profile"}),
    "output folder": ("--out", {"out", "out_dir", "output", "output_dir", "work_dir", "workdir", "outdir"}),
    "data dir": ("--data-dir", {"data_dir", "data", "dataset_dir", "datasets_dir"}),
    "launch statistic": ("--launch-statistic", {"launch_statistic", "statistic", "stat"}),
    "workload option": ("--option", {"option", "options", "workload_option"}),
    "timeout": ("--timeout", {"timeout", "timeout_s"}),
    "gpus": ("--gpus", {"gpus", "gpu", "cuda_visible_devices"}),
    "commit": ("--commit", {"commit", "sha", "commit_sha"}),
    "machine output": ("--json", {"json", "as_json", "json_out"}),
    "git repository": ("--repo", {"repo", "repository"}),
    "tier": ("--tier", {"tier", "tiers"}),
    "repeated launches": ("--repeats", {"repeats", "repeat"}),
    "tolerance": ("--tolerance", {"tolerance", "tol"}),
}
PYTEST = "pytest"


class PytestGroup:
    """pytest's parser as the plugin's pytest_addoption sees it: addoption
    hands its arguments to argparse, as pytest's own does."""

    def __init__(self):
        self.parser = argparse.ArgumentParser(add_help=False)

    def getgroup(self, name, description=""):
        return self

    def addoption(self, *names, **attrs):
        return self.parser.add_argument(*names, **attrs)

    def addini(self, *args, **kwargs):
        pass


def pytest_actions():
    group = PytestGroup()
    plugin.pytest_addoption(group)
    return group.parser._actions


def cli_parsers():
    """(command, parser) of `perfsuite` and every subcommand, old names included."""
    def walk(parser, command):
        yield command, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{command} {name}")

    yield from walk(cli.build_parser(), "perfsuite")


def every_option():
    """(where, the option's name as a concept's, its dest, its action): aliases left out."""
    for command, parser in cli_parsers():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, options.OldName):
                long = max(action.option_strings, key=len)
                yield command, long, action.dest, action
    for action in pytest_actions():
        if not isinstance(action, options.OldName):
            (name,) = action.option_strings
            assert name.startswith(options.PYTEST_PREFIX), name  # the convention: one prefix
            yield PYTEST, "--" + name[len(options.PYTEST_PREFIX):], action.dest.removeprefix("perf_"), action


def test_no_concept_goes_by_two_names():
    wrong = [f"{where}: {name} means the {concept}, whose one name is {one}"
             + (" (pytest: --perf-" + one[2:] + ")" if where == PYTEST else "")
             for where, name, dest, _ in every_option()
             for concept, (one, dests) in CONCEPTS.items() if dest in dests and name != one]
    assert not wrong, "\n".join(wrong)


def test_the_table_catches_a_second_name():
    """The check above is not vacuous: the names the commands had before fail it."""
    old = [("perfsuite history changes", "--url", "url"), ("perfsuite baseline record", "--root", "root"),
           ("perfsuite run", "--profile", "profile"), ("perfsuite baseline record", "--profile", "profile"),
           ("perfsuite detection", "--work-dir", "work_dir"), ("perfsuite history add", "--purpose", "purpose")]
    for _, name, dest in old:
        assert any(dest in dests and name != one for one, dests in CONCEPTS.values()), name


def test_every_old_name_is_a_hidden_alias_of_the_concepts_name():
    aliases = [(command, action) for command, parser in cli_parsers() for action in parser._actions
               if isinstance(action, options.OldName)]
    aliases += [(PYTEST, action) for action in pytest_actions() if isinstance(action, options.OldName)]
    found = {(command, action.option_strings[0], action.new) for command, action in aliases}
    assert found >= {("perfsuite run", "--profile", "--profiler"),
                     ("perfsuite baseline record", "--profile", "--hardware-profile"),
                     ("perfsuite baseline record", "--root", "--baselines"),
                     ("perfsuite history changes", "--url", "--history"),
                     ("perfsuite history add", "--purpose", "--history-purpose"),
                     ("perfsuite selftest verdict-detection", "--work-dir", "--out"),
                     (PYTEST, "--perf-profile", "--perf-profiler")}
    for _, action in aliases:
        assert action.help == argparse.SUPPRESS  # not in --help
        new = action.new.removeprefix(options.PYTEST_PREFIX).removeprefix("--")
        assert any("--" + new == one for one, _ in CONCEPTS.values()), action.new


def test_pytest_options_are_run_options_with_the_perf_prefix():
    run = dict(cli_parsers())["perfsuite run"]
    run_names = {max(a.option_strings, key=len) for a in run._actions
                 if a.option_strings and not isinstance(a, options.OldName)}
    pytest_names = {"--" + a.option_strings[0][len(options.PYTEST_PREFIX):] for a in pytest_actions()
                    if not isinstance(a, options.OldName)}
    # run takes ids as arguments, pytest --perf-cell; only run picks a workload or prints JSON
    assert pytest_names - run_names == {"--cell"}
    assert run_names - pytest_names == {"--help", "--workload", "--json"}


def test_run_ab_and_bisect_launch_with_one_group_of_options():
    parsers = dict(cli_parsers())
    launching = {"--" + name.replace("_", "-") for name in options.add_launch_options(lambda *a, **k: None)}
    for command in ("perfsuite run", "perfsuite ab", "perfsuite bisect"):
        names = {s for a in parsers[command]._actions for s in a.option_strings}
        assert launching <= names, (command, launching - names)


def test_every_option_has_help_and_shows_its_default():
    formatter = HelpFormatter("perfsuite")
    silent = []
    for command, parser in cli_parsers():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, options.OldName,
                                   argparse._SubParsersAction)):
                continue
            text = formatter._get_help_string(action)
            if not text:
                silent.append(f"{command} {action.dest}: no help")
            elif action.option_strings and action.nargs != 0 and not action.required and "default" not in text:
                silent.append(f"{command} {max(action.option_strings, key=len)}: no default shown")
    for action in pytest_actions():
        if isinstance(action, options.OldName):
            continue
        if not action.help:
            silent.append(f"pytest {action.option_strings[0]}: no help")
        elif action.nargs != 0 and "default" not in action.help:
            silent.append(f"pytest {action.option_strings[0]}: no default shown")
    assert not silent, "\n".join(silent)


def test_perfsuite_help_lists_every_command_with_a_line_of_help(capsys):
    for command, parser in cli_parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {a.dest for a in action._choices_actions}
                renamed = {name for name, child in action.choices.items()
                           if child.get_default("renamed_command")}
                assert listed == set(action.choices) - renamed, command
                assert all(a.help for a in action._choices_actions), command
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    said = capsys.readouterr().out
    for name in ("list", "run", "compare", "ab", "bisect", "baseline", "report", "profile", "history",
                 "doctor", "selftest"):
        assert f"\n    {name} " in said, name
    assert "\n    detection " not in said and "\n    overhead " not in said


def test_the_launch_statistic_has_one_default_everywhere(tmp_path):
    """Every command and the library read options.DEFAULT_LAUNCH_STATISTIC;
    a baseline folder that names its own keeps it, one that names none gets
    the default."""
    import inspect
    import json
    import sys

    from perfsuite.ab import bisect
    from perfsuite.ab import session as ab
    from perfsuite.history import rows as history_rows
    from perfsuite.judge import baselines
    from perfsuite.stats import launches as launchstats

    default = options.DEFAULT_LAUNCH_STATISTIC
    assert options.LAUNCH_STATISTICS == tuple(launchstats.LAUNCH_STATISTICS) and default in options.LAUNCH_STATISTICS
    defaults = {command: action.default for command, parser in cli_parsers() for action in parser._actions
                if action.dest == "launch_statistic"}
    assert defaults.pop("perfsuite baseline record") is None  # as the folder says: data, not a default
    assert set(defaults.values()) == {default}, defaults
    assert len(defaults) >= 8  # compare, ab, bisect, history changes/show/report, both detections
    assert history_rows.DEFAULT_LAUNCH_STATISTIC == default
    assert inspect.signature(launchstats.launch_values).parameters["statistic"].default == default
    assert inspect.signature(launchstats.compare_launches).parameters["statistic"].default == default
    session = ab.ABSession([], ab.Side("A", sys.executable), ab.Side("B", sys.executable), tmp_path / "ab")
    assert session.statistic == default
    assert inspect.signature(bisect.Bisection).parameters["statistic"].default == default
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"format": baselines.FORMAT, "hardware": "cpu-x-2c",
                                                     "kind": "recorded"}))
    assert baselines.load_profile(folder).launch_statistic == default
    other = next(s for s in options.LAUNCH_STATISTICS if s != default)
    (folder / "profile.json").write_text(json.dumps({"format": baselines.FORMAT, "hardware": "cpu-x-2c",
                                                     "kind": "recorded", "launch_statistic": other}))
    assert baselines.load_profile(folder).launch_statistic == other


def test_the_shared_vocabularies_match_their_homes():
    from perfsuite.history import schema as history_schema

    assert options.HISTORY_PURPOSES == history_schema.PURPOSES


def test_pytest_takes_the_old_profiler_option_and_says_once_which_replaces_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "test_profiler.py").write_text(
        "def test_profiler(pytestconfig):\n"
        "    assert pytestconfig.getoption('--perf-profiler') == 'off'\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_profiler.py",
                           "--perf-profile", "torch", "--perf-profile", "off"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert said.count("perfsuite: --perf-profile is now --perf-profiler") == 1, said
