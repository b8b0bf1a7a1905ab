"""The ``perfsuite`` command: its parser, ``main``, ``list`` and ``doctor``; every
other command lives in a ``cli_*`` module of its group, which adds its parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsuite import cells as cells_mod
from perfsuite import options
from perfsuite.cli import ab as cli_ab
from perfsuite.cli import history as cli_history
from perfsuite.cli import results as cli_results
from perfsuite.cli import run as cli_run
from perfsuite.cli import selftest as cli_selftest
from perfsuite.cli import shards as cli_shards
from perfsuite.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageProblem, emit_json

# perfsuite.doctor (some 360 modules with the runner and SQLAlchemy, ~0.5 s):
# imported in the command that uses it. main imports every cli module to build
# its parser, and the CLI's first screen (perfsuite list, --help) imports
# nothing heavy.


def _cmd_list(args: argparse.Namespace) -> int:
    chosen = cells_mod.select(tier=args.tier, workload=args.workload)
    if args.json:
        emit_json(args, [{"id": cell.id, "params": cell.params()} for cell in chosen])
        return 0
    for cell in chosen:
        print(cell.id)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perfsuite")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _cmd_doctor(args: argparse.Namespace) -> int:
    from perfsuite.doctor import checks as doctor

    checks = doctor.run_checks(tier=args.tier, data_dir=args.data_dir)
    if args.json:
        emit_json(args, doctor.summary(checks, args.tier))
    else:
        print(doctor.text(checks, args.tier))
    return EXIT_FAILED if any(c.status == doctor.BLOCKER for c in checks) else EXIT_OK


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs as written, and every option's default: appended where its help
    does not already say it (a flag's default is being absent)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)"


DESCRIPTION = """\
Measure multi-GPU training cells, judge them against baselines, against each
other and against their history. Each option --NAME of these commands is
pytest's --perf-NAME where pytest has it (perfsuite run --history URL, pytest
--perf-history URL). `perfsuite COMMAND --help` says more."""

EPILOG = """\
exit codes (run, compare, ab, baseline record, history changes; bisect's: its --help):
  0    fine: nothing regressed or failed
  1    a regression, a failed check or a failed cell
  2    usage or environment error, before anything was measured
  3    undecided (ab at its cap, compare with no shared cell)
  130  interrupted; what was measured is kept
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfsuite", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"perfsuite {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="print cell ids, one per line")
    p.add_argument("--tier", default="all", choices=[*cells_mod.TIERS, "all"], help="cells of this tier")
    p.add_argument("--workload", choices=cells_mod.WORKLOADS, help="cells of this workload (default: every one)")
    p.add_argument("--json", action="store_true", help="a JSON array of the cells: id and params")
    p.set_defaults(func=_cmd_list)
    cli_shards.add_parser(sub)

    cli_run.add_parser(sub)
    cli_results.add_compare_parser(sub)
    from perfsuite.cli import diff as cli_diff  # light: its heavy imports wait for the command

    cli_diff.add_parser(sub)
    cli_ab.add_parsers(sub)
    cli_results.add_parsers(sub)
    cli_history.add_parsers(sub)

    p = sub.add_parser("doctor", help="what will and will not work here, before a GPU run: "
                                      "GPUs, driver, NCCL, nsys, /dev/shm, disk, MNIST",
                       description="One line per check: ok, warn, or BLOCKER with the fix. "
                                   "Exit 1 on a blocker, 0 otherwise.")
    p.add_argument("--tier", choices=cells_mod.TIERS,
                   help="judge for this tier: gate and full need a GPU, smoke does not "
                        "(default: say which tiers can run, nothing blocks)")
    p.add_argument("--data-dir", type=Path,
                   help="directory with the MNIST IDX files, for the full tier (default: none)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=_cmd_doctor)

    cli_selftest.add_parsers(sub)
    _every_parser_formats_so(parser)
    return parser


def _every_parser_formats_so(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.formatter_class = HelpFormatter
                _every_parser_formats_so(child)
    parser.formatter_class = HelpFormatter


def escape_unencodable_output() -> None:
    """stdout and stderr print what their encoding cannot say escaped (\\xe9), not
    as a UnicodeEncodeError once the work is done: a path or an id in unicode
    under PYTHONIOENCODING=ascii or a C locale, a file name that is not UTF-8.
    A UTF-8 stream's surrogateescape stays: it prints such a name as it is."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        errors, encoding = getattr(stream, "errors", None), getattr(stream, "encoding", None)
        if not hasattr(stream, "reconfigure") or errors is None or encoding is None:
            continue
        try:
            utf8 = codecs.lookup(encoding).name == "utf-8"
        except LookupError:
            utf8 = False
        if errors == "strict" or (not utf8 and errors != "backslashreplace"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change: as it is
                pass


class _Tail:
    """A stream that writes through to ``stream`` and keeps the last line
    written: on stderr, what a --json command's document names when the
    command ends without one; on stdout, whether it wrote one."""

    def __init__(self, stream) -> None:
        self.stream, self.last = stream, ""

    def write(self, text: str) -> int:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = lines[-1].strip()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None, wants_json: bool) -> argparse.Namespace:
    """The command line, parsed; an old and a new name of one option given
    different values is refused as argparse refuses (exit 2). Under --json
    the refusal is also that one JSON object on stdout."""
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said) if wants_json else contextlib.nullcontext():
            args = parser.parse_args(argv)
            clash = options.old_name_clash(args)
            if clash:
                parser.error(clash)
    except SystemExit as stop:
        sys.stderr.write(said.getvalue())
        if stop.code and wants_json:
            lines = [line for line in said.getvalue().splitlines() if line.strip()]
            _json_exit(EXIT_USAGE, lines[-1] if lines else "the command line cannot be run")
        raise
    sys.stderr.write(said.getvalue())
    return args


def _json_exit(code: int, error: str | None) -> None:
    """A --json command's one document where the command gave none: its exit
    code and, for a failure, what it said last."""
    import json

    print(json.dumps({**({"error": error} if code else {}), "exit_code": code}), flush=True)


def _check_environment(args: argparse.Namespace) -> None:
    """Every PERFSUITE_* variable takes its value, and the store named takes
    its name, before anything is launched or stored; a variable perfsuite
    does not read is said (a typo). perfsuite doctor reports them instead (its
    env check) and runs on."""
    import os

    from perfsuite.system import envvars

    for line in envvars.strangers(os.environ):
        print(f"perfsuite: warning: {line}", file=sys.stderr)
    if args.command == "doctor":
        return
    found = envvars.problems(os.environ)
    history = getattr(args, "history", None)
    if isinstance(history, str) and options.history_problem(history):
        found.append(options.history_problem(history))
    if found:
        raise UsageProblem("\n".join(f"perfsuite {args.command}: {line}" for line in found))


def main(argv: list[str] | None = None) -> int:
    import contextlib
    import os
    import signal
    import threading

    escape_unencodable_output()  # before anything is printed
    options.forget_said()  # an old name is named once per command
    wants_json = "--json" in (sys.argv[1:] if argv is None else argv)
    args = _parse(build_parser(), argv, wants_json)
    if getattr(args, "renamed_command", None):
        options.say_renamed(*args.renamed_command)
    # `perfsuite list | head -1`: end of SIGPIPE, quietly, as other command-line
    # tools do, not in a BrokenPipeError traceback. Only as the console script
    # (argv None; a caller in-process, pytest included, keeps Python's handling),
    # and not for the commands that launch ranks: their BrokenPipeError unwinds
    # through the code that ends the ranks and keeps what was measured, and
    # ends quietly below.
    if (argv is None and hasattr(signal, "SIGPIPE") and not getattr(args, "launches_cells", False)
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    json_mode = bool(getattr(args, "json", False))
    tail, document = _Tail(sys.stderr), _Tail(sys.stdout)
    try:
        _check_environment(args)
        if not json_mode:
            return args.func(args)
        # --json: stdout carries the command's one JSON document (emit_json),
        # everything said on the way goes to stderr
        args.json_out = document
        with contextlib.redirect_stdout(tail), contextlib.redirect_stderr(tail):
            code = args.func(args)
        if not document.last:
            _json_exit(code, tail.last or None)
        return code
    except BrokenPipeError:  # the reader went away: nothing more to say, nowhere to say it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not complain
        return 128 + signal.SIGPIPE
    except (cells_mod.CellError, UsageProblem) as err:
        said = f"perfsuite: {err}" if isinstance(err, cells_mod.CellError) else str(err)
        return _failed(json_mode and not document.last, EXIT_USAGE, said)
    except OSError as err:  # a file that cannot be read or written: say which, no traceback
        return _failed(json_mode and not document.last, EXIT_USAGE,
                       f"perfsuite {args.command}: {err.filename or ''}: {err.strerror or err}")
    except KeyboardInterrupt:
        return _failed(json_mode and not document.last, EXIT_INTERRUPTED, f"perfsuite {args.command}: interrupted")
    finally:  # the zygotes the command's launches forked from end with it (in-process callers too)
        agent = sys.modules.get("perfsuite.launch.agent")
        if agent is not None:
            agent.close_zygotes()


def _failed(as_json: bool, code: int, said: str) -> int:
    """``said`` on stderr, and with ``as_json`` (--json, and the command gave
    no document) as the one document too; ``code`` returned."""
    print(said, file=sys.stderr)
    if as_json:
        _json_exit(code, said)
    return code


if __name__ == "__main__":
    sys.exit(main())
