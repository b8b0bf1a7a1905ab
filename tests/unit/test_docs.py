"""The README is a quick start that stays true, and docs/ beside it."""

import re
from collections.abc import Iterator
from pathlib import Path

from perfsuite.cli import reference as cli_reference
from perfsuite.system import envvars

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
ENV_NAME = re.compile(rb"PERFSUITE_[A-Z0-9_]+")


def markdown_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_cli_reference_is_what_the_parsers_say():
    written = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert written == cli_reference.render(), (
        "docs/reference/cli.md is out of date: python -m perfsuite.cli.reference > docs/reference/cli.md")


def test_every_command_and_option_is_in_the_reference():
    from perfsuite.cli.main import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for path, _, parser in cli_reference._commands(build_parser()):
        assert f"## {path}\n" in page
        for action in parser._actions:
            if action.help != "==SUPPRESS==" and action.option_strings and action.option_strings[0] != "-h":
                assert f"`{action.option_strings[0]}`" in page, (path, action.option_strings)


def test_the_environment_reference_is_what_the_registry_says():
    written = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert written == envvars.render(), (
        "docs/reference/environment.md is out of date: "
        "python -m perfsuite.system.envvars > docs/reference/environment.md")


def perfsuite_names() -> dict[str, str]:
    """Every PERFSUITE_* name in perfsuite/, .ci/ and .github/, and a file it is in."""
    found: dict[str, str] = {}
    for top in ("perfsuite", ".ci", ".github"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                for name in sorted(set(ENV_NAME.findall(path.read_bytes()))):
                    found.setdefault(name.decode(), str(path.relative_to(ROOT)))
    return found


def test_every_perfsuite_variable_is_in_the_registry():
    found = perfsuite_names()
    assert {"PERFSUITE_CACHE_DIR", "PERFSUITE_INSTALLER", "PERFSUITE_MNIST_DIR"} <= set(found)  # all three trees
    unknown = {name: where for name, where in found.items()
               if name not in envvars.by_name() and name not in envvars.NOT_VARIABLES}
    assert not unknown, ("add each to perfsuite/system/envvars.py, then python -m perfsuite.system.envvars "
                         f"> docs/reference/environment.md: {unknown}")


def test_the_registry_names_files_that_read_or_set_each_variable():
    """Each file the registry names holds the variable's name, or the name of
    a constant that holds it (``SOCKET_ENV = "PERFSUITE_WINDOWS"``)."""
    constants: dict[str, set[str]] = {}
    for path in (ROOT / "perfsuite").rglob("*.py"):
        for constant, name in re.findall(r'^(\w+) = "(PERFSUITE_[A-Z0-9_]+)"', path.read_text(), re.M):
            constants.setdefault(name, set()).add(constant)
    wrong = []
    for var in envvars.VARIABLES:
        for place in (*var.read_by, *var.set_by):
            text = (ROOT / place).read_text() if (ROOT / place).is_file() else ""
            if not any(word in text for word in (var.name, *constants.get(var.name, ()))):
                wrong.append(f"{var.name}: {place}")
    assert not wrong and not set(envvars.by_name()) & set(envvars.NOT_VARIABLES), wrong
    assert len(envvars.by_name()) == len(envvars.VARIABLES)


def test_every_relative_link_of_the_docs_leads_to_a_file():
    broken = []
    for page in markdown_files():
        for target, _ in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_is_a_quick_start_with_its_two_commands_first():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    commands = re.search(r"## Two commands.*?```bash\n(.*?)\n```", readme, re.S).group(1).splitlines()
    assert len(commands) == 2
    install, tests = commands
    ci = (ROOT / ".ci" / "run").read_text()
    # CI installs and tests exactly as the README says
    assert install.startswith("bash .ci/install .venv test && ") and "bash .ci/install .venv test\n" in ci
    assert tests == "bash .ci/test" and ci.endswith("\nbash .ci/test\n")
    # a newcomer finds gating a PR and their own training code from the contents
    contents = readme.split("## Contents", 1)[1].split("\n## ", 1)[0]
    for page in ("docs/how-to/gate-a-change.md", "docs/how-to/own-workload.md", "docs/how-to/gpu-runners.md",
                 "docs/reference/cli.md"):
        assert f"]({page})" in contents


def test_every_docs_page_is_linked_from_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if page.name != "README.md":
            assert f"]({page.relative_to(ROOT / 'docs')})" in index, page


HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"\s*([-*+]|\d+[.)])\s")
ANCHOR = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def docs_pages():
    return sorted((ROOT / "docs").rglob("*.md"))


def anchors(text: str) -> Iterator[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation
    dropped, spaces as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, 0) + 1
            yield slug if seen[slug] == 1 else f"{slug}-{seen[slug] - 1}"


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, lines) of each paragraph: consecutive non-blank lines
    outside code blocks and tables, a heading and each list item one of its
    own."""
    found, start, length, fenced = [], 0, 0, False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        ends = (stripped.startswith("```") or fenced or not stripped or stripped.startswith(("|", "#"))
                or LIST_ITEM.match(line))
        if ends and length:
            found.append((start, length))
            length = 0
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced and stripped and not stripped.startswith(("|", "#")):
            start, length = (number, 1) if not length else (start, length + 1)
    if length:
        found.append((start, length))
    return found


def test_every_anchor_of_the_docs_leads_to_a_heading():
    broken = []
    for page in markdown_files():
        for target, anchor in ANCHOR.findall(page.read_text()):
            if "://" in target or not (target == "" or target.endswith(".md")):
                continue
            linked = page.parent / target if target else page
            if not linked.is_file() or anchor not in set(anchors(linked.read_text())):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_every_how_to_starts_with_its_commands():
    """A reader finds the command in the first screen, before any history."""
    for page in sorted((ROOT / "docs" / "how-to").glob("*.md")):
        first_screen = page.read_text().splitlines()[:40]
        fences = [n for n, line in enumerate(first_screen) if line.lstrip().startswith("```")]
        assert len(fences) >= 2, f"{page.relative_to(ROOT)}: no code block in its first 40 lines"


def test_no_paragraph_of_the_docs_is_over_twelve_lines():
    long = [f"{page.relative_to(ROOT)}:{start} ({length} lines)"
            for page in docs_pages() for start, length in paragraphs(page.read_text()) if length > 12]
    assert not long, long


def test_the_paragraphs_are_counted_as_the_docs_define_them():
    text = "one\ntwo\n\n- item\n  more\n- next\n\n```\na\nb\n```\n| a |\n| b |\n# head\nthree\n"
    assert paragraphs(text) == [(1, 2), (4, 2), (6, 1), (15, 1)]
    assert list(anchors("# A `b`, c: d\n## A `b`, c: d\n```\n# no\n```\n")) == ["a-b-c-d", "a-b-c-d-1"]


def test_gating_a_change_fits_in_150_lines():
    assert len((ROOT / "docs" / "how-to" / "gate-a-change.md").read_text().splitlines()) <= 150
