"""docs/reference/cli.md, made from the command's own parsers and pytest's
option group, so that the reference cannot drift from what the command
accepts (tests/unit/test_docs.py compares the file with this output).

    python -m perfsuite.cli.reference > docs/reference/cli.md
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from perfsuite import options, plugin
from perfsuite.cli.main import build_parser

HEADER = """# Command reference

Every `perfsuite` command and option, with its default, and every pytest
option of the plugin, made from the parsers themselves (`python -m
perfsuite.cli.reference > docs/reference/cli.md`; a test checks this page is
what they say). A pytest option `--perf-NAME` is `perfsuite run --NAME`.
Options kept under an old name for one release are not listed: on use they
say which name replaces them.

## Exit codes

| code | meaning |
|---|---|
| 0 | fine: nothing regressed or failed |
| 1 | a regression, a failed check or a failed cell (with `--fail-on-skipped`, also a comparison not made) |
| 2 | usage or environment error, before anything was measured |
| 3 | undecided (`ab` or `bisect` at its cap, `compare` with no shared cell) |
| 130 | interrupted; what was measured is kept |
"""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0:
        return ""
    if isinstance(action.default, (list, tuple)):
        return ", ".join(map(str, action.default)) if action.default else ""
    return str(action.default)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    text = action.help % {"default": action.default, "prog": parser.prog, "choices": action.choices} \
        if "%(" in action.help else action.help
    return re.sub(r"\s+", " ", text.replace("%%", "%")).strip()


def _rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                    argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
        if action.option_strings and action.nargs != 0:
            names += f" {action.metavar or action.dest.upper()}"
        choices = f" ({', '.join(map(str, action.choices))})" if action.choices else ""
        yield (f"| {_escape(names)} | {_escape(_help(parser, action) + choices)} | "
               f"{_escape(_default(action))} |")


def _commands(parser: argparse.ArgumentParser, path: str = "perfsuite"
              ) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        shown = {choice.dest: choice.help for choice in action._choices_actions}
        for name, child in action.choices.items():
            if name not in shown:  # an old name kept for one release
                continue
            yield f"{path} {name}", (shown[name] or "").replace("%%", "%"), child
            yield from _commands(child, f"{path} {name}")


def _pytest_options() -> list[tuple[str, str, str]]:
    """(names, help, default) of the perfsuite group, as pytest registers it."""
    found: list[tuple[str, str, str]] = []

    class Group:
        def addoption(self, *names: str, **kwargs: object) -> None:
            if kwargs.get("help") == argparse.SUPPRESS or kwargs.get("action") is options.OldName:
                return  # an old name kept for one release
            default = kwargs.get("default")
            shown = "" if default in (None, False, [], ()) else str(default)
            text = str(kwargs.get("help") or "").replace("%(default)s", shown).replace("%%", "%")
            found.append((", ".join(f"`{n}`" for n in names), text, shown))

    class Parser:
        def getgroup(self, *args: object, **kwargs: object) -> Group:
            return Group()

        def addini(self, *args: object, **kwargs: object) -> None:
            pass

    plugin.pytest_addoption(Parser())
    return found


def render() -> str:
    parser = build_parser()
    out = [HEADER, "## Commands\n", "| command | what it does |", "|---|---|"]
    commands = list(_commands(parser))
    out += [f"| [`{path}`](#{path.replace(' ', '-')}) | {_escape(text)} |" for path, text, _ in commands]
    for path, text, child in commands:
        rows = list(_rows(child))
        out += ["", f"## {path}", "", _escape(text) + ".", ""]
        if rows:
            out += ["| option | what it does | default |", "|---|---|---|", *rows]
    out += ["", "## pytest options (`--perf-*`)", "", "| option | what it does | default |", "|---|---|---|"]
    out += [f"| {_escape(names)} | {_escape(re.sub(chr(92) + 's+', ' ', text))} | {_escape(default)} |"
            for names, text, default in _pytest_options()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
