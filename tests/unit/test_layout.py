"""The package's shape: packages along the data flow, no import circle, small modules.

Read from the source (every import statement, also those inside a function,
which run as surely as the others, only later), so the checks hold without
importing anything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "perfsuite"
MAX_TOP_LEVEL_MODULES = 12
MAX_MODULE_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The perfsuite modules ``path`` imports: for ``from pkg import name``
    the submodule ``pkg.name`` where there is one, else ``pkg``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = module_name(path).split(".")
            if path.name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
            out.update({f"{target}.{a.name}" for a in node.names} & known or {target} & known)
    if path.is_relative_to(PACKAGE):
        out.discard(module_name(path))
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(path, set(found)) for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from perfsuite.judge import checks\n    import perfsuite.cells\n")
    assert imports_of(source, {"perfsuite.judge", "perfsuite.judge.checks", "perfsuite.cells"}) == {
        "perfsuite.judge.checks", "perfsuite.cells"}


def test_few_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_long(name):
    lines = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def test_the_rank_side_does_not_know_the_host_side():
    """What runs in a rank (rank/, workloads/) never imports the launcher,
    the judging, the history, the report or the commands."""
    host = ("perfsuite.launch", "perfsuite.judge", "perfsuite.ab", "perfsuite.selftest", "perfsuite.history",
            "perfsuite.report", "perfsuite.doctor", "perfsuite.cli", "perfsuite.runner")
    graph = import_graph()
    crossing = {(name, dep) for name, deps in graph.items()
                if name.startswith(("perfsuite.rank", "perfsuite.workloads"))
                for dep in deps if dep.startswith(host)}
    assert crossing == set()


def test_every_package_says_what_it_holds():
    """A docstring per package: what it holds and which step of the data flow it is."""
    bare = [str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("__init__.py"))
            if not (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "").strip()]
    assert bare == [], f"give each a docstring: {bare}"


LAYOUT_PAGE = PACKAGE.parent / "docs" / "reference" / "layout.md"
PAGE_FILE = re.compile(r"(?<![\w/.*-])([\w/*]+\.py)\b")
# Imports of a module listed further down docs/reference/layout.md, each said there and why (none now).
IMPORTS_AGAINST_THE_ORDER: set[tuple[str, str]] = set()


def layout_entries(text: str) -> list[tuple[str, set[Path]]]:
    """The entries of the page's drawing in order: the path that starts an
    entry's first line, and the .py files its lines name (a bare name is in
    the entry's package; a line indented deeper carries the entry on)."""
    block = text.split("```\n")[1]
    entries: list[tuple[str, set[Path]]] = []
    for line in block.splitlines():
        if not line.startswith("   ") and line.strip():
            entries.append((line.split()[0], set()))
        if not entries or not entries[-1][0].startswith("perfsuite/"):
            continue
        head, named = entries[-1]
        for name in PAGE_FILE.findall(line):  # a bare name beside a module's own line: in perfsuite/
            folder = "" if name.startswith("perfsuite/") else head if head.endswith("/") else "perfsuite"
            named.add(PACKAGE.parent / folder / name)
    return entries


def test_the_layout_reader_reads_entries_and_their_names():
    text = ("```\nfloor\n  perfsuite/a.py   x.py is elsewhere\n  perfsuite/b/     one.py: one;\n"
            "                   two.py\nelsewhere/        three.py\n```\n")
    assert layout_entries(text) == [("floor", set()), ("perfsuite/a.py", {PACKAGE / "a.py", PACKAGE / "x.py"}),
                                    ("perfsuite/b/", {PACKAGE / "b" / "one.py", PACKAGE / "b" / "two.py"}),
                                    ("elsewhere/", set())]


def test_the_layout_page_names_every_module_and_only_modules():
    """docs/reference/layout.md names every module of the package by its own
    name (no pattern), and nothing that is not one; read at run time, so a
    module added or removed anywhere shows here."""
    named = set().union(*(files for _, files in layout_entries(LAYOUT_PAGE.read_text(encoding="utf-8"))))
    found = {p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    missing = sorted(str(p.relative_to(PACKAGE.parent)) for p in found - named)
    unknown = sorted(str(p.relative_to(PACKAGE.parent)) for p in named if not p.is_file())
    assert missing == [] and unknown == [], (
        f"docs/reference/layout.md: add a line for {missing}; these are no module: {unknown}")


def test_the_layout_page_lists_what_a_module_imports_above_it():
    heads = [head for head, _ in layout_entries(LAYOUT_PAGE.read_text(encoding="utf-8"))]

    def place(name: str) -> int | None:
        path = str(modules()[name].relative_to(PACKAGE.parent))
        if name == "perfsuite":
            return -1
        return next((i for i, head in enumerate(heads)
                     if path == head or (head.endswith("/") and path.startswith(head))), None)

    against = sorted((name, dep) for name, deps in import_graph().items() for dep in deps
                     if place(name) is not None and place(dep) is not None and place(dep) > place(name)
                     and (name, dep) not in IMPORTS_AGAINST_THE_ORDER)
    assert against == [], f"each imports a module listed below it in docs/reference/layout.md: {against}"
